package workq

import (
	"slices"
	"testing"
)

// TestOrderAndClose: work runs in the order enqueued; Close lets it finish
// and drops what comes after.
func TestOrderAndClose(t *testing.T) {
	q := New()
	var got []int
	for i := range 100 {
		q.Enqueue(func() { got = append(got, i) })
	}
	q.Close()
	q.Enqueue(func() { got = append(got, -1) })
	<-q.Done()
	if len(got) != 100 || !slices.IsSorted(got) {
		t.Errorf("ran %v, want 0 to 99 in order", got)
	}
}
