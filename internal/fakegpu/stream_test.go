package fakegpu

import (
	"errors"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestStreamOrder: work on a stream runs in the order enqueued, host
// functions among the copies, and a blocked host function holds back its
// stream only.
func TestStreamOrder(t *testing.T) {
	d := platform(t, 1).Device(0)
	s, other := newStream(t, d), newStream(t, d)
	var mu sync.Mutex
	var got []int
	gate := make(chan struct{})
	if err := d.LaunchHostFunc(s, func() { <-gate }); err != nil {
		t.Fatal(err)
	}
	for i := range 100 {
		if err := d.LaunchHostFunc(s, func() {
			mu.Lock()
			got = append(got, i)
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := d.LaunchHostFunc(other, func() {}); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(other); err != nil {
		t.Fatalf("the other stream, while s is blocked: %v", err)
	}
	close(gate)
	if err := d.Synchronize(s); err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(got) || len(got) != 100 {
		t.Errorf("host functions ran in the order %v", got)
	}
}

// TestForeignStream: a stream of another device is refused at the call,
// naming both devices; handle 0 is each device's own default stream.
func TestForeignStream(t *testing.T) {
	p := platform(t, 2)
	d0, d1 := p.Device(0), p.Device(1)
	s1 := newStream(t, d1)
	for name, err := range map[string]error{
		"LaunchHostFunc": d0.LaunchHostFunc(s1, func() { t.Error("ran on a foreign stream") }),
		"Copy":           d0.Copy(s1, 0, 0, 0),
		"Synchronize":    d0.Synchronize(s1),
		"DestroyStream":  d0.DestroyStream(s1),
	} {
		wantErr(t, name, err, name, "belongs to fake device 1, used on fake device 0")
	}
	wantErr(t, "an unknown stream", d0.LaunchHostFunc(0x77, func() {}), "not a stream of any fake device")
	ran := make(chan int, 2)
	d0.LaunchHostFunc(0, func() { ran <- 0 })
	d1.LaunchHostFunc(0, func() { ran <- 1 })
	if err := errors.Join(d0.Synchronize(0), d1.Synchronize(0)); err != nil {
		t.Fatal(err)
	}
	if a, b := <-ran, <-ran; a+b != 1 {
		t.Errorf("the default streams ran %d and %d", a, b)
	}
	if err := d1.DestroyStream(s1); err != nil {
		t.Fatal(err)
	}
	if got := d1.Resources().Streams; got != 0 {
		t.Errorf("%d streams after DestroyStream, want 0", got)
	}
}

// TestStickyError: a fault while work runs skips the device's later work
// and is returned by every later call, EventQuery included; the other
// devices go on.
func TestStickyError(t *testing.T) {
	p := platform(t, 2)
	d, other := p.Device(0), p.Device(1)
	buf := alloc(t, d, 16)
	ev, err := d.NewEvent(false)
	if err != nil {
		t.Fatal(err)
	}
	d.Copy(0, buf, buf+8, 16) // the source runs 8 bytes past the end
	ran := false
	d.LaunchHostFunc(0, func() { ran = true })
	d.Record(ev, 0)
	if err := d.Synchronize(0); err == nil {
		t.Fatal("Synchronize after the fault: no error")
	}
	if ran {
		t.Error("work after the fault ran")
	}
	_, err = d.EventQuery(ev)
	wantErr(t, "EventQuery", err, "EventQuery on fake device 0", "Copy on stream 0x0 faulted", "past the end")
	_, err = d.Alloc(4)
	wantErr(t, "Alloc", err, "Alloc on fake device 0", "faulted")
	wantErr(t, "LaunchHostFunc", d.LaunchHostFunc(0, func() {}), "faulted")
	if _, err := other.Alloc(4); err != nil {
		t.Errorf("the other device: %v", err)
	}
}

// TestLaunchError: an injected launch error fails the kernel launches, not
// sticky, until cleared.
func TestLaunchError(t *testing.T) {
	d := platform(t, 1).Device(0)
	failed := errors.New("CUDA_ERROR_LAUNCH_FAILED")
	d.InjectLaunchError(failed)
	if err := d.Flush(0, flushArgs(t, d)); !errors.Is(err, failed) {
		t.Errorf("Flush: %v, want the injected error", err)
	}
	if err := d.Synchronize(0); err != nil {
		t.Errorf("Synchronize after a failed launch: %v", err)
	}
	d.InjectLaunchError(nil)
	if err := errors.Join(d.Flush(0, flushArgs(t, d)), d.Synchronize(0)); err != nil {
		t.Errorf("Flush after clearing: %v", err)
	}
}

// TestCloseWaits: Close lets the work enqueued run, then the device's
// calls fail.
func TestCloseWaits(t *testing.T) {
	p := New(1)
	d := p.Device(0)
	done := false
	d.LaunchHostFunc(newStream(t, d), func() {
		time.Sleep(10 * time.Millisecond)
		done = true
	})
	p.Close()
	if !done {
		t.Error("Close returned before the stream's work ran")
	}
	_, err := d.NewStream()
	wantErr(t, "NewStream after Close", err, "the platform is closed")
}
