// Package staged carries host-memory collectives (comm.Comm) over a
// DeviceComm: each call copies its host buffers into device buffers,
// enqueues the DeviceComm's collective on a stream of its own, waits for
// the stream through the DeviceComm's Wait (so its timeout and abort
// apply), and copies the results back. It is how an engine on a GPU
// agrees with its peers (the handshake, the cost model's probes,
// verification, reshaped loads) over its own NCCL communicator, with no
// host transport beside it: the bytes are small and the calls rare.
//
// A Comm serializes its calls (one collective at a time, in the order
// its callers make them); every rank must make them in the same order,
// as for any comm.Comm. The DeviceComm should carry nothing else at the
// same time: NCCL orders operations per communicator, so a staged Comm
// over the communicator an engine exchanges buckets on could interleave
// differently on different ranks. Give it a communicator of its own
// (for NCCL, a split of the engine's with one color).
package staged

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
)

// Memory is the device memory a Comm stages through, and whether a
// stream has finished its work. Synced never blocks.
type Memory interface {
	gpu.Memory
	// Synced reports whether s has finished everything enqueued on it.
	Synced(s gpu.Stream) (bool, error)
}

// Comm is a comm.Comm over a DeviceComm. It implements comm.Topologist
// and, where the DeviceComm splits (comm.DeviceSplitter) and a topology
// was given, comm.Splitter.
type Comm struct {
	dc   comm.DeviceComm
	mem  Memory
	s    gpu.Stream
	topo comm.Topology

	mu     sync.Mutex
	bufs   [2]buffer // grown on demand, kept until Close
	err    error     // the failure that poisoned the Comm
	closed bool
}

// buffer is a device buffer of cap bytes (0: none yet).
type buffer struct {
	p   gpu.Ptr
	cap int
}

var (
	_ comm.Comm       = (*Comm)(nil)
	_ comm.Topologist = (*Comm)(nil)
	_ comm.Splitter   = (*Comm)(nil)
)

// New returns a Comm over dc that stages through mem on stream s (which
// the Comm uses alone). topo is this rank's place among the nodes (zero:
// unknown; Split then fails). The Comm owns neither dc nor s: Close
// frees its buffers only.
func New(dc comm.DeviceComm, mem Memory, s gpu.Stream, topo comm.Topology) *Comm {
	return &Comm{dc: dc, mem: mem, s: s, topo: topo}
}

// Rank implements comm.Comm.
func (c *Comm) Rank() int { return c.dc.Rank() }

// Size implements comm.Comm.
func (c *Comm) Size() int { return c.dc.Size() }

// Topology implements comm.Topologist.
func (c *Comm) Topology() comm.Topology { return c.topo }

// grow returns buffer i with at least n bytes (at least 4).
func (c *Comm) grow(i, n int) (gpu.Ptr, error) {
	n = max(n, 4)
	b := &c.bufs[i]
	if b.cap >= n {
		return b.p, nil
	}
	if b.cap > 0 {
		if err := c.mem.Free(b.p); err != nil {
			return 0, err
		}
		*b = buffer{}
	}
	p, err := c.mem.Alloc(n)
	if err != nil {
		return 0, err
	}
	*b = buffer{p: p, cap: n}
	return p, nil
}

// io is one device buffer of a call: in is copied into it (nil: not),
// it holds at least n bytes, and it is copied back into out (nil: not).
type io struct {
	in, out []byte
	n       int
}

// run stages bufs into the Comm's device buffers, calls f with their
// addresses, waits for the stream and copies the results back. A failure
// poisons the Comm: later calls return a *comm.PoisonedError, as a failed
// collective leaves the DeviceComm in no known state.
func (c *Comm) run(ctx context.Context, op comm.Op, bufs []io, f func(p []gpu.Ptr) error) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	switch {
	case c.closed:
		return &comm.PoisonedError{Rank: c.Rank(), Op: op, Cause: &comm.ClosedError{Rank: c.Rank()}}
	case c.err != nil:
		return &comm.PoisonedError{Rank: c.Rank(), Op: op, Cause: c.err}
	}
	if err := c.stage(ctx, bufs, f); err != nil {
		c.err = fmt.Errorf("comm/staged: rank %d: %v: %w", c.Rank(), op, err)
		return c.err
	}
	return nil
}

func (c *Comm) stage(ctx context.Context, bufs []io, f func(p []gpu.Ptr) error) error {
	p := make([]gpu.Ptr, len(bufs))
	for i, b := range bufs {
		var err error
		if p[i], err = c.grow(i, b.n); err != nil {
			return fmt.Errorf("device buffer of %d bytes: %w", b.n, err)
		}
		if len(b.in) > 0 {
			if err := c.mem.CopyIn(c.s, p[i], b.in); err != nil {
				return fmt.Errorf("copy to the device: %w", err)
			}
		}
	}
	if err := f(p); err != nil {
		return err
	}
	if err := c.dc.Wait(ctx, func() (bool, error) { return c.mem.Synced(c.s) }); err != nil {
		return err
	}
	for i, b := range bufs {
		if len(b.out) > 0 {
			if err := c.mem.CopyOut(c.s, b.out, p[i]); err != nil {
				return fmt.Errorf("copy from the device: %w", err)
			}
		}
	}
	return nil
}

