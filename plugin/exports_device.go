package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
)

// The device exports of gradcomp.h (ABI 1.2), documented there; their
// cores are in device.go. They follow exports.go's pattern: guard first,
// pointer and size checks, the handle, the core, outputs on success.
// gc_features only returns a constant and has nothing to guard.

//export gc_features
func gc_features() C.uint32_t { return C.uint32_t(features) }

//export gc_device_info
func gc_device_info(device C.int, name *C.char, nameCap C.size_t, major, minor *C.int, memory *C.uint64_t) (st C.int) {
	const fn = "gc_device_info"
	defer guard(fn, &st)
	if major == nil || minor == nil || memory == nil {
		return C.int(fail(errInvalid, fn, "null %s", nullName(major == nil, "major", nullName(minor == nil, "minor", "memory_bytes"))))
	}
	buf, err := cBytes(unsafe.Pointer(name), nameCap, "name")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	info, err := deviceInfo(int(device))
	if err != nil {
		return C.int(failErr(fn, err))
	}
	if len(buf) < len(info.Name)+1 {
		return C.int(fail(errSize, fn, "name holds %d bytes; device %d's name %q needs %d with its NUL", len(buf), info.Ordinal, info.Name, len(info.Name)+1))
	}
	buf[copy(buf, info.Name)] = 0
	*major, *minor, *memory = C.int(info.Major), C.int(info.Minor), C.uint64_t(info.Memory)
	return C.int(statusOK)
}

//export gc_compress_device
func gc_compress_device(h, bucket, step C.uint64_t, flags C.uint32_t, grad C.uintptr_t, n C.size_t,
	dst C.uintptr_t, capacity C.size_t, stream C.uintptr_t, written *C.size_t) (st C.int) {
	const fn = "gc_compress_device"
	defer guard(fn, &st)
	if written == nil {
		return C.int(fail(errInvalid, fn, "null written"))
	}
	*written = 0
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	m, err := c.compressDevice(compress.Key{Bucket: uint64(bucket), Step: uint64(step)}, uint32(flags),
		gpu.Ptr(grad), uint64(n), gpu.Ptr(dst), uint64(capacity), gpu.Stream(stream))
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*written = C.size_t(m)
	return C.int(statusOK)
}

//export gc_decompress_device
func gc_decompress_device(h C.uint64_t, payload C.uintptr_t, length C.size_t, dst C.uintptr_t, n C.size_t, stream C.uintptr_t) (st C.int) {
	defer guard("gc_decompress_device", &st)
	return decompressDeviceExport("gc_decompress_device", h, payload, length, 1, true, dst, n, false, stream)
}

//export gc_decompress_add_device
func gc_decompress_add_device(h C.uint64_t, payload C.uintptr_t, length C.size_t, dst C.uintptr_t, n C.size_t, stream C.uintptr_t) (st C.int) {
	defer guard("gc_decompress_add_device", &st)
	return decompressDeviceExport("gc_decompress_add_device", h, payload, length, 1, true, dst, n, true, stream)
}

//export gc_decompress_slots_device
func gc_decompress_slots_device(h C.uint64_t, slots C.uintptr_t, slotLen, count C.size_t, dst C.uintptr_t, n C.size_t, add C.int, stream C.uintptr_t) (st C.int) {
	const fn = "gc_decompress_slots_device"
	defer guard(fn, &st)
	if add != 0 && add != 1 {
		return C.int(fail(errInvalid, fn, "add = %d, want 0 or 1", int(add)))
	}
	return decompressDeviceExport(fn, h, slots, slotLen, count, false, dst, n, add == 1, stream)
}

// decompressDeviceExport is the body of the three decompress exports, named
// fn in messages.
func decompressDeviceExport(fn string, h C.uint64_t, p C.uintptr_t, slotLen, count C.size_t, exact bool, dst C.uintptr_t, n C.size_t, add bool, stream C.uintptr_t) C.int {
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	err = c.decompressDevice(gpu.Ptr(p), uint64(slotLen), uint64(count), exact, gpu.Ptr(dst), uint64(n), add, gpu.Stream(stream))
	if err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}
