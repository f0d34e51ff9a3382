package fakegpu

import (
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/gpu"
)

// newEvent creates an event on d or fails the test.
func newEvent(t *testing.T, d *Device, timing bool) gpu.Event {
	t.Helper()
	e, err := d.NewEvent(timing)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// TestEventCapturesPosition: Record marks the work enqueued so far, not
// later work; a stream waiting for the event waits for exactly that.
func TestEventCapturesPosition(t *testing.T) {
	d := platform(t, 1).Device(0)
	s, w := newStream(t, d), newStream(t, d)
	ev := newEvent(t, d, true)
	first, second := make(chan struct{}), make(chan struct{})
	d.LaunchHostFunc(s, func() { <-first })
	if err := d.Record(ev, s); err != nil {
		t.Fatal(err)
	}
	d.LaunchHostFunc(s, func() { <-second }) // after the record: not waited for
	if ok, err := d.EventQuery(ev); ok || err != nil {
		t.Fatalf("EventQuery before the work ran: %v, %v", ok, err)
	}
	if err := d.WaitEvent(w, ev); err != nil {
		t.Fatal(err)
	}
	passed := make(chan struct{})
	d.LaunchHostFunc(w, func() { close(passed) })
	select {
	case <-passed:
		t.Fatal("the waiting stream passed the event before it completed")
	case <-time.After(10 * time.Millisecond):
	}
	close(first)
	<-passed // the work after the record is still blocked
	if ok, err := d.EventQuery(ev); !ok || err != nil {
		t.Errorf("EventQuery after the work ran: %v, %v", ok, err)
	}
	close(second)
	start := newEvent(t, d, true)
	d.Record(start, s)
	d.Record(ev, s)
	d.Synchronize(s)
	if el, err := d.Elapsed(start, ev); err != nil || el < 0 {
		t.Errorf("Elapsed: %v, %v", el, err)
	}
}

// TestEventNeverRecorded: an event never recorded is complete, and a wait
// for it is a no-op.
func TestEventNeverRecorded(t *testing.T) {
	d := platform(t, 1).Device(0)
	ev := newEvent(t, d, false)
	if ok, err := d.EventQuery(ev); !ok || err != nil {
		t.Errorf("EventQuery: %v, %v; want complete", ok, err)
	}
	if err := d.WaitEvent(0, ev); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(0); err != nil {
		t.Fatal(err)
	}
	_, err := d.Elapsed(ev, ev)
	wantErr(t, "Elapsed of a non-timing event", err, "without timing")
}

// TestEventsAcrossDevices: an event of another device is refused by
// Record, EventQuery, Elapsed and DestroyEvent, naming both devices, but a
// stream may wait for it.
func TestEventsAcrossDevices(t *testing.T) {
	p := platform(t, 2)
	d0, d1 := p.Device(0), p.Device(1)
	ev1 := newEvent(t, d1, true)
	ev0 := newEvent(t, d0, true)
	_, errQuery := d0.EventQuery(ev1)
	_, errElapsed := d0.Elapsed(ev0, ev1)
	for name, err := range map[string]error{
		"Record":                     d0.Record(ev1, 0),
		"Record on a foreign stream": d1.Record(ev1, newStream(t, d0)),
		"EventQuery":                 errQuery,
		"Elapsed":                    errElapsed,
		"DestroyEvent":               d0.DestroyEvent(ev1),
	} {
		wantErr(t, name, err, "belongs to fake device", "used on fake device")
	}
	gate := make(chan struct{})
	d1.LaunchHostFunc(0, func() { <-gate })
	if err := d1.Record(ev1, 0); err != nil {
		t.Fatal(err)
	}
	if err := d0.WaitEvent(0, ev1); err != nil {
		t.Fatalf("WaitEvent on device 1's event: %v", err)
	}
	passed := make(chan struct{})
	d0.LaunchHostFunc(0, func() { close(passed) })
	select {
	case <-passed:
		t.Fatal("device 0's stream passed device 1's event before it completed")
	case <-time.After(10 * time.Millisecond):
	}
	close(gate)
	<-passed
	if err := d1.DestroyEvent(ev1); err != nil {
		t.Fatal(err)
	}
	if got := d1.Resources().Events; got != 0 {
		t.Errorf("%d events after DestroyEvent, want 0", got)
	}
}
