package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"unsafe"

	"github.com/gradcomp/gradcomp/outer"
)

// The outer-loop exports of gradcomp.h (ABI 2.11), documented there, over
// the cores in outer.go. gc_outer_config is read through cOuterConfig
// (outerconfig.go), gc_outer_report written through cOuterReport.

const outerKind = "outer loop"

// cOuterReport mirrors gc_outer_report (outerReportSize211 bytes): the
// caller's inputs (Size, Capacity and the arrays), then what the library
// writes.
type cOuterReport struct {
	Size, Capacity                uint32
	Started, Finished, Skipped    *int32
	Step, BytesSent               uint64
	NStarted, NFinished, NSkipped uint32
	FirstSkipped                  int32
}

// outerReportSize211 is sizeof(gc_outer_report) in ABI 2.11, which added
// it: the least a caller's struct holds.
const outerReportSize211 = 64

// withOuter runs call on the outer loop of handle h (withHandle).
func withOuter(fn string, h C.uint64_t, call func(o *outerLoop) error) C.int {
	return C.int(withHandle(fn, uint64(h), outerKind, call))
}

//export gc_outer_create
func gc_outer_create(t C.uint64_t, ocfg, ecfg unsafe.Pointer, params unsafe.Pointer, sizes *C.uint64_t, ntensors C.size_t, out *C.uint64_t) (st C.int) {
	const fn = "gc_outer_create"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null out"))
	}
	tr, err := lookupTransport(t)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	ps, invalid := readOuterParams(params, sizes, ntensors)
	var cfg outer.Config
	if invalid == nil {
		cfg, invalid = readOuterConfig(ocfg, len(ps))
	}
	ec, _, err := readEngineConfig(ecfg, nil, 0) // read whatever else fails: its timeout bounds the refusal
	switch {
	case invalid != nil:
	case err != nil:
		invalid = invalidf("ecfg", "%v", err)
	default:
		invalid = outerEngineConfig(ec)
	}
	o, err := newOuter(tr, cfg, ec, ps, invalid)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*out = C.uint64_t(newHandle(o))
	return C.int(statusOK)
}

//export gc_outer_destroy
func gc_outer_destroy(h C.uint64_t) (st C.int) {
	const fn = "gc_outer_destroy"
	defer guard(fn, &st)
	return destroyHandle[*outerLoop](fn, h, outerKind)
}

//export gc_outer_step
func gc_outer_step(h C.uint64_t, rep unsafe.Pointer) (st C.int) {
	const fn = "gc_outer_step"
	defer guard(fn, &st)
	if rep == nil {
		return C.int(fail(errInvalid, fn, "null rep"))
	}
	r := (*cOuterReport)(rep)
	if r.Size < outerReportSize211 {
		return C.int(fail(errInvalid, fn, "rep->size %d: want sizeof(gc_outer_report), %d in ABI 2.11 (set size from the header)", r.Size, outerReportSize211))
	}
	return withOuter(fn, h, func(o *outerLoop) error {
		report, err := o.step()
		putOuterReport(r, report)
		return err
	})
}

// putOuterReport writes rep into r: the counts, and as many fragment
// indices as r.Capacity holds into each of r's arrays that is not NULL.
func putOuterReport(r *cOuterReport, rep outer.Report) {
	var finished, skipped []int
	for _, s := range rep.Finished {
		finished = append(finished, s.Fragment)
		if s.Skipped != nil {
			skipped = append(skipped, s.Fragment)
		}
	}
	r.Step, r.BytesSent = rep.Step, uint64(max(rep.BytesSent, 0))
	r.NStarted, r.NFinished, r.NSkipped = uint32(len(rep.Started)), uint32(len(finished)), uint32(len(skipped))
	r.FirstSkipped = -1
	if len(skipped) > 0 {
		r.FirstSkipped = int32(skipped[0])
	}
	putIndices(r.Started, int(r.Capacity), rep.Started)
	putIndices(r.Finished, int(r.Capacity), finished)
	putIndices(r.Skipped, int(r.Capacity), skipped)
}

