package commtest

import (
	"context"
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/gradcomp/gradcomp/comm"
)

// RunSplit checks a comm.Comm that is a comm.Topologist and a
// comm.Splitter (comm/inproc's NewNodeGroup, comm/mpi). It is collective:
// call it on every rank of the group at once. It checks that the ranks'
// topologies describe one layout (comm.NodeTopologies of the nodes they
// name), splits, checks each rank's place in its node and cross-node
// comms and their members (the group ranks gathered over each), runs Run
// on both, then closes the node comm and checks that the cross comm and
// the group still work, and closes the cross comm. It returns the first
// discrepancy.
func RunSplit(ctx context.Context, c comm.Comm, o Options) error {
	t, ok := c.(comm.Topologist)
	sp, ok2 := c.(comm.Splitter)
	if !ok || !ok2 {
		return fmt.Errorf("commtest: RunSplit: %T is not a comm.Topologist and a comm.Splitter", c)
	}
	rank, size := c.Rank(), c.Size()
	topos, err := gatherTopologies(ctx, c, t.Topology())
	if err != nil {
		return err
	}
	nodeOf := make([]int, size)
	for r, p := range topos {
		nodeOf[r] = p.Node
	}
	want, err := comm.NodeTopologies(nodeOf)
	if err != nil {
		return fmt.Errorf("commtest: RunSplit on rank %d: the ranks' nodes %v: %w", rank, nodeOf, err)
	}
	if !slices.Equal(topos, want) {
		return fmt.Errorf("commtest: RunSplit on rank %d: the ranks' topologies %+v, their nodes make %+v", rank, topos, want)
	}
	me := want[rank]
	node, cross, err := sp.Split(ctx)
	if err != nil {
		return fmt.Errorf("commtest: Split on rank %d: %w", rank, err)
	}
	defer cross.Close()
	// The members of this rank's node and cross groups, in their order.
	var nodeMembers, crossMembers []int
	for r, p := range want {
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
	}{
		{"node", node, me.LocalRank, me.LocalSize, nodeMembers},
		{"cross-node", cross, me.Node, me.Nodes, crossMembers},
	} {
		if g.c.Rank() != g.rank || g.c.Size() != g.size {
			return fmt.Errorf("commtest: rank %d: its %s comm says rank %d of %d, want %d of %d", rank, g.name, g.c.Rank(), g.c.Size(), g.rank, g.size)
		}
		mine := binary.LittleEndian.AppendUint32(nil, uint32(rank))
		all := make([]byte, 4*g.size)
		if err := g.c.AllGather(ctx, all, mine); err != nil {
			return fmt.Errorf("commtest: rank %d: %s AllGather: %w", rank, g.name, err)
		}
		for i, r := range g.members {
			if got := int(binary.LittleEndian.Uint32(all[4*i:])); got != r {
				return fmt.Errorf("commtest: rank %d: its %s comm's rank %d is group rank %d, want %d (members %v)", rank, g.name, i, got, r, g.members)
			}
		}
		if err := Run(ctx, g.c, o); err != nil {
			return fmt.Errorf("commtest: rank %d's %s comm: %w", rank, g.name, err)
		}
	}
	if err := node.Close(); err != nil {
		return fmt.Errorf("commtest: rank %d: closing the node comm: %w", rank, err)
	}
	if err := cross.Barrier(ctx); err != nil {
		return fmt.Errorf("commtest: rank %d: the cross-node comm after the node comm closed: %w", rank, err)
	}
	if err := c.Barrier(ctx); err != nil {
		return fmt.Errorf("commtest: rank %d: the group after its node comm closed: %w", rank, err)
	}
	return nil
}

// gatherTopologies all-gathers every rank's topology.
func gatherTopologies(ctx context.Context, c comm.Comm, t comm.Topology) ([]comm.Topology, error) {
	var mine []byte
	for _, v := range []int{t.Node, t.Nodes, t.LocalRank, t.LocalSize} {
		mine = binary.LittleEndian.AppendUint32(mine, uint32(v))
	}
	all := make([]byte, c.Size()*len(mine))
	if err := c.AllGather(ctx, all, mine); err != nil {
		return nil, fmt.Errorf("commtest: rank %d: gathering the topologies: %w", c.Rank(), err)
	}
	out := make([]comm.Topology, c.Size())
	for r := range out {
		v := func(i int) int { return int(binary.LittleEndian.Uint32(all[16*r+4*i:])) }
		out[r] = comm.Topology{Node: v(0), Nodes: v(1), LocalRank: v(2), LocalSize: v(3)}
	}
	return out, nil
}
