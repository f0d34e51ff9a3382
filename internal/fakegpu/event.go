package fakegpu

import (
	"fmt"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/gpu"
)

// mark is a point in a stream's work: it fires when the stream reaches it.
type mark struct {
	once sync.Once
	ch   chan struct{} // closed when the mark fires
	at   time.Time     // when it fired; read after ch is closed
}

func newMark() *mark { return &mark{ch: make(chan struct{})} }

func (m *mark) fire() {
	m.once.Do(func() {
		m.at = time.Now()
		close(m.ch)
	})
}

// done reports whether the mark has fired.
func (m *mark) done() bool {
	select {
	case <-m.ch:
		return true
	default:
		return false
	}
}

// event is a CUDA event: the mark of its latest Record.
type event struct {
	dev    *Device
	timing bool

	mu   sync.Mutex
	last *mark // nil until recorded
}

// latest returns the mark of the event's latest Record, or nil.
func (e *event) latest() *mark {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.last
}

// lookupEvent returns event h, or an error if h is no event or, unless anyDevice
// is set, one of another device.
func (d *Device) lookupEvent(h gpu.Event, anyDevice bool) (*event, error) {
	e, ok := reg.object(uintptr(h)).(*event)
	switch {
	case !ok:
		return nil, fmt.Errorf("event %#x is not an event of any fake device", h)
	case e.dev != d && !anyDevice:
		return nil, d.foreign("event", uintptr(h), e.dev)
	}
	return e, nil
}

// event is lookupEvent for the calls that take only the device's events.
func (d *Device) event(op string, h gpu.Event) (*event, error) {
	if err := d.err(op); err != nil {
		return nil, err
	}
	e, err := d.lookupEvent(h, false)
	if err != nil {
		return nil, fmt.Errorf("fakegpu: %s: %w", op, err)
	}
	return e, nil
}

// NewEvent creates an event of the device; timing events can be given to
// Elapsed.
func (d *Device) NewEvent(timing bool) (gpu.Event, error) {
	if err := d.err("NewEvent"); err != nil {
		return 0, err
	}
	return gpu.Event(reg.handle(&event{dev: d, timing: timing})), nil
}

// DestroyEvent releases event h.
func (d *Device) DestroyEvent(h gpu.Event) error {
	if _, err := d.event("DestroyEvent", h); err != nil {
		return err
	}
	reg.drop(uintptr(h))
	return nil
}

// Record makes event h the point stream s has reached with the work
// enqueued so far; both must be the device's.
func (d *Device) Record(h gpu.Event, s gpu.Stream) error {
	e, err := d.event("Record", h)
	if err != nil {
		return err
	}
	st, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("fakegpu: Record: %w", err)
	}
	m := newMark()
	st.enqueue(m.fire) // even after a fault, so that no waiter hangs
	e.mu.Lock()
	e.last = m
	e.mu.Unlock()
	return nil
}

// WaitEvent makes the work enqueued on stream s from now on wait until
// event h's latest Record (made before this call) has completed. The event
// may be of any fake device; a wait for one never recorded is a no-op.
func (d *Device) WaitEvent(s gpu.Stream, h gpu.Event) error {
	if err := d.err("WaitEvent"); err != nil {
		return err
	}
	e, err := d.lookupEvent(h, true)
	if err != nil {
		return fmt.Errorf("fakegpu: WaitEvent: %w", err)
	}
	st, err := d.stream(s)
	if err != nil {
		return fmt.Errorf("fakegpu: WaitEvent: %w", err)
	}
	if m := e.latest(); m != nil {
		st.enqueue(func() { <-m.ch })
	}
	return nil
}

// EventQuery reports whether event h's latest Record has completed (true
// for an event never recorded), or returns the device's sticky error.
func (d *Device) EventQuery(h gpu.Event) (bool, error) {
	e, err := d.event("EventQuery", h)
	if err != nil {
		return false, err
	}
	m := e.latest()
	return m == nil || m.done(), nil
}

// Elapsed returns the time between two completed Records of timing events
// of the device.
func (d *Device) Elapsed(start, end gpu.Event) (time.Duration, error) {
	a, err := d.event("Elapsed", start)
	if err != nil {
		return 0, err
	}
	b, err := d.event("Elapsed", end)
	if err != nil {
		return 0, err
	}
	if !a.timing || !b.timing {
		return 0, fmt.Errorf("fakegpu: Elapsed(%#x, %#x) on %s: an event was created without timing", start, end, d)
	}
	ma, mb := a.latest(), b.latest()
	if ma == nil || mb == nil || !ma.done() || !mb.done() {
		return 0, fmt.Errorf("fakegpu: Elapsed(%#x, %#x) on %s: an event is not recorded or not complete", start, end, d)
	}
	return mb.at.Sub(ma.at), nil
}
