package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"unsafe"

	"github.com/gradcomp/gradcomp/compress"
)

// The exports of gradcomp.h, one each, documented there. Each defers guard
// first, checks its pointers and sizes, finds its handle, calls its core in
// compressor.go and writes its outputs on success only, except that
// gc_compress and gc_state_save zero *written first and the header's
// GC_ERR_SIZE cases still return the length needed. gc_abi_version and
// gc_version only return constants and have nothing to guard.

// cVersion is gc_version's string, in C memory for the process's lifetime.
var cVersion = C.CString(version)

//export gc_abi_version
func gc_abi_version() C.uint32_t { return C.uint32_t(abiVersion) }

//export gc_version
func gc_version() *C.char { return cVersion }

//export gc_compressor_create
func gc_compressor_create(spec *C.char, workers C.int, out *C.uint64_t) (st C.int) {
	defer guard("gc_compressor_create", &st)
	if spec == nil || out == nil {
		return C.int(fail(errInvalid, "gc_compressor_create", "null %s", nullName(spec == nil, "spec", "out")))
	}
	c, err := newCompressor(C.GoString(spec), int(workers))
	if err != nil {
		return C.int(failErr("gc_compressor_create", err))
	}
	*out = C.uint64_t(newHandle(c))
	return C.int(statusOK)
}

//export gc_compressor_destroy
func gc_compressor_destroy(h C.uint64_t) (st C.int) {
	defer guard("gc_compressor_destroy", &st)
	c, err := release(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, "gc_compressor_destroy", "%v", err))
	}
	if err := c.dev.close(); err != nil {
		return C.int(failErr("gc_compressor_destroy", fmt.Errorf("handle %d destroyed, but freeing its device memory failed: %w", uint64(h), err)))
	}
	return C.int(statusOK)
}

//export gc_compressor_spec
func gc_compressor_spec(h C.uint64_t, buf *C.char, capacity C.size_t, length *C.size_t) (st C.int) {
	const fn = "gc_compressor_spec"
	defer guard(fn, &st)
	if length == nil {
		return C.int(fail(errInvalid, fn, "null len"))
	}
	dst, err := cBytes(unsafe.Pointer(buf), capacity, "buf")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	return C.int(putSpec(fn, c.c.Spec().String(), dst, length))
}

//export gc_spec_canonical
func gc_spec_canonical(spec *C.char, buf *C.char, capacity C.size_t, length *C.size_t) (st C.int) {
	const fn = "gc_spec_canonical"
	defer guard(fn, &st)
	if spec == nil || length == nil {
		return C.int(fail(errInvalid, fn, "null %s", nullName(spec == nil, "spec", "len")))
	}
	dst, err := cBytes(unsafe.Pointer(buf), capacity, "buf")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	s, err := compress.ParseSpec(C.GoString(spec))
	if err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(putSpec(fn, s.String(), dst, length))
}

// putSpec copies spec and a NUL into dst and its length to *length (also
// when dst is too small: GC_ERR_SIZE), for fn.
func putSpec(fn, spec string, dst []byte, length *C.size_t) status {
	*length = C.size_t(len(spec))
	if len(dst) < len(spec)+1 {
		return fail(errSize, fn, "buf holds %d bytes; the spec %q needs %d with its NUL", len(dst), spec, len(spec)+1)
	}
	dst[copy(dst, spec)] = 0
	return statusOK
}

//export gc_max_encoded_len
func gc_max_encoded_len(h C.uint64_t, n C.size_t, out *C.size_t) (st C.int) {
	const fn = "gc_max_encoded_len"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null out"))
	}
	if uint64(n) > compress.MaxElements {
		return C.int(fail(errInvalid, fn, "n = %d elements exceeds the payload limit %d", uint64(n), uint64(compress.MaxElements)))
	}
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	*out = C.size_t(c.c.MaxEncodedLen(int(n)))
	return C.int(statusOK)
}

//export gc_compress
func gc_compress(h, bucket, step C.uint64_t, flags C.uint32_t, grad *C.float, n C.size_t,
	dst *C.uint8_t, capacity C.size_t, written *C.size_t) (st C.int) {
	const fn = "gc_compress"
	defer guard(fn, &st)
	if written == nil {
		return C.int(fail(errInvalid, fn, "null written"))
	}
	*written = 0
	g, err := cFloats(unsafe.Pointer(grad), n, "grad")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	out, err := cBytes(unsafe.Pointer(dst), capacity, "dst")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	m, err := c.compress(compress.Key{Bucket: uint64(bucket), Step: uint64(step)}, uint32(flags), g, out)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*written = C.size_t(m)
	return C.int(statusOK)
}

//export gc_settle
func gc_settle(h, bucket C.uint64_t, mode C.int) (st C.int) {
	const fn = "gc_settle"
	defer guard(fn, &st)
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	if err := c.settle(uint64(bucket), int(mode)); err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}

//export gc_payload_len
func gc_payload_len(buf *C.uint8_t, length C.size_t, out *C.size_t) (st C.int) {
	const fn = "gc_payload_len"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null out"))
	}
	b, err := cBytes(unsafe.Pointer(buf), length, "buf")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	m, err := payloadLen(b)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*out = C.size_t(m)
	return C.int(statusOK)
}

