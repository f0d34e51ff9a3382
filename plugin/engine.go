package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/hosted"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/overlap"
)

// The cores of the engine exports (exports_engine.go): the engine of
// package overlap over a hosted transport. Nothing here re-implements the
// engine: these functions only hold its handles and copy its results out.

// transport is what a gc_hosted handle refers to: a hosted transport, the
// pins that keep the Go buffers of taken ops in place while the host
// holds their addresses, and whether an engine or an outer loop uses it.
type transport struct {
	t *hosted.Transport

	mu      sync.Mutex
	pins    map[uint64]*runtime.Pinner // per taken op, until it is completed
	claimed string                     // "engine" or "outer loop": what was created on it; "" for nothing
}

// claim marks tr as used by what (an engine, an outer loop): one per
// transport, whose collectives alone it carries. GC_ERR_STATE when
// something already uses it.
func (tr *transport) claim(what string) error {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if tr.claimed != "" {
		return errorf(errState, "the transport already has an %s (one engine or outer loop per gc_hosted)", tr.claimed)
	}
	tr.claimed = what
	return nil
}

// release ends claim's use.
func (tr *transport) release() {
	tr.mu.Lock()
	tr.claimed = ""
	tr.mu.Unlock()
}

// newTransport is gc_hosted_create's core.
func newTransport(rank, size int) (*transport, error) {
	t, err := hosted.New(rank, size)
	if err != nil {
		return nil, errorf(errInvalid, "%v", err)
	}
	return &transport{t: t, pins: map[uint64]*runtime.Pinner{}}, nil
}

// take is gc_hosted_take's core (group -1: every group's posts) and
// gc_hosted_take_group's: the next post, with its Go buffers pinned until
// complete or close. timeout 0 means no wait.
func (tr *transport) take(group int, timeout time.Duration) (hosted.Op, error) {
	ctx, cancel := context.WithTimeout(context.Background(), max(timeout, time.Microsecond))
	defer cancel()
	var op hosted.Op
	var err error
	if group < 0 {
		op, err = tr.t.Take(ctx)
	} else {
		op, err = tr.t.TakeGroup(ctx, group)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		return op, errorf(errTimeout, "nothing posted within %v", timeout)
	case err != nil:
		return op, err
	}
	tr.pin(op)
	return op, nil
}

// pin keeps op's Go buffers in place until its completion or close.
func (tr *transport) pin(op hosted.Op) {
	p := new(runtime.Pinner)
	for _, b := range [][]byte{op.Send, op.Recv} {
		if len(b) > 0 {
			p.Pin(&b[0])
		}
	}
	tr.mu.Lock()
	tr.pins[op.ID] = p
	tr.mu.Unlock()
}

// setLauncher is gc_hosted_set_launcher's core: launch (nil: none, back
// to take) gets each later post of group as it is made, its Go buffers
// pinned as take pins them.
func (tr *transport) setLauncher(group int, launch func(hosted.Op)) error {
	var fn func(hosted.Op)
	if launch != nil {
		fn = func(op hosted.Op) {
			tr.pin(op)
			launch(op)
		}
	}
	if err := tr.t.SetLauncher(group, fn); err != nil {
		return errorf(errInvalid, "%v", err)
	}
	return nil
}

// complete is gc_hosted_complete's core.
func (tr *transport) complete(id uint64, recvBytes int, hostErr error) error {
	err := tr.t.Complete(id, recvBytes, hostErr)
	tr.mu.Lock()
	if p, ok := tr.pins[id]; ok {
		p.Unpin()
		delete(tr.pins, id)
	}
	tr.mu.Unlock()
	if err != nil {
		return errorf(errState, "%v", err)
	}
	return nil
}

// close is gc_hosted_destroy's core: the transport closes, and every pin
// is released (the ops it abandons are the engine's again).
func (tr *transport) close() {
	tr.t.Close()
	tr.mu.Lock()
	for id, p := range tr.pins {
		p.Unpin()
		delete(tr.pins, id)
	}
	tr.mu.Unlock()
}

// engineConfig is gc_engine_config in Go terms.
type engineConfig struct {
	overlap.Config
	device int           // -1: host buckets
	topo   comm.Topology // this rank's place among the nodes; zero: unknown
}

// rawEngineConfig is gc_engine_config's fields in Go types, before
// parseEngineConfig checks them (zero values: a field the caller's ABI
// version lacks).
type rawEngineConfig struct {
	spec, strategy, decision string
	ef, failNonFinite        bool
	warmup, workers, device  int
	timeout                  float64           // seconds
	momentum                 float64           // since ABI 2.1
	schedule                 string            // since ABI 2.1
	guard                    float64           // since ABI 2.2
	momentumMasking          bool              // since ABI 2.2
	topo                     comm.Topology     // since ABI 2.4; zero: unknown
	nodeSpec                 string            // since ABI 2.5; "": float32
	shapes                   [][]overlap.Shape // since ABI 2.7; nil: none
	feedbackDecay            float64           // since ABI 2.11; 0: none
}

