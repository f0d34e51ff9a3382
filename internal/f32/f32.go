// Package f32 views float32 slices as their bytes and back, without
// copying: how gradient buffers become the byte buffers that collectives,
// device copies and the C ABI move. The views share memory with their
// argument, in the host's byte order.
package f32

import "unsafe"

// Bytes returns the memory of x as 4·len(x) bytes (nil for an empty x).
func Bytes(x []float32) []byte {
	if len(x) == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(x))), 4*len(x))
}

// Floats returns the memory of b as len(b)/4 float32s (nil for fewer than
// 4 bytes). b must be 4-byte aligned, as every Go allocation of float32s
// and every buffer the ABI hands over is.
func Floats(b []byte) []float32 {
	if len(b) < 4 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(unsafe.SliceData(b))), len(b)/4)
}
