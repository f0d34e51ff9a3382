package ncclcomm_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/commtest"
	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/comm/ncclcomm"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// The tests run over the MOCK libnccl.so.2 of internal/ncclmock (a test
// fixture: host memory stands in for device memory), with comm/inproc as
// the host group that bootstraps the unique id.

var (
	lib     *nccl.Library
	loadErr error
)

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "gradcomp-ncclmock-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	var path string
	switch {
	case ncclmock.IsolatedChild():
		// The test loads its own library (real_test.go).
		loadErr = errors.New("the mock is not loaded in an isolated test's process")
	default:
		if path, loadErr = ncclmock.Build(dir); loadErr == nil {
			lib, loadErr = nccl.Open(nccl.WithPath(path))
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// group makes n DeviceComms bootstrapped over an inproc group.
func group(t *testing.T, n int, opts ...nccl.Option) []*ncclcomm.Comm {
	t.Helper()
	if loadErr != nil {
		t.Skipf("mock libnccl.so.2 not available: %v", loadErr)
	}
	boot, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	comms := make([]*ncclcomm.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { comms[r], errs[r] = ncclcomm.New(t.Context(), lib, boot[r], opts...) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("New on rank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Close()
		}
	})
	return comms
}

func each(t *testing.T, comms []*ncclcomm.Comm, what string, f func(r int, c *ncclcomm.Comm) error) {
	t.Helper()
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s on rank %d: %v", what, r, err)
		}
	}
}

func buffers(t *testing.T, ranks, bytes int) []*ncclmock.Buffer {
	t.Helper()
	bufs := make([]*ncclmock.Buffer, ranks)
	for r := range bufs {
		b, err := ncclmock.Alloc(bytes)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		bufs[r] = b
	}
	return bufs
}

func ptr(b *ncclmock.Buffer) gpu.Ptr { return gpu.Ptr(b.Ptr()) }

func TestDeviceComm(t *testing.T) {
	const ranks, n = 4, 515
	comms := group(t, ranks)
	ctx := t.Context()
	src, dst := buffers(t, ranks, 4*ranks*n), buffers(t, ranks, 4*ranks*n)
	const stream = gpu.Stream(0x1234) // the mock ignores streams; NCCL would get this handle

	// AllReduce of small integers: exact in any order.
	for r := range ranks {
		for i := range n {
			src[r].Float32s()[i] = float32(r*n + i)
		}
	}
	each(t, comms, "AllReduce", func(r int, c *ncclcomm.Comm) error { return c.AllReduce(ctx, ptr(src[r]), n, stream) })
	for r := range ranks {
		for i := range n {
			if got, want := src[r].Float32s()[i], float32(ranks*i+n*ranks*(ranks-1)/2); got != want {
				t.Fatalf("AllReduce rank %d [%d] = %v, want %v", r, i, got, want)
			}
		}
	}

	// AllGather and AllToAll of bytes.
	for r := range ranks {
		for i := range ranks * n {
			src[r].Bytes()[i] = byte(r*31 + i)
		}
	}
	each(t, comms, "AllGather", func(r int, c *ncclcomm.Comm) error { return c.AllGather(ctx, ptr(dst[r]), ptr(src[r]), n, stream) })
	for r := range ranks {
		for i := range ranks * n {
			if got, want := dst[r].Bytes()[i], byte((i/n)*31+i%n); got != want {
				t.Fatalf("AllGather rank %d [%d] = %d, want %d", r, i, got, want)
			}
		}
	}
	each(t, comms, "AllToAll", func(r int, c *ncclcomm.Comm) error { return c.AllToAll(ctx, ptr(dst[r]), ptr(src[r]), ranks*n, stream) })
	for r := range ranks {
		for i := range ranks * n {
			from, k := i/n, i%n // chunk i/n of dst comes from rank i/n, its chunk r
			if got, want := dst[r].Bytes()[i], byte(from*31+r*n+k); got != want {
				t.Fatalf("AllToAll rank %d [%d] = %d, want %d", r, i, got, want)
			}
		}
	}

	// ReduceScatter.
	for r := range ranks {
		for i := range ranks * n {
			src[r].Float32s()[i] = float32(r + i)
		}
	}
	each(t, comms, "ReduceScatter", func(r int, c *ncclcomm.Comm) error {
		return c.ReduceScatter(ctx, ptr(dst[r]), ptr(src[r]), n, stream)
	})
	for r := range ranks {
		for i := range n {
			if got, want := dst[r].Float32s()[i], float32(ranks*(r*n+i)+ranks*(ranks-1)/2); got != want {
				t.Fatalf("ReduceScatter rank %d [%d] = %v, want %v", r, i, got, want)
			}
		}
	}

	// Broadcast from rank 3.
	for r := range ranks {
		for i := range n {
			src[r].Bytes()[i] = byte(r)
		}
	}
	each(t, comms, "Broadcast", func(r int, c *ncclcomm.Comm) error { return c.Broadcast(ctx, ptr(src[r]), n, 3, stream) })
	for r := range ranks {
		for i := range n {
			if got := src[r].Bytes()[i]; got != 3 {
				t.Fatalf("Broadcast rank %d [%d] = %d, want 3", r, i, got)
			}
		}
	}
	each(t, comms, "Wait", func(_ int, c *ncclcomm.Comm) error { return c.Wait(ctx, func() (bool, error) { return true, nil }) })
	for r, c := range comms {
		if c.Rank() != r || c.Size() != ranks || c.NCCL().Rank() != r {
			t.Errorf("comm %d: Rank %d Size %d", r, c.Rank(), c.Size())
		}
	}
}

