// Package mpi implements comm.Comm over MPI (Open MPI 4.1), one rank per
// process, for CPU training and multi-process tests.
//
// # Build
//
//	tags        cgo   what you get
//	(none)      any   a stub: Init returns ErrNotBuilt
//	mpi         off   the same stub
//	mpi         on    the MPI transport; needs libopenmpi-dev and pkg-config
//	                  (package ompi-c) to build, and mpirun to run
//
// Run the program under mpirun, e.g.
//
//	mpirun -np 4 ./train
//
// # Threads
//
// Init asks for MPI_THREAD_MULTIPLE, so any goroutine may call MPI. If the
// library provides only MPI_THREAD_SERIALIZED, every MPI call of this package
// is serialized by one process-wide mutex instead, and ThreadLevel says so;
// below that Init fails. MPI_Init_thread and MPI_Finalize run on one
// dedicated OS thread (MPI's "main thread"), whichever goroutines call Init
// and Close.
//
// # How a collective runs
//
// Each collective is the matching non-blocking MPI call (MPI_Iallreduce,
// MPI_Iallgather, MPI_Ireduce_scatter_block, MPI_Ialltoall, MPI_Ibcast,
// MPI_Ibarrier), polled with MPI_Test until it completes, ctx ends or the
// Comm fails or is closed; the poll spins briefly (64 tests with
// runtime.Gosched between them), then sleeps between tests, from 10 µs
// doubling up to 1 ms. The Go buffers are pinned (runtime.Pinner) while MPI
// may touch them. Communicators use MPI_ERRORS_RETURN: an MPI error comes
// back as an *Error instead of aborting the job.
//
// A Comm is a comm.Starter with InFlight (8) collectives outstanding per
// communicator, counted across the Comm and its Unchecked view.
// StartAllReduce, StartAllGather, StartReduceScatter and StartAllToAll issue
// the non-blocking call, pinning the buffers until the request completes,
// and return; the Request's Wait polls it as above, bounded by Wait's ctx.
// The first Wait gives the request's place back, and its result is kept:
// later Waits return it at once.
// A blocking call is the same start followed by its wait, so it may run
// while started collectives are outstanding and takes its place in their
// order; a start made while a blocking call is in flight, or beyond
// InFlight outstanding requests, returns a *comm.BusyError. MPI matches the
// non-blocking collectives of a communicator in the order each rank issues
// them, which is the order of its starts and calls; Open MPI progresses all
// of them whenever any is tested, so the order of the Waits does not matter.
//
// With argument checks on (the default; see WithArgCheck), every collective
// first exchanges a 128-byte header (operation, length, root, validity, and
// the reason when invalid) with MPI_Iallgather, so a rank with invalid
// arguments or a disagreement between ranks gives every rank the same
// *comm.ArgumentError or *comm.MismatchError, as in comm/inproc, and no data
// moves. That costs one small all-gather per call: with 4 ranks on a 2-core
// machine, a 4-byte AllReduce took about 110 µs with the check and 70 µs
// without (BenchmarkAllReduce says how to measure). A start runs that
// exchange before it returns, bounded by the start's ctx, so it waits until
// every rank has made the matching start or call (the error of the check
// comes back from the start, which then starts nothing); without the check
// a start does not block and does not look at its ctx. Without the check, a
// call or start whose arguments differ between ranks is MPI's undefined
// behaviour (a hang until the deadline, a truncation error, or wrong data).
//
// # Sum order
//
// AllReduce and ReduceScatter use MPI_SUM on MPI_FLOAT. Open MPI's order of
// additions depends on its algorithm choice (group size, length, MCA
// parameters): it is the same from run to run, but it is not rank order, so
// the last bits can differ from comm/inproc (see package comm).
//
// # Deadlines and failure
//
// MPI cannot cancel a collective. When ctx ends first — a blocking call's, a
// Wait's, or a checked start's during the header exchange — the call
// returns a *comm.IncompleteError (the ranks that did not arrive are unknown
// to MPI) and leaves the MPI request outstanding, its buffers pinned and
// possibly still written by MPI: do not reuse them. The Comm is then
// poisoned on this rank: later calls and starts return a *comm.PoisonedError
// at once, and so does every request this rank had not yet seen complete
// (started requests whose Wait had not returned nil, and a call in flight on
// another goroutine): their Waits fail at once with a *comm.PoisonedError
// wrapping the first failure, whether or not MPI has completed them
// meanwhile, and their requests are abandoned the same way, buffers
// included. An MPI error of MPI_Test or of an MPI_I* call poisons the Comm
// likewise. Other ranks are not told; they time out in turn, or complete the
// collectives if the missing ranks make the matching calls later. The
// communicator cannot be trusted again: end the job with Abort. Only when
// the missing ranks are known to make the matching calls after all can the
// job end cleanly: Close then completes the abandoned requests (waiting up
// to the drain timeout) before freeing.
//
// A process that dies ends the job: mpirun kills the other ranks and names
// the rank that failed.
package mpi

