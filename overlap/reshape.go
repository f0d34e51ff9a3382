package overlap

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"

	"github.com/gradcomp/gradcomp/compress"
)

// Loading a state across a change of shape. Load takes a state into an
// engine of the same shape: a flat or two-level state under any layout
// (per-rank memories of whole buckets), a sharded StrategyHier state only
// where each rank's shard is the same. LoadReshaped takes the states of a
// job of any strategy, layout and world size into this one, collectively:
// what each old rank's memories and velocities would have added to the
// average at the next step is summed over the ranks (one all-reduce) and
// handed out again, so that the next steps add the same. A flat rank's
// memory e of a bucket adds e/N (its gradient's share of the average) and
// its SRA part memory adds itself (the averaged part it re-encodes); a
// sharded rank's adds e/K on its shard (the engine across nodes averages
// the K nodes' shards), its SRA part memory itself on its part of the
// shard; velocities add like memories. Each new rank gets the sum V: a
// flat rank V itself (N ranks adding V/N), a sharded rank V on its shard
// (K nodes adding V/K); SRA's part memories start empty.

// LoadReshaped replaces e's memories, velocities and step number with those
// of a job that may have had another strategy, layout or world size. It is
// collective over e's ranks: every rank passes the state that rank saved
// (rank r of the old job's; nil where the old job had no rank r, or none
// at all: those ranks add nothing), each of e's spec, error feedback,
// momentum, schedule, guard, feedback decay and bucket sizes and the same
// next step (the memories are summed as saved: already decayed). A
// state that does not say so is a *StateError on its rank and fails every
// rank's LoadReshaped (the others' naming that rank); nothing changes
// then. Pending accuracy-guard flushes start cleared. Its collectives are
// bounded by ctx and Config.Timeout.
func (e *core) LoadReshaped(ctx context.Context, r io.Reader) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if err := e.usable("LoadReshaped"); err != nil {
		return err
	}
	if e.cur != nil {
		return &UsageError{Call: "LoadReshaped", Err: ErrStepInFlight, Detail: fmt.Sprintf("step %d: call Wait first", e.cur.num)}
	}
	vs := make([][]float32, 2*len(e.buckets)) // per bucket the memories' sum, then the velocities'
	for i, b := range e.buckets {
		vs[i] = make([]float32, b.n)
		if e.cfg.Momentum != 0 {
			vs[len(e.buckets)+i] = make([]float32, b.n)
		}
	}
	var next uint64
	var mine error
	have := r != nil
	if have {
		next, mine = e.contribute(r, vs[:len(e.buckets)], vs[len(e.buckets):])
	}
	next, err := e.agreeReshape(ctx, have, mine, next)
	if err != nil {
		return err
	}
	var all []float32
	for _, v := range vs {
		all = append(all, v...)
	}
	actx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.host.AllReduce(actx, all); err != nil {
		return fmt.Errorf("overlap: LoadReshaped on rank %d: summing the memories: %w", e.rank, err)
	}
	for _, v := range vs {
		all = all[copy(v, all):]
	}
	st, err := e.reshaped(vs[:len(e.buckets)], vs[len(e.buckets):], next)
	if err != nil {
		return err
	}
	return e.apply(st)
}

// agreeReshape all-gathers every rank's outcome of reading its state and
// its next step: it returns the next step every rank with a state has, or
// the same error on every rank (this rank's own where it is at fault).
func (e *core) agreeReshape(ctx context.Context, have bool, mine error, next uint64) (uint64, error) {
	b := make([]byte, 16)
	switch {
	case mine != nil:
		b[0] = 2
	case have:
		b[0] = 1
	}
	binary.LittleEndian.PutUint64(b[8:], next)
	all := make([]byte, 16*e.size)
	ctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.host.AllGather(ctx, all, b); err != nil {
		return 0, fmt.Errorf("overlap: LoadReshaped on rank %d: agreeing on the states: %w", e.rank, err)
	}
	found := -1
	for q := range e.size {
		switch all[16*q] {
		case 2:
			if mine != nil {
				return 0, mine
			}
			return 0, &StateError{Reason: fmt.Sprintf("rank %d's state is not one this engine takes (its LoadReshaped says why)", q)}
		case 1:
			n := binary.LittleEndian.Uint64(all[16*q+8:])
			if found >= 0 && n != next {
				return 0, &StateError{Reason: fmt.Sprintf("rank %d's state resumes at step %d, rank %d's at step %d", found, next, q, n)}
			}
			found, next = q, n
		}
	}
	if found < 0 {
		return 0, &StateError{Reason: "no rank passed a state"}
	}
	return next, nil
}

