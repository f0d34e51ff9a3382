package outer

import (
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/overlap"
)

// Loop is one rank's outer synchronization: the global weights, the outer
// optimizer's momentum, the schedule and one overlap.Engine per fragment.
// A training loop calls Step after each inner optimizer step. A Loop is
// not safe for concurrent use: one goroutine per rank drives it.
type Loop struct {
	c        comm.Comm
	s        *settings
	params   [][]float32 // the caller's local weights θ_local
	global   [][]float32 // θ_global, per tensor
	momentum [][]float32 // Nesterov's, per tensor; nil for the other optimizers
	frags    []*fragment
	step     uint64 // inner steps counted: s of the last Step
	closed   bool
	broken   error // the failure that broke the Loop
}

// fragment is one fragment: its tensors' place in its engine's buckets,
// the buckets (the pseudo-gradient, then its average), the engine and the
// sync in flight.
type fragment struct {
	idx int
	layout
	cfg    overlap.Config // its engine's
	bufs   [][]float32    // per bucket; the engine owns them from its Step to its Wait
	eng    *overlap.Engine
	flight *exchange // the sync started and not yet applied; nil when none
}

// exchange is a fragment's sync from its start to its finish.
type exchange struct {
	started uint64 // the inner step it started at
	// waited: the engine's Wait has returned (Save waits early; Load
	// restores an arrived sync so): the average is in the fragment's
	// buffers, or nonFinite says why the sync is skipped.
	waited    bool
	stats     overlap.StepStats
	nonFinite *overlap.NonFiniteStepError
}

// Report says what one Step did on this rank.
type Report struct {
	Step      uint64 // the inner step s this call counted (1 for the first)
	Started   []int  // the fragments whose sync started at s, ascending
	Finished  []Sync // the syncs that ended at s, applied or skipped, by fragment
	BytesSent int64  // what this rank put on the wire for Finished's exchanges (their Stats.BytesSent)
}

// Sync is one fragment's sync that ended in a Step.
type Sync struct {
	Fragment int
	Started  uint64 // the inner step its exchange started at
	// Skipped is non-nil when the averaged pseudo-gradient was not finite:
	// the sync was skipped on every rank (nothing changed); nil when the
	// average was applied.
	Skipped *NonFiniteSyncError
	// Stats are the engine's statistics of the exchange (zero for one that
	// arrived before a Save and is applied after a Load).
	Stats overlap.StepStats
}

// New builds rank c.Rank()'s Loop over the local weights params (tensor i
// is params[i], updated in place by the caller's inner optimizer), and is
// collective over c: every rank calls it with the same cfg and tensor
// sizes. It refuses an invalid cfg with a *ConfigError naming the field
// (on every rank: a rank with an invalid configuration tells the others);
// runs the handshake (an all-gather of every rank's canonical
// configuration: a difference is the same *ConfigMismatchError on every
// rank); broadcasts rank 0's params into every rank's params, which become
// the global weights; and builds one overlap.Engine per fragment over c
// (each with its own handshake of the engine settings, an
// *overlap.ConfigMismatchError on a difference). Nothing else may use c
// while the Loop is open; Close does not close it. Its collectives are
// bounded by ctx and Engine.Timeout each.
func New(ctx context.Context, c comm.Comm, params [][]float32, cfg Config) (*Loop, error) {
	if c == nil {
		return nil, errors.New("outer: New: nil comm.Comm")
	}
	sizes := make([]int, len(params))
	for i, p := range params {
		sizes[i] = len(p)
	}
	s, invalid := resolve(cfg, sizes, c.Rank())
	timeout := cfg.timeout()
	if err := handshake(ctx, c, timeout, s, invalid); err != nil {
		return nil, err
	}
	l := &Loop{c: c, s: s, params: params}
	for _, p := range params {
		if len(p) == 0 {
			continue
		}
		bctx, cancel := context.WithTimeout(ctx, timeout)
		err := c.Broadcast(bctx, f32.Bytes(p), 0)
		cancel()
		if err != nil {
			return nil, fmt.Errorf("outer: New on rank %d: broadcasting rank 0's weights: %w", c.Rank(), err)
		}
	}
	l.global = clone(params)
	if s.Optimizer.Kind == Nesterov {
		l.momentum = zeros(sizes)
	}
	for f := range s.Fragments {
		frag := &fragment{idx: f, layout: layOut(s, f), cfg: s.Engine}
		frag.cfg.FailOnNonFinite = true
		frag.cfg.Shapes = frag.shapes
		frag.bufs = zeros(frag.sizes)
		eng, err := overlap.New(ctx, c, frag.sizes, frag.cfg)
		if err != nil {
			l.Close()
			return nil, fmt.Errorf("outer: fragment %d's engine: %w", f, err)
		}
		frag.eng = eng
		l.frags = append(l.frags, frag)
	}
	return l, nil
}

