package fakegpu

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
)

// Platform is a set of fake devices, ordinals 0 to Len()-1, as the GPUs of
// one machine. Platforms are independent of each other (a test makes its
// own), but every fake device of the process refuses the pointers,
// streams and events of every other.
type Platform struct {
	devs    []*Device
	streams sync.WaitGroup // ends when every stream of the platform's devices has
	closed  atomic.Bool
}

// Device is one fake GPU of a Platform. Its methods are overlap.Device's
// and may be called from any goroutine.
type Device struct {
	plat    *Platform
	ordinal int
	def     *stream // the default stream, handle 0

	mu        sync.Mutex
	sticky    error            // the first failure of work on the device; later calls return it
	launchErr error            // InjectLaunchError's
	draining  map[*stream]bool // destroyed streams whose work still runs
}

// errClosed is the sticky error of a device whose platform is closed.
var errClosed = errors.New("the platform is closed")

// New returns a platform of n fake devices.
func New(n int) *Platform {
	if n <= 0 {
		panic(fmt.Sprintf("fakegpu.New(%d): a platform needs at least one device", n))
	}
	p := &Platform{devs: make([]*Device, n)}
	for i := range p.devs {
		d := &Device{plat: p, ordinal: i}
		d.def = d.newStream()
		p.devs[i] = d
	}
	return p
}

// Len returns the number of devices.
func (p *Platform) Len() int { return len(p.devs) }

// Device returns device i. It panics if i is not in [0, Len()).
func (p *Platform) Device(i int) *Device {
	d, err := p.lookup(i)
	if err != nil {
		panic(err)
	}
	return d
}

// lookup returns device i, or an error naming the ordinal.
func (p *Platform) lookup(i int) (*Device, error) {
	if i < 0 || i >= len(p.devs) {
		return nil, fmt.Errorf("fakegpu: no fake device %d (the platform has %d)", i, len(p.devs))
	}
	return p.devs[i], nil
}

// Close ends the platform: the streams finish the work already enqueued
// (Close waits for them), then every device's calls fail, its memory is
// unmapped, its streams and events are released and it is unbound from
// every thread. Closing twice does nothing.
func (p *Platform) Close() {
	if p.closed.Swap(true) {
		return
	}
	objs := reg.release(p)
	for _, d := range p.devs {
		d.def.close()
	}
	for _, obj := range objs {
		if s, ok := obj.(*stream); ok {
			s.close()
		}
	}
	p.streams.Wait()
	for _, d := range p.devs {
		d.fail(errClosed)
	}
	for _, obj := range objs {
		if a, ok := obj.(*allocation); ok {
			a.unmap()
		}
	}
	unbind(p)
}

// Ordinal returns the device's index in its platform.
func (d *Device) Ordinal() int { return d.ordinal }

// String names the device ("fake device 1").
func (d *Device) String() string { return fmt.Sprintf("fake device %d", d.ordinal) }

// foreign is the error for an object of owner used on d.
func (d *Device) foreign(what string, v uintptr, owner *Device) error {
	where := owner.String()
	if owner.plat != d.plat {
		where += " of another platform"
	}
	return fmt.Errorf("%s %#x belongs to %s, used on %s", what, v, where, d)
}

// err returns the device's sticky error, wrapped with the call op.
func (d *Device) err(op string) error {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sticky != nil {
		return fmt.Errorf("fakegpu: %s on %s: %w", op, d, d.sticky)
	}
	return nil
}

// failed reports whether the device has a sticky error.
func (d *Device) failed() bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.sticky != nil
}

// fail makes err the device's sticky error unless it has one.
func (d *Device) fail(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.sticky == nil {
		d.sticky = err
	}
}

// InjectLaunchError makes every later kernel launch on the device (Encode
// to LowRankDecode) return err without enqueueing anything, as a failed
// launch (CUDA_ERROR_LAUNCH_FAILED) does; nil ends it. Unlike a fault, it
// is not sticky: the device's other calls go on working.
func (d *Device) InjectLaunchError(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.launchErr = err
}

// Resources counts what a device holds.
type Resources struct {
	Allocations int
	Streams     int // created by NewStream and not destroyed (the default stream is not counted)
	Events      int
}

// Resources returns what the device holds now (a test's leak check).
func (d *Device) Resources() Resources { return reg.count(d) }