// contribute reads the state in r as the engine that saved it would
// (every check Load makes, against that engine's strategy, world size,
// rank and layout and e's other settings) and adds what its memories and
// velocities add to the average into ve and vu (per bucket, whole). It
// returns the state's next step.
func (e *core) contribute(r io.Reader, ve, vu [][]float32) (uint64, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return 0, &StateError{Reason: "reading the state", Err: err}
	}
	info, err := InspectState(raw)
	if err != nil {
		return 0, err
	}
	src := &core{cfg: e.cfg, size: info.WorldSize, rank: info.Rank, layout: info.Layout}
	src.cfg.Strategy, src.cfg.NodeSpec = info.Strategy, "" // the node stages' codec keeps no state
	sizes := make([]int, len(e.buckets))
	for i, b := range e.buckets {
		sizes[i] = b.n
	}
	if err := src.configure(sizes, resolve); err != nil {
		return 0, &StateError{Reason: fmt.Sprintf("an engine of the saved strategy %v on %d ranks", info.Strategy, info.WorldSize), Err: err}
	}
	st, err := src.readState(bytes.NewReader(raw))
	if err != nil {
		return 0, err
	}
	if !src.sharded() {
		addShares(ve, vu, st, src.rank, src.size, func(i int) (int, int) { return 0, e.buckets[i].n })
		return info.NextStep, nil
	}
	inner, err := src.nestedCore()
	if err != nil {
		return 0, err
	}
	l := info.Layout
	shard := func(i int) (int, int) {
		m := shardLen(e.buckets[i].n, l.LocalSize)
		return l.LocalRank * m, m
	}
	addShares(ve, vu, st.nested, inner.rank, inner.size, shard)
	return info.NextStep, nil
}

// addShares adds the memories and velocities of st, rank's of ranks, to ve
// and vu: on bucket i's window (start, length) from at, its stage-1 memory
// and velocity divided by ranks (the share of the average its ranks'
// values have), its SRA part memory (rank's part of the window) whole.
// Elements past a bucket's end (a padded shard's) add nothing.
func addShares(ve, vu [][]float32, st *savedState, rank, ranks int, at func(i int) (start, length int)) {
	mem, velocity := st.mem, st.velocity
	put := func(dst []float32, start int, src []float32, scale float32) {
		for j, x := range src {
			if k := start + j; k < len(dst) {
				dst[k] += x * scale
			}
		}
	}
	share := 1 / float32(ranks)
	if f := mem[0]; f != nil {
		for _, id := range f.Buckets() {
			start, _ := at(int(id))
			put(ve[id], start, f.Residual(id), share)
		}
	}
	if f := mem[1]; f != nil {
		part := &parts{count: ranks}
		for _, id := range f.Buckets() {
			start, length := at(int(id))
			lo, _ := part.bounds(length, rank)
			put(ve[id], start+lo, f.Residual(id), 1)
		}
	}
	for i, u := range velocity {
		if u != nil && vu[i] != nil {
			start, _ := at(i)
			put(vu[i], start, u, share)
		}
	}
}

// reshaped is the state of e (a savedState for apply) whose memories and
// velocities add ve and vu to the average: each rank's whole bucket, or on
// a sharded StrategyHier engine its shard, zero-padded past the bucket.
func (e *core) reshaped(ve, vu [][]float32, next uint64) (*savedState, error) {
	c, window := e, func(v []float32) []float32 { return v }
	if e.sharded() {
		c = e.be.(nester).nestedCore()
		l := e.layout
		window = func(v []float32) []float32 {
			m := shardLen(len(v), l.LocalSize)
			w := make([]float32, m)
			if lo := l.LocalRank * m; lo < len(v) {
				copy(w, v[lo:])
			}
			return w
		}
	}
	st := &savedState{info: StateInfo{NextStep: next}, velocity: make([][]float32, len(c.buckets)), guards: make([]string, len(c.buckets))}
	if c.mem1 != nil {
		st.mem[0] = compress.NewErrorFeedback(c.mem1)
	}
	for i := range c.buckets {
		if st.mem[0] != nil {
			if err := st.mem[0].SetResidual(uint64(i), window(ve[i])); err != nil {
				return nil, fmt.Errorf("overlap: LoadReshaped on rank %d: bucket %d: %w", e.rank, i, err)
			}
		}
		if vu[i] != nil {
			st.velocity[i] = window(vu[i])
		}
	}
	if c != e {
		return &savedState{info: st.info, nested: st}, nil
	}
	return st, nil
}
