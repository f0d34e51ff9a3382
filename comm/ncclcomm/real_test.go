package ncclcomm_test

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/comm/ncclcomm"
	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// TestRealNew bootstraps a communicator of two ranks over the REAL
// libnccl.so.2 (ncclmock.RealLibrary), in a process of its own: rank 0's
// unique id reaches rank 1 over the host group, and on a machine without
// a GPU both ranks' ncclCommInitRank fail promptly with NCCL's CUDA error,
// which New returns as the *nccl.Error.
func TestRealNew(t *testing.T) {
	path, err := ncclmock.RealLibrary()
	if err != nil {
		t.Skip(err)
	}
	if !ncclmock.Isolate(t, 2*time.Minute) {
		return
	}
	l, err := nccl.Open(nccl.WithPath(path))
	if errors.Is(err, nccl.ErrNoCgo) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	boot, err := inproc.NewGroup(2)
	if err != nil {
		t.Fatal(err)
	}
	const timeout = 30 * time.Second
	errs := make([]error, 2)
	comms := make([]*ncclcomm.Comm, 2)
	start := time.Now()
	var wg sync.WaitGroup
	for r := range 2 {
		wg.Go(func() {
			comms[r], errs[r] = ncclcomm.New(t.Context(), l, boot[r], nccl.WithTimeout(timeout), nccl.WithAbortGrace(5*time.Second))
		})
	}
	wg.Wait()
	took := time.Since(start)
	if errs[0] == nil && errs[1] == nil {
		for _, c := range comms {
			c.Close()
		}
		t.Skip("New succeeded: this machine has a usable GPU, so the failure path is not reachable here")
	}
	for r, err := range errs {
		var ne *nccl.Error
		if !errors.As(err, &ne) || ne.Func != "ncclCommInitRank" || ne.Rank != r || ne.Result == nccl.ResultSuccess {
			t.Errorf("rank %d: got %T %v, want the *nccl.Error of ncclCommInitRank", r, err, err)
		}
		if comms[r] != nil {
			t.Errorf("rank %d: a Comm came back with the error", r)
		}
	}
	if took > timeout/2 {
		t.Errorf("New took %v to fail", took)
	}
	t.Logf("NCCL %v, New failed in %v: %v", l.Version(), took.Round(time.Millisecond), errs[0])
}

// TestRealSplit splits a one-rank DeviceComm over the REAL libnccl.so.2,
// in a process of its own, through comm.DeviceSplitter: the child is rank
// 0 of 1, and closing it leaves the parent usable. Without a GPU New fails
// (ncclCommInitRank's *nccl.Error) and the test skips, saying so.
func TestRealSplit(t *testing.T) {
	path, err := ncclmock.RealLibrary()
	if err != nil {
		t.Skip(err)
	}
	if !ncclmock.Isolate(t, 2*time.Minute) {
		return
	}
	l, err := nccl.Open(nccl.WithPath(path))
	if errors.Is(err, nccl.ErrNoCgo) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if v := l.Version(); v.Minor < 18 {
		t.Skipf("NCCL %v predates ncclCommSplit (2.18)", v)
	}
	boot, err := inproc.NewGroup(1)
	if err != nil {
		t.Fatal(err)
	}
	ctx := t.Context()
	c, err := ncclcomm.New(ctx, l, boot[0], nccl.WithTimeout(30*time.Second), nccl.WithAbortGrace(5*time.Second))
	if err != nil {
		var ne *nccl.Error
		if errors.As(err, &ne) && ne.Func == "ncclCommInitRank" {
			t.Skipf("New failed (no usable GPU here), so Split is out of reach: %v", err)
		}
		t.Fatal(err)
	}
	defer c.Close()
	var sp comm.DeviceSplitter = c
	s, err := sp.Split(ctx, 0, 0)
	if err != nil {
		t.Fatalf("Split: %v", err)
	}
	if s.Rank() != 0 || s.Size() != 1 {
		t.Errorf("Split of one rank: Rank %d Size %d", s.Rank(), s.Size())
	}
	if err := s.Close(); err != nil {
		t.Fatalf("Close of the child: %v", err)
	}
	if err := c.Wait(ctx, func() (bool, error) { return true, nil }); err != nil {
		t.Errorf("the parent after its child's Close: %v", err)
	}
	if err := c.Close(); err != nil {
		t.Errorf("Close of the parent: %v", err)
	}
}
