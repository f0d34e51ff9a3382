// Package comm defines gradcomp's transport: the collectives the exchange
// strategies are built from (all-reduce, all-gather, reduce-scatter,
// all-to-all, broadcast, barrier) over a fixed group of ranks.
//
// Implementations:
//
//	comm/inproc   N ranks in one process (tests, single machine)
//	comm/mpi      one rank per process over Open MPI (build with -tags mpi)
//	comm/hosted   collectives posted to the host program, which carries
//	              them out with its own communicator (the C ABI, PyTorch)
//
// # Collective calls
//
// Every method but Rank, Size and Close is collective: each rank of the group
// makes the same sequence of calls, and the k-th call on one rank is matched
// with the k-th call on every other rank. Matched calls must name the same
// operation with the same lengths (and the same root for Broadcast).
// Implementations check this where they can and then return a
// *MismatchError, the same one on every rank, instead of moving data.
//
// A Comm runs one blocking call at a time: a call made on a rank while
// another call is in flight on the same Comm returns a *BusyError at once
// (the order of two concurrent calls would differ between ranks).
// Goroutines that need independent streams of collectives use independent
// Comms, or one Starter (below) from one goroutine.
//
// Buffers belong to the call until it returns: the caller must not read or
// write them meanwhile. Buffers of different ranks must not overlap each
// other, and a call's dst must not overlap its src.
//
// # Several collectives in flight
//
// A Comm that is also a Starter lets one rank have up to InFlight()
// collectives started and not yet waited for. StartAllReduce and its
// siblings issue a collective and return at once with a Request; the
// collective then runs while the caller goes on, and Request.Wait ends it.
// Starts are matched across ranks by their order, exactly as calls are
// (the k-th collective a rank starts or calls meets the k-th of every other
// rank), so every rank must start them in the same order, from one
// goroutine or in an order the caller fixes; Waits may come in any order
// and from any goroutine, and collectives may complete in any order. A
// blocking call while requests are outstanding is one more collective in
// that order. A start beyond InFlight() outstanding requests, or made while
// a blocking call is in flight, returns a *BusyError and starts nothing.
//
// Buffers belong to a started collective until its Wait has returned. When
// one collective fails (an error of the transport or host, a Wait whose ctx
// ended first), the Comm is poisoned: every request not complete by then
// fails with a *PoisonedError wrapping that first failure, on this rank,
// and the other ranks learn of it as the implementation documents.
//
// # Sum order
//
// AllReduce and ReduceScatter add float32 values in rank order, left to
// right, rounding after every addition:
//
//	sum[i] = (…((x₀[i] + x₁[i]) + x₂[i]) + …) + x₍ₙ₋₁₎[i]
//
// where xᵣ is rank r's input. comm/inproc follows this order exactly, so its
// results are bit-identical across runs and equal a serial loop over ranks.
// comm/mpi uses Open MPI's reduction, whose order is fixed for a given group
// size, length and MCA configuration (bit-identical across runs) but is not
// rank order; its results can differ from inproc in the last bits, and agree
// exactly whenever every partial sum is representable (integer values below
// 2²⁴, for example). The order of an implementation is part of its doc.
//
// # Deadlines, cancellation and failure
//
// Every collective honours its context: when ctx is done before the
// collective completes, the call returns an *IncompleteError that wraps
// ctx.Err() and names, where the implementation knows them, the ranks that
// had not arrived. A collective abandoned this way leaves the group out of
// step, so the Comm becomes unusable ("poisoned"): every later call on it,
// on every rank that learns of the failure, returns a *PoisonedError
// wrapping the first failure. Implementations document how the other ranks
// learn of it and how to end the job.
package comm

import "context"

