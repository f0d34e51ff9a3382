package hosted_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/commtest"
	"github.com/gradcomp/gradcomp/comm/hosted"
	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/gpu"
)

// servedGroup returns n hosted transports whose posts Go hosts carry out
// on an in-process group, until the test ends.
func servedGroup(t *testing.T, n int) []*hosted.Transport {
	t.Helper()
	inner, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	ts := make([]*hosted.Transport, n)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for r := range n {
		if ts[r], err = hosted.New(r, n); err != nil {
			t.Fatal(err)
		}
		wg.Go(func() {
			if err := hosted.Serve(ctx, ts[r], inner[r], nil); err != nil {
				t.Errorf("rank %d: Serve: %v", r, err)
			}
		})
	}
	t.Cleanup(func() {
		cancel()
		for _, tr := range ts {
			tr.Close()
		}
		wg.Wait()
		for _, c := range inner {
			c.Close()
		}
	})
	return ts
}

// TestConformance: the hosted transport over Go hosts on comm/inproc
// passes comm's conformance suite, rank-order sums included.
func TestConformance(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		ts := servedGroup(t, n)
		errs := make([]error, n)
		var wg sync.WaitGroup
		for r, tr := range ts {
			wg.Go(func() { errs[r] = commtest.Run(context.Background(), tr.Host(), commtest.Options{RankOrder: true}) })
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Errorf("%d ranks, rank %d: %v", n, r, err)
			}
		}
	}
}

// post starts c's AllReduce of buf on a goroutine and returns its result.
func post(ctx context.Context, c comm.Comm, buf []float32) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- c.AllReduce(ctx, buf) }()
	return ch
}

func take(t *testing.T, tr *hosted.Transport) hosted.Op {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	op, err := tr.Take(ctx)
	if err != nil {
		t.Fatalf("Take: %v", err)
	}
	return op
}

func mustPoisoned(t *testing.T, tr *hosted.Transport, cause any) {
	t.Helper()
	err := tr.Host().Barrier(context.Background())
	var pe *comm.PoisonedError
	if !errors.As(err, &pe) || !errors.As(err, cause) {
		t.Fatalf("a later call: %v, want a *comm.PoisonedError wrapping %T", err, cause)
	}
}

