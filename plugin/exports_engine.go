package main

/*
#include <stddef.h>
#include <stdint.h>

// gc_call_launcher calls a gc_launch_fn (gc_hosted_set_launcher).
static inline void gc_call_launcher(uintptr_t fn, uintptr_t ctx, void *op) {
	((void (*)(void *, const void *))fn)((void *)ctx, op);
}
*/
import "C"

import (
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm/hosted"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/overlap"
)

// The engine exports of gradcomp.h (ABI 2.0 to 2.10), documented there,
// over the cores in engine.go. The structs the header declares are passed
// as pointers and read or written through Go mirrors (cOp and
// cBucketStats below, cEngineConfig in engineconfig.go, cBucketVerdict in
// exports_verdict.go), whose layouts equal the C structs' on every 64-bit
// target (checked by TestMirrorLayouts and by the C test's static
// assertions).

// cOp mirrors gc_op (72 bytes).
type cOp struct {
	ID                   uint64
	Kind, Root, Device   int32
	Group                int32 // since ABI 2.4 (reserved, 0, before)
	Count                uint64
	Send, Recv           uintptr
	SendBytes, RecvBytes uint64
	Stream               uintptr
}

// cBucketStats mirrors gc_bucket_stats (640 bytes).
type cBucketStats struct {
	Elements, BytesSent                    uint64
	Compressed, NonFinite, Trial, Switched int32
	DecidedCompressed, Guarded             int32
	Compress, Exchange, Decompress         float64
	PredictedDense, PredictedCompressed    float64
	MeasuredDense, MeasuredCompressed      float64
	Strategy                               [32]byte
	Reason                                 [512]byte
}

const (
	hostedKind = "hosted transport"
	engineKind = "engine"
)

func lookupTransport(h C.uint64_t) (*transport, error) {
	return lookupKind[*transport](uint64(h), hostedKind)
}

// withEngine runs call on the engine of handle h (withHandle).
func withEngine(fn string, h C.uint64_t, call func(e *engine) error) C.int {
	return C.int(withHandle(fn, uint64(h), engineKind, call))
}

func lookupEngine(h C.uint64_t) (*engine, error) {
	return lookupKind[*engine](uint64(h), engineKind)
}

// seconds converts a C timeout, refusing NaN, negative and absurd values.
func seconds(what string, s C.double) (time.Duration, error) {
	v := float64(s)
	if !(v >= 0 && v <= 86400*365) {
		return 0, errorf(errInvalid, "%s %v: want 0 to a year of seconds", what, v)
	}
	return time.Duration(v * float64(time.Second)), nil
}

//export gc_hosted_create
func gc_hosted_create(rank, size C.int, out *C.uint64_t) (st C.int) {
	const fn = "gc_hosted_create"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null out"))
	}
	tr, err := newTransport(int(rank), int(size))
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*out = C.uint64_t(newHandle(tr))
	return C.int(statusOK)
}

//export gc_hosted_destroy
func gc_hosted_destroy(h C.uint64_t) (st C.int) {
	const fn = "gc_hosted_destroy"
	defer guard(fn, &st)
	tr, err := releaseAs[*transport](uint64(h), hostedKind)
	if err != nil {
		return C.int(fail(errHandle, fn, "%v", err))
	}
	tr.close()
	return C.int(statusOK)
}

//export gc_hosted_take
func gc_hosted_take(h C.uint64_t, timeout C.double, out unsafe.Pointer) (st C.int) {
	const fn = "gc_hosted_take"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null op"))
	}
	d, err := seconds("timeout_seconds", timeout)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	tr, err := lookupTransport(h)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	op, err := tr.take(-1, d)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*(*cOp)(out) = toCOp(op)
	return C.int(statusOK)
}

//export gc_hosted_take_group
func gc_hosted_take_group(h C.uint64_t, group C.int, timeout C.double, out unsafe.Pointer) (st C.int) {
	const fn = "gc_hosted_take_group"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null op"))
	}
	if group < groupWorld || group > groupCross {
		return C.int(fail(errInvalid, fn, "group %d: want GC_GROUP_WORLD (0), GC_GROUP_NODE (1) or GC_GROUP_CROSS (2)", int(group)))
	}
	d, err := seconds("timeout_seconds", timeout)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	tr, err := lookupTransport(h)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	op, err := tr.take(int(group), d)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*(*cOp)(out) = toCOp(op)
	return C.int(statusOK)
}