import (
	"context"
	"errors"
	"fmt"
	"math"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/internal/check"
)

// ErrNotBuilt is returned by Init in a binary built without MPI support.
var ErrNotBuilt = errors.New("comm/mpi: built without MPI support: rebuild with -tags mpi and CGO_ENABLED=1 (needs libopenmpi-dev and pkg-config)")

// Error reports an MPI function that returned an error code.
type Error struct {
	Op   string // what this package was doing: a collective's name, "Init", "Dup", "Split", "Close"
	Func string // the MPI function, e.g. "MPI_Iallreduce"
	Rank int    // this process's rank in the communicator the call was made on (the parent for Dup and Split), -1 before Init knows it
	Code int    // the MPI error code
	Msg  string // MPI_Error_string of Code
}

func (e *Error) Error() string {
	return fmt.Sprintf("comm/mpi: %s on rank %d: %s failed: %s (error code %d)", e.Op, e.Rank, e.Func, e.Msg, e.Code)
}

// Option configures a Comm made by Init or Dup.
type Option func(*config) error

type config struct {
	argCheck bool
	drain    time.Duration
}

func defaults() config { return config{argCheck: true, drain: 2 * time.Second} }

func (cfg *config) apply(opts []Option) error {
	for _, o := range opts {
		if err := o(cfg); err != nil {
			return err
		}
	}
	return nil
}

// WithArgCheck turns the cross-rank argument check on or off (default on;
// see the package doc). Every rank must make the same choice: the check
// is itself a collective.
func WithArgCheck(on bool) Option {
	return func(c *config) error { c.argCheck = on; return nil }
}

// WithDrainTimeout sets how long Close waits for abandoned collectives to
// complete: those given up on after a deadline, failed by another's
// failure, or failed by Close itself (default 2s). It must not be
// negative.
func WithDrainTimeout(d time.Duration) Option {
	return func(c *config) error {
		if d < 0 {
			return fmt.Errorf("comm/mpi: drain timeout %v, want >= 0", d)
		}
		c.drain = d
		return nil
	}
}

// Init initializes MPI (MPI_Init_thread, unless the process already did) and
// returns this process's rank of a duplicate of MPI_COMM_WORLD. Call it
// once per process; more communicators come from Dup and Split. In a binary
// built without MPI support it returns ErrNotBuilt. When Init fails after
// making the duplicate (reading its rank and size, or finding the
// topology: see RanksPerNodeEnv), it frees the duplicate and returns the
// error; MPI stays initialized and Init cannot be called again in the
// process, which should exit.
func Init(opts ...Option) (*Comm, error) {
	cfg := defaults()
	if err := cfg.apply(opts); err != nil {
		return nil, err
	}
	return initWorld(cfg)
}

// Comm is one process's rank of an MPI communicator; it implements
// comm.Comm and comm.Starter. Make one with Init and more with Dup.
type Comm struct {
	rank, size int
	topo       comm.Topology
	cfg        config
	h          *handle // the MPI communicator and its state, shared with Unchecked's view; build-specific
}

var (
	_ comm.Comm       = (*Comm)(nil)
	_ comm.Starter    = (*Comm)(nil)
	_ comm.Unchecker  = (*Comm)(nil)
	_ comm.Topologist = (*Comm)(nil)
	_ comm.Splitter   = (*Comm)(nil)
)

// RanksPerNodeEnv names the environment variable that, set to a positive
// integer k dividing the world size, makes Init place world rank r on node
// r/k instead of asking MPI which ranks share a node
// (MPI_Comm_split_type with MPI_COMM_TYPE_SHARED). Tests on one machine use
// it to pretend there are several nodes.
const RanksPerNodeEnv = "GRADCOMP_MPI_RANKS_PER_NODE"