// TestOpContents: a post carries the caller's buffers, lengths and
// (device ops) pointers and stream; the host's writes land in the
// caller's buffer.
func TestOpContents(t *testing.T) {
	tr, _ := hosted.New(1, 3)
	buf := []float32{1, 2, 3}
	res := post(context.Background(), tr.Host(), buf)
	op := take(t, tr)
	if op.ID != 1 || op.Kind != comm.OpAllReduce || op.Count != 3 || op.SendBytes != 12 || op.RecvBytes != 12 || op.Device {
		t.Fatalf("op = %v", op)
	}
	hosted.Float32s(op.Recv)[2] = 30
	if err := tr.Complete(op.ID, 12, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-res; err != nil || buf[2] != 30 {
		t.Fatalf("AllReduce = %v, buf %v", err, buf)
	}

	dres := make(chan error, 1)
	go func() { dres <- tr.Device().AllGather(context.Background(), 0x2000, 0x1000, 64, 0xabc) }()
	op = take(t, tr)
	if op.ID != 2 || op.Kind != comm.OpAllGather || !op.Device || op.SendPtr != 0x1000 || op.RecvPtr != 0x2000 ||
		op.SendBytes != 64 || op.RecvBytes != 192 || op.Stream != 0xabc {
		t.Fatalf("device op = %+v", op)
	}
	if err := tr.Complete(op.ID, 192, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-dres; err != nil {
		t.Fatal(err)
	}
	polls := 0
	if err := tr.Device().Wait(context.Background(), func() (bool, error) { polls++; return polls == 3, nil }); err != nil || polls != 3 {
		t.Fatalf("Wait = %v after %d polls", err, polls)
	}
}

// TestFailures: every way the host can fail ends the collective in flight
// with a typed error, and poisons the transport.
func TestFailures(t *testing.T) {
	t.Run("nobody takes", func(t *testing.T) {
		tr, _ := hosted.New(0, 2)
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		err := tr.Host().AllReduce(ctx, make([]float32, 4))
		var ie *comm.IncompleteError
		if !errors.As(err, &ie) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("AllReduce = %v, want *comm.IncompleteError (deadline)", err)
		}
		mustPoisoned(t, tr, &ie)
		// The abandoned post is gone: the host finds nothing.
		tctx, tcancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer tcancel()
		if op, err := tr.Take(tctx); err == nil {
			t.Fatalf("Take after the caller gave up returned %v", op)
		}
	})
	t.Run("host error", func(t *testing.T) {
		tr, _ := hosted.New(0, 2)
		res := post(context.Background(), tr.Host(), make([]float32, 4))
		op := take(t, tr)
		if err := tr.Complete(op.ID, 0, errors.New("gloo: connection reset by peer")); err != nil {
			t.Fatal(err)
		}
		err := <-res
		var he *hosted.HostError
		if !errors.As(err, &he) || he.Op.ID != op.ID || err.Error() != "hosted: rank 0: the host failed op 1: AllReduce of 4 (host; 16 bytes in, 16 out): gloo: connection reset by peer" {
			t.Fatalf("AllReduce = %v, want *hosted.HostError", err)
		}
		mustPoisoned(t, tr, &he)
	})
	for _, tc := range []struct {
		name string
		id   func(op hosted.Op) uint64
		n    int
	}{
		{"unknown id", func(op hosted.Op) uint64 { return op.ID + 7 }, 16},
		{"zero id", func(hosted.Op) uint64 { return 0 }, 16},
		{"wrong length", func(op hosted.Op) uint64 { return op.ID }, 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tr, _ := hosted.New(0, 2)
			res := post(context.Background(), tr.Host(), make([]float32, 4))
			op := take(t, tr)
			err := tr.Complete(tc.id(op), tc.n, nil)
			var pe *hosted.ProtocolError
			if !errors.As(err, &pe) {
				t.Fatalf("Complete = %v, want *hosted.ProtocolError", err)
			}
			if got := <-res; !errors.As(got, &pe) {
				t.Fatalf("AllReduce = %v, want the *hosted.ProtocolError", got)
			}
			mustPoisoned(t, tr, &pe)
		})
	}
	t.Run("completed twice", func(t *testing.T) {
		tr, _ := hosted.New(0, 1)
		res := post(context.Background(), tr.Host(), make([]float32, 1))
		op := take(t, tr)
		if err := tr.Complete(op.ID, 4, nil); err != nil {
			t.Fatal(err)
		}
		if err := <-res; err != nil {
			t.Fatal(err)
		}
		var pe *hosted.ProtocolError
		if err := tr.Complete(op.ID, 4, nil); !errors.As(err, &pe) {
			t.Fatalf("second Complete = %v, want *hosted.ProtocolError", err)
		}
		mustPoisoned(t, tr, &pe)
	})
	t.Run("close", func(t *testing.T) {
		tr, _ := hosted.New(0, 2)
		res := post(context.Background(), tr.Host(), make([]float32, 4))
		op := take(t, tr)
		taking := make(chan error, 1)
		go func() { _, err := tr.Take(context.Background()); taking <- err }()
		tr.Close()
		if err := <-res; !errors.Is(err, comm.ErrClosed) {
			t.Fatalf("AllReduce in flight at Close = %v, want ErrClosed", err)
		}
		if err := <-taking; !errors.Is(err, hosted.ErrClosed) {
			t.Fatalf("Take waiting at Close = %v, want ErrClosed", err)
		}
		if err := tr.Complete(op.ID, 16, nil); !errors.Is(err, hosted.ErrClosed) {
			t.Fatalf("Complete after Close = %v, want ErrClosed", err)
		}
		if err := tr.Host().Barrier(context.Background()); !errors.Is(err, comm.ErrClosed) {
			t.Fatalf("Barrier after Close = %v, want ErrClosed", err)
		}
		if err := tr.Close(); err != nil {
			t.Fatalf("second Close = %v", err)
		}
	})
	t.Run("busy", func(t *testing.T) {
		tr, _ := hosted.New(0, 2)
		res := post(context.Background(), tr.Host(), make([]float32, 4))
		op := take(t, tr)
		var be *comm.BusyError
		if err := tr.Host().Barrier(context.Background()); !errors.As(err, &be) {
			t.Fatalf("a second call in flight = %v, want *comm.BusyError", err)
		}
		tr.Complete(op.ID, 16, nil)
		if err := <-res; err != nil {
			t.Fatal(err)
		}
	})
	t.Run("device wait timeout", func(t *testing.T) {
		tr, _ := hosted.New(0, 2, hosted.WithTimeout(30*time.Millisecond))
		err := tr.Device().Wait(context.Background(), func() (bool, error) { return false, nil })
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("Wait = %v, want a deadline", err)
		}
	})
	t.Run("bad arguments", func(t *testing.T) {
		tr, _ := hosted.New(0, 2)
		var ae *comm.ArgumentError
		for name, err := range map[string]error{
			"AllGather":       tr.Host().AllGather(context.Background(), make([]byte, 3), make([]byte, 2)),
			"AllToAll":        tr.Host().AllToAll(context.Background(), make([]byte, 3), make([]byte, 3)),
			"Broadcast":       tr.Host().Broadcast(context.Background(), nil, 2),
			"ReduceScatter":   tr.Host().ReduceScatter(context.Background(), make([]float32, 2), make([]float32, 3)),
			"device null ptr": tr.Device().AllReduce(context.Background(), 0, 4, 0),
		} {
			if !errors.As(err, &ae) {
				t.Errorf("%s: %v, want *comm.ArgumentError", name, err)
			}
		}
		for _, bad := range [][2]int{{-1, 2}, {2, 2}, {0, 0}, {0, 1 << 16}} {
			if _, err := hosted.New(bad[0], bad[1]); err == nil {
				t.Errorf("New(%d, %d) succeeded", bad[0], bad[1])
			}
		}
	})
}

