// Package ncclcomm implements comm.DeviceComm over NCCL (package
// github.com/gradcomp/gradcomp/nccl): collectives on GPU memory, enqueued
// on CUDA streams, one rank per GPU.
//
// New bootstraps the NCCL communicator over a host comm.Comm of the same
// ranks (comm/inproc, comm/mpi): rank 0 makes the ncclUniqueId and
// broadcasts it, and every rank calls ncclCommInitRank with the host
// group's rank and size.
//
// Each method maps to one NCCL call, or one group:
//
//	AllReduce      ncclAllReduce(buf, buf, n, ncclFloat32, ncclSum) (in place)
//	AllGather      ncclAllGather(src, dst, n, ncclUint8)
//	ReduceScatter  ncclReduceScatter(src, dst, n, ncclFloat32, ncclSum)
//	AllToAll       one group of ncclSend/ncclRecv of n/Size() bytes with every rank, itself included
//	Broadcast      ncclBroadcast(buf, buf, n, ncclUint8, root) (in place)
//	Split          ncclCommSplit(comm, color, key, &newcomm, NULL) (comm.DeviceSplitter; NCCL ≥ 2.18)
//
// Timeouts, aborts and errors are those of the binding (nccl.Comm): a call
// or Wait that runs past the timeout given to New (nccl.WithTimeout) or
// past its ctx aborts the communicator and returns an *nccl.AbortError;
// the Comm is unusable afterwards. Every error that matches nccl.ErrClosed
// (an abort, a destroyed communicator) matches comm.ErrClosed too, as the
// end of every comm.DeviceComm does. Invalid arguments are an
// *nccl.ArgumentError, or a *comm.ArgumentError for what only this
// package checks (AllToAll's divisibility). Split on a library older than
// NCCL 2.18 is an *nccl.UnsupportedError.
package ncclcomm

import (
	"context"
	"errors"
	"fmt"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/nccl"
)

// Comm is one rank's comm.DeviceComm over an NCCL communicator.
type Comm struct {
	c *nccl.Comm
}

var (
	_ comm.DeviceComm     = (*Comm)(nil)
	_ comm.DeviceSplitter = (*Comm)(nil)
)

// New creates this rank's NCCL communicator for the ranks of boot, which
// it uses once to broadcast the unique id from rank 0 (a collective call on
// boot: every rank calls New at about the same time). opts configure the
// communicator (nccl.WithTimeout, nccl.WithAbortGrace). The GPU is the
// calling thread's current CUDA device (see nccl.Library.InitRank).
func New(ctx context.Context, lib *nccl.Library, boot comm.Comm, opts ...nccl.Option) (*Comm, error) {
	var id nccl.UniqueID
	var idErr error
	if boot.Rank() == 0 {
		// On failure rank 0 still broadcasts (a zero id), so no rank waits
		// for an id that never comes.
		id, idErr = lib.GetUniqueID()
	}
	if err := boot.Broadcast(ctx, id[:], 0); err != nil {
		return nil, fmt.Errorf("comm/ncclcomm: rank %d: broadcasting the NCCL unique id: %w", boot.Rank(), err)
	}
	switch {
	case idErr != nil:
		return nil, fmt.Errorf("comm/ncclcomm: rank 0: %w", idErr)
	case id.IsZero():
		return nil, fmt.Errorf("comm/ncclcomm: rank %d: rank 0 could not make an NCCL unique id (see its error)", boot.Rank())
	}
	c, err := lib.InitRank(ctx, boot.Size(), id, boot.Rank(), opts...)
	if err != nil {
		return nil, ended(err)
	}
	return &Comm{c: c}, nil
}

// Wrap returns the Comm of an NCCL communicator made elsewhere (for
// example by InitRank from a unique id the host program spread). The Comm
// owns c: its Close destroys it.
func Wrap(c *nccl.Comm) *Comm { return &Comm{c: c} }

// NCCL returns the underlying communicator, for operations this package
// does not wrap (other data types and reductions, point-to-point).
func (c *Comm) NCCL() *nccl.Comm { return c.c }

// Rank implements comm.DeviceComm.
func (c *Comm) Rank() int { return c.c.Rank() }

// Size implements comm.DeviceComm.
func (c *Comm) Size() int { return c.c.Size() }