// parseEngineConfig turns gc_engine_config's strings into overlap's types.
// On error the configuration holds the timeout when that is valid.
func parseEngineConfig(r rawEngineConfig) (engineConfig, error) {
	c := engineConfig{device: r.device, topo: r.topo}
	if !(r.timeout >= 0 && r.timeout <= 86400) {
		return c, errorf(errInvalid, "timeout_seconds %v: want 0 (the default) to 86400", r.timeout)
	}
	c.Timeout = time.Duration(r.timeout * float64(time.Second))
	c.Spec, c.ErrorFeedback, c.FailOnNonFinite, c.Warmup, c.Workers = r.spec, r.ef, r.failNonFinite, r.warmup, r.workers
	c.Momentum, c.MomentumMasking, c.Guard, c.NodeSpec = r.momentum, r.momentumMasking, r.guard, r.nodeSpec
	c.Shapes, c.FeedbackDecay = r.shapes, r.feedbackDecay
	var err error
	if c.Schedule, err = overlap.ParseSchedule(r.schedule); err != nil {
		return c, errorf(errInvalid, "schedule: %v", err)
	}
	if r.strategy != "" {
		if c.Strategy, err = overlap.ParseStrategy(r.strategy); err != nil {
			return c, errorf(errInvalid, "strategy: %v", err)
		}
	}
	if r.decision != "" {
		if c.Decision, err = overlap.ParseDecision(r.decision); err != nil {
			return c, errorf(errInvalid, "decision: %v", err)
		}
	}
	t := r.topo
	switch {
	case t != comm.Topology{} && (t.Nodes < 1 || t.LocalSize < 1 || t.Node < 0 || t.Node >= t.Nodes || t.LocalRank < 0 || t.LocalRank >= t.LocalSize):
		return c, errorf(errInvalid, "topology node %d of nodes %d, local_rank %d of local_size %d: want 0 ≤ node < nodes and 0 ≤ local_rank < local_size (all 0: unknown)",
			t.Node, t.Nodes, t.LocalRank, t.LocalSize)
	case c.Strategy == overlap.StrategyHier && t.Nodes == 0:
		return c, errorf(errInvalid, "strategy hier needs this rank's place among the nodes: set gc_engine_config's node, nodes, local_rank and local_size (ABI 2.4)")
	case r.warmup < 0:
		return c, errorf(errInvalid, "warmup %d is negative", r.warmup)
	case r.workers < 0:
		return c, errorf(errInvalid, "workers %d is negative", r.workers)
	case r.device < -1:
		return c, errorf(errInvalid, "device %d: want -1 (host buckets) or a CUDA device ordinal", r.device)
	}
	return c, nil
}

// engine is what a gc_engine handle refers to: the overlap engine (host
// or device buckets) and the statistics of the last step waited for.
type engine struct {
	tr     *transport // the hosted transport, or nil
	nccl   *ncclParts // the engine's own NCCL communicator, or nil
	sizes  []int
	host   *overlap.Engine       // host buckets, or nil
	device *overlap.DeviceEngine // device buckets, or nil

	mu     sync.Mutex
	last   overlap.StepStats
	waited bool // last holds a step
}

// newEngine is gc_engine_create's core: it runs the handshake (and the
// cost model's measurements) through tr, so another thread must serve it.
// A rank that cannot build its engine, because its configuration is
// invalid (invalid, from readEngineConfig) or its device does not open,
// still takes part in the handshake (overlap.Refuse), so that the other
// ranks fail at once with a *overlap.ConfigError naming it; it returns its
// *overlap.ConfigError, or the device's own error. Only a transport that
// already has an engine or an outer loop takes no part.
func newEngine(tr *transport, c engineConfig, sizes []int, invalid error) (*engine, error) {
	if err := tr.claim("engine"); err != nil {
		return nil, err
	}
	ctx, host := context.Background(), tr.t.Host()
	e := &engine{tr: tr, sizes: sizes}
	undo := useWorkers(c.Workers)
	if invalid == nil {
		if err := tr.t.SetTopology(c.topo); err != nil {
			invalid = errorf(errInvalid, "%v", err)
		}
	}
	var err error
	switch {
	case invalid != nil:
		err = overlap.Refuse(ctx, host, c.Timeout, invalid)
	case c.device < 0:
		e.host, err = overlap.New(ctx, host, sizes, c.Config)
	default:
		var d *deviceContext
		if d, err = openDevice(c.device); err != nil {
			_ = overlap.Refuse(ctx, host, c.Timeout, err) // this rank reports the device's own error
		} else {
			e.device, err = overlap.NewDevice(ctx, overlap.CUDA(d.ctx), tr.t.Device(), host, sizes, c.Config)
		}
	}
	if err != nil {
		undo()
		tr.release()
		return nil, err
	}
	return e, nil
}

// stepper is what the host and device engines share.
type stepper interface {
	Step() error
	Wait(ctx context.Context) (overlap.StepStats, error)
	Save(w *bytes.Buffer) error
	Load(b []byte) error
	LoadReshaped(ctx context.Context, r io.Reader) error
	Close() error
	Compressed() []bool
}

type hostStepper struct{ *overlap.Engine }

