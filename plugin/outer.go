package main

import (
	"bytes"
	"context"
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/outer"
)

// The cores of the outer-loop exports (exports_outer.go): package outer's
// Loop over a hosted transport. Nothing here re-implements the Loop (its
// schedule, optimizer and state): these functions hold its handle,
// serialize the calls on it and copy its results out.

// outerLoop is what a gc_outer handle refers to.
type outerLoop struct {
	tr *transport

	mu   sync.Mutex // one call at a time: a Loop is not safe for concurrent use
	loop *outer.Loop
}

// newOuter is gc_outer_create's core: it builds the Loop over tr's ranks
// with cfg (its Engine from gc_engine_config, ec) on params, running the
// Loop's handshake, the broadcast of rank 0's params and the fragment
// engines' handshakes through tr, so another thread must serve it. A rank
// whose arguments cannot be read (invalid) still takes part in the
// handshake (outer.Refuse), so that the others fail at once with a
// *outer.ConfigError naming it; only a transport already in use takes no
// part.
func newOuter(tr *transport, cfg outer.Config, ec engineConfig, params [][]float32, invalid *outer.ConfigError) (*outerLoop, error) {
	if err := tr.claim("outer loop"); err != nil {
		return nil, err
	}
	ctx, host := context.Background(), tr.t.Host()
	undo := useWorkers(ec.Workers)
	if invalid == nil {
		if err := tr.t.SetTopology(ec.topo); err != nil {
			invalid = invalidf("ecfg", "%v", err)
		}
	}
	var l *outer.Loop
	var err error
	if invalid != nil {
		err = outer.Refuse(ctx, host, ec.Timeout, invalid)
	} else {
		cfg.Engine = ec.Config
		l, err = outer.New(ctx, host, params, cfg)
	}
	if err != nil {
		undo()
		tr.release()
		return nil, err
	}
	return &outerLoop{tr: tr, loop: l}, nil
}

// outerEngineConfig checks what gc_engine_config gives the outer loop's
// engines: host buffers, and no tensor shapes (the loop's are per tensor,
// gc_outer_config.shapes).
func outerEngineConfig(ec engineConfig) *outer.ConfigError {
	switch {
	case ec.device != -1:
		return invalidf("ecfg->device", "%d: the outer loop's engines average host buffers: set -1", ec.device)
	case ec.Shapes != nil:
		return invalidf("ecfg->tensor_counts", "the outer loop's tensor shapes are ocfg->shapes (per tensor): leave ecfg->tensor_counts and ecfg->shapes NULL")
	}
	return nil
}

// with runs fn on the Loop, one call at a time.
func (o *outerLoop) with(fn func(l *outer.Loop) error) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	return fn(o.loop)
}

// step is gc_outer_step's core: the Loop's Step and its report (filled
// on error too: what the call did before it failed).
func (o *outerLoop) step() (rep outer.Report, err error) {
	err = o.with(func(l *outer.Loop) error {
		rep, err = l.Step(context.Background())
		return err
	})
	return rep, err
}

// due is gc_outer_due's core.
func (o *outerLoop) due() (starts, finishes []int) {
	o.with(func(l *outer.Loop) error {
		starts, finishes = l.Due()
		return nil
	})
	return starts, finishes
}

// layout is gc_outer_layout's core: each tensor's fragment, and how many
// fragments there are.
func (o *outerLoop) layout() (fragmentOf []int, fragments int) {
	o.with(func(l *outer.Loop) error {
		fragmentOf, fragments = l.FragmentOf(), l.Fragments()
		return nil
	})
	return fragmentOf, fragments
}

// save is gc_outer_state_size's and gc_outer_state_save's core.
func (o *outerLoop) save() ([]byte, error) {
	var b bytes.Buffer
	err := o.with(func(l *outer.Loop) error { return l.Save(&b) })
	return b.Bytes(), err
}

// load is gc_outer_state_load's core: src nil for a rank without a state.
func (o *outerLoop) load(src []byte) error {
	return o.with(func(l *outer.Loop) error {
		if src == nil {
			return l.Load(context.Background(), nil)
		}
		return l.Load(context.Background(), bytes.NewReader(src))
	})
}

// global is gc_outer_global's core: tensor's global weights into dst.
func (o *outerLoop) global(tensor uint64, dst []float32) error {
	return o.with(func(l *outer.Loop) error {
		g := l.Global()
		switch {
		case tensor >= uint64(len(g)):
			return errorf(errInvalid, "tensor %d: the loop has tensors 0 to %d", tensor, len(g)-1)
		case len(dst) != len(g[tensor]):
			return errorf(errSize, "tensor %d has %d elements, n = %d", tensor, len(g[tensor]), len(dst))
		}
		copy(dst, g[tensor])
		return nil
	})
}

// close is gc_outer_destroy's core: the Loop closes and the transport is
// free for another engine or loop.
func (o *outerLoop) close() error {
	err := o.with(func(l *outer.Loop) error { return l.Close() })
	o.tr.release()
	if err != nil {
		return fmt.Errorf("closing the outer loop: %w", err)
	}
	return nil
}
