package nccl_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// split calls Split(color(r), key(r)) on every rank of comms at once and
// returns the new communicators, failing the test on an error.
func split(t *testing.T, comms []*nccl.Comm, color, key func(r int) int, opts ...nccl.Option) []*nccl.Comm {
	t.Helper()
	subs := make([]*nccl.Comm, len(comms))
	noErrors(t, "Split", onRanks(comms, func(r int, c *nccl.Comm) error {
		var err error
		subs[r], err = c.Split(t.Context(), color(r), key(r), opts...)
		return err
	}))
	t.Cleanup(func() {
		for _, s := range subs {
			if s != nil {
				s.Destroy(context.Background())
			}
		}
	})
	return subs
}

// TestSplit splits 4 ranks into 2 groups by color (even and odd ranks),
// keys reversed: each group's ranks come in the opposite order, and an
// AllReduce in a group sums that group's ranks only. The parent keeps
// working beside its children.
func TestSplit(t *testing.T) {
	l := open(t)
	const ranks, n = 4, 257
	comms := world(t, l, ranks, ncclmock.ModeOK, nccl.WithTimeout(10*time.Second))
	subs := split(t, comms, func(r int) int { return r % 2 }, func(r int) int { return ranks - 1 - r })
	// Color 0 is old ranks {0, 2} with keys {3, 1}: old 2 is rank 0, old 0
	// is rank 1; color 1 likewise ({1, 3} with keys {2, 0}).
	for r, s := range subs {
		if want := 1 - r/2; s.Rank() != want || s.Size() != 2 || s.Library() != l {
			t.Errorf("old rank %d: new Rank %d Size %d, want rank %d of 2", r, s.Rank(), s.Size(), want)
		}
	}
	bufs := alloc(t, ranks, n)
	for r, b := range bufs {
		for i := range b.Float32s() {
			b.Float32s()[i] = val(r, i)
		}
	}
	noErrors(t, "AllReduce in the groups", onRanks(subs, func(r int, s *nccl.Comm) error {
		return s.Run(t.Context(), nccl.AllReduce(bufs[r].Ptr(), bufs[r].Ptr(), n, nccl.Float32, nccl.Sum, 0))
	}))
	for r, b := range bufs {
		for i, g := range b.Float32s() {
			// The group of r is r%2: ranks r%2 and r%2 + 2.
			if w := val(r%2, i) + val(r%2+2, i); g != w {
				t.Fatalf("old rank %d element %d = %v, want %v (the sum over its group only)", r, i, g, w)
			}
		}
	}
	noErrors(t, "AllReduce on the parent", onRanks(comms, func(r int, c *nccl.Comm) error {
		return c.Run(t.Context(), nccl.AllReduce(bufs[r].Ptr(), bufs[r].Ptr(), n, nccl.Float32, nccl.Sum, 0))
	}))
	for r, b := range bufs {
		if g, w := b.Float32s()[5], 2*(val(0, 5)+val(1, 5)+val(2, 5)+val(3, 5)); g != w {
			t.Fatalf("parent AllReduce: rank %d element 5 = %v, want %v", r, g, w)
		}
	}

	// Equal keys: the order of the old ranks. A child splits again.
	again := split(t, subs, func(int) int { return 0 }, func(int) int { return 7 })
	for r, s := range again {
		if s.Rank() != subs[r].Rank() || s.Size() != 2 {
			t.Errorf("split of a split, old rank %d: Rank %d Size %d, want %d of 2", r, s.Rank(), s.Size(), subs[r].Rank())
		}
	}
}

// TestSplitNoColor: a rank that passes NoColor takes part in the call and
// gets no communicator; the others form theirs.
func TestSplitNoColor(t *testing.T) {
	l := open(t)
	comms := world(t, l, 3, ncclmock.ModeOK)
	subs := split(t, comms, func(r int) int {
		if r == 1 {
			return nccl.NoColor
		}
		return 5
	}, func(r int) int { return r })
	if subs[1] != nil {
		t.Errorf("NoColor: got a communicator of rank %d of %d", subs[1].Rank(), subs[1].Size())
	}
	for _, r := range []int{0, 2} {
		if s := subs[r]; s == nil || s.Rank() != r/2 || s.Size() != 2 {
			t.Errorf("old rank %d: got %v, want rank %d of 2", r, s, r/2)
		}
	}
}

