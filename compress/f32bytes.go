package compress

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// hostLittleEndian reports whether float32 values sit in memory in the wire's
// byte order, so fp32 bodies can be read and written as []float32 directly.
var hostLittleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

// float32View returns b as a []float32 without copying when the host is
// little-endian and b is 4-byte aligned; ok is false otherwise.
func float32View(b []byte) (vals []float32, ok bool) {
	if !hostLittleEndian || len(b)%4 != 0 || uintptr(unsafe.Pointer(unsafe.SliceData(b)))%4 != 0 {
		return nil, false
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4), true
}

// putFloat32s writes src to dst (len 4·len(src)) as little-endian float32.
func putFloat32s(dst []byte, src []float32) {
	if hostLittleEndian {
		copy(dst, unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(src))), 4*len(src)))
		return
	}
	for i, x := range src {
		binary.LittleEndian.PutUint32(dst[4*i:], math.Float32bits(x))
	}
}

// getFloat32s sets dst from little-endian float32 bytes src (len 4·len(dst)).
func getFloat32s(dst []float32, src []byte) {
	if hostLittleEndian {
		copy(unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(dst))), 4*len(dst)), src)
		return
	}
	for i := range dst {
		dst[i] = math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// addFloat32s adds little-endian float32 bytes src (len 4·len(dst)) to dst.
func addFloat32s(dst []float32, src []byte) {
	if vals, ok := float32View(src); ok {
		addKernel(dst, dst, vals)
		return
	}
	for i := range dst {
		dst[i] += math.Float32frombits(binary.LittleEndian.Uint32(src[4*i:]))
	}
}

// uint16s returns little-endian uint16 bytes b as a []uint16: a view without
// copying when the host is little-endian and b is 2-byte aligned, else a copy.
func uint16s(b []byte) []uint16 {
	if hostLittleEndian && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%2 == 0 {
		return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/2)
	}
	u := make([]uint16, len(b)/2)
	for i := range u {
		u[i] = binary.LittleEndian.Uint16(b[2*i:])
	}
	return u
}

// float32Bits returns x as its bit patterns (math.Float32bits of each
// element) without copying: float32 and uint32 share one byte order on every
// host, so the view is portable.
func float32Bits(x []float32) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(x))), len(x))
}
