package ncclcomm_test

import (
	"errors"
	"sync"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/commtest"
	"github.com/gradcomp/gradcomp/comm/ncclcomm"
	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// eachDevice runs f on every DeviceComm at once and fails the test on an
// error.
func eachDevice(t *testing.T, dcs []comm.DeviceComm, what string, f func(r int, dc comm.DeviceComm) error) {
	t.Helper()
	errs := make([]error, len(dcs))
	var wg sync.WaitGroup
	for r, dc := range dcs {
		wg.Go(func() { errs[r] = f(r, dc) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s on rank %d: %v", what, r, err)
		}
	}
}

// splitAll splits every Comm of comms through comm.DeviceSplitter with
// color(r) and key(r), and closes the new DeviceComms at the end of the
// test.
func splitAll(t *testing.T, comms []*ncclcomm.Comm, color, key func(r int) int) []comm.DeviceComm {
	t.Helper()
	subs := make([]comm.DeviceComm, len(comms))
	var wg sync.WaitGroup
	errs := make([]error, len(comms))
	for r, c := range comms {
		var dc comm.DeviceComm = c
		sp, ok := dc.(comm.DeviceSplitter)
		if !ok {
			t.Fatal("*ncclcomm.Comm is not a comm.DeviceSplitter")
		}
		wg.Go(func() { subs[r], errs[r] = sp.Split(t.Context(), color(r), key(r)) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("Split on rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, s := range subs {
			s.Close()
		}
	})
	return subs
}

// TestSplit splits 4 ranks into 2 groups by color (even and odd ranks),
// keys reversed, through comm.DeviceSplitter: each group's ranks come in
// the opposite order, AllReduce sums the group only and AllGather
// gathers in the new order. Closing the children leaves the parents
// usable; closing the parents leaves a second split usable, which then
// passes the DeviceComm conformance suite.
func TestSplit(t *testing.T) {
	const ranks, n = 4, 129
	comms := group(t, ranks)
	ctx := t.Context()
	subs := splitAll(t, comms, func(r int) int { return r % 2 }, func(r int) int { return ranks - 1 - r })
	// Group r%2 is old ranks r%2 and r%2 + 2; the keys put the latter first.
	for r, s := range subs {
		if want := 1 - r/2; s.Rank() != want || s.Size() != 2 {
			t.Errorf("old rank %d: Rank %d Size %d, want rank %d of 2", r, s.Rank(), s.Size(), want)
		}
	}
	bufs, dst := buffers(t, ranks, 4*ranks*n), buffers(t, ranks, 4*ranks*n)
	for r, b := range bufs {
		for i := range n {
			b.Float32s()[i] = float32(1000*(r+1) + i)
		}
	}
	eachDevice(t, subs, "AllReduce", func(r int, s comm.DeviceComm) error { return s.AllReduce(ctx, ptr(bufs[r]), n, 0) })
	for r, b := range bufs {
		for i := range n {
			if got, want := b.Float32s()[i], float32(1000*(r%2+1)+1000*(r%2+3)+2*i); got != want {
				t.Fatalf("AllReduce old rank %d [%d] = %v, want %v (its group's sum)", r, i, got, want)
			}
		}
	}
	for r, b := range bufs {
		for i := range n {
			b.Bytes()[i] = byte(r)
		}
	}
	eachDevice(t, subs, "AllGather", func(r int, s comm.DeviceComm) error {
		return s.AllGather(ctx, ptr(dst[r]), ptr(bufs[r]), n, 0)
	})
	for r, d := range dst {
		// New rank 0 of group r%2 is old rank r%2 + 2, new rank 1 old rank r%2.
		for i := range 2 * n {
			if got, want := d.Bytes()[i], byte(r%2+2*(1-i/n)); got != want {
				t.Fatalf("AllGather old rank %d [%d] = %d, want %d", r, i, got, want)
			}
		}
	}

	for r, s := range subs {
		if err := s.Close(); err != nil {
			t.Fatalf("Close of the child of rank %d: %v", r, err)
		}
	}
	for r, b := range bufs {
		clear(b.Float32s())
		b.Float32s()[0] = float32(r + 1)
	}
	each(t, comms, "AllReduce on the parent after closing its child", func(r int, c *ncclcomm.Comm) error {
		return c.AllReduce(ctx, ptr(bufs[r]), n, 0)
	})
	for r, b := range bufs {
		if got := b.Float32s()[0]; got != 1+2+3+4 {
			t.Fatalf("parent AllReduce rank %d = %v, want 10", r, got)
		}
	}

	again := splitAll(t, comms, func(r int) int { return r / 2 }, func(int) int { return 0 })
	for _, c := range comms {
		if err := c.Close(); err != nil {
			t.Fatal(err)
		}
	}
	var mem ncclmock.Memory
	eachDevice(t, again, "commtest.RunDevice on a split after closing its parent", func(_ int, s comm.DeviceComm) error {
		return commtest.RunDevice(ctx, s, &mem, 0, commtest.Options{})
	})
}

// TestSplitBadArguments: a negative color (nccl.NoColor included: a
// DeviceSplitter puts every rank in a group) or key is an
// *nccl.ArgumentError, and the Comm stays usable.
func TestSplitBadArguments(t *testing.T) {
	c := group(t, 1)[0]
	for _, bad := range []struct{ color, key int }{{nccl.NoColor, 0}, {-5, 0}, {0, -1}} {
		s, err := c.Split(t.Context(), bad.color, bad.key)
		var ae *nccl.ArgumentError
		if s != nil || !errors.As(err, &ae) || ae.Func != "ncclCommSplit" {
			t.Errorf("Split(%d, %d): got %v, %v; want an *nccl.ArgumentError", bad.color, bad.key, s, err)
		}
	}
	s, err := c.Split(t.Context(), 0, 0)
	if err != nil || s.Rank() != 0 || s.Size() != 1 {
		t.Fatalf("Split after the bad calls: %v", err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
}