// toCOp lays op out as gc_op: host buffers by address (pinned by take),
// device ones as they came.
func toCOp(op hosted.Op) cOp {
	c := cOp{ID: op.ID, Kind: int32(op.Kind), Root: int32(op.Root), Group: int32(op.Group), Count: uint64(op.Count),
		SendBytes: uint64(op.SendBytes), RecvBytes: uint64(op.RecvBytes)}
	if op.Device {
		c.Device, c.Send, c.Recv, c.Stream = 1, uintptr(op.SendPtr), uintptr(op.RecvPtr), uintptr(op.Stream)
		return c
	}
	if len(op.Send) > 0 {
		c.Send = uintptr(unsafe.Pointer(&op.Send[0]))
	}
	if len(op.Recv) > 0 {
		c.Recv = uintptr(unsafe.Pointer(&op.Recv[0]))
	}
	return c
}

//export gc_hosted_set_launcher
func gc_hosted_set_launcher(h C.uint64_t, group C.int, launcher, ctx C.uintptr_t) (st C.int) {
	const fn = "gc_hosted_set_launcher"
	defer guard(fn, &st)
	tr, err := lookupTransport(h)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	var launch func(hosted.Op)
	if launcher != 0 {
		launch = func(op hosted.Op) {
			c := toCOp(op)
			C.gc_call_launcher(launcher, ctx, unsafe.Pointer(&c))
		}
	}
	if err := tr.setLauncher(int(group), launch); err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}

//export gc_hosted_complete
func gc_hosted_complete(h C.uint64_t, id C.uint64_t, status C.int, message *C.char, recvBytes C.uint64_t) (st C.int) {
	const fn = "gc_hosted_complete"
	defer guard(fn, &st)
	tr, err := lookupTransport(h)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	var hostErr error
	if status != C.int(statusOK) {
		msg := "(no message)"
		if message != nil {
			msg = C.GoString(message)
		}
		hostErr = errorf(errComm, "status %d: %s", int(status), msg)
	}
	if recvBytes > maxBuffer {
		// A wrong length like any other: the op fails at once, with
		// this message unless the host reported a failure of its own.
		bad := fmt.Sprintf("recv_bytes %d is not a plausible length", uint64(recvBytes))
		if hostErr == nil {
			hostErr = errorf(errComm, "%s", bad)
		}
		if err := tr.complete(uint64(id), 0, hostErr); err != nil {
			return C.int(failErr(fn, err))
		}
		return C.int(fail(errInvalid, fn, "op %d: %s: the op failed", uint64(id), bad))
	}
	if err := tr.complete(uint64(id), int(recvBytes), hostErr); err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}

//export gc_engine_create
func gc_engine_create(t C.uint64_t, cfg unsafe.Pointer, sizes *C.uint64_t, nbuckets C.size_t, out *C.uint64_t) (st C.int) {
	const fn = "gc_engine_create"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null out"))
	}
	tr, err := lookupTransport(t)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	conf, sz, invalid := readEngineConfig(cfg, sizes, nbuckets)
	e, err := newEngine(tr, conf, sz, invalid)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*out = C.uint64_t(newHandle(e))
	return C.int(statusOK)
}

//export gc_engine_destroy
func gc_engine_destroy(h C.uint64_t) (st C.int) {
	const fn = "gc_engine_destroy"
	defer guard(fn, &st)
	return destroyHandle[*engine](fn, h, engineKind)
}

//export gc_engine_step
func gc_engine_step(h C.uint64_t) (st C.int) {
	const fn = "gc_engine_step"
	defer guard(fn, &st)
	return withEngine(fn, h, func(e *engine) error { return e.stepper().Step() })
}

//export gc_engine_ready
func gc_engine_ready(h C.uint64_t, bucket C.size_t, grad *C.float, n C.size_t) (st C.int) {
	const fn = "gc_engine_ready"
	defer guard(fn, &st)
	g, err := cFloats(unsafe.Pointer(grad), n, "grad")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	return withEngine(fn, h, func(e *engine) error { return e.ready(int(min(uint64(bucket), math.MaxInt32)), g) })
}

//export gc_engine_delegable
func gc_engine_delegable(h C.uint64_t, bucket C.size_t, out *C.int) (st C.int) {
	const fn = "gc_engine_delegable"
	defer guard(fn, &st)
	if out == nil {
		return C.int(failErr(fn, errorf(errInvalid, "delegable is NULL")))
	}
	e, err := lookupEngine(h)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*out = 0
	if e.delegation().Delegable(int(min(uint64(bucket), math.MaxInt32))) {
		*out = 1
	}
	return C.int(statusOK)
}

//export gc_engine_delegate
func gc_engine_delegate(h C.uint64_t, bucket C.size_t) (st C.int) {
	const fn = "gc_engine_delegate"
	defer guard(fn, &st)
	return withEngine(fn, h, func(e *engine) error { return e.delegation().Delegate(int(min(uint64(bucket), math.MaxInt32))) })
}

