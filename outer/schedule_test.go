package outer

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
)

// TestStreamingSchedule: F = 4, H = 8, τ = 1: fragment f starts at
// ⌊(f+1)·8/4⌋ = 2, 4, 6, 8 and every 8 steps after, each finishing one
// step later, as every rank's Reports say; between its start and its
// finish a fragment's exchange is in flight (its engine's step open).
func TestStreamingSchedule(t *testing.T) {
	q := quad{sizes: []int{3, 9, 4, 4, 7, 2, 5, 6}}
	loops, params := setup(t, q, 2, Config{SyncEvery: 8, Fragments: 4, Delay: 1, Engine: dense})
	want := map[int][2][]int{ // s: started, finished
		2: {{0}, nil}, 3: {nil, {0}}, 4: {{1}, nil}, 5: {nil, {1}}, 6: {{2}, nil}, 7: {nil, {2}},
		8: {{3}, nil}, 9: {nil, {3}}, 10: {{0}, nil}, 11: {nil, {0}}, 12: {{1}, nil}, 13: {nil, {1}},
		14: {{2}, nil}, 15: {nil, {2}}, 16: {{3}, nil}, 17: {nil, {3}}, 18: {{0}, nil}, 19: {nil, {0}}, 20: {{1}, nil},
	}
	inFlight := make([][]string, 2) // per rank, after each step: the fragments with an exchange in flight
	reports := train(t, q, loops, params, 0, 20, func(r, k int) {
		if k == 0 {
			return
		}
		var open []string
		for _, f := range loops[r].frags {
			if f.flight != nil {
				open = append(open, fmt.Sprint(f.idx, "@", f.flight.started))
			}
		}
		inFlight[r] = append(inFlight[r], fmt.Sprint(k, ":", open))
	})
	for r := range loops {
		for k, rep := range reports[r] {
			s := k + 1
			var finished []int
			for _, f := range rep.Finished {
				finished = append(finished, f.Fragment)
				if f.Started != uint64(s-1) || f.Skipped != nil || f.Stats.BytesSent == 0 {
					t.Errorf("rank %d, step %d: %+v, want started at %d, applied, bytes sent", r, s, f, s-1)
				}
			}
			w := want[s]
			if rep.Step != uint64(s) || !slices.Equal(rep.Started, w[0]) || !slices.Equal(finished, w[1]) {
				t.Errorf("rank %d, step %d: report step %d, started %v, finished %v; want started %v, finished %v", r, s, rep.Step, rep.Started, finished, w[0], w[1])
			}
		}
		// After step s (before the Step of s+1, k = s): the fragment started
		// at s is in flight when s is a start step.
		for k := 1; k < 20; k++ {
			var open []string
			if w := want[k]; len(w[0]) == 1 {
				open = []string{fmt.Sprint(w[0][0], "@", k)}
			}
			if got, w := inFlight[r][k-1], fmt.Sprint(k, ":", open); got != w {
				t.Errorf("rank %d: in flight after step %s, want %s", r, got, w)
			}
		}
	}
}

// TestDue: before every Step, Due names the fragments that Step then
// reports started and finished, for streaming (τ = 1) and for F > H with
// τ = 0 (several fragments at one step, each finished at once); with the
// default layout FragmentOf is the balanced one and Fragments F.
func TestDue(t *testing.T) {
	q := quad{sizes: []int{3, 9, 4, 4, 7, 2}}
	for _, cfg := range []Config{
		{SyncEvery: 6, Fragments: 3, Delay: 1, Engine: dense},
		{SyncEvery: 2, Fragments: 3, Engine: dense},
	} {
		loops, params := setup(t, q, 2, cfg)
		if got := loops[0].FragmentOf(); loops[0].Fragments() != cfg.Fragments || !slices.Equal(got, balanced(q.sizes, cfg.Fragments)) {
			t.Errorf("%+v: %d fragments, layout %v; want %d, %v", cfg, loops[0].Fragments(), got, cfg.Fragments, balanced(q.sizes, cfg.Fragments))
		}
		due := make([][2][]int, 2) // per rank, before the next Step
		for k := range 14 {
			for r, l := range loops {
				due[r][0], due[r][1] = l.Due()
			}
			reports := train(t, q, loops, params, k, 1, nil)
			for r := range loops {
				rep := reports[r][0]
				var finished []int
				for _, f := range rep.Finished {
					finished = append(finished, f.Fragment)
				}
				if !slices.Equal(due[r][0], rep.Started) || !slices.Equal(due[r][1], finished) {
					t.Errorf("H %d, F %d, τ %d, step %d, rank %d: Due said starts %v, finishes %v; Step started %v, finished %v",
						cfg.SyncEvery, cfg.Fragments, cfg.Delay, rep.Step, r, due[r][0], due[r][1], rep.Started, finished)
				}
			}
		}
	}
}

