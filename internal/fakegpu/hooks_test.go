//go:build cgo

package fakegpu

import (
	"runtime"
	"slices"
	"sync"
	"testing"

	"github.com/gradcomp/gradcomp/internal/fakegpu/hooktest"
)

// TestNCCLHooks: AttachNCCL installs the hooks through the mock's
// gcmock_set_device_hooks; from C, the current-device hook answers the
// calling thread's device, and the launch hook runs host functions in the
// stream's order and refuses a stream of another device, naming both.
func TestNCCLHooks(t *testing.T) {
	p := platform(t, 2)
	if err := p.AttachNCCL(hooktest.SetHooksAddr()); err != nil {
		t.Fatal(err)
	}
	d1 := p.Device(1)
	var wg sync.WaitGroup
	wg.Go(func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if c := hooktest.CurrentDevice(); c != -1 {
			t.Errorf("current device before Bind: %d, want -1", c)
		}
		d1.Bind()
		if c := hooktest.CurrentDevice(); c != 1 {
			t.Errorf("current device after Bind: %d, want 1", c)
		}
	})
	wg.Wait()

	s1 := newStream(t, d1)
	var mu sync.Mutex
	var got []int
	for i := range 10 {
		if err := hooktest.Launch(uintptr(s1), 1, func() {
			mu.Lock()
			got = append(got, i)
			mu.Unlock()
		}); err != nil {
			t.Fatal(err)
		}
	}
	if err := hooktest.Launch(0, 0, func() {}); err != nil {
		t.Errorf("device 0's default stream: %v", err)
	}
	if err := d1.Synchronize(s1); err != nil {
		t.Fatal(err)
	}
	if !slices.IsSorted(got) || len(got) != 10 {
		t.Errorf("launched host functions ran in the order %v", got)
	}
	err := hooktest.Launch(uintptr(s1), 0, func() { t.Error("ran on a refused launch") })
	wantErr(t, "launch on device 0 of device 1's stream", err, "belongs to fake device 1, used on fake device 0")
	wantErr(t, "launch on device 2", hooktest.Launch(0, 2, func() {}), "no fake device 2")
}