//export gc_engine_delegate_done
func gc_engine_delegate_done(h C.uint64_t, bucket C.size_t) (st C.int) {
	const fn = "gc_engine_delegate_done"
	defer guard(fn, &st)
	return withEngine(fn, h, func(e *engine) error { return e.delegation().DelegateDone(int(min(uint64(bucket), math.MaxInt32))) })
}

//export gc_engine_ready_device
func gc_engine_ready_device(h C.uint64_t, bucket C.size_t, grad C.uintptr_t, n C.size_t, stream C.uintptr_t) (st C.int) {
	const fn = "gc_engine_ready_device"
	defer guard(fn, &st)
	return withEngine(fn, h, func(e *engine) error {
		return e.readyDevice(int(min(uint64(bucket), math.MaxInt32)), gpu.Ptr(grad), int(min(uint64(n), math.MaxInt32)), gpu.Stream(stream))
	})
}

//export gc_engine_done
func gc_engine_done(h C.uint64_t, stream C.uintptr_t) (st C.int) {
	const fn = "gc_engine_done"
	defer guard(fn, &st)
	return withEngine(fn, h, func(e *engine) error { return e.done(gpu.Stream(stream)) })
}

//export gc_engine_wait
func gc_engine_wait(h C.uint64_t, timeout C.double) (st C.int) {
	const fn = "gc_engine_wait"
	defer guard(fn, &st)
	d, err := seconds("timeout_seconds", timeout)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	return withEngine(fn, h, func(e *engine) error { return e.wait(d) })
}

//export gc_engine_held_back
func gc_engine_held_back(h C.uint64_t, bucket C.size_t, out *C.double) (st C.int) {
	const fn = "gc_engine_held_back"
	defer guard(fn, &st)
	if out == nil {
		return C.int(fail(errInvalid, fn, "null out"))
	}
	e, err := lookupEngine(h)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	b, _, err := e.bucketStats(uint64(bucket))
	if err != nil {
		return C.int(failErr(fn, err))
	}
	*out = C.double(b.HeldBack)
	return C.int(statusOK)
}

//export gc_engine_stats
func gc_engine_stats(h C.uint64_t, bucket C.size_t, out unsafe.Pointer, step, bytesSent *C.uint64_t, total, exposed *C.double) (st C.int) {
	const fn = "gc_engine_stats"
	defer guard(fn, &st)
	e, err := lookupEngine(h)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	s, _, err := e.stats()
	if err != nil {
		return C.int(failErr(fn, err))
	}
	if out != nil {
		b, decided, err := e.bucketStats(uint64(bucket))
		if err != nil {
			return C.int(failErr(fn, err))
		}
		*(*cBucketStats)(out) = toCBucketStats(b, decided)
	}
	if step != nil {
		*step = C.uint64_t(s.Step)
	}
	if bytesSent != nil {
		*bytesSent = C.uint64_t(s.BytesSent)
	}
	if total != nil {
		*total = C.double(s.Total.Seconds())
	}
	if exposed != nil {
		*exposed = C.double(s.Exposed.Seconds())
	}
	return C.int(statusOK)
}

// toCBucketStats lays b out as gc_bucket_stats.
func toCBucketStats(b overlap.BucketStats, decided bool) cBucketStats {
	flag := func(v bool) int32 {
		if v {
			return 1
		}
		return 0
	}
	c := cBucketStats{Elements: uint64(b.Elements), BytesSent: uint64(max(b.BytesSent, 0)),
		Compressed: flag(b.Compressed), NonFinite: flag(b.NonFinite), Trial: flag(b.Trial), Switched: flag(b.Switched),
		DecidedCompressed: flag(decided), Guarded: flag(b.Guarded),
		Compress: b.Compress.Seconds(), Exchange: b.Exchange.Seconds(), Decompress: b.Decompress.Seconds(),
		PredictedDense: b.PredictedDense.Seconds(), PredictedCompressed: b.PredictedCompressed.Seconds(),
		MeasuredDense: b.MeasuredDense.Seconds(), MeasuredCompressed: b.MeasuredCompressed.Seconds()}
	putCString(c.Strategy[:], b.Strategy.String())
	putCString(c.Reason[:], b.Reason)
	return c
}

// putCString copies s into dst NUL-terminated, cut at a UTF-8 boundary to
// fit.
func putCString(dst []byte, s string) {
	if len(s) >= len(dst) {
		s = cutUTF8(s, len(dst)-1)
	}
	dst[copy(dst, s)] = 0
}

//export gc_engine_state_size
func gc_engine_state_size(h C.uint64_t, length *C.size_t) (st C.int) {
	const fn = "gc_engine_state_size"
	defer guard(fn, &st)
	return stateSize(fn, h, engineKind, (*engine).saveState, length)
}

