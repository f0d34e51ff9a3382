package overlap

import (
	"fmt"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/devresid"
	"github.com/gradcomp/gradcomp/kernels"
)

// devBuffers are one bucket's device buffers and events. The events exist
// for every bucket; the buffers once the bucket first takes the
// compressed path (prepare).
type devBuffers struct {
	// Slots: a 16-byte Encode status, with Config.Guard a 16-byte guard
	// block (kernels.GuardLen: ρ), then the body, padded to 16 bytes
	// (slotHead). Gather strategies: send is this rank's slot, recv every rank's. SRA:
	// send holds this rank's N part slots (slot bytes each), recv every
	// rank's slot of this rank's part; send2 and recv2 (slot2 bytes per
	// rank) carry the stage-2 payloads of the averaged parts.
	slot, slot2  int
	send, recv   gpu.Ptr
	send2, recv2 gpu.Ptr
	resid        *devresid.Residual // error feedback: e, and the residual Encode writes
	resid2       *devresid.Residual // SRA: this rank's part's second memory
	mid          gpu.Ptr            // SRA: this rank's part, summed and averaged
	work, work2  gpu.Ptr            // Encode workspaces: stage 1 (encode stream), stage 2 (decode stream)
	phase        int                // the schedule phase the slots and workspaces are sized for
	// StrategyLowRank: the bucket's layout; send and recv are the two
	// all-reduces' buffers (kernels.LowRankArgs' Vals1 and Vals2), work
	// the round's workspace, resid the residual memory and its Out M (m
	// without error feedback), resid2 the warm start's Q̄ and its Out the
	// next one.
	layout     *lowrank.Layout
	qOwn, q, m gpu.Ptr
	// Momentum correction (every bucket): u, and the step's m·u + g
	// until settle installs it; velocity: u was written (by a step or
	// Load), so the state holds it.
	mom, next gpu.Ptr
	velocity  bool
	// Events: the caller's gradient ready; each stage's start and end on
	// its stream (timing events).
	ready                                      gpu.Event
	encBeg, encEnd, xBeg, xEnd, decBeg, decEnd gpu.Event
	xMid, midEnd                               gpu.Event // SRA: the all-to-all's end; the owner's work's end
}

// event makes an event (timed with timing) that release destroys.
func (e *DeviceEngine) event(timing bool) (gpu.Event, error) {
	ev, err := e.dev.NewEvent(timing)
	if err == nil {
		e.events = append(e.events, ev)
	}
	return ev, err
}

// alloc allocates bytes of device memory that release frees.
func (e *DeviceEngine) alloc(bytes int) (gpu.Ptr, error) {
	p, err := e.dev.Alloc(bytes)
	if err == nil {
		e.mem = append(e.mem, p)
	}
	return p, err
}

// allocate makes the streams, the events and the status blocks.
func (e *DeviceEngine) allocate() error {
	var err error
	for _, s := range []*gpu.Stream{&e.enc, &e.wire, &e.dec} {
		if *s, err = e.dev.NewStream(); err != nil {
			return err
		}
	}
	for _, p := range []*gpu.Event{&e.done, &e.drained[0], &e.drained[1], &e.mark, &e.timed[0], &e.timed[1]} {
		if *p, err = e.event(p == &e.timed[0] || p == &e.timed[1]); err != nil {
			return err
		}
	}
	if e.statuses, err = e.alloc(kernels.StatusLen * len(e.buckets)); err != nil {
		return err
	}
	if e.mech == StrategyQuantSRA {
		if e.midStatuses, err = e.alloc(kernels.StatusLen * len(e.buckets)); err != nil {
			return err
		}
	}
	if e.cfg.Guard > 0 {
		if e.guards, err = e.alloc(kernels.GuardLen * len(e.buckets)); err != nil {
			return err
		}
	}
	e.bufs = make([]*devBuffers, len(e.buckets))
	for i := range e.buckets {
		b := &devBuffers{}
		e.bufs[i] = b
		if b.ready, err = e.event(false); err != nil {
			return err
		}
		for k, p := range []*gpu.Event{&b.encBeg, &b.encEnd, &b.xBeg, &b.xEnd, &b.decBeg, &b.decEnd, &b.xMid, &b.midEnd} {
			if *p, err = e.event(k < 6); err != nil { // the stage bounds are timed
				return err
			}
		}
	}
	if e.cfg.Momentum == 0 || e.sharded() {
		return nil // a sharded StrategyHier's engine across nodes keeps the velocities
	}
	if e.momStatuses, err = e.alloc(kernels.StatusLen * len(e.buckets)); err != nil {
		return err
	}
	for i, bk := range e.buckets {
		b := e.bufs[i]
		for _, p := range []*gpu.Ptr{&b.mom, &b.next} {
			if *p, err = e.alloc(4 * bk.n); err != nil {
				return err
			}
		}
		if err := e.dev.CopyIn(e.enc, b.mom, make([]byte, 4*bk.n)); err != nil {
			return err
		}
	}
	return nil
}

// prepare allocates bucket bk's buffers for the strategy's compressed
// path (devExchanger.buffers: slots, workspaces and zeroed memories) the
// first time it takes that path, and again, for the active schedule
// phase's codec, the first time it takes it in another phase: then the
// slots and workspaces are replaced, and the memories (floats per
// element, whatever the codec) carry over. On a failure the bucket keeps
// the buffers it had.
func (e *DeviceEngine) prepare(bk *bucket) error {
	b := e.bufs[bk.idx]
	if b.send != 0 && b.phase == e.active {
		return nil
	}
	nb := *b
	nb.phase, nb.send, nb.recv, nb.work, nb.send2, nb.recv2, nb.work2 = e.active, 0, 0, 0, 0, 0, 0
	nb.slot, nb.slot2 = 0, 0
	if err := e.allocAll(e.x.buffers(bk, &nb)); err != nil {
		return err
	}
	// Another phase's slots and workspaces: the last step that used them
	// has ended (Wait).
	for _, p := range []gpu.Ptr{b.send, b.recv, b.work, b.send2, b.recv2, b.work2} {
		if err := e.free(p); err != nil {
			return err
		}
	}
	*b = nb
	return nil
}