// Step counts one inner step, s (1 for the first call), and carries out
// the schedule's work at s: it finishes the exchanges due at s, then
// starts the syncs due at s (with Delay 0 finishing each at once). Call it
// on every rank after each inner optimizer step; the caller must not touch
// params during Step.
//
// A sync's start computes the fragment's pseudo-gradient Δ = θ_global −
// θ_local into the fragment's own buffers and hands them to its engine
// (Step and Ready, which never block). Its finish waits for the engine
// (bounded by ctx and Engine.Timeout) and, with a finite average,
// applies the outer optimizer to the fragment's global weights and blends
// its local weights (Config.Alpha).
//
// Errors: a non-finite average skips the sync on every rank (Sync.Skipped)
// and, with FailNonFinite, Step returns its *NonFiniteSyncError after
// doing the rest of the step's work; the Loop stays usable. A failed
// exchange (a dead or stalled peer: the engine's error within its
// Timeout; an ended ctx) is returned on every rank, and nothing of it is
// applied: params, the global weights and the momentum stay as they were
// before the call (but for a sync this call finished before it, with
// Delay 0 and Fragments above SyncEvery). It breaks the Loop: later calls
// return a *BrokenError.
func (l *Loop) Step(ctx context.Context) (Report, error) {
	if err := l.usable("Step"); err != nil {
		return Report{}, err
	}
	l.step++
	rep := Report{Step: l.step}
	var failed []error
	finish := func(f *fragment) error {
		sync, err := l.finish(ctx, f)
		if err != nil {
			return err
		}
		rep.Finished = append(rep.Finished, sync)
		rep.BytesSent += sync.Stats.BytesSent
		if sync.Skipped != nil && l.s.OnNonFinite == FailNonFinite {
			failed = append(failed, sync.Skipped)
		}
		return nil
	}
	finishing, starting := l.dueAt(l.step)
	for _, f := range finishing {
		if err := finish(f); err != nil {
			return rep, err
		}
	}
	for _, f := range starting {
		if err := l.start(f); err != nil {
			return rep, err
		}
		rep.Started = append(rep.Started, f.idx)
		if l.s.Delay == 0 {
			if err := finish(f); err != nil {
				return rep, err
			}
		}
	}
	return rep, errors.Join(failed...)
}

// dueAt returns the work of inner step s: the fragments whose exchange in
// flight finishes at s and those whose sync starts at s, each in fragment
// order. (With Delay 0 nothing is in flight between Steps, and Step
// finishes each started sync at once.)
func (l *Loop) dueAt(s uint64) (finishing, starting []*fragment) {
	for _, f := range l.frags {
		if f.flight != nil && f.flight.started+uint64(l.s.Delay) == s {
			finishing = append(finishing, f)
		}
	}
	for _, f := range l.frags {
		if l.s.startsAt(f.idx, s) {
			starting = append(starting, f)
		}
	}
	return finishing, starting
}

// Due returns what the next Step does: the fragments whose sync it starts
// and the fragments whose sync it finishes (with Delay 0 the ones it
// starts, each finished at once), each ascending, from the schedule and
// the syncs in flight (after a Load, the loaded ones). It is for a caller
// whose weights live elsewhere (on a GPU) and are mirrored in params:
// Step reads the tensors of every fragment in starts (Δ) and in finishes
// (the blend) and writes those of finishes when it applies an average, so
// copying the former into params before the Step and the latter back
// after it keeps the two in step; the other tensors Step neither reads
// nor writes. Due changes nothing and makes no collective.
func (l *Loop) Due() (starts, finishes []int) {
	finishing, starting := l.dueAt(l.step + 1)
	for _, f := range finishing {
		finishes = append(finishes, f.idx)
	}
	for _, f := range starting {
		starts = append(starts, f.idx)
		if l.s.Delay == 0 {
			finishes = append(finishes, f.idx)
		}
	}
	return starts, finishes
}

// Fragments returns F, the number of fragments.
func (l *Loop) Fragments() int { return l.s.Fragments }