// inout is a buffer copied in and back.
func inout(b []byte) io { return io{in: b, out: b, n: len(b)} }

// AllReduce implements comm.Comm.
func (c *Comm) AllReduce(ctx context.Context, buf []float32) error {
	return c.run(ctx, comm.OpAllReduce, []io{inout(f32.Bytes(buf))}, func(p []gpu.Ptr) error {
		return c.dc.AllReduce(ctx, p[0], len(buf), c.s)
	})
}

// AllGather implements comm.Comm.
func (c *Comm) AllGather(ctx context.Context, dst, src []byte) error {
	if len(dst) != c.Size()*len(src) {
		return fmt.Errorf("comm/staged: rank %d: AllGather: len(dst) = %d, want Size() × len(src) = %d", c.Rank(), len(dst), c.Size()*len(src))
	}
	return c.run(ctx, comm.OpAllGather, []io{{in: src, n: len(src)}, {out: dst, n: len(dst)}}, func(p []gpu.Ptr) error {
		return c.dc.AllGather(ctx, p[1], p[0], len(src), c.s)
	})
}

// ReduceScatter implements comm.Comm.
func (c *Comm) ReduceScatter(ctx context.Context, dst, src []float32) error {
	if len(src) != c.Size()*len(dst) {
		return fmt.Errorf("comm/staged: rank %d: ReduceScatter: len(src) = %d, want Size() × len(dst) = %d", c.Rank(), len(src), c.Size()*len(dst))
	}
	d, s := f32.Bytes(dst), f32.Bytes(src)
	return c.run(ctx, comm.OpReduceScatter, []io{{in: s, n: len(s)}, {out: d, n: len(d)}}, func(p []gpu.Ptr) error {
		return c.dc.ReduceScatter(ctx, p[1], p[0], len(dst), c.s)
	})
}

// AllToAll implements comm.Comm.
func (c *Comm) AllToAll(ctx context.Context, dst, src []byte) error {
	if len(dst) != len(src) {
		return fmt.Errorf("comm/staged: rank %d: AllToAll: len(dst) = %d, len(src) = %d, want equal", c.Rank(), len(dst), len(src))
	}
	return c.run(ctx, comm.OpAllToAll, []io{{in: src, n: len(src)}, {out: dst, n: len(dst)}}, func(p []gpu.Ptr) error {
		return c.dc.AllToAll(ctx, p[1], p[0], len(src), c.s)
	})
}

// Broadcast implements comm.Comm.
func (c *Comm) Broadcast(ctx context.Context, buf []byte, root int) error {
	return c.run(ctx, comm.OpBroadcast, []io{inout(buf)}, func(p []gpu.Ptr) error {
		return c.dc.Broadcast(ctx, p[0], len(buf), root, c.s)
	})
}

// Barrier implements comm.Comm: an all-reduce of one element.
func (c *Comm) Barrier(ctx context.Context) error {
	return c.AllReduce(ctx, make([]float32, 1))
}

// Split implements comm.Splitter: two splits of the DeviceComm (the
// ranks of this node, ranked by local rank; the ranks of this local rank
// across nodes, ranked by node), each staged on this Comm's stream and
// memory. It is collective over every rank.
func (c *Comm) Split(ctx context.Context) (node, cross comm.Comm, err error) {
	ds, ok := c.dc.(comm.DeviceSplitter)
	switch {
	case !ok:
		return nil, nil, fmt.Errorf("comm/staged: rank %d: Split: %T does not split (comm.DeviceSplitter)", c.Rank(), c.dc)
	case c.topo == comm.Topology{}:
		return nil, nil, fmt.Errorf("comm/staged: rank %d: Split: this rank's place among the nodes is unknown", c.Rank())
	}
	t := c.topo
	nodeDC, err := ds.Split(ctx, t.Node, t.LocalRank)
	if err != nil {
		return nil, nil, fmt.Errorf("comm/staged: rank %d: splitting by node: %w", c.Rank(), err)
	}
	crossDC, err := ds.Split(ctx, t.LocalRank, t.Node)
	if err != nil {
		return nil, nil, errors.Join(fmt.Errorf("comm/staged: rank %d: splitting across nodes: %w", c.Rank(), err), nodeDC.Close())
	}
	nodeT := comm.Topology{Nodes: 1, LocalRank: t.LocalRank, LocalSize: t.LocalSize}
	crossT := comm.Topology{Node: t.Node, Nodes: t.Nodes, LocalSize: 1}
	return &owning{New(nodeDC, c.mem, c.s, nodeT)}, &owning{New(crossDC, c.mem, c.s, crossT)}, nil
}

// Close frees the Comm's device buffers (after the stream has passed
// them: every call waited for it). Later calls fail; closing twice
// returns nil. The DeviceComm stays open.
func (c *Comm) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for i := range c.bufs {
		if c.bufs[i].cap > 0 {
			errs = append(errs, c.mem.Free(c.bufs[i].p))
			c.bufs[i] = buffer{}
		}
	}
	return errors.Join(errs...)
}

// owning is a Comm that Split made: it owns its DeviceComm and closes it.
type owning struct{ *Comm }

// Close implements comm.Comm: the buffers, then the split DeviceComm.
func (o *owning) Close() error { return errors.Join(o.Comm.Close(), o.dc.Close()) }
