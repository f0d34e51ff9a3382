package overlap

import (
	"context"
	"errors"
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/hosted"
)

// oneAtATimeComm hides a comm's comm.Starter: the engine's wire then
// waits for every collective before it makes the next.
type oneAtATimeComm struct{ comm.Comm }

// inFlightSizes are buckets of lengths no handshake collective has.
var inFlightSizes = []int{1001, 2003, 3005, 517}

// inFlightShapes are inFlightSizes' tensors, for low-rank (every matrix
// compressed at rank 2; bucket 1 begins with a bias of 3).
var inFlightShapes = [][]Shape{{{7, 143}}, {{1, 3}, {40, 50}}, {{5, 601}}, {{11, 47}}}

// TestWireInFlight: with its last collectives in flight (comm/inproc and
// the hosted transport with different InFlight on different ranks), every
// strategy gives bit for bit what the wire gives one collective at a
// time, a non-finite gradient's dense fallback included, over three steps.
func TestWireInFlight(t *testing.T) {
	for _, spec := range []string{"none", "int8", "int4", "topk:0.05", "randomk:0.25", "fp16", "sign", "powersgd:2"} {
		t.Run(spec, func(t *testing.T) {
			cfg := Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Timeout: 20 * time.Second, Shapes: inFlightShapes}
			const n = 3
			serial := group(t, n)
			for r := range serial {
				serial[r] = oneAtATimeComm{serial[r]}
			}
			inner := group(t, n)
			viaHost := make([]comm.Comm, n)
			for r := range viaHost {
				tr, err := hosted.New(r, n, hosted.WithInFlight(2+r))
				if err != nil {
					t.Fatal(err)
				}
				serve(t, tr, inner[r], nil)
				viaHost[r] = tr.Host()
			}
			runs := [][]*Engine{
				newEnginesOn(t, serial, inFlightSizes, cfg),
				newEnginesOn(t, group(t, n), inFlightSizes, cfg),
				newEnginesOn(t, viaHost, inFlightSizes, cfg),
			}
			for s := range 3 {
				var want [][][]float32
				var wantStats []StepStats
				for k, engines := range runs {
					grads := stepGrads(n, s, inFlightSizes)
					if s == 1 {
						grads[2][1][7] = float32(math.NaN()) // bucket 1 goes dense this step
					}
					stats, errs := runStep(engines, grads, reversedOnOdd(len(inFlightSizes)))
					mustNoErrors(t, fmt.Sprintf("step %d, run %d", s, k), errs)
					if k == 0 {
						want, wantStats = grads, stats
						if s == 1 && !stats[0].Buckets[1].NonFinite {
							t.Fatalf("step 1: bucket 1 not reported non-finite")
						}
						continue
					}
					for r := range n {
						for b := range inFlightSizes {
							if i := sameFloats(grads[r][b], want[r][b]); i >= 0 {
								t.Fatalf("step %d, run %d, rank %d, bucket %d: element %d is %v, one at a time %v", s, k, r, b, i, grads[r][b][i], want[r][b][i])
							}
							got, w := stats[r].Buckets[b], wantStats[r].Buckets[b]
							if got.Compressed != w.Compressed || got.NonFinite != w.NonFinite || got.BytesSent != w.BytesSent {
								t.Fatalf("step %d, run %d, rank %d, bucket %d: compressed %v, non-finite %v, %d bytes; one at a time %v, %v, %d",
									s, k, r, b, got.Compressed, got.NonFinite, got.BytesSent, w.Compressed, w.NonFinite, w.BytesSent)
							}
						}
					}
				}
			}
		})
	}
}

// TestWireStartsBeforeWaiting: the wire starts a bucket's collective
// before the previous bucket's has completed. Each rank's host holds the
// first bucket's all-reduce until it has taken the second one's, so an
// engine that waited for each collective before the next would time out.
func TestWireStartsBeforeWaiting(t *testing.T) {
	const n = 2
	inner := group(t, n)
	comms := make([]comm.Comm, n)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	hostErr := make(chan error, n)
	for r := range comms {
		tr, err := hosted.New(r, n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { tr.Close() })
		comms[r] = tr.Host()
		c := inner[r].(comm.Starter)
		go func() { hostErr <- pairingHost(ctx, tr, c, inFlightSizes[0]) }()
	}
	engines := newEnginesOn(t, comms, inFlightSizes, Config{Spec: "none", Timeout: 10 * time.Second})
	grads := stepGrads(n, 0, inFlightSizes)
	want := clone3(grads)
	_, errs := runStep(engines, grads, inOrder(len(inFlightSizes)))
	mustNoErrors(t, "step", errs)
	for r := range n {
		if err := <-hostErr; err != nil {
			t.Fatalf("host: %v", err)
		}
		for b := range inFlightSizes {
			avg := exactAverage(want, b)
			for i, v := range grads[r][b] {
				if math.Abs(float64(v)-avg[i]) > 1e-6*(1+math.Abs(avg[i])) {
					t.Fatalf("rank %d bucket %d element %d: %v, want %v", r, b, i, v, avg[i])
				}
			}
		}
	}
}

