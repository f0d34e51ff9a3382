package check

import (
	"errors"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
)

func TestOverlap(t *testing.T) {
	b := make([]byte, 10)
	f := make([]float32, 10)
	cases := []struct {
		name string
		got  bool
		want bool
	}{
		{"adjacent bytes", overlap(b[:5], b[5:]), false},
		{"one shared byte", overlap(b[:6], b[5:]), true},
		{"contained", overlap(b, b[3:4]), true},
		{"empty", overlap(b[:0], b), false},
		{"adjacent floats", overlap(f[:5], f[5:]), false},
		{"one shared float", overlap(f[4:5], f[:5]), true},
		{"separate arrays", overlap(b, make([]byte, 10)), false},
	}
	for _, tc := range cases {
		if tc.got != tc.want {
			t.Errorf("%s: overlap = %v, want %v", tc.name, tc.got, tc.want)
		}
	}
}

// TestAgreeOrder: the lowest invalid rank wins over later ones and over
// mismatches; mismatches are reported against rank 0, the first one found.
func TestAgreeOrder(t *testing.T) {
	bad := func(r int) error { return &comm.ArgumentError{Op: comm.OpAllGather, Rank: r, Reason: "x"} }
	calls := []Call{
		{Op: comm.OpAllGather, Len: 3},
		{Op: comm.OpAllGather, Len: 4},
		{Op: comm.OpAllGather, Len: 3, Err: bad(2)},
		{Op: comm.OpAllGather, Len: 3, Err: bad(3)},
	}
	var a *comm.ArgumentError
	if err := Agree(calls); !errors.As(err, &a) || a.Rank != 2 {
		t.Errorf("got %v, want rank 2's argument error", err)
	}
	calls[2].Err, calls[3].Err = nil, nil
	calls[3].Op = comm.OpBarrier
	var m *comm.MismatchError
	if err := Agree(calls); !errors.As(err, &m) || m.RankB != 1 || m.What != "len(src)" {
		t.Errorf("got %v, want rank 1's length mismatch", err)
	}
	calls[1].Len = 3
	if err := Agree(calls); !errors.As(err, &m) || m.RankB != 3 || m.What != "operation" {
		t.Errorf("got %v, want rank 3's operation mismatch", err)
	}
	calls[3].Op = comm.OpAllGather
	if err := Agree(calls); err != nil {
		t.Errorf("agreeing calls: %v", err)
	}
}
