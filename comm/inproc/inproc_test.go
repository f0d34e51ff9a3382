package inproc

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/commtest"
)

// newGroup returns a group of n ranks, closed when the test ends.
func newGroup(t *testing.T, n int) []comm.Comm {
	t.Helper()
	ranks, err := NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		for _, c := range ranks {
			c.Close()
		}
	})
	return ranks
}

// each runs fn on every rank in ranks, one goroutine per rank, and returns
// their errors by rank.
func each(ranks []comm.Comm, fn func(c comm.Comm) error) []error {
	errs := make([]error, len(ranks))
	done := make(chan struct{})
	for i, c := range ranks {
		go func() {
			defer func() { done <- struct{}{} }()
			errs[i] = fn(c)
		}()
	}
	for range ranks {
		<-done
	}
	return errs
}

func noErrors(t *testing.T, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

func TestConformance(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4, 8} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			noErrors(t, each(newGroup(t, n), func(c comm.Comm) error {
				return commtest.Run(ctx, c, commtest.Options{RankOrder: true})
			}))
		})
	}
}

// TestStartedConformance: several collectives in flight (comm.Starter).
func TestStartedConformance(t *testing.T) {
	for _, n := range []int{1, 2, 3, 4} {
		t.Run(fmt.Sprint("n=", n), func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			noErrors(t, each(newGroup(t, n), func(c comm.Comm) error {
				return commtest.RunStarted(ctx, c.(comm.Starter), commtest.Options{RankOrder: true})
			}))
		})
	}
}

// TestStartedFailure: ranks 1 and 2 start a fourth collective that rank
// 0 never makes; rank 1 gives up on it. Rank 1 gets an
// *comm.IncompleteError, rank 2's outstanding request fails with a
// *comm.PoisonedError instead of hanging, and the three collectives every
// rank made complete on every rank, whatever the order of the waits.
func TestStartedFailure(t *testing.T) {
	const n = 3
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	errs := each(newGroup(t, n), func(c comm.Comm) error {
		s := c.(comm.Starter)
		var reqs []comm.Request
		for range 3 {
			q, err := s.StartAllReduce(ctx, make([]float32, 5))
			if err != nil {
				return err
			}
			reqs = append(reqs, q)
		}
		if c.Rank() > 0 {
			q, err := s.StartAllGather(ctx, make([]byte, n), []byte{1})
			if err != nil {
				return err
			}
			wait := ctx
			if c.Rank() == 1 {
				short, stop := context.WithTimeout(ctx, 20*time.Millisecond)
				defer stop()
				wait = short
			}
			err = q.Wait(wait)
			var inc *comm.IncompleteError
			var p *comm.PoisonedError
			switch {
			case c.Rank() == 1 && !errors.As(err, &inc):
				return fmt.Errorf("abandoned wait: %v, want an *IncompleteError", err)
			case c.Rank() == 2 && !errors.As(err, &p):
				return fmt.Errorf("outstanding request after the failure: %v, want a *PoisonedError", err)
			}
		}
		for i := range reqs {
			if err := reqs[len(reqs)-1-i].Wait(ctx); err != nil {
				return fmt.Errorf("request %d, which every rank made: %v", len(reqs)-1-i, err)
			}
		}
		return nil
	})
	noErrors(t, errs)
}

func TestNewGroupSize(t *testing.T) {
	if _, err := NewGroup(0); err == nil || !strings.Contains(err.Error(), "size 0") {
		t.Fatalf("NewGroup(0) = %v, want an error naming size 0", err)
	}
}

// TestBarrierWaitsForAll: no rank leaves a barrier before every rank has
// entered it, over many rounds (the rounds also reuse the rendezvous).
func TestBarrierWaitsForAll(t *testing.T) {
	const n, rounds = 4, 200
	ranks := newGroup(t, n)
	var entered atomic.Int64
	noErrors(t, each(ranks, func(c comm.Comm) error {
		for k := 1; k <= rounds; k++ {
			entered.Add(1)
			if err := c.Barrier(context.Background()); err != nil {
				return err
			}
			if got := entered.Load(); got < int64(k*n) {
				t.Errorf("rank %d left barrier %d after %d entries, want at least %d", c.Rank(), k, got, k*n)
			}
		}
		return nil
	}))
}

