package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/gradcomp/gradcomp/nccl"
)

// The exports of the engine on the library's own NCCL communicator
// (gradcomp.h, ABI 2.9), over the cores in nccl.go.

//export gc_nccl_unique_id
func gc_nccl_unique_id(id *C.uint8_t) (st C.int) {
	const fn = "gc_nccl_unique_id"
	defer guard(fn, &st)
	if id == nil {
		return C.int(fail(errInvalid, fn, "null id"))
	}
	u, err := ncclUniqueID()
	if err != nil {
		return C.int(failErr(fn, err))
	}
	copy(unsafe.Slice((*byte)(unsafe.Pointer(id)), nccl.UniqueIDBytes), u[:])
	return C.int(statusOK)
}

//export gc_engine_create_nccl
func gc_engine_create_nccl(id *C.uint8_t, rank, size C.int, cfg unsafe.Pointer, sizes *C.uint64_t, nbuckets C.size_t, out *C.uint64_t) (st C.int) {
	const fn = "gc_engine_create_nccl"
	defer guard(fn, &st)
	switch {
	case out == nil:
		return C.int(fail(errInvalid, fn, "null out"))
	case id == nil:
		return C.int(fail(errInvalid, fn, "null id"))
	}
	var u nccl.UniqueID
	copy(u[:], unsafe.Slice((*byte)(unsafe.Pointer(id)), nccl.UniqueIDBytes))
	conf, sz, invalid := readEngineConfig(cfg, sizes, nbuckets)
	e, err := newNCCLEngine(u, int(rank), int(size), conf, sz, invalid)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*out = C.uint64_t(newHandle(e))
	return C.int(statusOK)
}