//export gc_engine_state_save
func gc_engine_state_save(h C.uint64_t, dst unsafe.Pointer, capacity C.size_t, written *C.size_t) (st C.int) {
	const fn = "gc_engine_state_save"
	defer guard(fn, &st)
	return stateSave(fn, h, engineKind, (*engine).saveState, dst, capacity, written)
}

//export gc_engine_state_load
func gc_engine_state_load(h C.uint64_t, src unsafe.Pointer, length C.size_t) (st C.int) {
	const fn = "gc_engine_state_load"
	defer guard(fn, &st)
	in, err := cBytes(src, length, "src")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	return withEngine(fn, h, func(e *engine) error { return e.loadState(in) })
}

//export gc_engine_state_load_reshaped
func gc_engine_state_load_reshaped(h C.uint64_t, src unsafe.Pointer, length C.size_t) (st C.int) {
	const fn = "gc_engine_state_load_reshaped"
	defer guard(fn, &st)
	in, err := cBytes(src, length, "src")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	if src == nil {
		in = nil // this rank has no state
	}
	return withEngine(fn, h, func(e *engine) error { return e.loadReshaped(in) })
}

//export gc_engine_state_check
func gc_engine_state_check(src unsafe.Pointer, length C.size_t, cfg unsafe.Pointer, sizes *C.uint64_t, nbuckets C.size_t, world C.int) (st C.int) {
	const fn = "gc_engine_state_check"
	defer guard(fn, &st)
	in, err := cBytes(src, length, "src")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	if world < 1 || world > math.MaxUint16 {
		return C.int(fail(errInvalid, fn, "world_size %d: want 1 to %d", int(world), math.MaxUint16))
	}
	conf, sz, err := readEngineConfig(cfg, sizes, nbuckets)
	if err != nil {
		return C.int(failErr(fn, &overlap.ConfigError{Rank: -1, Reason: err.Error(), Err: err}))
	}
	if err := overlap.CheckState(in, conf.Config, sz, int(world), conf.topo); err != nil {
		return C.int(failErr(fn, err))
	}
	return C.int(statusOK)
}

//export gc_engine_state_layout
func gc_engine_state_layout(src unsafe.Pointer, length C.size_t, node, nodes, localRank, localSize *C.int) (st C.int) {
	const fn = "gc_engine_state_layout"
	defer guard(fn, &st)
	in, err := cBytes(src, length, "src")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	if node == nil || nodes == nil || localRank == nil || localSize == nil {
		return C.int(fail(errInvalid, fn, "null output pointer"))
	}
	info, err := overlap.InspectState(in)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	l := info.Layout
	*node, *nodes, *localRank, *localSize = C.int(l.Node), C.int(l.Nodes), C.int(l.LocalRank), C.int(l.LocalSize)
	return C.int(statusOK)
}

//export gc_engine_state_info
func gc_engine_state_info(src unsafe.Pointer, length C.size_t, spec *C.char, specCap C.size_t, strategy *C.char, strategyCap C.size_t,
	world, rank *C.int, nextStep *C.uint64_t, nbuckets *C.size_t, sizes *C.uint64_t, sizesCap C.size_t) (st C.int) {
	const fn = "gc_engine_state_info"
	defer guard(fn, &st)
	in, err := cBytes(src, length, "src")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	specBuf, err := cBytes(unsafe.Pointer(spec), specCap, "spec")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	strategyBuf, err := cBytes(unsafe.Pointer(strategy), strategyCap, "strategy")
	if err != nil {
		return C.int(failErr(fn, err))
	}
	if sizes == nil && sizesCap > 0 {
		return C.int(fail(errInvalid, fn, "null sizes with sizes_cap %d", uint64(sizesCap)))
	}
	info, err := overlap.InspectState(in)
	if err != nil {
		return C.int(failErr(fn, err))
	}
	if len(specBuf) > 0 {
		putCString(specBuf, info.Spec)
	}
	if len(strategyBuf) > 0 {
		putCString(strategyBuf, info.Strategy.String())
	}
	if world != nil {
		*world = C.int(info.WorldSize)
	}
	if rank != nil {
		*rank = C.int(info.Rank)
	}
	if nextStep != nil {
		*nextStep = C.uint64_t(info.NextStep)
	}
	if nbuckets != nil {
		*nbuckets = C.size_t(len(info.Buckets))
	}
	if sizes != nil {
		dst := unsafe.Slice((*uint64)(unsafe.Pointer(sizes)), int(min(uint64(sizesCap), uint64(len(info.Buckets)))))
		for i := range dst {
			dst[i] = uint64(info.Buckets[i])
		}
	}
	return C.int(statusOK)
}
