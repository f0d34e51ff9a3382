package fakegpu

import (
	"runtime"
	"sync"
	"testing"
)

// TestBindPerThread: Bind makes a device current on the calling OS thread
// only; Close unbinds the platform's devices.
func TestBindPerThread(t *testing.T) {
	p := New(2)
	var bound, read sync.WaitGroup
	bound.Add(2)
	read.Add(2)
	both, closed := make(chan struct{}), make(chan struct{})
	var after [2]int
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			runtime.LockOSThread()
			defer runtime.UnlockOSThread()
			if c := Current(); c != -1 {
				t.Errorf("thread %d: Current before Bind: %d, want -1", i, c)
			}
			p.Device(i).Bind()
			bound.Done()
			<-both
			after[i] = Current()
			read.Done()
			<-closed
			if c := Current(); c != -1 {
				t.Errorf("thread %d: Current after Close: %d, want -1", i, c)
			}
		})
	}
	bound.Wait()
	close(both)
	read.Wait()
	p.Close()
	close(closed)
	wg.Wait()
	if after != [2]int{0, 1} {
		t.Errorf("Current on the two threads: %v, want [0 1]", after)
	}
}