// Topology implements comm.Topologist: the node of this rank, as Init
// found it (see RanksPerNodeEnv); a Dup or Unchecked view keeps it.
func (c *Comm) Topology() comm.Topology { return c.topo }

// Rank returns this process's rank in the communicator.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks in the communicator.
func (c *Comm) Size() int { return c.size }

// ThreadLevel describes the thread support MPI provided: "MPI_THREAD_MULTIPLE",
// or "MPI_THREAD_SERIALIZED (calls serialized by a process-wide mutex)".
func (c *Comm) ThreadLevel() string { return threadLevel() }

// Dup returns a new communicator over the same ranks (MPI_Comm_idup), with
// the options of c changed by opts. It is collective on c: call it on every
// rank in the same position of the sequence of calls, with the same options.
// Collectives on different Comms may run concurrently.
func (c *Comm) Dup(ctx context.Context, opts ...Option) (*Comm, error) {
	cfg := c.cfg
	if err := cfg.apply(opts); err != nil {
		return nil, err
	}
	return c.dup(ctx, cfg)
}

// Split implements comm.Splitter with MPI_Comm_split: node holds the ranks
// of this rank's node (colour Node, key rank) and reports the Topology
// {Node: 0, Nodes: 1, LocalRank, LocalSize} of c's, one node holding all
// its ranks; cross holds the ranks of this rank's local rank (colour
// LocalRank, key Node) and reports {Node, Nodes, LocalRank: 0,
// LocalSize: 1}, every rank on a node of its own. Both are full Comms
// with c's options (a Split of an Unchecked view is unchecked too),
// independent of c and of each other: their own failures, their own
// Close (which does not finalize MPI).
//
// Split is collective on c and counts as one call on it: a call made on c
// meanwhile returns a *comm.BusyError naming Dup, the operation Split is
// reported as. MPI_Comm_split blocks until every rank has called it and
// cannot honour ctx, so Split first makes a Barrier on c (MPI_Ibarrier,
// after the argument check when it is on), polled like every collective:
// when ctx ends first, Split returns the Barrier's *comm.IncompleteError
// and c is poisoned, as after any collective. The argument check sees a
// Barrier: a rank that calls Barrier while the others call Split passes
// it, and the others then block in MPI_Comm_split. Once every rank has
// passed the Barrier the splits follow at once; a rank that dies or
// stalls between the two leaves the others blocked in MPI_Comm_split (end
// the job with Abort). Errors name Split and this rank; a failure of
// MPI_Comm_split poisons c.
func (c *Comm) Split(ctx context.Context) (node, cross comm.Comm, err error) {
	n, x, err := c.split(ctx)
	if err != nil {
		return nil, nil, err // not n, x: typed nil pointers would be non-nil Comms
	}
	return n, x, nil
}

// Unchecked implements comm.Unchecker: c's communicator without the
// argument check (WithArgCheck(false)), sharing c's state — one blocking
// call at a time and InFlight started collectives across both, one
// failure, and Close of either closes both. It is a comm.Starter too.
func (c *Comm) Unchecked() comm.Comm {
	u := *c
	u.cfg.argCheck = false
	return &u
}

// AllReduce implements comm.Comm.AllReduce with MPI_Iallreduce (in place,
// MPI_FLOAT, MPI_SUM).
func (c *Comm) AllReduce(ctx context.Context, buf []float32) error {
	call := check.AllReduce(buf)
	return c.run(ctx, c.limit(call, len(buf)), args{f32: buf})
}

// AllGather implements comm.Comm.AllGather with MPI_Iallgather (MPI_BYTE).
func (c *Comm) AllGather(ctx context.Context, dst, src []byte) error {
	call := check.AllGather(c.rank, c.size, dst, src)
	return c.run(ctx, c.limit(call, len(src)), args{b: dst, bsrc: src})
}

// ReduceScatter implements comm.Comm.ReduceScatter with
// MPI_Ireduce_scatter_block (MPI_FLOAT, MPI_SUM).
func (c *Comm) ReduceScatter(ctx context.Context, dst, src []float32) error {
	call := check.ReduceScatter(c.rank, c.size, dst, src)
	return c.run(ctx, c.limit(call, len(dst)), args{f32: dst, f32src: src})
}

