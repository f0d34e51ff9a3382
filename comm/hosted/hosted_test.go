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
// on an in-process group, until the test ends: each rank's ServeGroup
// takes them, or, with launched, Launch carries each out as it is posted.
func servedGroup(t *testing.T, n int, launched bool) []*hosted.Transport {
	t.Helper()
	inner, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	ts := make([]*hosted.Transport, n)
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	var stops []func() error
	for r := range n {
		if ts[r], err = hosted.New(r, n); err != nil {
			t.Fatal(err)
		}
		if launched {
			stop, err := hosted.Launch(ctx, ts[r], hosted.GroupWorld, inner[r], nil)
			if err != nil {
				t.Fatal(err)
			}
			stops = append(stops, stop)
			continue
		}
		wg.Go(func() {
			if err := hosted.Serve(ctx, ts[r], inner[r], nil); err != nil {
				t.Errorf("rank %d: Serve: %v", r, err)
			}
		})
	}
	t.Cleanup(func() {
		for r, stop := range stops {
			if err := stop(); err != nil {
				t.Errorf("rank %d: Launch's stop: %v", r, err)
			}
		}
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
		ts := servedGroup(t, n, false)
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

// hierGroup returns n hosted transports of nodes of k ranks (rank r on node
// r/k), each with Go hosts for its three groups on in-process groups of
// the same ranks (the world's, and its Split's node and cross groups),
// until the test ends.
func hierGroup(t *testing.T, n, k int) []*hosted.Transport {
	t.Helper()
	nodeOf := make([]int, n)
	for r := range nodeOf {
		nodeOf[r] = r / k
	}
	world, err := inproc.NewNodeGroup(nodeOf)
	if err != nil {
		t.Fatal(err)
	}
	node, cross := make([]comm.Comm, n), make([]comm.Comm, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() {
			var err error
			if node[r], cross[r], err = world[r].(comm.Splitter).Split(context.Background()); err != nil {
				t.Errorf("rank %d: inproc Split: %v", r, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ts := make([]*hosted.Transport, n)
	ctx, cancel := context.WithCancel(context.Background())
	for r := range n {
		topo := world[r].(comm.Topologist).Topology()
		if ts[r], err = hosted.New(r, n, hosted.WithTopology(topo)); err != nil {
			t.Fatal(err)
		}
		for g, c := range []comm.Comm{world[r], node[r], cross[r]} {
			wg.Go(func() {
				if err := hosted.ServeGroup(ctx, ts[r], g, c, nil); err != nil {
					t.Errorf("rank %d group %d: ServeGroup: %v", r, g, err)
				}
			})
		}
	}
	t.Cleanup(func() {
		cancel()
		for _, tr := range ts {
			tr.Close()
		}
		wg.Wait()
		for _, cs := range [][]comm.Comm{world, node, cross} {
			for _, c := range cs {
				c.Close()
			}
		}
	})
	return ts
}

// TestSplit: a transport with a topology splits into node and cross groups
// whose posts carry their group ids, run at once on their own queues, and
// pass comm's conformance suite, each on its own ranks.
func TestSplit(t *testing.T) {
	const n, k = 4, 2
	ts := hierGroup(t, n, k)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r, tr := range ts {
		wg.Go(func() {
			c := tr.Host()
			topo := c.(comm.Topologist).Topology()
			if want := (comm.Topology{Node: r / k, Nodes: n / k, LocalRank: r % k, LocalSize: k}); topo != want {
				errs[r] = fmt.Errorf("Topology() = %+v, want %+v", topo, want)
				return
			}
			node, cross, err := c.(comm.Splitter).Split(context.Background())
			if err != nil {
				errs[r] = err
				return
			}
			defer node.Close()
			defer cross.Close()
			if node.Rank() != r%k || node.Size() != k || cross.Rank() != r/k || cross.Size() != n/k {
				errs[r] = fmt.Errorf("node %d of %d, cross %d of %d", node.Rank(), node.Size(), cross.Rank(), cross.Size())
				return
			}
			if _, _, err := c.(comm.Splitter).Split(context.Background()); err == nil {
				errs[r] = errors.New("a second Split with the first's comms open succeeded")
				return
			}
			// The three groups at once, each from its own goroutine.
			var inner sync.WaitGroup
			gerrs := make([]error, 3)
			for g, gc := range []comm.Comm{c, node, cross} {
				inner.Go(func() { gerrs[g] = commtest.Run(context.Background(), gc, commtest.Options{RankOrder: true}) })
			}
			inner.Wait()
			errs[r] = errors.Join(gerrs...)
		})
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d: %v", r, err)
		}
	}
}

// TestSplitGroups: posts carry their group ids; TakeGroup takes one
// group's; a failure of one group poisons it alone; closing a split comm
// leaves the world working, and a completion of its abandoned op says
// closed without poisoning anything.
func TestSplitGroups(t *testing.T) {
	tr, err := hosted.New(1, 4, hosted.WithTopology(comm.Topology{Node: 0, Nodes: 2, LocalRank: 1, LocalSize: 2}))
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	node, cross, err := tr.Split(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	// A split comm's device face posts on its group.
	ndc := node.(comm.DeviceHost).Device()
	if ndc.Rank() != 1 || ndc.Size() != 2 {
		t.Errorf("node device comm: rank %d of %d, want 1 of 2", ndc.Rank(), ndc.Size())
	}
	devDone := make(chan error, 1)
	go func() { devDone <- ndc.AllReduce(ctx, 0x1000, 4, 7) }()
	dop := take(t, tr)
	if dop.Group != hosted.GroupNode || !dop.Device || dop.Count != 4 {
		t.Errorf("node device op %+v, want group node, device, 4 elements", dop)
	}
	if err := tr.Complete(dop.ID, dop.RecvBytes, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-devDone; err != nil {
		t.Errorf("node device AllReduce = %v", err)
	}
	nodeDone := post(ctx, node, make([]float32, 3))
	crossDone := post(ctx, cross, make([]float32, 5))
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	if op, err := tr.TakeGroup(short, hosted.GroupWorld); err == nil {
		t.Errorf("TakeGroup(world) with only split posts = %v", op)
	}
	cancel()
	cop := func() hosted.Op {
		ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		op, err := tr.TakeGroup(ctx, hosted.GroupCross)
		if err != nil {
			t.Fatal(err)
		}
		return op
	}()
	if cop.Group != hosted.GroupCross || cop.Count != 5 {
		t.Errorf("cross op %v: group %d", cop, cop.Group)
	}
	nop := take(t, tr)
	if nop.Group != hosted.GroupNode || nop.Count != 3 {
		t.Errorf("node op %v: group %d", nop, nop.Group)
	}
	// The node op fails: the node group is poisoned, the others are not.
	if err := tr.Complete(nop.ID, 0, errors.New("boom")); err != nil {
		t.Fatal(err)
	}
	var herr *hosted.HostError
	if err := <-nodeDone; !errors.As(err, &herr) {
		t.Errorf("node AllReduce = %v, want a *HostError", err)
	}
	if err := node.Barrier(ctx); !errors.As(err, new(*comm.PoisonedError)) {
		t.Errorf("node Barrier after the failure = %v, want poisoned", err)
	}
	if err := tr.Complete(cop.ID, cop.RecvBytes, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-crossDone; err != nil {
		t.Errorf("cross AllReduce = %v", err)
	}
	// Closing the cross comm with an op taken: its completion says closed,
	// and the world still works.
	crossDone = post(ctx, cross, make([]float32, 2))
	cop = take(t, tr)
	cross.Close()
	if err := <-crossDone; !errors.Is(err, hosted.ErrClosed) {
		t.Errorf("cross AllReduce ended by Close = %v", err)
	}
	if err := tr.Complete(cop.ID, cop.RecvBytes, nil); !errors.Is(err, hosted.ErrClosed) {
		t.Errorf("Complete of a closed group's op = %v, want ErrClosed", err)
	}
	worldDone := post(ctx, tr.Host(), make([]float32, 1))
	wop := take(t, tr)
	if err := tr.Complete(wop.ID, wop.RecvBytes, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-worldDone; err != nil || wop.Group != hosted.GroupWorld {
		t.Errorf("world AllReduce after the cross group closed = %v (group %d)", err, wop.Group)
	}
	// Still open: the node comm; a new Split waits for it.
	if _, _, err := tr.Split(ctx); err == nil {
		t.Error("Split with the node comm open succeeded")
	}
	node.Close()
	n2, c2, err := tr.Split(ctx)
	if err != nil {
		t.Fatalf("Split after closing both: %v", err)
	}
	n2.Close()
	c2.Close()
}

// TestTopologyRefused: a topology that does not cover the ranks, and a
// Split without one.
func TestTopologyRefused(t *testing.T) {
	if _, err := hosted.New(0, 4, hosted.WithTopology(comm.Topology{Node: 0, Nodes: 3, LocalRank: 0, LocalSize: 2})); err == nil {
		t.Error("3 nodes × 2 on 4 ranks accepted")
	}
	if _, err := hosted.New(0, 4, hosted.WithTopology(comm.Topology{Node: 2, Nodes: 2, LocalRank: 0, LocalSize: 2})); err == nil {
		t.Error("node 2 of 2 accepted")
	}
	tr, err := hosted.New(0, 4)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Close()
	if _, _, err := tr.Split(context.Background()); err == nil {
		t.Error("Split without a topology succeeded")
	}
}

// TestStartedConformance: the hosted transport as a comm.Starter, served
// by Go hosts that start each post on comm/inproc and complete it when it
// finishes (out of post order where it finishes first), passes the
// several-in-flight conformance suite, the posts taken (ServeGroup) or
// launched as they are made (Launch).
func TestStartedConformance(t *testing.T) {
	for _, launched := range []bool{false, true} {
		for _, n := range []int{1, 2, 3} {
			ts := servedGroup(t, n, launched)
			errs := make([]error, n)
			var wg sync.WaitGroup
			for r, tr := range ts {
				wg.Go(func() {
					errs[r] = commtest.RunStarted(context.Background(), tr.Host().(comm.Starter), commtest.Options{RankOrder: true})
				})
			}
			wg.Wait()
			for r, err := range errs {
				if err != nil {
					t.Errorf("launched %v, %d ranks, rank %d: %v", launched, n, r, err)
				}
			}
		}
	}
}

// TestLauncher: SetLauncher hands posts over in post order as they are
// made, lets the launcher complete an op from within (a failed launch),
// refuses a group that does not exist, and nil goes back to Take.
func TestLauncher(t *testing.T) {
	tr, _ := hosted.New(0, 2, hosted.WithInFlight(8))
	if err := tr.SetLauncher(3, func(hosted.Op) {}); err == nil {
		t.Fatal("SetLauncher of group 3 succeeded")
	}
	var mu sync.Mutex
	var ids []uint64
	var ops []hosted.Op
	if err := tr.SetLauncher(hosted.GroupWorld, func(op hosted.Op) {
		mu.Lock()
		defer mu.Unlock()
		ids = append(ids, op.ID)
		ops = append(ops, op)
	}); err != nil {
		t.Fatal(err)
	}
	reqs := make([]comm.Request, 4)
	var wg sync.WaitGroup
	for i := range reqs { // concurrent posters: the launcher still gets them in id order
		wg.Go(func() {
			q, err := tr.Host().(comm.Starter).StartAllReduce(context.Background(), []float32{1})
			if err != nil {
				t.Error(err)
				return
			}
			reqs[i] = q
		})
	}
	wg.Wait()
	for i, id := range ids {
		if id != uint64(i+1) {
			t.Fatalf("launched ids %v, want 1 to 4 in order", ids)
		}
	}
	if len(ids) != 4 {
		t.Fatalf("launched %v, want 4 ops", ids)
	}
	for i := len(ops) - 1; i >= 0; i-- {
		hosted.Float32s(ops[i].Recv)[0] = 2
		if err := tr.Complete(ops[i].ID, 4, nil); err != nil {
			t.Fatal(err)
		}
	}
	for i, q := range reqs {
		if err := q.Wait(context.Background()); err != nil {
			t.Fatalf("request %d: %v", i, err)
		}
	}

	// A launch that fails completes its op from within the launcher.
	if err := tr.SetLauncher(hosted.GroupWorld, func(op hosted.Op) {
		if err := tr.Complete(op.ID, 0, errors.New("gloo: no such device")); err != nil {
			t.Error(err)
		}
	}); err != nil {
		t.Fatal(err)
	}
	var he *hosted.HostError
	if err := tr.Host().AllReduce(context.Background(), []float32{1}); !errors.As(err, &he) {
		t.Fatalf("an all-reduce whose launch failed: %v, want a *HostError", err)
	}

	// nil: later posts queue for Take again.
	tr2, _ := hosted.New(0, 2)
	tr2.SetLauncher(hosted.GroupWorld, func(hosted.Op) { t.Error("the cleared launcher was called") })
	if err := tr2.SetLauncher(hosted.GroupWorld, nil); err != nil {
		t.Fatal(err)
	}
	done := post(context.Background(), tr2.Host(), []float32{1})
	op := take(t, tr2)
	if err := tr2.Complete(op.ID, 4, nil); err != nil {
		t.Fatal(err)
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// startN starts n all-reduces of one element on tr, returning the
// requests and their buffers.
func startN(t *testing.T, tr *hosted.Transport, n int) ([]comm.Request, [][]float32) {
	t.Helper()
	s := tr.Host().(comm.Starter)
	var reqs []comm.Request
	var bufs [][]float32
	for i := range n {
		buf := []float32{float32(i)}
		q, err := s.StartAllReduce(context.Background(), buf)
		if err != nil {
			t.Fatalf("start %d: %v", i, err)
		}
		reqs, bufs = append(reqs, q), append(bufs, buf)
	}
	return reqs, bufs
}

// TestStartedHost: a host completing several outstanding posts out of
// order, twice, never, or with an error.
func TestStartedHost(t *testing.T) {
	waitAll := func(reqs []comm.Request, ctx context.Context) []error {
		errs := make([]error, len(reqs))
		for i, q := range reqs {
			errs[i] = q.Wait(ctx)
		}
		return errs
	}
	t.Run("out of order", func(t *testing.T) {
		tr, _ := hosted.New(0, 1, hosted.WithInFlight(3))
		reqs, bufs := startN(t, tr, 3)
		var busy *comm.BusyError
		if _, err := tr.Host().(comm.Starter).StartAllReduce(context.Background(), make([]float32, 1)); !errors.As(err, &busy) || busy.Started != 3 {
			t.Fatalf("a fourth start with WithInFlight(3): %v, want a *comm.BusyError with Started 3", err)
		}
		ops := []hosted.Op{take(t, tr), take(t, tr), take(t, tr)}
		for i := 2; i >= 0; i-- {
			hosted.Float32s(ops[i].Recv)[0] += 10
			if err := tr.Complete(ops[i].ID, 4, nil); err != nil {
				t.Fatal(err)
			}
		}
		for i, err := range waitAll(reqs, context.Background()) {
			if err != nil || bufs[i][0] != float32(i+10) {
				t.Fatalf("request %d: %v, buffer %v", i, err, bufs[i])
			}
		}
	})
	t.Run("one of several fails", func(t *testing.T) {
		tr, _ := hosted.New(0, 2)
		reqs, _ := startN(t, tr, 3)
		a, b := take(t, tr), take(t, tr) // the third is never taken
		if err := tr.Complete(a.ID, 4, nil); err != nil {
			t.Fatal(err)
		}
		if err := tr.Complete(b.ID, 0, errors.New("gloo: connection reset by peer")); err != nil {
			t.Fatal(err)
		}
		errs := waitAll(reqs, context.Background())
		var he *hosted.HostError
		var pe *comm.PoisonedError
		if errs[0] != nil || !errors.As(errs[1], &he) || !errors.As(errs[2], &pe) || !errors.As(errs[2], &he) {
			t.Fatalf("waits: %v; want nil (complete before), the *HostError, a *PoisonedError wrapping it", errs)
		}
		tctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if op, err := tr.Take(tctx); err == nil {
			t.Fatalf("Take after the failure returned %v: the failed group's posts must leave the queue", op)
		}
		mustPoisoned(t, tr, &he)
	})
	t.Run("completed twice", func(t *testing.T) {
		tr, _ := hosted.New(0, 2)
		reqs, _ := startN(t, tr, 2)
		a, _ := take(t, tr), take(t, tr)
		if err := tr.Complete(a.ID, 4, nil); err != nil {
			t.Fatal(err)
		}
		var perr *hosted.ProtocolError
		if err := tr.Complete(a.ID, 4, nil); !errors.As(err, &perr) {
			t.Fatalf("second completion: %v, want a *ProtocolError", err)
		}
		errs := waitAll(reqs, context.Background())
		if errs[0] != nil || !errors.As(errs[1], &perr) {
			t.Fatalf("waits: %v; want nil, then a failure wrapping the *ProtocolError", errs)
		}
	})
	t.Run("never completed", func(t *testing.T) {
		tr, _ := hosted.New(0, 2)
		reqs, _ := startN(t, tr, 2)
		take(t, tr)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		t0 := time.Now()
		errs := waitAll(reqs, ctx)
		var ie *comm.IncompleteError
		var pe *comm.PoisonedError
		if !errors.As(errs[0], &ie) || !errors.As(errs[1], &pe) || time.Since(t0) > 5*time.Second {
			t.Fatalf("waits: %v after %v; want an *IncompleteError, then a *PoisonedError, at once", errs, time.Since(t0))
		}
	})
}
