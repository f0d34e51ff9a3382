package overlap

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// Choosing between the flat and the hierarchical exchange. An engine
// configured StrategyAuto over a comm that knows its nodes and splits by
// them (comm.Topologist, comm.Splitter) that spans several nodes of
// several ranks each times whole steps of both shapes and keeps the
// faster. Which one wins depends on more than any one collective shows —
// the two links' speeds, how the node stages and the exchange across
// nodes overlap across buckets, what the node stages cost the cores the
// codec needs — so the engine measures the steps themselves: a flat
// all-reduce and a two-level one of the same bytes can take the same time
// while the hierarchical exchange of the whole model is 1.5× faster
// (docs/DESIGN.md, "Auto").

// The trials' size.
const (
	shapeTrialSteps = 3 // timed steps per shape, after one untimed
	// shapeMargin is how much faster the hierarchical exchange must be to
	// be chosen: flat is the default, and a closer race is within what a
	// loaded host's noise moves.
	shapeMargin = 0.1
)

// shapeTrials reports whether an engine configured with cfg over c chooses
// its shape by trial: StrategyAuto, and c places this rank in a layout of
// at least two nodes of at least two ranks each. It is a handshake field,
// so ranks that see their layout differently fail together.
func shapeTrials(c comm.Comm, cfg Config) bool {
	if cfg.Strategy != StrategyAuto {
		return false
	}
	topo, err := hierLayout(c)
	return err == nil && topo.Nodes >= 2 && topo.LocalSize >= 2
}

// chooseShape is New's last step for e, a flat engine for which
// shapeTrials holds: when every rank's layout is one layout (checkLayout),
// it builds the hierarchical engine over the same comm, times shapeTrialSteps steps of each on a synthetic
// gradient (after one untimed; every bucket ready at once, each engine on
// its decided paths, no verification trial; the steps numbered past the
// warm-up and the schedule, so they exchange as training will), and
// returns the faster, the other closed: hierarchical when its step's
// median, the slowest rank's, is at least shapeMargin faster. Each engine
// is given back the state it had before the trials (Save, Load). Every
// rank takes the same choice, from the times all-gathered. A layout the
// ranks do not agree on keeps the flat engine.
func chooseShape(ctx context.Context, e *Engine, sizes []int, t timing) (*Engine, error) {
	topo, _ := hierLayout(e.c) // shapeTrials checked it
	if _, err := checkLayout(ctx, e.c, topo, e.cfg.Timeout); err != nil {
		var te *TopologyError
		if errors.As(err, &te) {
			e.note = "flat: the ranks do not describe one layout of nodes (" + te.Reason + ")"
			return e, nil
		}
		e.Close()
		return nil, err
	}
	hcfg := e.cfg
	hcfg.Strategy = StrategyHier
	h, err := newEngine(ctx, e.c, sizes, hcfg, t)
	var ce *ConfigError
	switch {
	case errors.As(err, &ce):
		// The same on every rank (the handshake's): the flat engine serves.
		e.note = joinNote(e.note, "flat: the hierarchical exchange cannot run here ("+err.Error()+")")
		return e, nil
	case err != nil:
		e.Close()
		return nil, err
	}
	var mine [2]float64
	for k, x := range []*Engine{e, h} {
		if mine[k], err = timeSteps(ctx, x); err == nil {
			mine[k] = t.trial(x.strategy, mine[k])
		}
		if err != nil {
			e.Close()
			h.Close()
			return nil, fmt.Errorf("overlap: choosing between flat and hierarchical on rank %d: %s trial: %w", e.rank, x.strategy, err)
		}
	}
	flat, hier, err := slowest(ctx, e, mine)
	if err != nil {
		e.Close()
		h.Close()
		return nil, err
	}
	why := fmt.Sprintf("auto on %d nodes × %d ranks: hierarchical %v a step in trials, flat %s %v",
		topo.Nodes, topo.LocalSize, seconds(hier), e.strategy, seconds(flat))
	if hier < flat/(1+shapeMargin) {
		e.Close()
		h.note = joinNote(h.note, why)
		return h, nil
	}
	h.Close()
	e.note = joinNote(e.note, why)
	return e, nil
}

// joinNote appends b to the note a.
func joinNote(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// slowest all-gathers every rank's trial times (flat, hierarchical) and
// returns the largest of each.
func slowest(ctx context.Context, e *Engine, mine [2]float64) (flat, hier float64, err error) {
	b := make([]byte, 16)
	for k, v := range mine {
		binary.LittleEndian.PutUint64(b[8*k:], math.Float64bits(v))
	}
	all := make([]byte, 16*e.size)
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.c.AllGather(ctx, all, b); err != nil {
		return 0, 0, fmt.Errorf("overlap: sharing the shape trials' times on rank %d: %w", e.rank, err)
	}
	for r := range e.size {
		flat = max(flat, math.Float64frombits(binary.LittleEndian.Uint64(all[16*r:])))
		hier = max(hier, math.Float64frombits(binary.LittleEndian.Uint64(all[16*r+8:])))
	}
	return flat, hier, nil
}

// timeSteps times x's steps as chooseShape describes and returns their
// median in seconds, x restored.
func timeSteps(ctx context.Context, x *Engine) (float64, error) {
	var snap bytes.Buffer
	if err := x.Save(&snap); err != nil {
		return 0, err
	}
	restore := x.trialMode()
	rng := rand.New(rand.NewPCG(uint64(x.rank), 3))
	grads := make([][]float32, len(x.buckets))
	for i, b := range x.buckets {
		grads[i] = make([]float32, b.n)
	}
	var ts []float64
	var err error
	for s := 0; s <= shapeTrialSteps && err == nil; s++ {
		for _, g := range grads {
			for j := range g {
				g[j] = float32(rng.NormFloat64())
			}
		}
		start := time.Now()
		err = x.Step()
		for i := 0; i < len(grads) && err == nil; i++ {
			err = x.Ready(i, grads[i])
		}
		if err == nil {
			_, err = x.Wait(ctx)
		}
		if s > 0 {
			ts = append(ts, time.Since(start).Seconds())
		}
	}
	restore()
	if err != nil {
		return 0, err
	}
	if err := x.Load(&snap); err != nil {
		return 0, err
	}
	slices.Sort(ts)
	return ts[len(ts)/2], nil
}

// cores returns e's cores: its own and, for a sharded StrategyHier
// engine, the engine across nodes'.
func (e *Engine) cores() []*core {
	if e.hier != nil {
		return []*core{e.core, e.hier.inner.core}
	}
	return []*core{e.core}
}

// trialMode readies e for trial steps: no verification, and steps
// numbered past the warm-up and the schedule (on every core alike, so a
// sharded engine's two cores stay in step). It returns what undoes it but
// for the step number, which the caller's Load restores.
func (e *Engine) trialMode() (restore func()) {
	cs := e.cores()
	var past uint64
	saved := make([]*verifier, len(cs))
	for i, c := range cs {
		past = max(past, c.next, uint64(c.cfg.Warmup))
		if c.phases != nil {
			past = max(past, c.phases[len(c.phases)-2].end)
		}
		saved[i], c.verify = c.verify, nil
	}
	for _, c := range cs {
		c.next = past
	}
	return func() {
		for i, c := range cs {
			c.verify = saved[i]
		}
	}
}
