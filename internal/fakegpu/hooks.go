//go:build cgo

package fakegpu

/*
#include <stddef.h>
#include <stdint.h>

typedef int (*gcmock_current_device_fn)(void);
typedef void (*gcmock_host_fn)(void *);
typedef int (*gcmock_launch_fn)(void *stream, int device, gcmock_host_fn fn, void *arg, char *err, size_t errcap);
typedef void (*gcmock_set_device_hooks_fn)(gcmock_current_device_fn, gcmock_launch_fn);

extern int gcfakegpuCurrentDevice(void);
extern int gcfakegpuLaunch(void *stream, int device, gcmock_host_fn fn, void *arg, char *err, size_t errcap);

static inline void gcfakegpu_set_hooks(uintptr_t set) {
	((gcmock_set_device_hooks_fn)set)(gcfakegpuCurrentDevice, gcfakegpuLaunch);
}

static inline void gcfakegpu_call(gcmock_host_fn fn, void *arg) { fn(arg); }
*/
import "C"

import (
	"errors"
	"fmt"
	"sync/atomic"
	"unsafe"

	"github.com/gradcomp/gradcomp/gpu"
)

// hooked is the platform whose devices the mock NCCL's hooks reach
// (AttachNCCL's).
var hooked atomic.Pointer[Platform]

// launchHook is the mock NCCL's launch hook: fn on stream s of device
// ordinal of the hooked platform (0: that device's default stream), after
// the work already on it. A stream of another device is refused.
func launchHook(s gpu.Stream, ordinal int, fn func()) error {
	p := hooked.Load()
	if p == nil {
		return errors.New("fakegpu: no platform is attached to the mock NCCL")
	}
	d, err := p.lookup(ordinal)
	if err != nil {
		return err
	}
	return d.LaunchHostFunc(s, fn)
}

// AttachNCCL installs the platform's devices as the mock libnccl.so.2's:
// setHooks is the address of the loaded mock's gcmock_set_device_hooks (a
// dlsym of it), which AttachNCCL calls with two functions of this package:
//
//	int current_device(void)  the calling thread's current device (Current), -1 for none
//	int launch(void *stream, int device, void (*fn)(void *), void *arg, char *err, size_t errcap)
//	                          fn(arg) enqueued on stream (0: the default stream) of
//	                          device `device` after the work already on it (LaunchHostFunc);
//	                          0, or nonzero with a message in err if the stream is not
//	                          that device's (or the device does not exist)
//
// The hooks reach one platform at a time: the one attached last.
func (p *Platform) AttachNCCL(setHooks uintptr) error {
	if setHooks == 0 {
		return fmt.Errorf("fakegpu: AttachNCCL: null gcmock_set_device_hooks")
	}
	hooked.Store(p)
	C.gcfakegpu_set_hooks(C.uintptr_t(setHooks))
	return nil
}

//export gcfakegpuCurrentDevice
func gcfakegpuCurrentDevice() C.int { return C.int(Current()) }

//export gcfakegpuLaunch
func gcfakegpuLaunch(stream unsafe.Pointer, device C.int, fn C.gcmock_host_fn, arg unsafe.Pointer, msg *C.char, msgCap C.size_t) C.int {
	err := launchHook(gpu.Stream(uintptr(stream)), int(device), func() { C.gcfakegpu_call(fn, arg) })
	if err == nil {
		return 0
	}
	if msg != nil && msgCap > 0 {
		buf := unsafe.Slice((*byte)(unsafe.Pointer(msg)), int(msgCap))
		buf[copy(buf[:len(buf)-1], err.Error())] = 0
	}
	return 1
}