// TestSplitTimeout: a rank whose peer never calls Split is aborted after
// the timeout Split was given (not the parent's), with an error naming
// ncclCommSplit and the rank; the parent has ended.
func TestSplitTimeout(t *testing.T) {
	l := open(t)
	comms := world(t, l, 2, ncclmock.ModeOK, nccl.WithTimeout(time.Minute))
	start := time.Now()
	s, err := comms[1].Split(t.Context(), 0, 0, nccl.WithTimeout(100*time.Millisecond), nccl.WithAbortGrace(5*time.Second))
	took := time.Since(start)
	var ae *nccl.AbortError
	if s != nil || !errors.As(err, &ae) || ae.Func != "ncclCommSplit" || ae.Rank != 1 || !ae.Aborted || !ae.Returned {
		t.Fatalf("got %v, %v; want an *AbortError of ncclCommSplit on rank 1", s, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, nccl.ErrClosed) {
		t.Errorf("%v: want errors.Is DeadlineExceeded and ErrClosed", err)
	}
	if !strings.Contains(err.Error(), "nccl: ncclCommSplit on rank 1 stopped after") {
		t.Errorf("message: %v", err)
	}
	if took < 100*time.Millisecond || took > 3*time.Second {
		t.Errorf("Split took %v with a 100ms timeout", took)
	}
	buf := alloc(t, 1, 4)[0].Ptr()
	var de *nccl.DestroyedError
	if err := comms[1].Run(t.Context(), nccl.AllReduce(buf, buf, 4, nccl.Float32, nccl.Sum, 0)); !errors.As(err, &de) {
		t.Errorf("the parent after the abort: %v", err)
	}
	if _, err := comms[1].Split(t.Context(), 0, 0); !errors.As(err, &de) || de.Func != "ncclCommSplit" {
		t.Errorf("Split on the ended parent: %v", err)
	}
}

// TestSplitErrors: invalid arguments are an *ArgumentError before NCCL
// sees them; an NCCL failure is an *Error naming ncclCommSplit; neither
// ends the parent.
func TestSplitErrors(t *testing.T) {
	l := open(t)
	c := world(t, l, 1, ncclmock.ModeOK)[0]
	for _, bad := range []struct {
		color, key int
		opts       []nccl.Option
		want       string
	}{
		{0, -1, nil, "rank 0: key = -1, want ≥ 0"},
		{-2, 0, nil, "rank 0: color = -2, want ≥ 0, or NoColor (-1) to join no group"},
		{0, 0, []nccl.Option{nccl.WithDevice(0)}, "WithDevice(0): the new communicator is on the parent's device"},
		{0, 1 << 31, nil, "color = 0, key = 2147483648: each must fit a C int (≤ 2147483647)"},
	} {
		s, err := c.Split(t.Context(), bad.color, bad.key, bad.opts...)
		var ae *nccl.ArgumentError
		if s != nil || !errors.As(err, &ae) || ae.Func != "ncclCommSplit" || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("Split(%d, %d): got %v, want an *ArgumentError with %q", bad.color, bad.key, err, bad.want)
		}
	}
	if _, err := c.Split(t.Context(), 0, 0, nccl.WithTimeout(-time.Second)); err == nil {
		t.Error("WithTimeout(-1s) accepted")
	}
	s, err := c.Split(t.Context(), 3, 0)
	if err != nil || s.Rank() != 0 || s.Size() != 1 {
		t.Fatalf("Split of one rank after the bad calls: %v", err)
	}
	if err := s.Destroy(t.Context()); err != nil {
		t.Fatal(err)
	}

	f := world(t, l, 1, ncclmock.ModeFail)[0]
	_, err = f.Split(t.Context(), 0, 0)
	var ne *nccl.Error
	if !errors.As(err, &ne) || ne.Func != "ncclCommSplit" || ne.Rank != 0 || ne.Result != nccl.ResultInvalidUsage ||
		ne.Detail != "mock: ncclCommSplit: told to fail by the unique id" {
		t.Errorf("NCCL failure: got %v", err)
	}
	if err := f.AsyncError(); err != nil {
		t.Errorf("the parent after a failed Split: %v", err)
	}
}

// TestSplitUnsupported: a library without ncclCommSplit (an NCCL 2.17
// mock) still loads, and Split says which function is missing and which
// version the library is; the parent stays usable.
func TestSplitUnsupported(t *testing.T) {
	if buildErr != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	var env []string // the child inherits the old mock's path
	if !ncclmock.IsolatedChild() {
		old, err := ncclmock.Build(t.TempDir(), "MOCK_NO_SPLIT", "MOCK_VERSION=21704")
		if err != nil {
			t.Fatal(err)
		}
		env = []string{"MOCK_NO_SPLIT=" + old}
	}
	if !ncclmock.Isolate(t, isolatedTimeout, env...) {
		return
	}
	path := os.Getenv("MOCK_NO_SPLIT")
	l, err := nccl.Open(nccl.WithPath(path))
	if errors.Is(err, nccl.ErrNoCgo) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("Open of an NCCL 2.17 without ncclCommSplit: %v", err)
	}
	if l.Version().String() != "2.17.4" || l.SymbolFile("ncclCommSplit") != "" {
		t.Fatalf("loaded %v from %s, ncclCommSplit in %q", l.Version(), l.Path(), l.SymbolFile("ncclCommSplit"))
	}
	comms := world(t, l, 2, ncclmock.ModeOK)
	errs := onRanks(comms, func(_ int, c *nccl.Comm) error {
		s, err := c.Split(t.Context(), 0, 0)
		if s != nil {
			t.Errorf("a communicator came back with %v", err)
		}
		return err
	})
	for r, err := range errs {
		var ue *nccl.UnsupportedError
		if !errors.As(err, &ue) || !errors.Is(err, errors.ErrUnsupported) || ue.Func != "ncclCommSplit" || ue.Rank != r ||
			ue.Version.String() != "2.17.4" || ue.Since.Minor != 18 || ue.Path != path {
			t.Fatalf("rank %d: got %T %v, want an *UnsupportedError", r, err, err)
		}
		want := fmt.Sprintf("nccl: ncclCommSplit on rank %d: %s is NCCL 2.17.4, which has no function ncclCommSplit (NCCL 2.18 added it); load NCCL 2.18 or newer", r, path)
		if !strings.HasPrefix(err.Error(), want) {
			t.Errorf("message\n%v\nwant it to start with\n%s", err, want)
		}
	}
	t.Logf("as expected: %v", errs[0])
	bufs := alloc(t, 2, 4)
	noErrors(t, "AllReduce after the refused Split", onRanks(comms, func(r int, c *nccl.Comm) error {
		return c.Run(t.Context(), nccl.AllReduce(bufs[r].Ptr(), bufs[r].Ptr(), 4, nccl.Float32, nccl.Sum, 0))
	}))
}