// TestDeadRank: rank 3 never calls. Rank 0 (shortest deadline) reports rank
// 3 missing; ranks 1 and 2, whose deadlines are far away, are released at
// once with the same cause; every later call fails fast.
func TestDeadRank(t *testing.T) {
	ranks := newGroup(t, 4)
	deadlines := []time.Duration{50 * time.Millisecond, 30 * time.Second, 30 * time.Second}
	elapsed := make([]time.Duration, 3)
	errs := each(ranks[:3], func(c comm.Comm) error {
		ctx, cancel := context.WithTimeout(context.Background(), deadlines[c.Rank()])
		defer cancel()
		start := time.Now()
		err := c.AllReduce(ctx, make([]float32, 5))
		elapsed[c.Rank()] = time.Since(start)
		return err
	})
	for r, err := range errs {
		if !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), "rank 3 had not arrived") {
			t.Errorf("rank %d: got %v, want a deadline error naming rank 3", r, err)
		}
		if elapsed[r] > time.Second {
			t.Errorf("rank %d returned after %v, want within 50ms (+ slack) of rank 0's deadline", r, elapsed[r])
		}
	}
	var inc *comm.IncompleteError
	if !errors.As(errs[0], &inc) || inc.Rank != 0 || len(inc.Missing) != 1 || inc.Missing[0] != 3 || inc.Op != comm.OpAllReduce {
		t.Errorf("rank 0: got %#v, want *IncompleteError{Op: AllReduce, Rank: 0, Missing: [3]}", errs[0])
	}
	for r := 1; r < 3; r++ {
		var p *comm.PoisonedError
		if !errors.As(errs[r], &p) || p.Rank != r || p.Cause != errs[0] {
			t.Errorf("rank %d: got %v, want *PoisonedError wrapping rank 0's error", r, errs[r])
		}
	}
	// The latecomer and everyone else now fail at once, without a deadline.
	for _, c := range ranks {
		err := c.Barrier(context.Background())
		var p *comm.PoisonedError
		if !errors.As(err, &p) || p.Cause != errs[0] || p.Op != comm.OpBarrier {
			t.Errorf("rank %d after the failure: got %v, want *PoisonedError wrapping %v", c.Rank(), err, errs[0])
		}
	}
}

func TestCancel(t *testing.T) {
	ranks := newGroup(t, 3)
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(20*time.Millisecond, cancel)
	errs := each(ranks[:2], func(c comm.Comm) error {
		return c.AllGather(ctx, make([]byte, 3), []byte{1})
	})
	for r, err := range errs {
		if !errors.Is(err, context.Canceled) || !strings.Contains(err.Error(), "rank 2 had not arrived") {
			t.Errorf("rank %d: got %v, want a cancellation naming rank 2", r, err)
		}
	}
}

// TestMismatch: a rank that disagrees gives every rank the same error naming
// both values, moves no data, and leaves the group usable.
func TestMismatch(t *testing.T) {
	cases := []struct {
		name string
		call func(c comm.Comm) error
		want string
	}{
		{"length", func(c comm.Comm) error {
			l := 12
			if c.Rank() == 2 {
				l = 10
			}
			return c.AllReduce(context.Background(), make([]float32, l))
		}, "AllReduce: ranks disagree on len(buf): rank 0 passed 12, rank 2 passed 10"},
		{"root", func(c comm.Comm) error {
			return c.Broadcast(context.Background(), make([]byte, 4), c.Rank()%2)
		}, "Broadcast: ranks disagree on root: rank 0 passed 0, rank 1 passed 1"},
		{"operation", func(c comm.Comm) error {
			if c.Rank() == 3 {
				return c.Barrier(context.Background())
			}
			return c.AllToAll(context.Background(), make([]byte, 8), make([]byte, 8))
		}, "AllToAll: ranks disagree on operation: rank 0 passed AllToAll, rank 3 passed Barrier"},
		{"chunk", func(c comm.Comm) error {
			m := 2 + c.Rank()/3
			return c.ReduceScatter(context.Background(), make([]float32, m), make([]float32, 4*m))
		}, "ReduceScatter: ranks disagree on len(dst): rank 0 passed 2, rank 3 passed 3"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ranks := newGroup(t, 4)
			for r, err := range each(ranks, tc.call) {
				var m *comm.MismatchError
				if !errors.As(err, &m) || !strings.HasSuffix(err.Error(), tc.want) {
					t.Errorf("rank %d: got %v, want *MismatchError %q", r, err, tc.want)
				}
			}
			usable(t, ranks)
		})
	}
}

// usable checks that ranks still sum correctly.
func usable(t *testing.T, ranks []comm.Comm) {
	t.Helper()
	noErrors(t, each(ranks, func(c comm.Comm) error {
		buf := []float32{float32(c.Rank() + 1)}
		if err := c.AllReduce(context.Background(), buf); err != nil {
			return err
		}
		if n := len(ranks); buf[0] != float32(n*(n+1)/2) {
			t.Errorf("rank %d: sum %v after the error, want %d", c.Rank(), buf[0], n*(n+1)/2)
		}
		return nil
	}))
}