// FragmentOf returns each tensor's fragment (0 to Fragments()−1), as
// Config.FragmentOf gave it or the default layout made it; the slice is
// the caller's.
func (l *Loop) FragmentOf() []int { return slices.Clone(l.s.fragmentOf) }

// start begins fragment f's sync at the current step: Δ into its buffers,
// its engine's Step and every bucket's Ready.
func (l *Loop) start(f *fragment) error {
	for _, g := range f.segs {
		buf := f.bufs[g.bucket][g.off : g.off+g.n]
		global := l.global[g.tensor][g.at : g.at+g.n]
		local := l.params[g.tensor][g.at : g.at+g.n]
		for i := range buf {
			buf[i] = global[i] - local[i]
		}
	}
	err := f.eng.Step()
	for i := 0; err == nil && i < len(f.bufs); i++ {
		err = f.eng.Ready(i, f.bufs[i])
	}
	if err != nil {
		return l.fail(fmt.Errorf("outer: step %d: starting fragment %d's exchange: %w", l.step, f.idx, err))
	}
	f.flight = &exchange{started: l.step}
	return nil
}

// finish ends fragment f's sync: it waits for the exchange unless Save
// did, then applies the average or reports the skip.
func (l *Loop) finish(ctx context.Context, f *fragment) (Sync, error) {
	x := f.flight
	if !x.waited {
		if err := l.wait(ctx, f); err != nil {
			return Sync{}, err
		}
	}
	f.flight = nil
	sync := Sync{Fragment: f.idx, Started: x.started, Stats: x.stats}
	if x.nonFinite != nil {
		sync.Skipped = &NonFiniteSyncError{Fragment: f.idx, Started: x.started, Err: x.nonFinite}
		return sync, nil
	}
	for _, g := range f.segs {
		global := l.global[g.tensor][g.at : g.at+g.n]
		var m []float32
		if l.momentum != nil {
			m = l.momentum[g.tensor][g.at : g.at+g.n]
		}
		l.s.Optimizer.step(global, m, f.bufs[g.bucket][g.off:g.off+g.n])
		blend(l.params[g.tensor][g.at:g.at+g.n], global, l.s.Alpha)
	}
	return sync, nil
}

// wait waits for fragment f's exchange in flight and records its outcome;
// a failure other than a non-finite average breaks the Loop.
func (l *Loop) wait(ctx context.Context, f *fragment) error {
	x := f.flight
	stats, err := f.eng.Wait(ctx)
	var nf *overlap.NonFiniteStepError
	switch {
	case errors.As(err, &nf):
		x.nonFinite = nf
	case err != nil:
		return l.fail(fmt.Errorf("outer: step %d: fragment %d's exchange (started at step %d): %w", l.step, f.idx, x.started, err))
	}
	x.stats, x.waited = stats, true
	return nil
}

// fail breaks the Loop with err and returns it.
func (l *Loop) fail(err error) error {
	if l.broken == nil {
		l.broken = err
	}
	return err
}

// usable returns why call cannot run: the Loop is closed or broken.
func (l *Loop) usable(call string) error {
	switch {
	case l.closed:
		return fmt.Errorf("outer: %s: %w", call, ErrClosed)
	case l.broken != nil:
		return &BrokenError{Cause: l.broken}
	}
	return nil
}

// Global returns the global weights θ_global, per tensor. They belong to
// the Loop: read them (to evaluate or export the global model) between
// Steps, never write them. A fragment's are updated when its sync is
// applied.
func (l *Loop) Global() [][]float32 { return l.global }

// InnerSteps returns the inner steps counted so far: s of the last Step
// (or of the state Load restored), 0 before the first.
func (l *Loop) InnerSteps() uint64 { return l.step }

// Close closes the fragment engines; an exchange in flight is abandoned.
// It does not close the Comm. Later calls return an error wrapping
// ErrClosed; closing twice returns nil.
func (l *Loop) Close() error {
	if l.closed {
		return nil
	}
	l.closed = true
	var errs []error
	for _, f := range l.frags {
		if err := f.eng.Close(); err != nil {
			errs = append(errs, fmt.Errorf("outer: closing fragment %d's engine: %w", f.idx, err))
		}
	}
	return errors.Join(errs...)
}

func clone(xs [][]float32) [][]float32 {
	out := make([][]float32, len(xs))
	for i, x := range xs {
		out[i] = append([]float32(nil), x...)
	}
	return out
}

func zeros(sizes []int) [][]float32 {
	out := make([][]float32, len(sizes))
	for i, n := range sizes {
		out[i] = make([]float32, n)
	}
	return out
}
