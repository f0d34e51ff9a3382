package ncclmock_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// childTimeout bounds every call of a scenario that should succeed; the
// scenarios that end in an abort use shortTimeout, and abortGrace is how
// long an aborted call may take to return (the mock wakes it at once).
const (
	childTimeout = 60 * time.Second
	shortTimeout = 500 * time.Millisecond
	abortGrace   = time.Second
)

// rank is one child process's view of its world.
type rank struct {
	lib        *nccl.Library
	id         nccl.UniqueID
	rank, size int
	ctx        context.Context
	report     func(format string, args ...any) // records a failed check
}

// child runs the scenario role as one rank and returns the exit status: 0
// when every check passed; what failed is on stderr.
func child(role string) int {
	failed := false
	r := rank{ctx: context.Background()}
	r.report = func(format string, args ...any) {
		fmt.Fprintf(os.Stderr, "rank %d (%s): %s\n", r.rank, role, fmt.Sprintf(format, args...))
		failed = true
	}
	var err error
	if r.lib, err = nccl.Open(nccl.WithPath(os.Getenv(pathEnv))); err != nil {
		r.report("%v", err)
		return 1
	}
	if r.id, err = nccl.ParseUniqueID(os.Getenv(idEnv)); err != nil {
		r.report("%s: %v", idEnv, err)
		return 1
	}
	r.rank, _ = strconv.Atoi(os.Getenv(rankEnv))
	r.size, _ = strconv.Atoi(os.Getenv(sizeEnv))
	scenarios := map[string]func(rank){
		"collectives": collectives, "hang": hang, "async": async, "fail": fail, "failinit": failInit, "exit": exitMidway,
	}
	f, ok := scenarios[role]
	if !ok {
		r.report("no scenario %q", role)
		return 2
	}
	f(r)
	if failed {
		return 1
	}
	return 0
}

// init makes this rank's communicator, nil (reported) on failure.
func (r rank) init(opts ...nccl.Option) *nccl.Comm {
	c, err := r.lib.InitRank(r.ctx, r.size, r.id, r.rank, opts...)
	if err != nil {
		r.report("InitRank: %v", err)
	}
	return c
}

// buffer returns a mock device buffer of n float32s, filled by f.
func (r rank) buffer(n int, f func(i int) float32) *ncclmock.Buffer {
	b, err := ncclmock.Alloc(4 * n)
	if err != nil {
		panic(err)
	}
	for i := range b.Float32s() {
		b.Float32s()[i] = f(i)
	}
	return b
}

// val is rank q's input element i: small integers, so every sum is exact.
func val(q, i int) float32 { return float32((q+1)*1000 + i%997) }

// expect reports the first element of got that differs from want(i).
func (r rank) expect(what string, got []float32, want func(i int) float32) {
	for i, g := range got {
		if w := want(i); g != w {
			r.report("%s: element %d = %v, want %v", what, i, g, w)
			return
		}
	}
}

// run runs ops on c, reporting a failure.
func (r rank) run(c *nccl.Comm, what string, ops ...nccl.Op) bool {
	if err := c.Run(r.ctx, ops...); err != nil {
		r.report("%s: %v", what, err)
		return false
	}
	return true
}

// collectives runs every operation, on buffers many staging areas long,
// and checks each result exactly.
func collectives(r rank) {
	c := r.init(nccl.WithTimeout(childTimeout))
	if c == nil {
		return
	}
	defer c.Destroy(r.ctx)
	const n = 5003 // about 5 staging areas of float32s; not a multiple of anything
	n64 := r.size * n
	sumOf := func(i int) float32 {
		var s float32
		for q := range r.size {
			s += val(q, i)
		}
		return s
	}
	send := r.buffer(n64, func(i int) float32 { return val(r.rank, i) })
	recv := r.buffer(n64, func(int) float32 { return -1 })
	if r.run(c, "AllReduce", nccl.AllReduce(send.Ptr(), recv.Ptr(), n, nccl.Float32, nccl.Sum, 0)) {
		r.expect("AllReduce", recv.Float32s()[:n], sumOf)
	}
	if r.run(c, "AllGather", nccl.AllGather(send.Ptr(), recv.Ptr(), n, nccl.Float32, 0)) {
		r.expect("AllGather", recv.Float32s(), func(i int) float32 { return val(i/n, i%n) })
	}
	if r.run(c, "ReduceScatter", nccl.ReduceScatter(send.Ptr(), recv.Ptr(), n, nccl.Float32, nccl.Sum, 0)) {
		r.expect("ReduceScatter", recv.Float32s()[:n], func(i int) float32 { return sumOf(r.rank*n + i) })
	}
	const root = 1
	if r.run(c, "Broadcast", nccl.Broadcast(send.Ptr(), recv.Ptr(), n, nccl.Float32, root, 0)) {
		r.expect("Broadcast", recv.Float32s()[:n], func(i int) float32 { return val(root, i) })
	}
	// A ring, both ways at once: each rank sends to both neighbours and
	// receives from both, in one group.
	next, prev := (r.rank+1)%r.size, (r.rank+r.size-1)%r.size
	fromPrev := r.buffer(n, func(int) float32 { return -1 })
	if r.run(c, "Send/Recv", nccl.Send(send.Ptr(), n, nccl.Float32, next, 0), nccl.Send(send.Ptr(), n, nccl.Float32, prev, 0),
		nccl.Recv(fromPrev.Ptr(), n, nccl.Float32, prev, 0), nccl.Recv(recv.Ptr(), n, nccl.Float32, next, 0)) {
		r.expect("Recv from the previous rank", fromPrev.Float32s(), func(i int) float32 { return val(prev, i) })
		r.expect("Recv from the next rank", recv.Float32s()[:n], func(i int) float32 { return val(next, i) })
	}
	// Split by parity, ordered backwards: the child's ranks are the
	// parent's of one parity, highest first.
	sub, err := c.Split(r.ctx, r.rank%2, r.size-r.rank)
	if err != nil {
		r.report("Split: %v", err)
		return
	}
	defer sub.Destroy(r.ctx)
	var members []int
	for q := r.size - 1; q >= 0; q-- {
		if q%2 == r.rank%2 {
			members = append(members, q)
		}
	}
	if sub.Size() != len(members) || members[sub.Rank()] != r.rank {
		r.report("Split: rank %d of %d, want %d of %d", sub.Rank(), sub.Size(), slices.Index(members, r.rank), len(members))
		return
	}
	if r.run(sub, "AllReduce on the split", nccl.AllReduce(send.Ptr(), recv.Ptr(), n, nccl.Float32, nccl.Sum, 0)) {
		r.expect("AllReduce on the split", recv.Float32s()[:n], func(i int) float32 {
			var s float32
			for _, q := range members {
				s += val(q, i)
			}
			return s
		})
	}
}

