package twolevel

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/commtest"
	"github.com/gradcomp/gradcomp/comm/inproc"
)

// TestConformance: the two-level Comm passes comm's conformance suite on
// layouts of 2×2, 3×2, 2×3, 4×1 and 1×3 ranks, and on ranks whose nodes
// interleave (rank r on node r mod 2).
func TestConformance(t *testing.T) {
	for name, nodeOf := range map[string][]int{
		"2x2": {0, 0, 1, 1}, "3x2": {0, 0, 1, 1, 2, 2}, "2x3": {0, 0, 0, 1, 1, 1},
		"4x1": {0, 1, 2, 3}, "1x3": {0, 0, 0}, "interleaved": {0, 1, 0, 1},
	} {
		t.Run(name, func(t *testing.T) {
			ranks, err := inproc.NewNodeGroup(nodeOf)
			if err != nil {
				t.Fatal(err)
			}
			topo, err := comm.NodeTopologies(nodeOf)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			errs := make([]error, len(ranks))
			var wg sync.WaitGroup
			for r, g := range ranks {
				wg.Go(func() {
					node, cross, err := g.(comm.Splitter).Split(ctx)
					if err != nil {
						errs[r] = err
						return
					}
					c, err := New(g, node, cross, topo)
					if err != nil {
						errs[r] = err
						return
					}
					defer c.Close()
					if got := c.Topology(); got != topo[r] {
						errs[r] = fmt.Errorf("Topology %+v, want %+v", got, topo[r])
						return
					}
					errs[r] = commtest.Run(ctx, c, commtest.Options{})
				})
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Errorf("rank %d: %v", r, err)
				}
			}
		})
	}
}

// TestNewRefusesWrongComms: node and cross comms that do not match the
// rank's topology are refused.
func TestNewRefusesWrongComms(t *testing.T) {
	ranks, err := inproc.NewNodeGroup([]int{0, 0, 1, 1})
	if err != nil {
		t.Fatal(err)
	}
	topo, _ := comm.NodeTopologies([]int{0, 0, 1, 1})
	other, _ := inproc.NewGroup(3)
	if _, err := New(ranks[0], other[0], other[1], topo); err == nil {
		t.Error("New with node and cross comms of 3 ranks: no error")
	}
	if _, err := New(ranks[0], other[0], other[1], topo[:2]); err == nil {
		t.Error("New with 2 topologies for 4 ranks: no error")
	}
}
