package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/gradcomp/gradcomp/overlap"
)

// cBucketVerdict mirrors gc_bucket_verdict (verdictSize210 bytes).
type cBucketVerdict struct {
	Size                     uint32
	Origin, Caution, Guard   int32
	HeldBack, GuardThreshold float64
}

// verdictSize210 is sizeof(gc_bucket_verdict) in ABI 2.10, which added
// it: the least a caller's struct holds.
const verdictSize210 = 32

//export gc_engine_verdict
func gc_engine_verdict(h C.uint64_t, bucket C.size_t, out unsafe.Pointer) (st C.int) {
	const fn = "gc_engine_verdict"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null out"))
	}
	size := *(*uint32)(out)
	if size < verdictSize210 {
		return C.int(fail(errInvalid, fn, "out->size %d: want sizeof(gc_bucket_verdict), %d in ABI 2.10 (set size from the header)", size, verdictSize210))
	}
	e, err := lookupEngine(h)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	b, _, err := e.bucketStats(uint64(bucket))
	if err != nil {
		return C.int(failErr(fn, err))
	}
	v := toCBucketVerdict(b, min(size, uint32(unsafe.Sizeof(cBucketVerdict{}))))
	copy(unsafe.Slice((*byte)(out), v.Size), unsafe.Slice((*byte)(unsafe.Pointer(&v)), v.Size))
	return C.int(statusOK)
}

// toCBucketVerdict lays b's verdicts out as gc_bucket_verdict, size
// bytes of it: this library's, or fewer where the caller's header is
// older (once a later ABI appends to the struct).
func toCBucketVerdict(b overlap.BucketStats, size uint32) cBucketVerdict {
	return cBucketVerdict{Size: size, Origin: int32(b.Origin), Caution: int32(b.Caution), Guard: int32(b.Guard),
		HeldBack: b.HeldBack, GuardThreshold: b.GuardThreshold}
}
