package comm

import (
	"context"
	"fmt"
)

// Topology places one rank of a Comm on the machines of the job: the rank
// runs on node Node of Nodes, where it is local rank LocalRank of the
// LocalSize ranks of that node. Nodes are numbered 0..Nodes-1 in the order
// of their lowest rank, and local ranks in rank order within the node.
type Topology struct {
	Node, Nodes          int
	LocalRank, LocalSize int
}

// Topologist is implemented by a Comm that knows which node each of its
// ranks runs on. Topology returns the calling rank's place; it is not
// collective.
type Topologist interface {
	Topology() Topology
}

// NodeTopologies returns the Topology of every rank of a group of
// len(nodeOf) ranks in which rank r runs on the node named nodeOf[r]; node
// names need not be dense or ordered. Every node must hold the same number
// of ranks, since the cross-node groups (one per local rank) would
// otherwise differ in size; a node of one rank is legal. The error names
// the first node whose size differs from node 0's.
func NodeTopologies(nodeOf []int) ([]Topology, error) {
	if len(nodeOf) == 0 {
		return nil, fmt.Errorf("comm: NodeTopologies: no ranks")
	}
	index := map[int]int{}
	var sizes []int
	local := make([]int, len(nodeOf))
	for r, id := range nodeOf {
		n, ok := index[id]
		if !ok {
			n = len(sizes)
			index[id] = n
			sizes = append(sizes, 0)
		}
		local[r] = sizes[n]
		sizes[n]++
	}
	for n, s := range sizes {
		if s != sizes[0] {
			return nil, fmt.Errorf("comm: NodeTopologies: node %d has %d ranks and node 0 has %d: every node must hold the same number of ranks", n, s, sizes[0])
		}
	}
	t := make([]Topology, len(nodeOf))
	for r, id := range nodeOf {
		t[r] = Topology{Node: index[id], Nodes: len(sizes), LocalRank: local[r], LocalSize: sizes[0]}
	}
	return t, nil
}

// Splitter is implemented by a Comm that can split itself by node. Split is
// collective on the parent: node is a new Comm over the ranks of the
// caller's node, ordered by rank (its rank is the caller's LocalRank), and
// cross is a new Comm over the ranks of every node with the caller's local
// rank, ordered by node (its rank is the caller's Node). Both are
// independent of the parent: a failure in one poisons only that Comm, and
// each is closed on its own. Where they are Topologists, node reports one
// node holding its ranks ({Node: 0, Nodes: 1, LocalRank, LocalSize} of the
// caller's place) and cross reports one rank per node ({Node, Nodes,
// LocalRank: 0, LocalSize: 1}). commtest.RunSplit checks all of this.
type Splitter interface {
	Split(ctx context.Context) (node, cross Comm, err error)
}

// CheckTopologies checks that ts, the Topology of every rank of a group in
// rank order (ts[r] is rank r's), describes one layout: every rank agrees
// on Nodes and LocalSize, Nodes × LocalSize is the group size, each rank
// has a Node in [0, Nodes) and a LocalRank in [0, LocalSize), no two ranks
// claim the same (Node, LocalRank), nodes are numbered in the order of
// their lowest rank and local ranks in rank order within a node. It
// returns nil for such a layout, else an error naming the first rank that
// breaks one of these rules, checked in that order.
func CheckTopologies(ts []Topology) error {
	if len(ts) == 0 {
		return fmt.Errorf("comm: CheckTopologies: no ranks")
	}
	t0 := ts[0]
	for r, t := range ts {
		if t.Nodes != t0.Nodes || t.LocalSize != t0.LocalSize {
			return fmt.Errorf("comm: CheckTopologies: rank %d says %d node(s) of %d rank(s), rank 0 says %d of %d", r, t.Nodes, t.LocalSize, t0.Nodes, t0.LocalSize)
		}
	}
	if t0.Nodes < 1 || t0.LocalSize < 1 || t0.Nodes*t0.LocalSize != len(ts) {
		return fmt.Errorf("comm: CheckTopologies: the ranks say %d node(s) of %d rank(s), but the group has %d rank(s)", t0.Nodes, t0.LocalSize, len(ts))
	}
	owner := map[[2]int]int{} // (Node, LocalRank) → the first rank claiming it
	for r, t := range ts {
		if t.Node < 0 || t.Node >= t.Nodes || t.LocalRank < 0 || t.LocalRank >= t.LocalSize {
			return fmt.Errorf("comm: CheckTopologies: rank %d says node %d, local rank %d: want node in [0, %d) and local rank in [0, %d)", r, t.Node, t.LocalRank, t.Nodes, t.LocalSize)
		}
		k := [2]int{t.Node, t.LocalRank}
		if q, ok := owner[k]; ok {
			return fmt.Errorf("comm: CheckTopologies: ranks %d and %d both say node %d, local rank %d", q, r, t.Node, t.LocalRank)
		}
		owner[k] = r
	}
	held := make([]int, t0.Nodes) // ranks seen so far on each node
	nodes := 0                    // nodes seen so far
	for r, t := range ts {
		if held[t.Node] == 0 {
			if t.Node != nodes {
				return fmt.Errorf("comm: CheckTopologies: rank %d is the lowest rank of node %d, which should be node %d: nodes are numbered in the order of their lowest rank", r, t.Node, nodes)
			}
			nodes++
		}
		if t.LocalRank != held[t.Node] {
			return fmt.Errorf("comm: CheckTopologies: rank %d says local rank %d of node %d, which should be %d: local ranks follow rank order within a node", r, t.LocalRank, t.Node, held[t.Node])
		}
		held[t.Node]++
	}
	return nil
}