// recordingDC is a comm.DeviceComm that records the calls it gets.
type recordingDC struct {
	comm.DeviceComm // nil: the methods not overridden panic
	calls           []string
}

func (d *recordingDC) AllGather(_ context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	d.calls = append(d.calls, fmt.Sprintf("AllGather(%#x, %#x, %d, %#x)", dst, src, n, s))
	return nil
}

func (d *recordingDC) AllReduce(_ context.Context, buf gpu.Ptr, n int, s gpu.Stream) error {
	d.calls = append(d.calls, fmt.Sprintf("AllReduce(%#x, %d, %#x)", buf, n, s))
	return nil
}

// TestServeDevice: Serve carries device ops out on the host's device
// communicator, with the caller's pointers, length and stream; without one
// a device op fails with a *hosted.HostError.
func TestServeDevice(t *testing.T) {
	tr, _ := hosted.New(0, 2)
	dc := &recordingDC{}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- hosted.Serve(ctx, tr, nil, dc) }()
	if err := tr.Device().AllGather(context.Background(), 0x2000, 0x1000, 8, 7); err != nil {
		t.Fatal(err)
	}
	if err := tr.Device().AllReduce(context.Background(), 0x3000, 5, 9); err != nil {
		t.Fatal(err)
	}
	cancel()
	<-done
	want := []string{"AllGather(0x2000, 0x1000, 8, 0x7)", "AllReduce(0x3000, 5, 0x9)"}
	if fmt.Sprint(dc.calls) != fmt.Sprint(want) {
		t.Fatalf("device calls %v, want %v", dc.calls, want)
	}

	tr2, _ := hosted.New(0, 2)
	go hosted.Serve(context.Background(), tr2, nil, nil)
	defer tr2.Close()
	var he *hosted.HostError
	if err := tr2.Device().AllReduce(context.Background(), 0x3000, 5, 9); !errors.As(err, &he) {
		t.Fatalf("a device op on a host without a device communicator: %v, want *hosted.HostError", err)
	}
}