func TestBadArguments(t *testing.T) {
	comms := group(t, 2)
	var ae *comm.ArgumentError
	if err := comms[0].AllToAll(t.Context(), 8, 16, 3, 0); !errors.As(err, &ae) || ae.Op != comm.OpAllToAll {
		t.Errorf("AllToAll of 3 bytes over 2 ranks: %v", err)
	}
	var ne *nccl.ArgumentError
	if err := comms[0].AllReduce(t.Context(), 0, 4, 0); !errors.As(err, &ne) {
		t.Errorf("AllReduce of a null pointer: %v", err)
	}
}

// TestHungPeer: a rank whose peer never joins a collective gets an abort
// within the timeout, and the DeviceComm is closed afterwards: the error
// matches comm.ErrClosed, as every Comm's end does.
func TestHungPeer(t *testing.T) {
	comms := group(t, 2, nccl.WithTimeout(100*time.Millisecond))
	buf := buffers(t, 1, 16)[0]
	start := time.Now()
	err := comms[0].AllReduce(t.Context(), ptr(buf), 4, 0)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, nccl.ErrClosed) || !errors.Is(err, comm.ErrClosed) {
		t.Fatalf("got %v; want an abort matching context.DeadlineExceeded and comm.ErrClosed", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("took %v", took)
	}
	if err := comms[0].Close(); err != nil {
		t.Errorf("Close after the abort: %v", err)
	}
}

func TestBootstrapFailure(t *testing.T) {
	if loadErr != nil {
		t.Skipf("mock libnccl.so.2 not available: %v", loadErr)
	}
	boot, err := inproc.NewGroup(2)
	if err != nil {
		t.Fatal(err)
	}
	boot[1].Close() // rank 1 is gone: the broadcast fails, nothing hangs
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	if _, err := ncclcomm.New(ctx, lib, boot[0]); err == nil {
		t.Fatal("New over a closed group succeeded")
	}
}

// TestConformance runs comm/commtest's suite on 4 DeviceComms over the
// mock (commtest.RunDevice): every collective at every length of the
// suite, on "device" buffers.
func TestConformance(t *testing.T) {
	comms := group(t, 4)
	var mem ncclmock.Memory
	each(t, comms, "commtest.RunDevice", func(r int, c *ncclcomm.Comm) error {
		return commtest.RunDevice(t.Context(), c, &mem, 0, commtest.Options{})
	})
}