// putIndices writes the first capacity of xs into dst (nothing when dst
// is NULL).
func putIndices(dst *int32, capacity int, xs []int) {
	if dst == nil {
		return
	}
	out := unsafe.Slice(dst, capacity)
	for i := range min(capacity, len(xs)) {
		out[i] = int32(xs[i])
	}
}

//export gc_outer_due
func gc_outer_due(h C.uint64_t, starts, finishes *C.int32_t, capacity C.size_t, nstarts, nfinishes *C.size_t) (st C.int) {
	const fn = "gc_outer_due"
	defer guard(fn, &st)
	switch {
	case nstarts == nil || nfinishes == nil:
		return C.int(fail(errInvalid, fn, "null nstarts or nfinishes"))
	case capacity > 0 && (starts == nil || finishes == nil):
		return C.int(fail(errInvalid, fn, "null starts or finishes with capacity %d", uint64(capacity)))
	}
	return withOuter(fn, h, func(o *outerLoop) error {
		s, f := o.due()
		*nstarts, *nfinishes = C.size_t(len(s)), C.size_t(len(f))
		putIndices((*int32)(unsafe.Pointer(starts)), int(capacity), s)
		putIndices((*int32)(unsafe.Pointer(finishes)), int(capacity), f)
		return nil
	})
}

//export gc_outer_layout
func gc_outer_layout(h C.uint64_t, fragmentOf *C.int32_t, ntensors C.size_t, nfragments *C.size_t) (st C.int) {
	const fn = "gc_outer_layout"
	defer guard(fn, &st)
	switch {
	case nfragments == nil:
		return C.int(fail(errInvalid, fn, "null nfragments"))
	case ntensors > 0 && fragmentOf == nil:
		return C.int(fail(errInvalid, fn, "null fragment_of with ntensors %d", uint64(ntensors)))
	}
	return withOuter(fn, h, func(o *outerLoop) error {
		of, n := o.layout()
		if ntensors > 0 && uint64(ntensors) != uint64(len(of)) {
			return errorf(errSize, "ntensors %d: the loop has %d tensors", uint64(ntensors), len(of))
		}
		*nfragments = C.size_t(n)
		putIndices((*int32)(unsafe.Pointer(fragmentOf)), int(ntensors), of)
		return nil
	})
}

//export gc_outer_global
func gc_outer_global(h C.uint64_t, tensor C.size_t, dst *C.float, n C.size_t) (st C.int) {
	const fn = "gc_outer_global"
	defer guard(fn, &st)
	out, err := cFloats(unsafe.Pointer(dst), n, "dst")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	return withOuter(fn, h, func(o *outerLoop) error { return o.global(uint64(tensor), out) })
}

//export gc_outer_state_size
func gc_outer_state_size(h C.uint64_t, length *C.size_t) (st C.int) {
	const fn = "gc_outer_state_size"
	defer guard(fn, &st)
	return stateSize(fn, h, outerKind, (*outerLoop).save, length)
}

//export gc_outer_state_save
func gc_outer_state_save(h C.uint64_t, dst unsafe.Pointer, capacity C.size_t, written *C.size_t) (st C.int) {
	const fn = "gc_outer_state_save"
	defer guard(fn, &st)
	return stateSave(fn, h, outerKind, (*outerLoop).save, dst, capacity, written)
}

//export gc_outer_state_load
func gc_outer_state_load(h C.uint64_t, src unsafe.Pointer, length C.size_t) (st C.int) {
	const fn = "gc_outer_state_load"
	defer guard(fn, &st)
	in, err := cBytes(src, length, "src")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	if src == nil {
		in = nil // this rank has no state
	}
	return withOuter(fn, h, func(o *outerLoop) error { return o.load(in) })
}