//export gc_decompress
func gc_decompress(h C.uint64_t, payload *C.uint8_t, length C.size_t, dst *C.float, n C.size_t) (st C.int) {
	defer guard("gc_decompress", &st)
	return decompressExport("gc_decompress", h, payload, length, dst, n, false)
}

//export gc_decompress_add
func gc_decompress_add(h C.uint64_t, payload *C.uint8_t, length C.size_t, dst *C.float, n C.size_t) (st C.int) {
	defer guard("gc_decompress_add", &st)
	return decompressExport("gc_decompress_add", h, payload, length, dst, n, true)
}

// decompressExport is the body of gc_decompress (add false) and
// gc_decompress_add (add true), named fn in messages.
func decompressExport(fn string, h C.uint64_t, payload *C.uint8_t, length C.size_t, dst *C.float, n C.size_t, add bool) C.int {
	p, err := cBytes(unsafe.Pointer(payload), length, "payload")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	d, err := cFloats(unsafe.Pointer(dst), n, "dst")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	if err := c.decompress(p, d, add); err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}

//export gc_state_size
func gc_state_size(h C.uint64_t, length *C.size_t) (st C.int) {
	const fn = "gc_state_size"
	defer guard(fn, &st)
	if length == nil {
		return C.int(fail(errInvalid, fn, "null len"))
	}
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	s, err := c.state()
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*length = C.size_t(len(s))
	return C.int(statusOK)
}

//export gc_state_save
func gc_state_save(h C.uint64_t, dst *C.uint8_t, capacity C.size_t, written *C.size_t) (st C.int) {
	const fn = "gc_state_save"
	defer guard(fn, &st)
	if written == nil {
		return C.int(fail(errInvalid, fn, "null written"))
	}
	*written = 0
	d, err := cBytes(unsafe.Pointer(dst), capacity, "dst")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	m, err := c.saveState(d)
	*written = C.size_t(m)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}

//export gc_state_load
func gc_state_load(h C.uint64_t, src *C.uint8_t, length C.size_t) (st C.int) {
	const fn = "gc_state_load"
	defer guard(fn, &st)
	s, err := cBytes(unsafe.Pointer(src), length, "src")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	if err := c.loadState(s); err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}

//export gc_decide
func gc_decide(h C.uint64_t, strategy *C.char, n C.size_t, world C.int, bandwidth, latency C.double,
	compressOut *C.int, denseSeconds, compressedSeconds *C.double) (st C.int) {
	const fn = "gc_decide"
	defer guard(fn, &st)
	if strategy == nil || compressOut == nil {
		return C.int(fail(errInvalid, fn, "null %s", nullName(strategy == nil, "strategy", "compress")))
	}
	c, err := lookup(uint64(h))
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	p, err := c.decide(C.GoString(strategy), uint64(n), int(world), float64(bandwidth), float64(latency))
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*compressOut = 0
	if p.Compress {
		*compressOut = 1
	}
	if denseSeconds != nil {
		*denseSeconds = C.double(p.Dense.Seconds())
	}
	if compressedSeconds != nil {
		*compressedSeconds = C.double(p.Compressed.Seconds())
	}
	return C.int(statusOK)
}

//export gc_live_handles
func gc_live_handles(out *C.size_t) (st C.int) {
	defer guard("gc_live_handles", &st)
	if out == nil {
		return C.int(fail(errInvalid, "gc_live_handles", "null out"))
	}
	*out = C.size_t(liveHandles())
	return C.int(statusOK)
}

// cFloats returns the n float32s at p as a slice (no copy), named what in
// errors. p may be null only when n is 0.
func cFloats(p unsafe.Pointer, n C.size_t, what string) ([]float32, error) {
	if uint64(n) > compress.MaxElements {
		return nil, errorf(errInvalid, "%s: %d elements exceeds the payload limit %d", what, uint64(n), uint64(compress.MaxElements))
	}
	if p == nil && n > 0 {
		return nil, errorf(errInvalid, "null %s with %d elements", what, uint64(n))
	}
	return unsafe.Slice((*float32)(p), int(n)), nil
}

// maxBuffer bounds a byte count: the x86-64 user address space. A larger
// size_t is most likely a negative number cast.
const maxBuffer = 1 << 47

// cBytes returns the n bytes at p as a slice (no copy), named what in
// errors. p may be null only when n is 0.
func cBytes(p unsafe.Pointer, n C.size_t, what string) ([]byte, error) {
	if uint64(n) > maxBuffer {
		return nil, errorf(errInvalid, "%s: %d bytes is not a plausible buffer size", what, uint64(n))
	}
	if p == nil && n > 0 {
		return nil, errorf(errInvalid, "null %s with %d bytes", what, uint64(n))
	}
	return unsafe.Slice((*byte)(p), int(n)), nil
}

// nullName names the first null pointer of two.
func nullName(firstNull bool, first, second string) string {
	if firstNull {
		return first
	}
	return second
}
