package fakegpu

import (
	"fmt"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/workq"
)

// stream runs the work enqueued on it in order on a goroutine of its own,
// as a CUDA stream does on the device. Enqueueing never blocks.
type stream struct {
	dev *Device
	q   *workq.Queue
}

// newStream starts a stream of d.
func (d *Device) newStream() *stream {
	s := &stream{dev: d, q: workq.New()}
	d.plat.streams.Go(func() { <-s.q.Done() })
	return s
}

// enqueue appends fn to the stream's work; after close it is dropped.
func (s *stream) enqueue(fn func()) { s.q.Enqueue(fn) }

// close lets the work enqueued so far run, then ends the goroutine.
func (s *stream) close() { s.q.Close() }

// stream returns d's stream h (0: the default stream), or an error if h is
// no stream or one of another device.
func (d *Device) stream(h gpu.Stream) (*stream, error) {
	if h == 0 {
		return d.def, nil
	}
	s, ok := reg.object(uintptr(h)).(*stream)
	switch {
	case !ok:
		return nil, fmt.Errorf("stream %#x is not a stream of any fake device", h)
	case s.dev != d:
		return nil, d.foreign("stream", uintptr(h), s.dev)
	}
	return s, nil
}

// NewStream creates a stream of the device.
func (d *Device) NewStream() (gpu.Stream, error) {
	if err := d.err("NewStream"); err != nil {
		return 0, err
	}
	return gpu.Stream(reg.handle(d.newStream())), nil
}

// DestroyStream releases stream h; the work already on it still runs (as
// cuStreamDestroy). The default stream cannot be destroyed.
func (d *Device) DestroyStream(h gpu.Stream) error {
	if err := d.err("DestroyStream"); err != nil {
		return err
	}
	if h == 0 {
		return fmt.Errorf("fakegpu: DestroyStream on %s: the default stream cannot be destroyed", d)
	}
	s, err := d.stream(h)
	if err != nil {
		return fmt.Errorf("fakegpu: DestroyStream: %w", err)
	}
	reg.drop(uintptr(h))
	d.drain(s)
	return nil
}

// drain closes s and keeps it among the device's draining streams until
// its work has run: synchronize (so Free) waits for it, as cudaFree waits
// for the work of a destroyed stream.
func (d *Device) drain(s *stream) {
	d.mu.Lock()
	if d.draining == nil {
		d.draining = map[*stream]bool{}
	}
	d.draining[s] = true
	d.mu.Unlock()
	s.close()
	go func() {
		<-s.q.Done()
		d.mu.Lock()
		delete(d.draining, s)
		d.mu.Unlock()
	}()
}

// launch enqueues work on stream h, which runs it by run: the public
// calls that enqueue (op names the call in errors) are made of it.
func (d *Device) launch(op string, h gpu.Stream, work func()) error {
	if err := d.err(op); err != nil {
		return err
	}
	s, err := d.stream(h)
	if err != nil {
		return fmt.Errorf("fakegpu: %s: %w", op, err)
	}
	s.enqueue(func() { d.run(op, h, work) })
	return nil
}

// run runs work on stream h, unless the device has failed; a fault of
// work becomes the device's sticky error.
func (d *Device) run(op string, h gpu.Stream, work func()) {
	if d.failed() {
		return
	}
	defer func() {
		if r := recover(); r != nil {
			f, ok := r.(fault)
			if !ok {
				panic(r)
			}
			d.fail(fmt.Errorf("%s on stream %#x faulted: %w", op, h, f.err))
		}
	}()
	work()
}

// LaunchHostFunc enqueues fn on stream h after the work already on it, as
// cuLaunchHostFunc: fn runs on the stream's goroutine, and the stream's
// later work waits for it to return. fn may block, which holds back this
// stream only; it must not wait for later work of the same stream.
func (d *Device) LaunchHostFunc(h gpu.Stream, fn func()) error {
	return d.launch("LaunchHostFunc", h, fn)
}

// Synchronize waits until stream h has run the work enqueued so far, then
// returns the device's sticky error, if any (cuStreamSynchronize).
func (d *Device) Synchronize(h gpu.Stream) error {
	if err := d.err("Synchronize"); err != nil {
		return err
	}
	s, err := d.stream(h)
	if err != nil {
		return fmt.Errorf("fakegpu: Synchronize: %w", err)
	}
	m := newMark()
	s.enqueue(m.fire)
	<-m.ch
	return d.err("Synchronize")
}

// synchronize waits until every stream of the device has run the work
// enqueued so far.
func (d *Device) synchronize() {
	var marks []*mark
	for _, s := range append(reg.streams(d), d.def) {
		m := newMark()
		s.enqueue(m.fire)
		marks = append(marks, m)
	}
	for _, m := range marks {
		<-m.ch
	}
	d.mu.Lock()
	var draining []*stream
	for s := range d.draining {
		draining = append(draining, s)
	}
	d.mu.Unlock()
	for _, s := range draining {
		<-s.q.Done()
	}
}