// TestInvalidArguments: the rank with bad arguments fails at once; the
// others get the same error when they arrive; the group stays usable.
func TestInvalidArguments(t *testing.T) {
	shared := make([]byte, 12)
	cases := []struct {
		name string
		call func(c comm.Comm, bad bool) error
		want string
	}{
		{"allgather dst", func(c comm.Comm, bad bool) error {
			dst := make([]byte, 12)
			if bad {
				dst = dst[:11]
			}
			return c.AllGather(context.Background(), dst, make([]byte, 3))
		}, "len(dst) = 11, want Size() × len(src) = 4 × 3 = 12"},
		{"allgather overlap", func(c comm.Comm, bad bool) error {
			dst, src := make([]byte, 12), make([]byte, 3)
			if bad {
				dst, src = shared, shared[9:]
			}
			return c.AllGather(context.Background(), dst, src)
		}, "dst and src overlap"},
		{"reducescatter src", func(c comm.Comm, bad bool) error {
			src := make([]float32, 8)
			if bad {
				src = src[:7]
			}
			return c.ReduceScatter(context.Background(), make([]float32, 2), src)
		}, "len(src) = 7, want Size() × len(dst) = 4 × 2 = 8"},
		{"alltoall unequal", func(c comm.Comm, bad bool) error {
			dst := make([]byte, 8)
			if bad {
				dst = make([]byte, 12)
			}
			return c.AllToAll(context.Background(), dst, make([]byte, 8))
		}, "len(dst) = 12, len(src) = 8, want them equal"},
		{"alltoall multiple", func(c comm.Comm, bad bool) error {
			l := 8
			if bad {
				l = 6
			}
			return c.AllToAll(context.Background(), make([]byte, l), make([]byte, l))
		}, "len(src) = 6 is not a multiple of Size() = 4"},
		{"broadcast root", func(c comm.Comm, bad bool) error {
			root := 0
			if bad {
				root = 4
			}
			return c.Broadcast(context.Background(), make([]byte, 1), root)
		}, "root = 4, want 0 <= root < Size() = 4"},
	}
	const badRank = 1
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ranks := newGroup(t, 4)
			errs := each(ranks, func(c comm.Comm) error { return tc.call(c, c.Rank() == badRank) })
			for r, err := range errs {
				var a *comm.ArgumentError
				if !errors.As(err, &a) || a.Rank != badRank || !strings.HasSuffix(err.Error(), "invalid argument on rank 1: "+tc.want) {
					t.Errorf("rank %d: got %v, want *ArgumentError on rank 1: %s", r, err, tc.want)
				}
			}
			usable(t, ranks)
		})
	}
}

// TestInvalidArgumentReturnsAtOnce: the bad rank does not wait for the
// others.
func TestInvalidArgumentReturnsAtOnce(t *testing.T) {
	ranks := newGroup(t, 2)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	start := time.Now()
	err := ranks[0].Broadcast(ctx, nil, -1)
	if _, ok := err.(*comm.ArgumentError); !ok || time.Since(start) > time.Second {
		t.Fatalf("got %v after %v, want an *ArgumentError at once", err, time.Since(start))
	}
}

// TestClose: Close of one rank releases the others' pending calls and fails
// later calls on every rank, itself included.
func TestClose(t *testing.T) {
	ranks := newGroup(t, 3)
	time.AfterFunc(20*time.Millisecond, func() { ranks[0].Close() })
	errs := each(ranks[1:], func(c comm.Comm) error { return c.Barrier(context.Background()) })
	for i, err := range errs {
		var ce *comm.ClosedError
		if !errors.Is(err, comm.ErrClosed) || !errors.As(err, &ce) || ce.Rank != 0 {
			t.Errorf("rank %d pending: got %v, want an error wrapping *ClosedError{Rank: 0}", i+1, err)
		}
	}
	for _, c := range ranks {
		if err := c.Barrier(context.Background()); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("rank %d after Close: got %v, want ErrClosed", c.Rank(), err)
		}
	}
	if err := ranks[0].Close(); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

// TestBusy: a second call while one is in flight on the same rank is
// rejected and does not disturb the first.
func TestBusy(t *testing.T) {
	ranks := newGroup(t, 2)
	first := make(chan error)
	go func() { first <- ranks[0].AllReduce(context.Background(), []float32{1}) }()
	for inFlight := false; !inFlight; {
		select {
		case <-ranks[0].(*rank).guard.Idle():
			time.Sleep(time.Millisecond)
		default:
			inFlight = true
		}
	}
	err := ranks[0].Barrier(context.Background())
	var b *comm.BusyError
	if !errors.As(err, &b) || b.Pending != comm.OpAllReduce || b.Op != comm.OpBarrier || b.Rank != 0 {
		t.Errorf("got %v, want Barrier on rank 0 rejected while AllReduce is in flight", err)
	}
	buf := []float32{2}
	if err := ranks[1].AllReduce(context.Background(), buf); err != nil || buf[0] != 3 {
		t.Fatalf("rank 1: %v, sum %v, want 3", err, buf[0])
	}
	if err := <-first; err != nil {
		t.Fatal(err)
	}
}

