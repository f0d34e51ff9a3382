package overlap

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/twolevel"
)

// Choosing between the flat and the hierarchical exchange (StrategyAuto
// with DecideAuto on a comm of several nodes of several ranks). The
// hierarchical exchange sends fewer bytes between nodes and more inside
// them; whether that pays depends on how much faster the node's link is
// than the share of the link between nodes each rank gets, which New
// measures rather than assumes: the same all-reduce, flat on the comm and
// in two levels (reduce-scatter in the node, all-reduce across nodes,
// all-gather in the node), alternately, layoutProbeReps times each after
// one untimed pair, on the largest bucket (at most layoutProbeElems
// float32s). The slowest rank's time of each run counts, the fastest run
// of each way decides: hierarchical when the two-level all-reduce is at
// least layoutMargin faster, identically on every rank.
const (
	layoutProbeReps  = 3
	layoutProbeElems = 1 << 22
	layoutMargin     = 0.05
)

// weighsLayout reports whether New with cfg on c weighs the hierarchical
// exchange against the flat one (this rank's view; chooseStrategy agrees).
func weighsLayout(c comm.Comm, cfg Config) bool {
	if cfg.Strategy != StrategyAuto || cfg.Decision != DecideAuto {
		return false
	}
	t, ok := c.(comm.Topologist)
	if _, split := c.(comm.Splitter); !ok || !split {
		return false
	}
	topo := t.Topology()
	return topo.Nodes > 1 && topo.LocalSize > 1 && topo.Nodes*topo.LocalSize == c.Size()
}

// chooseStrategy returns the strategy New builds for cfg (StrategyAuto,
// DecideAuto; after the handshake compared it) on c, a comm.Splitter:
// StrategyHier when every rank weighs the layouts and the two-level
// all-reduce measured faster, else cfg.Strategy; and why ("" when the
// layouts were not weighed).
func chooseStrategy(ctx context.Context, c comm.Comm, sizes []int, cfg Config, t timing) (Strategy, string, error) {
	mine := []byte{0}
	if weighsLayout(c, cfg) {
		mine[0] = 1
	}
	all := make([]byte, c.Size())
	if err := bounded(ctx, cfg.Timeout, func(ctx context.Context) error { return c.AllGather(ctx, all, mine) }); err != nil {
		return 0, "", fmt.Errorf("overlap: New on rank %d: agreeing on the layout: %w", c.Rank(), err)
	}
	for _, v := range all {
		if v == 0 {
			return cfg.Strategy, "", nil
		}
	}
	topo := c.(comm.Topologist).Topology()
	topos, err := checkLayout(ctx, c, topo, cfg.Timeout)
	if err != nil {
		return 0, "", err
	}
	var node, cross comm.Comm
	if err := bounded(ctx, cfg.Timeout, func(ctx context.Context) (err error) {
		node, cross, err = c.(comm.Splitter).Split(ctx)
		return err
	}); err != nil {
		return 0, "", fmt.Errorf("overlap: New on rank %d: splitting the comm by node: %w", c.Rank(), err)
	}
	tl, err := twolevel.New(c, node, cross, topos)
	if err != nil {
		node.Close()
		cross.Close()
		return 0, "", fmt.Errorf("overlap: New on rank %d: %w", c.Rank(), err)
	}
	defer tl.Close()
	n := 0
	for _, s := range sizes {
		n = max(n, s)
	}
	n = min(n, layoutProbeElems)
	flat, hier, err := probeLayouts(ctx, c, tl, n, cfg, t)
	if err != nil {
		return 0, "", err
	}
	choice, verdict := cfg.Strategy, "flat"
	if hier < flat/(1+layoutMargin) {
		choice, verdict = StrategyHier, "hierarchical"
	}
	why := fmt.Sprintf("auto on %d nodes × %d ranks: an all-reduce of %d float32s took %v flat and %v in two levels: %s",
		topo.Nodes, topo.LocalSize, n, seconds(flat), seconds(hier), verdict)
	return choice, why, nil
}

// probeLayouts times an all-reduce of n float32s on c and on tl,
// alternately, and returns each way's fastest run of the slowest rank.
func probeLayouts(ctx context.Context, c, tl comm.Comm, n int, cfg Config, t timing) (flat, hier float64, err error) {
	buf := make([]float32, n)
	flat, hier = math.Inf(1), math.Inf(1)
	for rep := range layoutProbeReps + 1 {
		var times [2]float64
		for i, on := range []comm.Comm{c, tl} {
			clear(buf)
			if err := bounded(ctx, cfg.Timeout, func(ctx context.Context) (err error) {
				times[i], err = t.probe(ctx, on, buf)
				return err
			}); err != nil {
				return 0, 0, fmt.Errorf("overlap: New on rank %d: timing the layouts: %w", c.Rank(), err)
			}
		}
		slowest, err := maxOverRanks(ctx, c, cfg, times[:])
		if err != nil {
			return 0, 0, err
		}
		if rep > 0 {
			flat, hier = min(flat, slowest[0]), min(hier, slowest[1])
		}
	}
	return flat, hier, nil
}

// maxOverRanks returns, element by element, the largest of every rank's
// xs.
func maxOverRanks(ctx context.Context, c comm.Comm, cfg Config, xs []float64) ([]float64, error) {
	src := make([]byte, 8*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint64(src[8*i:], math.Float64bits(x))
	}
	dst := make([]byte, c.Size()*len(src))
	if err := bounded(ctx, cfg.Timeout, func(ctx context.Context) error { return c.AllGather(ctx, dst, src) }); err != nil {
		return nil, fmt.Errorf("overlap: New on rank %d: gathering the layout times: %w", c.Rank(), err)
	}
	out := make([]float64, len(xs))
	for i := range dst[:len(dst)/8] {
		out[i%len(xs)] = max(out[i%len(xs)], math.Float64frombits(binary.LittleEndian.Uint64(dst[8*i:])))
	}
	return out, nil
}

// bounded runs f with ctx bounded by timeout.
func bounded(ctx context.Context, timeout time.Duration, f func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return f(ctx)
}
