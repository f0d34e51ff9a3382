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