// Comm is one rank's end of a group of Size() ranks. See the package
// documentation for the rules every collective follows.
type Comm interface {
	// Rank returns this rank's index in [0, Size()). It never blocks.
	Rank() int

	// Size returns the number of ranks in the group (at least 1). It never
	// blocks.
	Size() int

	// AllReduce replaces buf, on every rank, with the element-wise float32
	// sum of every rank's buf, in the package's sum order. len(buf) must be
	// equal on every rank; it may be 0. It blocks until the sum is in buf
	// or fails; on error the contents of buf are unspecified.
	AllReduce(ctx context.Context, buf []float32) error

	// AllGather concatenates every rank's src into dst, on every rank, in
	// rank order: rank r's src lands at dst[r*len(src) : (r+1)*len(src)].
	// len(src) must be equal on every rank and len(dst) must be
	// Size()*len(src); dst must not overlap src. src is only read. It
	// blocks until dst is filled or fails; on error dst is unspecified.
	AllGather(ctx context.Context, dst, src []byte) error

	// ReduceScatter sums src over ranks, in the package's sum order, and
	// leaves chunk Rank() of the sum in dst: with m = len(dst),
	// dst[i] = Σᵣ srcᵣ[Rank()*m + i]. len(dst) must be equal on every
	// rank and len(src) must be Size()*len(dst); dst must not overlap src.
	// src is only read. It blocks until dst is filled or fails; on error
	// dst is unspecified.
	ReduceScatter(ctx context.Context, dst, src []float32) error

	// AllToAll exchanges equal chunks between every pair of ranks: with
	// m = len(src)/Size(), chunk j of src (src[j*m:(j+1)*m]) goes to rank j,
	// and chunk i of dst comes from rank i. len(src) == len(dst) must be a
	// multiple of Size() and equal on every rank; dst must not overlap src.
	// src is only read. It blocks until dst is filled or fails; on error
	// dst is unspecified.
	AllToAll(ctx context.Context, dst, src []byte) error

	// Broadcast copies root's buf into buf on every other rank. len(buf)
	// and root must be equal on every rank, with 0 <= root < Size(). The
	// root's buf is only read. It blocks until this rank's part is done or
	// fails; on error a non-root buf is unspecified.
	Broadcast(ctx context.Context, buf []byte, root int) error

	// Barrier returns once every rank has called it (or fails).
	Barrier(ctx context.Context) error

	// Close releases this rank's end of the group; later calls on this
	// Comm return a *PoisonedError wrapping a *ClosedError (errors.Is
	// ErrClosed). Whether Close interrupts a call in flight, what it does
	// to the other ranks and whether it waits for them is documented by
	// each implementation. Closing a closed Comm returns nil.
	Close() error
}

// Unchecker is implemented by a Comm whose collectives first check their
// arguments across ranks (comm/mpi with its argument check on, the
// default). Unchecked returns a Comm over the same ranks, transport and
// state that skips that check: a call whose arguments differ between
// ranks is then the transport's undefined behaviour (with comm/mpi: a hang
// until the deadline, a truncation error or wrong data). It is for a
// caller that has established the agreement another way, as the overlap
// engine has for its bucket collectives, whose lengths follow from the
// configuration its handshake compared. The two Comms share everything
// else: one order of collectives and one bound on those in flight across
// both, one failure, one Close.
type Unchecker interface {
	Unchecked() Comm
}

// Request is a collective a Starter started.
type Request interface {
	// Wait blocks until the collective completes (nil), fails, or ctx
	// ends. A Wait whose ctx ends first abandons the collective: it
	// returns an *IncompleteError and poisons the Comm. The first Wait
	// releases the request's slot of Starter.InFlight; later Waits
	// return the same result at once.
	Wait(ctx context.Context) error
}

// Starter is implemented by a Comm that can have several collectives in
// flight (see "Several collectives in flight" in the package doc). Each
// Start method takes the arguments of the Comm method of the same name,
// checks them as that method does (an invalid call returns its error and
// starts nothing), issues the collective and returns without waiting for
// the other ranks. ctx bounds the start itself; the Request's Wait takes
// its own.
type Starter interface {
	Comm
	// InFlight returns how many started collectives this rank may have
	// outstanding (started, not yet waited for) at once; at least 2. It
	// never blocks.
	InFlight() int
	StartAllReduce(ctx context.Context, buf []float32) (Request, error)
	StartAllGather(ctx context.Context, dst, src []byte) (Request, error)
	StartReduceScatter(ctx context.Context, dst, src []float32) (Request, error)
	StartAllToAll(ctx context.Context, dst, src []byte) (Request, error)
}
