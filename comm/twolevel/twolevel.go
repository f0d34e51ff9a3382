// Package twolevel makes one comm.Comm of a group's node and cross-node
// comms (comm.Splitter): the collectives that gain from it run in two
// levels, so that what crosses between nodes is what one rank per node
// sends for its node, and the rest runs on the group itself.
//
//	AllGather      an all-gather across nodes (each rank's src to the
//	               ranks of its local rank), then one in the node of the
//	               K blocks each rank got: every byte of src crosses
//	               between nodes K−1 times (not N−L)
//	AllReduce      a reduce-scatter in the node, an all-reduce across
//	               nodes of each rank's chunk, an all-gather in the node
//	ReduceScatter, AllToAll, Broadcast, Barrier
//	               the group's own
//
// Sum order: AllReduce adds within each node in rank order, then the node
// sums in the cross-node comm's order; the result can differ from the
// group's own all-reduce in the last bits (comm's package doc).
//
// A Comm runs one collective at a time (it is not a comm.Starter); a failure of
// the node or cross comm poisons that comm, and the Comm's later calls
// that use it fail with its error.
package twolevel

import (
	"context"
	"fmt"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/internal/check"
	"github.com/gradcomp/gradcomp/internal/f32"
)

// Comm is a group's comm.Comm with two-level AllGather and AllReduce.
type Comm struct {
	group, node, cross comm.Comm
	nodes, local       int
	// order[k*local+l] is the group rank of local rank l of node k.
	order []int
	guard check.Guard

	// Scratch, grown as calls need it.
	gathered, nodeGathered []byte
	padded, chunk          []float32
}

var _ comm.Comm = (*Comm)(nil)

// New returns the two-level Comm of group, whose Split gave node and
// cross, and whose ranks are placed as topo says (topo[r] is group rank
// r's, as comm.NodeTopologies gives them; every rank passes the same).
// The Comm owns node and cross (Close closes them), not group.
func New(group, node, cross comm.Comm, topo []comm.Topology) (*Comm, error) {
	if len(topo) != group.Size() {
		return nil, fmt.Errorf("twolevel: %d topologies for a group of %d ranks", len(topo), group.Size())
	}
	t := topo[group.Rank()]
	if node.Size() != t.LocalSize || cross.Size() != t.Nodes || node.Rank() != t.LocalRank || cross.Rank() != t.Node {
		return nil, fmt.Errorf("twolevel: rank %d is local rank %d of %d on node %d of %d, but its node comm is rank %d of %d and its cross comm rank %d of %d",
			group.Rank(), t.LocalRank, t.LocalSize, t.Node, t.Nodes, node.Rank(), node.Size(), cross.Rank(), cross.Size())
	}
	c := &Comm{group: group, node: node, cross: cross, nodes: t.Nodes, local: t.LocalSize, order: make([]int, len(topo))}
	for r, p := range topo {
		c.order[p.Node*c.local+p.LocalRank] = r
	}
	return c, nil
}

// Rank returns the rank in the group.
func (c *Comm) Rank() int { return c.group.Rank() }

// Size returns the group's size.
func (c *Comm) Size() int { return c.group.Size() }

// Topology implements comm.Topologist: the group's layout.
func (c *Comm) Topology() comm.Topology {
	return comm.Topology{Node: c.cross.Rank(), Nodes: c.nodes, LocalRank: c.node.Rank(), LocalSize: c.local}
}

// AllGather implements comm.Comm.AllGather in two levels: across nodes,
// then in the node.
func (c *Comm) AllGather(ctx context.Context, dst, src []byte) error {
	call := check.AllGather(c.Rank(), c.Size(), dst, src)
	if err := c.enter(call); err != nil {
		return err
	}
	defer c.guard.Exit()
	s := len(src)
	c.gathered = grow(c.gathered, c.nodes*s)
	if err := c.cross.AllGather(ctx, c.gathered, src); err != nil {
		return fmt.Errorf("twolevel: AllGather across nodes: %w", err)
	}
	c.nodeGathered = grow(c.nodeGathered, c.local*c.nodes*s)
	if err := c.node.AllGather(ctx, c.nodeGathered, c.gathered); err != nil {
		return fmt.Errorf("twolevel: AllGather in the node: %w", err)
	}
	// nodeGathered holds, per local rank l, the blocks of nodes 0..K−1.
	for l := range c.local {
		for k := range c.nodes {
			r := c.order[k*c.local+l]
			copy(dst[r*s:(r+1)*s], c.nodeGathered[(l*c.nodes+k)*s:])
		}
	}
	return nil
}

// AllReduce implements comm.Comm.AllReduce in three steps: a
// reduce-scatter in the node (buf padded with zeros to a multiple of the
// node's size), an all-reduce of this rank's chunk across nodes, an
// all-gather in the node.
func (c *Comm) AllReduce(ctx context.Context, buf []float32) error {
	if err := c.enter(check.AllReduce(buf)); err != nil {
		return err
	}
	defer c.guard.Exit()
	if c.local == 1 {
		return wrap("AllReduce across nodes", c.cross.AllReduce(ctx, buf))
	}
	m := (len(buf) + c.local - 1) / c.local
	src := buf
	if len(buf) != m*c.local {
		c.padded = growFloats(c.padded, m*c.local)
		copy(c.padded, buf)
		clear(c.padded[len(buf):])
		src = c.padded
	}
	c.chunk = growFloats(c.chunk, m)
	if err := c.node.ReduceScatter(ctx, c.chunk, src); err != nil {
		return wrap("AllReduce: ReduceScatter in the node", err)
	}
	if err := c.cross.AllReduce(ctx, c.chunk); err != nil {
		return wrap("AllReduce across nodes", err)
	}
	if err := c.node.AllGather(ctx, f32.Bytes(src), f32.Bytes(c.chunk)); err != nil {
		return wrap("AllReduce: AllGather in the node", err)
	}
	if len(src) != len(buf) {
		copy(buf, src)
	}
	return nil
}

// ReduceScatter implements comm.Comm.ReduceScatter with the group's.
func (c *Comm) ReduceScatter(ctx context.Context, dst, src []float32) error {
	return c.group.ReduceScatter(ctx, dst, src)
}

// AllToAll implements comm.Comm.AllToAll with the group's.
func (c *Comm) AllToAll(ctx context.Context, dst, src []byte) error {
	return c.group.AllToAll(ctx, dst, src)
}

// Broadcast implements comm.Comm.Broadcast with the group's.
func (c *Comm) Broadcast(ctx context.Context, buf []byte, root int) error {
	return c.group.Broadcast(ctx, buf, root)
}

// Barrier implements comm.Comm.Barrier with the group's.
func (c *Comm) Barrier(ctx context.Context) error { return c.group.Barrier(ctx) }

// Close closes the node and cross comms; the group stays open.
func (c *Comm) Close() error {
	errNode, errCross := c.node.Close(), c.cross.Close()
	if errNode != nil {
		return errNode
	}
	return errCross
}

// enter refuses a second call in flight and an invalid one.
func (c *Comm) enter(call check.Call) error {
	if err := c.guard.Enter(call.Op, c.Rank()); err != nil {
		return err
	}
	if call.Err != nil {
		c.guard.Exit()
		return call.Err
	}
	return nil
}

func wrap(stage string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("twolevel: %s: %w", stage, err)
}

func grow(b []byte, n int) []byte {
	if cap(b) < n {
		return make([]byte, n)
	}
	return b[:n]
}

func growFloats(b []float32, n int) []float32 {
	if cap(b) < n {
		return make([]float32, n)
	}
	return b[:n]
}