// abortedWithin checks that err is an *AbortError of fn whose call
// returned within the abort grace.
func (r rank) abortedWithin(err error, fn string) *nccl.AbortError {
	var ae *nccl.AbortError
	if !errors.As(err, &ae) || ae.Func != fn || !ae.Returned {
		r.report("got %v, want an *AbortError of %s whose call returned within %v of the abort", err, fn, abortGrace)
		return nil
	}
	return ae
}

// oneAllReduce runs a small in-place all-reduce on c.
func (r rank) oneAllReduce(ctx context.Context, c *nccl.Comm) error {
	b := r.buffer(4, func(i int) float32 { return val(r.rank, i) })
	return c.Run(ctx, nccl.AllReduce(b.Ptr(), b.Ptr(), 4, nccl.Float32, nccl.Sum, 0))
}

// hang: every rank's all-reduce blocks until its own timeout aborts it.
func hang(r rank) {
	if c := r.init(nccl.WithTimeout(shortTimeout), nccl.WithAbortGrace(abortGrace)); c != nil {
		if ae := r.abortedWithin(r.oneAllReduce(r.ctx, c), "ncclAllReduce"); ae != nil && !errors.Is(ae, context.DeadlineExceeded) {
			r.report("abort cause %v, want the timeout", ae.Cause)
		}
	}
}

// async: the all-reduce runs, then the asynchronous error aborts it.
func async(r rank) {
	if c := r.init(nccl.WithTimeout(childTimeout)); c != nil {
		var ne *nccl.Error
		if ae := r.abortedWithin(r.oneAllReduce(r.ctx, c), "ncclAllReduce"); ae != nil &&
			(!errors.As(ae.Cause, &ne) || ne.Result != nccl.ResultRemoteError) {
			r.report("abort cause %v, want ncclRemoteError from ncclCommGetAsyncError", ae.Cause)
		}
	}
}

// fail: the all-reduce fails at once, with the mock's last error.
func fail(r rank) {
	if c := r.init(nccl.WithTimeout(childTimeout)); c != nil {
		defer c.Destroy(r.ctx)
		var ne *nccl.Error
		if err := r.oneAllReduce(r.ctx, c); !errors.As(err, &ne) || ne.Result != nccl.ResultInvalidUsage ||
			ne.Detail != "mock: AllReduce: told to fail by the unique id" {
			r.report("got %v, want ncclInvalidUsage told by the unique id", err)
		}
	}
}

// failInit: rank 1's init fails; the others wait for it until their timeout.
func failInit(r rank) {
	_, err := r.lib.InitRank(r.ctx, r.size, r.id, r.rank, nccl.WithTimeout(shortTimeout), nccl.WithAbortGrace(abortGrace))
	if r.rank != 1 {
		r.abortedWithin(err, "ncclCommInitRank")
		return
	}
	var ne *nccl.Error
	if !errors.As(err, &ne) || ne.Result != nccl.ResultUnhandledCudaError || !strings.Contains(ne.Detail, "failinit=1") {
		r.report("got %v, want ncclUnhandledCudaError told by the unique id", err)
	}
}

// exitMidway: the last rank exits once the world is made; the others,
// in an all-reduce that waits for it, are aborted by their deadline.
func exitMidway(r rank) {
	c := r.init(nccl.WithTimeout(childTimeout), nccl.WithAbortGrace(abortGrace))
	if c == nil {
		return
	}
	if r.rank == r.size-1 {
		os.Exit(0) // no Destroy, no Abort: as a crash
	}
	ctx, cancel := context.WithTimeout(r.ctx, shortTimeout)
	defer cancel()
	if ae := r.abortedWithin(r.oneAllReduce(ctx, c), "ncclAllReduce"); ae != nil && !errors.Is(ae, context.DeadlineExceeded) {
		r.report("abort cause %v, want the deadline", ae.Cause)
	}
}