// devAlloc is one buffer allocAll allocates when needed and not held
// (kept from another schedule phase): bytes into p (devBuf), or a memory
// of n floats, zeroed, into r (devMem).
type devAlloc struct {
	p    *gpu.Ptr
	r    **devresid.Residual
	size int // p's bytes, r's floats
	need bool
}

// devBuf is a buffer of bytes into p, when needed.
func devBuf(p *gpu.Ptr, bytes int, need bool) devAlloc {
	return devAlloc{p: p, size: bytes, need: need}
}

// devMem is a memory of n floats into r, when needed.
func devMem(r **devresid.Residual, n int, need bool) devAlloc {
	return devAlloc{r: r, size: n, need: need}
}

// allocAll allocates the buffers of bufs (those needed and not yet held).
func (e *DeviceEngine) allocAll(bufs []devAlloc) error {
	for _, x := range bufs {
		var err error
		switch {
		case !x.need:
		case x.r != nil && *x.r == nil:
			*x.r, err = devresid.New(e.dev, e.enc, x.size)
			if err == nil {
				e.resids = append(e.resids, *x.r)
			}
		case x.p != nil && *x.p == 0:
			*x.p, err = e.alloc(x.size)
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// free releases p, an allocation of alloc (0: nothing).
func (e *DeviceEngine) free(p gpu.Ptr) error {
	if p == 0 {
		return nil
	}
	for i, q := range e.mem {
		if q == p {
			e.mem = append(e.mem[:i], e.mem[i+1:]...)
			break
		}
	}
	return e.dev.Free(p)
}

// release destroys the events and streams and frees the buffers, and
// returns the first failure.
func (e *DeviceEngine) release() error {
	var first error
	keep := func(err error) {
		if err != nil && first == nil {
			first = err
		}
	}
	for _, ev := range e.events {
		keep(e.dev.DestroyEvent(ev))
	}
	for _, s := range []gpu.Stream{e.enc, e.wire, e.dec} {
		if s != 0 {
			keep(e.dev.DestroyStream(s))
		}
	}
	for _, p := range e.mem {
		keep(e.dev.Free(p))
	}
	for _, r := range e.resids {
		keep(r.Free())
	}
	e.events, e.mem, e.resids, e.bufs = nil, nil, nil, nil
	e.released = true
	return first
}

// memory copies the error-feedback memories from the device (which waits
// for the engine's streams).
func (e *DeviceEngine) memory(call string) (gradEF, partEF *compress.ErrorFeedback, err error) {
	if e.released {
		return nil, nil, &UsageError{Call: call, Err: ErrEngineClosed}
	}
	if e.mem1 != nil {
		gradEF = compress.NewErrorFeedback(e.mem1)
	}
	if e.mem2 != nil {
		partEF = compress.NewErrorFeedback(e.mem2)
	}
	for i, bk := range e.buckets {
		b := e.bufs[i]
		if b.send == 0 {
			continue // never compressed: no memory
		}
		for _, m := range e.memories(bk, gradEF, partEF) {
			if err := m.r.SaveTo(e.enc, m.f, uint64(i)); err != nil {
				return nil, nil, fmt.Errorf("overlap: %s on rank %d: bucket %d's %s memory: %w", call, e.rank, i, m.tag, err)
			}
		}
	}
	return gradEF, partEF, nil
}

// devMemory is one of a bucket's memories on the device, and the host
// memory it is saved to and loaded from.
type devMemory struct {
	f   *compress.ErrorFeedback
	r   *devresid.Residual
	tag string
}

// memories returns bucket bk's memories on the device, paired with gradEF
// and partEF; ones that do not exist or are empty are left out.
func (e *DeviceEngine) memories(bk *bucket, gradEF, partEF *compress.ErrorFeedback) []devMemory {
	b := e.bufs[bk.idx]
	tag2 := "stage-2"
	if b.layout != nil {
		tag2 = "warm start's"
	}
	var out []devMemory
	for _, m := range []devMemory{{gradEF, b.resid, "stage-1"}, {partEF, b.resid2, tag2}} {
		if m.f != nil && m.r != nil && m.r.Len() > 0 {
			out = append(out, m)
		}
	}
	return out
}

// install copies memories Load validated to the device (zeros where they
// hold none for a bucket), ordered before the next step's compression. A
// bucket never compressed gets its buffers now if the state holds memory
// for it, so that nothing loaded is lost.
func (e *DeviceEngine) install(gradEF, partEF *compress.ErrorFeedback) error {
	for i, bk := range e.buckets {
		holds := func(f *compress.ErrorFeedback) bool { return f != nil && f.Residual(uint64(i)) != nil }
		if e.bufs[i].send == 0 {
			if !holds(gradEF) && !holds(partEF) {
				continue
			}
			if err := e.prepare(bk); err != nil {
				return fmt.Errorf("overlap: Load on rank %d: preparing bucket %d: %w", e.rank, i, err)
			}
		}
		for _, m := range e.memories(bk, gradEF, partEF) {
			if err := m.r.LoadFrom(e.enc, m.f, uint64(i)); err != nil {
				return fmt.Errorf("overlap: Load on rank %d: bucket %d's %s memory: %w", e.rank, i, m.tag, err)
			}
		}
	}
	return nil
}