func (h hostStepper) Save(w *bytes.Buffer) error { return h.Engine.Save(w) }
func (h hostStepper) Load(b []byte) error        { return h.Engine.Load(bytes.NewReader(b)) }

type deviceStepper struct{ *overlap.DeviceEngine }

func (d deviceStepper) Save(w *bytes.Buffer) error { return d.DeviceEngine.Save(w) }
func (d deviceStepper) Load(b []byte) error        { return d.DeviceEngine.Load(bytes.NewReader(b)) }

func (e *engine) stepper() stepper {
	if e.host != nil {
		return hostStepper{e.host}
	}
	return deviceStepper{e.device}
}

// ready is gc_engine_ready's core (host buckets).
func (e *engine) ready(i int, grad []float32) error {
	if e.host == nil {
		return errorf(errInvalid, "this engine has device buckets (gc_engine_config.device ≥ 0): use gc_engine_ready_device")
	}
	return e.host.Ready(i, grad)
}

// delegator is the delegation calls both engines have (Delegable,
// Delegate, DelegateDone): gc_engine_delegable's, gc_engine_delegate's and
// gc_engine_delegate_done's cores. A device engine's DelegateDone is
// optional: it checks the call and waits for nothing.
type delegator interface {
	Delegable(i int) bool
	Delegate(i int) error
	DelegateDone(i int) error
}

// delegation returns the engine's delegator, host or device.
func (e *engine) delegation() delegator {
	if e.host != nil {
		return e.host
	}
	return e.device
}

// readyDevice is gc_engine_ready_device's core.
func (e *engine) readyDevice(i int, grad gpu.Ptr, n int, s gpu.Stream) error {
	if e.device == nil {
		return errorf(errInvalid, "this engine has host buckets (gc_engine_config.device = -1): use gc_engine_ready")
	}
	if i >= 0 && i < len(e.sizes) && n != e.sizes[i] {
		return errorf(errSize, "bucket %d has %d elements, n = %d", i, e.sizes[i], n)
	}
	return e.device.Ready(i, grad, s)
}

// done is gc_engine_done's core.
func (e *engine) done(s gpu.Stream) error {
	if e.device == nil {
		return errorf(errInvalid, "gc_engine_done is for device engines; a host engine's buckets are done when gc_engine_wait returns")
	}
	return e.device.Done(s)
}

// wait is gc_engine_wait's core: the step's end, bounded by timeout (0:
// only the engine's per-collective timeout), and its statistics kept for
// gc_engine_stats.
func (e *engine) wait(timeout time.Duration) error {
	ctx := context.Background()
	if timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, timeout)
		defer cancel()
	}
	st, err := e.stepper().Wait(ctx)
	var usage *overlap.UsageError
	if errors.As(err, &usage) {
		return err // no step ended: the last statistics stay
	}
	e.mu.Lock()
	e.last, e.waited = st, true
	e.mu.Unlock()
	return err
}

// stats returns the last waited step's statistics and the decisions for
// the steps to come.
func (e *engine) stats() (overlap.StepStats, []bool, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if !e.waited {
		return overlap.StepStats{}, nil, errorf(errState, "no step has been waited for yet")
	}
	return e.last, e.stepper().Compressed(), nil
}

// bucketStats returns bucket i's statistics in the last waited step and
// whether it is decided compressed for the steps to come.
func (e *engine) bucketStats(i uint64) (overlap.BucketStats, bool, error) {
	s, decided, err := e.stats()
	if err != nil {
		return overlap.BucketStats{}, false, err
	}
	if i >= uint64(len(s.Buckets)) {
		return overlap.BucketStats{}, false, errorf(errInvalid, "bucket %d: the engine has buckets 0 to %d", i, len(s.Buckets)-1)
	}
	return s.Buckets[i], decided[i], nil
}

// saveState is gc_engine_state_save's core.
func (e *engine) saveState() ([]byte, error) {
	var b bytes.Buffer
	if err := e.stepper().Save(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// loadState is gc_engine_state_load's core: src must be exactly one state
// (InspectState checks its checksum over all of it) before Load validates
// its contents against the engine; on any error the engine is unchanged.
func (e *engine) loadState(src []byte) error {
	if _, err := overlap.InspectState(src); err != nil {
		return err
	}
	return e.stepper().Load(src)
}

// loadReshaped is gc_engine_state_load_reshaped's core: src nil for a
// rank without a state.
func (e *engine) loadReshaped(src []byte) error {
	var r io.Reader
	if src != nil {
		r = bytes.NewReader(src)
	}
	return e.stepper().LoadReshaped(context.Background(), r)
}

// close is gc_engine_destroy's core.
func (e *engine) close() error {
	err := e.stepper().Close()
	if e.tr != nil {
		e.tr.release()
	}
	if err != nil {
		err = fmt.Errorf("closing the engine: %w", err)
	}
	if e.nccl != nil {
		if cerr := e.nccl.close(); cerr != nil {
			err = errors.Join(err, fmt.Errorf("closing its NCCL communicators: %w", cerr))
		}
	}
	return err
}
