package comm

import (
	"reflect"
	"testing"
)

func TestNodeTopologies(t *testing.T) {
	got, err := NodeTopologies([]int{7, 7, 3, 3})
	if err != nil {
		t.Fatal(err)
	}
	want := []Topology{{0, 2, 0, 2}, {0, 2, 1, 2}, {1, 2, 0, 2}, {1, 2, 1, 2}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("2x2: got %v, want %v", got, want)
	}
	got, err = NodeTopologies([]int{0, 1, 2})
	if err != nil {
		t.Fatal(err)
	}
	want = []Topology{{0, 3, 0, 1}, {1, 3, 0, 1}, {2, 3, 0, 1}}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("nodes of one rank: got %v, want %v", got, want)
	}
	if _, err := NodeTopologies([]int{0, 0, 1}); err == nil {
		t.Fatal("unequal local sizes: no error")
	}
	if _, err := NodeTopologies(nil); err == nil {
		t.Fatal("no ranks: no error")
	}
}

func TestCheckTopologies(t *testing.T) {
	grid := func(nodeOf ...int) []Topology {
		ts, err := NodeTopologies(nodeOf)
		if err != nil {
			t.Fatal(err)
		}
		return ts
	}
	for _, tc := range []struct {
		name string
		ts   []Topology
		want string // the error; "" for none
	}{
		{"one rank", grid(0), ""},
		{"2x2", grid(0, 0, 1, 1), ""},
		{"interleaved", grid(4, 9, 4, 9), ""},
		{"3 nodes of 1", grid(0, 1, 2), ""},
		{"1 node of 3", grid(0, 0, 0), ""},
		{"no ranks", nil, "comm: CheckTopologies: no ranks"},
		{"Nodes differ", []Topology{{0, 2, 0, 2}, {0, 2, 1, 2}, {1, 1, 0, 2}, {1, 2, 1, 2}},
			"comm: CheckTopologies: rank 2 says 1 node(s) of 2 rank(s), rank 0 says 2 of 2"},
		{"LocalSize differs", []Topology{{0, 2, 0, 2}, {0, 2, 1, 3}, {1, 2, 0, 2}, {1, 2, 1, 2}},
			"comm: CheckTopologies: rank 1 says 2 node(s) of 3 rank(s), rank 0 says 2 of 2"},
		{"product", []Topology{{0, 2, 0, 2}, {0, 2, 1, 2}, {1, 2, 0, 2}},
			"comm: CheckTopologies: the ranks say 2 node(s) of 2 rank(s), but the group has 3 rank(s)"},
		{"zero", []Topology{{}},
			"comm: CheckTopologies: the ranks say 0 node(s) of 0 rank(s), but the group has 1 rank(s)"},
		{"node out of range", []Topology{{0, 2, 0, 1}, {2, 2, 0, 1}},
			"comm: CheckTopologies: rank 1 says node 2, local rank 0: want node in [0, 2) and local rank in [0, 1)"},
		{"local rank out of range", []Topology{{0, 1, 0, 2}, {0, 1, -1, 2}},
			"comm: CheckTopologies: rank 1 says node 0, local rank -1: want node in [0, 1) and local rank in [0, 2)"},
		{"claimed twice", []Topology{{0, 2, 0, 2}, {0, 2, 1, 2}, {1, 2, 0, 2}, {0, 2, 1, 2}},
			"comm: CheckTopologies: ranks 1 and 3 both say node 0, local rank 1"},
		{"nodes not by lowest rank", []Topology{{1, 2, 0, 2}, {1, 2, 1, 2}, {0, 2, 0, 2}, {0, 2, 1, 2}},
			"comm: CheckTopologies: rank 0 is the lowest rank of node 1, which should be node 0: nodes are numbered in the order of their lowest rank"},
		{"local ranks not in rank order", []Topology{{0, 2, 1, 2}, {0, 2, 0, 2}, {1, 2, 0, 2}, {1, 2, 1, 2}},
			"comm: CheckTopologies: rank 0 says local rank 1 of node 0, which should be 0: local ranks follow rank order within a node"},
		{"interleaved, local ranks swapped", []Topology{{0, 2, 0, 2}, {1, 2, 1, 2}, {0, 2, 1, 2}, {1, 2, 0, 2}},
			"comm: CheckTopologies: rank 1 says local rank 1 of node 1, which should be 0: local ranks follow rank order within a node"},
	} {
		err := CheckTopologies(tc.ts)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v, want nil", tc.name, err)
		case tc.want != "" && (err == nil || err.Error() != tc.want):
			t.Errorf("%s: got %v, want %q", tc.name, err, tc.want)
		}
	}
}