// pairingHost serves tr on c one post at a time, except the all-reduce of
// first floats: it takes the next post before it carries that one out,
// and fails if none comes. It returns after carrying out that pair.
func pairingHost(ctx context.Context, tr *hosted.Transport, c comm.Starter, first int) error {
	for {
		op, err := tr.Take(ctx)
		if err != nil {
			return err
		}
		if op.Kind != comm.OpAllReduce || op.Count != first {
			n, err := hosted.Run(ctx, op, c)
			if err := tr.Complete(op.ID, n, err); err != nil {
				return err
			}
			continue
		}
		wait, stop := context.WithTimeout(ctx, 5*time.Second)
		next, err := tr.Take(wait)
		stop()
		if err != nil {
			return fmt.Errorf("no second post while the all-reduce of bucket 0 was in flight: %w", err)
		}
		for _, o := range []hosted.Op{op, next} {
			n, err := hosted.Run(ctx, o, c)
			if err := tr.Complete(o.ID, n, err); err != nil {
				return err
			}
		}
		go hosted.Serve(ctx, tr, c, nil)
		return nil
	}
}

// TestDelegate: in warm-up every bucket is Delegable on every rank; a
// caller that all-reduces some buckets itself and readies the others gets
// the averages, the statistics say which it exchanged, and the error
// feedback memory is untouched. A compressed bucket is not Delegable, and
// Delegate refuses it without taking it.
func TestDelegate(t *testing.T) {
	const n = 2
	cfg := Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed, Warmup: 1}
	engines := newEngines(t, n, inFlightSizes, cfg)
	own := group(t, n)
	grads := stepGrads(n, 0, inFlightSizes)
	want := clone3(grads)
	stats := make([]StepStats, n)
	errs := onRanks(own, func(r int, c comm.Comm) error {
		e := engines[r]
		if err := e.Step(); err != nil {
			return err
		}
		for b := range inFlightSizes {
			if !e.Delegable(b) {
				return fmt.Errorf("warm-up bucket %d not Delegable", b)
			}
			if b%2 == 1 {
				if err := e.Ready(b, grads[r][b]); err != nil {
					return err
				}
				continue
			}
			if err := c.AllReduce(context.Background(), grads[r][b]); err != nil {
				return err
			}
			for i := range grads[r][b] {
				grads[r][b][i] /= n
			}
			if err := e.Delegate(b); err != nil {
				return err
			}
			if err := e.DelegateDone(b); err != nil {
				return err
			}
			if err := e.DelegateDone(b); !errors.Is(err, ErrAlreadyReady) {
				return fmt.Errorf("a second DelegateDone(%d): %v, want ErrAlreadyReady", b, err)
			}
		}
		if err := e.DelegateDone(1); !errors.Is(err, ErrNotDelegated) {
			return fmt.Errorf("DelegateDone of a bucket readied: %v, want ErrNotDelegated", err)
		}
		var err error
		stats[r], err = e.Wait(context.Background())
		return err
	})
	mustNoErrors(t, "step 0", errs)
	for r := range n {
		for b := range inFlightSizes {
			avg := exactAverage(want, b)
			for i, v := range grads[r][b] {
				if math.Abs(float64(v)-avg[i]) > 1e-6*(1+math.Abs(avg[i])) {
					t.Fatalf("rank %d bucket %d element %d: %v, want %v", r, b, i, v, avg[i])
				}
			}
			s := stats[r].Buckets[b]
			if s.Delegated != (b%2 == 0) || s.Compressed || s.BytesSent != allReduceVolume(n, 4*inFlightSizes[b]) {
				t.Errorf("rank %d bucket %d: delegated %v, compressed %v, %d bytes", r, b, s.Delegated, s.Compressed, s.BytesSent)
			}
		}
		if got := engines[r].gradEF.Buckets(); len(got) != 0 {
			t.Fatalf("rank %d: a dense step left error feedback memory for buckets %v", r, got)
		}
	}
	// Step 1 compresses: nothing is Delegable, Delegate refuses.
	errs = onRanks(own, func(r int, c comm.Comm) error {
		e := engines[r]
		if err := e.Step(); err != nil {
			return err
		}
		if e.Delegable(0) {
			return fmt.Errorf("compressed bucket 0 Delegable")
		}
		if err := e.Delegate(0); !errors.Is(err, ErrNotDelegable) {
			return fmt.Errorf("Delegate of a compressed bucket: %v, want ErrNotDelegable", err)
		}
		for b := range inFlightSizes {
			if err := e.Ready(b, grads[r][b]); err != nil {
				return err
			}
		}
		_, err := e.Wait(context.Background())
		return err
	})
	mustNoErrors(t, "step 1", errs)
}

// TestDelegateNeverDone: a caller that delegates a bucket and never
// reports it done gets a *StepError from Wait within Config.Timeout on
// every rank, instead of a Wait that never returns.
func TestDelegateNeverDone(t *testing.T) {
	const n, timeout = 2, 100 * time.Millisecond
	engines := newEngines(t, n, inFlightSizes, Config{Spec: "none", Timeout: timeout})
	grads := stepGrads(n, 0, inFlightSizes)
	errs := onRanks(make([]comm.Comm, n), func(r int, _ comm.Comm) error {
		e := engines[r]
		if err := e.Step(); err != nil {
			return err
		}
		for b := range inFlightSizes {
			var err error
			if b == 2 {
				err = e.Delegate(b)
			} else {
				err = e.Ready(b, grads[r][b])
			}
			if err != nil {
				return err
			}
		}
		t0 := time.Now()
		_, err := e.Wait(context.Background())
		var se *StepError
		if !errors.As(err, &se) || se.Bucket != 2 || se.Stage != "delegated all-reduce" {
			return fmt.Errorf("Wait: %v, want a *StepError of bucket 2's delegated all-reduce", err)
		}
		return within(time.Since(t0), timeout+time.Second)
	})
	mustNoErrors(t, "step", errs)
}
