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
// each is closed on its own.
type Splitter interface {
	Split(ctx context.Context) (node, cross Comm, err error)
}
