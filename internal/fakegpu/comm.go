package fakegpu

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/gpu"
)

// Comm is a comm.DeviceComm over a host comm.Comm on a fake device's
// memory, for tests in one process: each collective is host work on the
// given stream (LaunchHostFunc's), run when the stream reaches it as
// NCCL's kernels are, and its failure is reported asynchronously through
// Wait, as ncclCommGetAsyncError's. Broadcast is not implemented.
type Comm struct {
	c       comm.Comm
	dev     *Device
	timeout time.Duration
	base    context.Context // cancelled by an abort: collectives in flight end
	cancel  context.CancelFunc

	mu       sync.Mutex
	asyncErr error
	aborted  bool
	split    []comm.Comm // Split: the cross comm its first call made, until the second takes it
}

var (
	_ comm.DeviceComm     = (*Comm)(nil)
	_ comm.DeviceSplitter = (*Comm)(nil)
)

// NewComm returns c's DeviceComm on dev; each collective, and Wait, is
// bounded by timeout.
func NewComm(c comm.Comm, dev *Device, timeout time.Duration) *Comm {
	base, cancel := context.WithCancel(context.Background())
	return &Comm{c: c, dev: dev, timeout: timeout, base: base, cancel: cancel}
}

// Rank is the host comm's.
func (f *Comm) Rank() int { return f.c.Rank() }

// Size is the host comm's.
func (f *Comm) Size() int { return f.c.Size() }

// run enqueues collective op on stream s, bounded by the timeout.
func (f *Comm) run(op string, s gpu.Stream, fn func(ctx context.Context) error) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.aborted {
		return fmt.Errorf("fakegpu: Comm.%s on %s: aborted", op, f.dev)
	}
	return f.dev.launch("Comm."+op, s, func() {
		ctx, cancel := context.WithTimeout(f.base, f.timeout)
		defer cancel()
		if err := fn(ctx); err != nil {
			f.mu.Lock()
			if f.asyncErr == nil {
				f.asyncErr = fmt.Errorf("%s: %w", op, err)
			}
			f.mu.Unlock()
		}
	})
}

// AllReduce is comm.DeviceComm's.
func (f *Comm) AllReduce(_ context.Context, buf gpu.Ptr, n int, s gpu.Stream) error {
	return f.run("AllReduce", s, func(ctx context.Context) error {
		return f.c.AllReduce(ctx, f.dev.floats(buf, n))
	})
}

// AllGather is comm.DeviceComm's.
func (f *Comm) AllGather(_ context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	return f.run("AllGather", s, func(ctx context.Context) error {
		return f.c.AllGather(ctx, f.dev.bytes(dst, n*f.c.Size()), f.dev.bytes(src, n))
	})
}

// ReduceScatter is comm.DeviceComm's.
func (f *Comm) ReduceScatter(_ context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	return f.run("ReduceScatter", s, func(ctx context.Context) error {
		return f.c.ReduceScatter(ctx, f.dev.floats(dst, n), f.dev.floats(src, n*f.c.Size()))
	})
}

// AllToAll is comm.DeviceComm's.
func (f *Comm) AllToAll(_ context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	if n%f.c.Size() != 0 {
		return fmt.Errorf("fakegpu: Comm.AllToAll on %s: %d bytes for %d ranks", f.dev, n, f.c.Size())
	}
	return f.run("AllToAll", s, func(ctx context.Context) error {
		return f.c.AllToAll(ctx, f.dev.bytes(dst, n), f.dev.bytes(src, n))
	})
}

// Broadcast is not implemented: the engine does not use it.
func (f *Comm) Broadcast(context.Context, gpu.Ptr, int, int, gpu.Stream) error {
	return errors.New("fakegpu: Comm.Broadcast is not implemented (the engine does not use it)")
}

// Split is comm.DeviceSplitter's, for the hierarchical exchange only: the
// host comm (a comm.Splitter and comm.Topologist) is split by node at the
// first call, which returns the node's Comm (color the node, key the local
// rank); the second returns the cross-node one (color the local rank, key
// the node).
func (f *Comm) Split(ctx context.Context, color, key int) (comm.DeviceComm, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	topo := f.c.(comm.Topologist).Topology()
	if f.split == nil {
		node, cross, err := f.c.(comm.Splitter).Split(ctx)
		if err != nil {
			return nil, err
		}
		if color != topo.Node || key != topo.LocalRank {
			return nil, fmt.Errorf("fakegpu: Comm.Split: first call (%d, %d), want the node's (%d, %d)", color, key, topo.Node, topo.LocalRank)
		}
		f.split = []comm.Comm{cross}
		return NewComm(node, f.dev, f.timeout), nil
	}
	if len(f.split) != 1 || color != topo.LocalRank || key != topo.Node {
		return nil, fmt.Errorf("fakegpu: Comm.Split: call (%d, %d), want the cross-node one (%d, %d) once", color, key, topo.LocalRank, topo.Node)
	}
	cross := f.split[0]
	f.split = f.split[:0:0]
	return NewComm(cross, f.dev, f.timeout), nil
}

// Wait polls done and the asynchronous error until the timeout or ctx,
// then aborts (later calls fail), as nccl.Comm.Wait.
func (f *Comm) Wait(ctx context.Context, done func() (bool, error)) error {
	deadline := time.NewTimer(f.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(100 * time.Microsecond)
	defer tick.Stop()
	for {
		f.mu.Lock()
		err := f.asyncErr
		f.mu.Unlock()
		if err != nil {
			f.abort()
			return fmt.Errorf("fakegpu: Comm on %s: asynchronous error: %w", f.dev, err)
		}
		ok, err := done()
		switch {
		case err != nil:
			return err
		case ok:
			return nil
		}
		select {
		case <-ctx.Done():
			f.abort()
			return fmt.Errorf("fakegpu: Comm on %s: aborted: %w", f.dev, ctx.Err())
		case <-deadline.C:
			f.abort()
			return fmt.Errorf("fakegpu: Comm on %s: aborted after the %v timeout", f.dev, f.timeout)
		case <-tick.C:
		}
	}
}

func (f *Comm) abort() {
	f.mu.Lock()
	f.aborted = true
	f.mu.Unlock()
	f.cancel()
}

// Close does nothing: the host comm is the caller's.
func (f *Comm) Close() error { return nil }
