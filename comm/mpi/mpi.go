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
// Comm is closed; the poll spins briefly (64 tests with runtime.Gosched
// between them), then sleeps between tests, from 10 µs doubling up to 1 ms.
// The Go buffers are pinned (runtime.Pinner) while MPI may touch them.
// Communicators use MPI_ERRORS_RETURN: an MPI error comes back as an *Error
// instead of aborting the job.
//
// With argument checks on (the default; see WithArgCheck), every collective
// first exchanges a 128-byte header (operation, length, root, validity, and
// the reason when invalid) with MPI_Iallgather, so a rank with invalid
// arguments or a disagreement between ranks gives every rank the same
// *comm.ArgumentError or *comm.MismatchError, as in comm/inproc, and no data
// moves. That costs one small all-gather per call: with 4 ranks on a 2-core
// machine, a 4-byte AllReduce took about 110 µs with the check and 70 µs
// without (BenchmarkAllReduce says how to measure). Without the check, such
// a call is MPI's undefined behaviour (a hang until the deadline, a
// truncation error, or wrong data).
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
// MPI cannot cancel a collective. When ctx ends first, the call returns a
// *comm.IncompleteError (the ranks that did not arrive are unknown to MPI)
// and leaves the request outstanding, its buffers pinned and possibly still
// written by MPI: do not reuse them. The Comm is then poisoned on this rank:
// later calls return a *comm.PoisonedError at once. Other ranks are not told;
// they time out in turn, or complete the collective if the missing ranks
// make the matching calls later. The communicator cannot be trusted again:
// end the job with Abort. Only when the missing ranks are known to make the
// matching calls after all can the job end cleanly: Close then completes the
// abandoned requests (waiting up to the drain timeout) before freeing.
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

// WithDrainTimeout sets how long Close waits for collectives abandoned after
// a deadline to complete (default 2s). It must not be negative.
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
// comm.Comm. Make one with Init and more with Dup.
type Comm struct {
	rank, size int
	topo       comm.Topology
	cfg        config
	h          *handle // the MPI communicator and its state, shared with Unchecked's view; build-specific
}

var (
	_ comm.Comm       = (*Comm)(nil)
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
// argument check (WithArgCheck(false)), sharing c's state — one collective
// at a time across both, one failure, and Close of either closes both.
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
// *comm.PoisonedError wrapping a *comm.ClosedError. Close is collective: call it on every rank once its last collective has
// returned. A call in flight on another goroutine is abandoned and returns a
// *comm.PoisonedError wrapping a *comm.ClosedError. Collectives abandoned
// after a deadline get up to the drain timeout to complete; if some do not,
// Close leaves the communicator (and MPI) as they are and returns an error
// saying so — end the job with Abort then. Later calls return a
// *comm.PoisonedError. Closing a closed Comm returns nil.
func (c *Comm) Close() error { return c.close() }

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