// TestOffsets: the schedule's first sync steps and start steps.
func TestOffsets(t *testing.T) {
	for _, tc := range []struct {
		h, f   int
		starts [][]uint64 // per fragment, its start steps up to 3H
	}{
		{8, 1, [][]uint64{{8, 16, 24}}},
		{8, 4, [][]uint64{{2, 10, 18}, {4, 12, 20}, {6, 14, 22}, {8, 16, 24}}},
		{7, 3, [][]uint64{{2, 9, 16}, {4, 11, 18}, {7, 14, 21}}},
		{2, 3, [][]uint64{{2, 4, 6}, {1, 3, 5}, {2, 4, 6}}}, // F > H: offsets 0 (never a step), 1, 2
	} {
		s := &settings{Config: Config{SyncEvery: tc.h, Fragments: tc.f}}
		for f := range tc.f {
			var got []uint64
			for step := uint64(1); step <= uint64(3*tc.h); step++ {
				if s.startsAt(f, step) {
					got = append(got, step)
				}
			}
			if !slices.Equal(got, tc.starts[f]) {
				t.Errorf("H %d, F %d: fragment %d starts at %v, want %v", tc.h, tc.f, f, got, tc.starts[f])
			}
		}
	}
	// (f+1)·H past 64 bits.
	s := &settings{Config: Config{SyncEvery: math.MaxInt, Fragments: 3}}
	if got := []uint64{s.offset(0), s.offset(1), s.offset(2)}; !slices.Equal(got, []uint64{math.MaxInt / 3, 2 * (math.MaxInt / 3), math.MaxInt}) {
		t.Errorf("H = MaxInt, F = 3: offsets %v", got)
	}
}

// gated is a Comm whose collectives wait at a gate while it is shut, each
// announcing its arrival, so a test can hold an exchange on the wire.
type gated struct {
	comm.Comm
	mu      sync.Mutex
	shut    chan struct{} // nil: open; closed by open
	arrived chan struct{}
}

func (g *gated) close() {
	g.mu.Lock()
	g.shut = make(chan struct{})
	g.mu.Unlock()
}

func (g *gated) open() {
	g.mu.Lock()
	close(g.shut)
	g.shut = nil
	g.mu.Unlock()
}

func (g *gated) pass(ctx context.Context) error {
	g.mu.Lock()
	shut := g.shut
	g.mu.Unlock()
	if shut == nil {
		return nil
	}
	g.arrived <- struct{}{}
	select {
	case <-shut:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (g *gated) AllReduce(ctx context.Context, buf []float32) error {
	if err := g.pass(ctx); err != nil {
		return err
	}
	return g.Comm.AllReduce(ctx, buf)
}

func (g *gated) AllGather(ctx context.Context, dst, src []byte) error {
	if err := g.pass(ctx); err != nil {
		return err
	}
	return g.Comm.AllGather(ctx, dst, src)
}

// TestExchangeOverlapsInnerSteps: a fragment's exchange runs while the
// caller's inner steps do: with the wire held shut, the Step that starts
// the sync returns, the exchange has reached the wire, and an inner step
// runs; the sync is applied once the wire opens, at its finish, with the
// pseudo-gradient of its start.
func TestExchangeOverlapsInnerSteps(t *testing.T) {
	q := quad{sizes: []int{8, 8}}
	const ranks = 2
	comms := group(t, ranks)
	gates := make([]*gated, ranks)
	params := make([][][]float32, ranks)
	for r := range comms {
		gates[r] = &gated{Comm: comms[r], arrived: make(chan struct{}, 16)}
		comms[r] = gates[r]
		params[r] = q.init(r)
	}
	// F = 2, H = 4, τ = 1: fragment 0 (tensor 0) starts at 2, finishes at 3.
	loops := newLoops(t, comms, params, Config{SyncEvery: 4, Fragments: 2, Delay: 1, Optimizer: Optimizer{Kind: None}, Engine: dense})
	atStart := make([][][]float32, ranks)
	errs := onRanks(comms, func(r int, _ comm.Comm) error {
		l, ctx := loops[r], context.Background()
		for k := range 3 {
			sgd(params[r], q.grad(r, k, params[r]), innerLR)
			if k == 1 {
				gates[r].close()
				atStart[r] = clone(params[r])
			}
			if k == 2 {
				<-gates[r].arrived // the exchange is on the wire, held
				if l.frags[0].flight == nil {
					return fmt.Errorf("after step 2 fragment 0 is not in flight")
				}
				gates[r].open()
			}
			rep, err := l.Step(ctx)
			if err != nil {
				return err
			}
			if k == 1 && !slices.Equal(rep.Started, []int{0}) {
				return fmt.Errorf("step 2 started %v, want [0]", rep.Started)
			}
			if k == 2 && (len(rep.Finished) != 1 || rep.Finished[0].Fragment != 0) {
				return fmt.Errorf("step 3 finished %+v, want fragment 0", rep.Finished)
			}
		}
		return nil
	})
	mustNoErrors(t, "steps", errs)
	avg := average(atStart)
	for r, l := range loops {
		if ti, i := closeTo(l.Global()[:1], avg[:1], 1e-6); ti >= 0 {
			t.Errorf("rank %d: global tensor 0[%d] = %v, want the average of the local weights at the start, %v", r, i, l.Global()[0][i], avg[0][i])
		}
		if ti, i := identical(params[r][:1], l.Global()[:1]); ti >= 0 {
			t.Errorf("rank %d: local tensor 0[%d] = %v, want the global %v", r, i, params[r][0][i], l.Global()[0][i])
		}
	}
}