// AllReduce implements comm.DeviceComm: an in-place ncclAllReduce sum of n
// float32s.
func (c *Comm) AllReduce(ctx context.Context, buf gpu.Ptr, n int, s gpu.Stream) error {
	b := buf
	return ended(c.c.Run(ctx, nccl.AllReduce(b, b, n, nccl.Float32, nccl.Sum, s)))
}

// AllGather implements comm.DeviceComm: ncclAllGather of n bytes per rank.
func (c *Comm) AllGather(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	return ended(c.c.Run(ctx, nccl.AllGather(src, dst, n, nccl.Uint8, s)))
}

// ReduceScatter implements comm.DeviceComm: ncclReduceScatter sum, n
// float32s per rank.
func (c *Comm) ReduceScatter(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	return ended(c.c.Run(ctx, nccl.ReduceScatter(src, dst, n, nccl.Float32, nccl.Sum, s)))
}

// AllToAll implements comm.DeviceComm: one NCCL group of a send and a
// receive of n/Size() bytes with every rank.
func (c *Comm) AllToAll(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	size := c.c.Size()
	if n < 0 || n%size != 0 {
		return &comm.ArgumentError{Op: comm.OpAllToAll, Rank: c.c.Rank(),
			Reason: fmt.Sprintf("n = %d bytes, want a non-negative multiple of Size() = %d", n, size)}
	}
	m := n / size
	ops := make([]nccl.Op, 0, 2*size)
	for j := range size {
		off := gpu.Ptr(j * m)
		ops = append(ops,
			nccl.Send(src+off, m, nccl.Uint8, j, s),
			nccl.Recv(dst+off, m, nccl.Uint8, j, s))
	}
	return ended(c.c.Run(ctx, ops...))
}

// Broadcast implements comm.DeviceComm: an in-place ncclBroadcast of n
// bytes.
func (c *Comm) Broadcast(ctx context.Context, buf gpu.Ptr, n int, root int, s gpu.Stream) error {
	b := buf
	return ended(c.c.Run(ctx, nccl.Broadcast(b, b, n, nccl.Uint8, root, s)))
}

// Split implements comm.DeviceSplitter with nccl.Comm.Split
// (ncclCommSplit): the ranks that pass the same color form a new Comm,
// ranked by key, ties by their rank here. It is collective over every rank
// of c. The new Comm has c's device, timeout and abort grace; closing
// either leaves the other open. color must be ≥ 0 (every rank joins a
// group; nccl.NoColor is for NCCL() directly) and key ≥ 0: otherwise an
// *nccl.ArgumentError. A Split that does not complete within the timeout
// or ctx aborts c too (see nccl.Comm.Split).
func (c *Comm) Split(ctx context.Context, color, key int) (comm.DeviceComm, error) {
	if color < 0 {
		return nil, &nccl.ArgumentError{Func: "ncclCommSplit", Reason: fmt.Sprintf(
			"rank %d: color = %d, want ≥ 0 (comm.DeviceSplitter puts every rank in a group; use NCCL().Split with nccl.NoColor to leave one out)", c.c.Rank(), color)}
	}
	s, err := c.c.Split(ctx, color, key)
	if err != nil {
		return nil, ended(err)
	}
	return &Comm{c: s}, nil
}

// Wait implements comm.DeviceComm with nccl.Comm.Wait.
func (c *Comm) Wait(ctx context.Context, done func() (bool, error)) error {
	return ended(c.c.Wait(ctx, done))
}

// Close implements comm.DeviceComm: ncclCommDestroy, bounded by the
// communicator's timeout.
func (c *Comm) Close() error {
	return ended(c.c.Destroy(context.Background()))
}

// ended returns err, made to match comm.ErrClosed too (errors.Is) where it
// matches nccl.ErrClosed: the binding's sentinel of a communicator that
// can no longer be used, reported in comm's vocabulary. err stays in the
// chain (errors.As finds an *nccl.AbortError as before).
func ended(err error) error {
	if err == nil || !errors.Is(err, nccl.ErrClosed) {
		return err
	}
	return endedError{err}
}

// endedError is an error of the binding that ended the communicator.
type endedError struct{ error }

func (e endedError) Unwrap() error { return e.error }

// Is reports whether target is comm.ErrClosed.
func (e endedError) Is(target error) bool { return target == comm.ErrClosed }
