package commtest

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/gradcomp/gradcomp/comm"
)

// RunSplit checks a comm.Comm that is a comm.Topologist and a
// comm.Splitter (comm/inproc's NewNodeGroup, comm/mpi). It is collective:
// call it on every rank of the group at once, with the same Options. It
// gathers every rank's Topology and checks them with comm.CheckTopologies,
// splits, and checks for the node and the cross-node comm: this rank's
// rank and the size (LocalRank of LocalSize, Node of Nodes), the members
// (the group ranks gathered over the comm, in the order the topologies
// predict), the Topology the comm reports when it is a comm.Topologist
// (the one comm.Splitter documents, checked on every rank of the comm
// with comm.CheckTopologies), and Run on it. Then it closes the node comm
// and checks that the node comm reports comm.ErrClosed while the cross
// comm and the group still work, and closes the cross comm. It returns
// the first discrepancy, naming the rank and the comm.
func RunSplit(ctx context.Context, c comm.Comm, o Options) error {
	t, ok := c.(comm.Topologist)
	sp, ok2 := c.(comm.Splitter)
	if !ok || !ok2 {
		return fmt.Errorf("commtest: RunSplit: %T is not a comm.Topologist and a comm.Splitter", c)
	}
	rank := c.Rank()
	topos, err := gatherTopologies(ctx, c, t.Topology())
	if err != nil {
		return fmt.Errorf("commtest: RunSplit on rank %d: the group: %w", rank, err)
	}
	if err := comm.CheckTopologies(topos); err != nil {
		return fmt.Errorf("commtest: RunSplit on rank %d: the group's topologies %+v: %w", rank, topos, err)
	}
	me := topos[rank]
	node, cross, err := sp.Split(ctx)
	if err != nil {
		return fmt.Errorf("commtest: RunSplit on rank %d: Split: %w", rank, err)
	}
	defer node.Close()
	defer cross.Close()
	// The members of this rank's node and cross groups, in their order.
	var nodeMembers, crossMembers []int
	for r, p := range topos {
		if p.Node == me.Node {
			nodeMembers = append(nodeMembers, r)
		}
		if p.LocalRank == me.LocalRank {
			crossMembers = append(crossMembers, r)
		}
	}
	for _, g := range []struct {
		name       string
		c          comm.Comm
		rank, size int
		members    []int
		topo       comm.Topology // what the comm reports as a comm.Topologist
	}{
		{"node", node, me.LocalRank, me.LocalSize, nodeMembers,
			comm.Topology{Node: 0, Nodes: 1, LocalRank: me.LocalRank, LocalSize: me.LocalSize}},
		{"cross-node", cross, me.Node, me.Nodes, crossMembers,
			comm.Topology{Node: me.Node, Nodes: me.Nodes, LocalRank: 0, LocalSize: 1}},
	} {
		if g.c.Rank() != g.rank || g.c.Size() != g.size {
			return fmt.Errorf("commtest: RunSplit on rank %d: its %s comm says rank %d of %d, want %d of %d", rank, g.name, g.c.Rank(), g.c.Size(), g.rank, g.size)
		}
		mine := binary.LittleEndian.AppendUint32(nil, uint32(rank))
		all := make([]byte, 4*g.size)
		if err := g.c.AllGather(ctx, all, mine); err != nil {
			return fmt.Errorf("commtest: RunSplit on rank %d: %s comm: gathering the members: %w", rank, g.name, err)
		}
		for i, r := range g.members {
			if got := int(binary.LittleEndian.Uint32(all[4*i:])); got != r {
				return fmt.Errorf("commtest: RunSplit on rank %d: its %s comm's rank %d is group rank %d, want %d (members %v)", rank, g.name, i, got, r, g.members)
			}
		}
		if gt, ok := g.c.(comm.Topologist); ok {
			if got := gt.Topology(); got != g.topo {
				return fmt.Errorf("commtest: RunSplit on rank %d: its %s comm reports Topology %+v, want %+v", rank, g.name, got, g.topo)
			}
			ts, err := gatherTopologies(ctx, g.c, gt.Topology())
			if err != nil {
				return fmt.Errorf("commtest: RunSplit on rank %d: %s comm: %w", rank, g.name, err)
			}
			if err := comm.CheckTopologies(ts); err != nil {
				return fmt.Errorf("commtest: RunSplit on rank %d: the %s comm's topologies %+v: %w", rank, g.name, ts, err)
			}
		}
		if err := Run(ctx, g.c, o); err != nil {
			return fmt.Errorf("commtest: RunSplit on rank %d: %s comm: %w", rank, g.name, err)
		}
	}
	if err := node.Close(); err != nil {
		return fmt.Errorf("commtest: RunSplit on rank %d: closing the node comm: %w", rank, err)
	}
	if err := node.Barrier(ctx); !errors.Is(err, comm.ErrClosed) {
		return fmt.Errorf("commtest: RunSplit on rank %d: Barrier on the closed node comm: got %v, want an error wrapping comm.ErrClosed", rank, err)
	}
	if err := cross.Barrier(ctx); err != nil {
		return fmt.Errorf("commtest: RunSplit on rank %d: the cross-node comm after the node comm closed: %w", rank, err)
	}
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("commtest: RunSplit on rank %d: the group after its node comm closed: %w", rank, err)
	}
	if err := cross.Close(); err != nil {
		return fmt.Errorf("commtest: RunSplit on rank %d: closing the cross-node comm: %w", rank, err)
	}
	return nil
}

// gatherTopologies all-gathers every rank's topology t over c.
func gatherTopologies(ctx context.Context, c comm.Comm, t comm.Topology) ([]comm.Topology, error) {
	var mine []byte
	for _, v := range []int{t.Node, t.Nodes, t.LocalRank, t.LocalSize} {
		mine = binary.LittleEndian.AppendUint32(mine, uint32(int32(v)))
	}
	all := make([]byte, c.Size()*len(mine))
	if err := c.AllGather(ctx, all, mine); err != nil {
		return nil, fmt.Errorf("gathering the topologies: %w", err)
	}
	out := make([]comm.Topology, c.Size())
	for r := range out {
		v := func(i int) int { return int(int32(binary.LittleEndian.Uint32(all[16*r+4*i:]))) }
		out[r] = comm.Topology{Node: v(0), Nodes: v(1), LocalRank: v(2), LocalSize: v(3)}
	}
	return out, nil
}
