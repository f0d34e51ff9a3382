package fakegpu

import (
	"sync"

	"golang.org/x/sys/unix"
)

// current maps an OS thread id to the device current on it.
var current sync.Map // int → *Device

// Bind makes the device current on the calling OS thread, as
// cudaSetDevice does for CUDA's per-thread context; the caller must hold
// the thread (runtime.LockOSThread) for the binding to mean anything.
// The mock NCCL asks which device the thread that initializes a
// communicator has current (Current, and the hook AttachNCCL installs).
func (d *Device) Bind() { current.Store(unix.Gettid(), d) }

// Current returns the ordinal of the device current on the calling OS
// thread (Bind), or -1 if none is.
func Current() int {
	if d, ok := current.Load(unix.Gettid()); ok {
		return d.(*Device).ordinal
	}
	return -1
}

// unbind removes the bindings of p's devices.
func unbind(p *Platform) {
	current.Range(func(tid, d any) bool {
		if d.(*Device).plat == p {
			current.Delete(tid)
		}
		return true
	})
}