// BenchmarkAllReduce measures a 4-rank AllReduce (SetBytes: one rank's
// buffer) beside a copy of the same bytes, the floor of any implementation.
func BenchmarkAllReduce(b *testing.B) {
	for _, l := range []int{1 << 10, 1 << 20} {
		b.Run(fmt.Sprintf("n=4/%dKiB", l*4>>10), func(b *testing.B) {
			ranks, err := NewGroup(4)
			if err != nil {
				b.Fatal(err)
			}
			bufs := make([][]float32, len(ranks))
			for r := range bufs {
				bufs[r] = make([]float32, l)
			}
			b.SetBytes(int64(4 * l))
			b.ResetTimer()
			for _, err := range each(ranks, func(c comm.Comm) error {
				for range b.N {
					if err := c.AllReduce(context.Background(), bufs[c.Rank()]); err != nil {
						return err
					}
				}
				return nil
			}) {
				if err != nil {
					b.Fatal(err)
				}
			}
		})
		b.Run(fmt.Sprintf("copy/%dKiB", l*4>>10), func(b *testing.B) {
			src, dst := make([]float32, l), make([]float32, l)
			b.SetBytes(int64(4 * l))
			for b.Loop() {
				copy(dst, src)
			}
		})
	}
}

func TestNodeGroupTopology(t *testing.T) {
	ranks, err := NewNodeGroup([]int{5, 5, 9, 9})
	if err != nil {
		t.Fatal(err)
	}
	for r, c := range ranks {
		got := c.(comm.Topologist).Topology()
		want := comm.Topology{Node: r / 2, Nodes: 2, LocalRank: r % 2, LocalSize: 2}
		if got != want {
			t.Errorf("rank %d: Topology %+v, want %+v", r, got, want)
		}
	}
	ranks, err = NewGroup(3)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := ranks[2].(comm.Topologist).Topology(), (comm.Topology{Node: 0, Nodes: 1, LocalRank: 2, LocalSize: 3}); got != want {
		t.Errorf("NewGroup rank 2: Topology %+v, want %+v", got, want)
	}
	if _, err := NewNodeGroup([]int{0, 0, 1}); err == nil {
		t.Error("unequal node sizes: no error")
	}
}

// TestSplit: commtest.RunSplit on layouts of 2×2, 2×4, 4×2, 3×1, 1×3 and
// 1×1 ranks (nodes × ranks per node) and on ranks whose nodes interleave.
func TestSplit(t *testing.T) {
	for _, nodeOf := range [][]int{{0, 0, 1, 1}, {0, 0, 0, 0, 1, 1, 1, 1}, {0, 0, 1, 1, 2, 2, 3, 3}, {0, 1, 2}, {0, 0, 0}, {0}, {5, 7, 5, 7}} {
		t.Run(fmt.Sprint(nodeOf), func(t *testing.T) {
			ranks, err := NewNodeGroup(nodeOf)
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for r, c := range ranks {
				wg.Go(func() {
					ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
					defer cancel()
					if err := commtest.RunSplit(ctx, c, commtest.Options{RankOrder: true}); err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestSplitDeadline: a rank that never calls Split ends the others' Split
// at their deadline with an error naming Split, the rank and the missing
// rank, and the parent is poisoned.
func TestSplitDeadline(t *testing.T) {
	ranks, err := NewNodeGroup([]int{0, 0, 1, 1})
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for r, c := range ranks[:3] {
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
			defer cancel()
			_, _, err := c.(comm.Splitter).Split(ctx)
			var inc *comm.IncompleteError
			var p *comm.PoisonedError
			switch {
			case errors.As(err, &inc):
				if !errors.Is(err, context.DeadlineExceeded) || !slices.Equal(inc.Missing, []int{3}) {
					t.Errorf("rank %d: got %v, want the deadline with rank 3 missing", r, err)
				}
			case !errors.As(err, &p):
				t.Errorf("rank %d: got %v, want an *IncompleteError or a *PoisonedError", r, err)
			}
			if want := fmt.Sprintf("inproc: Split on rank %d: ", r); err == nil || !strings.HasPrefix(err.Error(), want) {
				t.Errorf("rank %d: got %v, want it prefixed %q", r, err, want)
			}
			if err := c.Barrier(context.Background()); !errors.As(err, &p) {
				t.Errorf("rank %d: Barrier after the failed Split: got %v, want a *PoisonedError", r, err)
			}
		})
	}
	wg.Wait()
}