// AllToAll implements comm.Comm.AllToAll with MPI_Ialltoall (MPI_BYTE).
func (c *Comm) AllToAll(ctx context.Context, dst, src []byte) error {
	call := check.AllToAll(c.rank, c.size, dst, src)
	return c.run(ctx, c.limit(call, len(src)/c.size), args{b: dst, bsrc: src})
}

// Broadcast implements comm.Comm.Broadcast with MPI_Ibcast (MPI_BYTE).
func (c *Comm) Broadcast(ctx context.Context, buf []byte, root int) error {
	call := check.Broadcast(c.rank, c.size, buf, root)
	return c.run(ctx, c.limit(call, len(buf)), args{b: buf, root: root})
}

// Barrier implements comm.Comm.Barrier with MPI_Ibarrier.
func (c *Comm) Barrier(ctx context.Context) error {
	return c.run(ctx, check.Barrier(), args{})
}

// Close releases the communicator (MPI_Comm_free); on the Comm returned by
// Init it also finalizes MPI (MPI_Finalize, which in Open MPI waits for the
// other ranks to finalize too), unless MPI was initialized before Init.
// Close that Comm last: calls on any Comm after it fail with a
// *comm.PoisonedError wrapping a *comm.ClosedError. Close is collective:
// call it on every rank once its last collective has returned and its
// last started collective has been waited for. A call in flight on another
// goroutine is abandoned and returns a *comm.PoisonedError wrapping a
// *comm.ClosedError; so is every started collective not yet seen complete
// (its Wait returns that error, at once). Collectives abandoned this way or
// after a deadline get up to the drain timeout to complete; if some do
// not, Close leaves the communicator (and MPI) as they are and returns an
// error saying so — end the job with Abort then. Later calls and starts
// return a *comm.PoisonedError. Closing a closed Comm returns nil.
func (c *Comm) Close() error { return c.close() }

// InFlight is how many started collectives a Comm may have outstanding
// (started, not yet waited for) at once: comm.Starter.InFlight.
const InFlight = 8

// InFlight implements comm.Starter: it returns the package's InFlight.
func (c *Comm) InFlight() int { return InFlight }

// StartAllReduce implements comm.Starter with MPI_Iallreduce (see
// AllReduce).
func (c *Comm) StartAllReduce(ctx context.Context, buf []float32) (comm.Request, error) {
	call := check.AllReduce(buf)
	return c.start(ctx, c.limit(call, len(buf)), args{f32: buf})
}

// StartAllGather implements comm.Starter with MPI_Iallgather (see
// AllGather).
func (c *Comm) StartAllGather(ctx context.Context, dst, src []byte) (comm.Request, error) {
	call := check.AllGather(c.rank, c.size, dst, src)
	return c.start(ctx, c.limit(call, len(src)), args{b: dst, bsrc: src})
}

// StartReduceScatter implements comm.Starter with
// MPI_Ireduce_scatter_block (see ReduceScatter).
func (c *Comm) StartReduceScatter(ctx context.Context, dst, src []float32) (comm.Request, error) {
	call := check.ReduceScatter(c.rank, c.size, dst, src)
	return c.start(ctx, c.limit(call, len(dst)), args{f32: dst, f32src: src})
}

// StartAllToAll implements comm.Starter with MPI_Ialltoall (see AllToAll).
func (c *Comm) StartAllToAll(ctx context.Context, dst, src []byte) (comm.Request, error) {
	call := check.AllToAll(c.rank, c.size, dst, src)
	return c.start(ctx, c.limit(call, len(src)/c.size), args{b: dst, bsrc: src})
}

// Abort ends the whole job (MPI_Abort with code) after writing a line to
// stderr naming this rank. It does not return.
func (c *Comm) Abort(code int) { c.abort(code) }

// args holds one call's buffers.
type args struct {
	f32, f32src []float32
	b, bsrc     []byte
	root        int
}

// limit marks call invalid when count, the element count MPI receives as a
// C int, does not fit one.
func (c *Comm) limit(call check.Call, count int) check.Call {
	if call.Err == nil && count > math.MaxInt32 {
		call.Err = &comm.ArgumentError{Op: call.Op, Rank: c.rank,
			Reason: fmt.Sprintf("MPI element count %d exceeds the C int limit %d", count, math.MaxInt32)}
	}
	return call
}
