//go:build cgo

// Package hooktest is a TEST FIXTURE: the C side of the device hooks of
// the mock libnccl.so.2 (gcmock_set_device_hooks and calls of the hooks it
// stores, as the mock makes them), so that fakegpu's tests run AttachNCCL
// and the hooks through C. Only _test.go files import it.
package hooktest

// #include "hooktest.h"
import "C"

import (
	"errors"
	"runtime/cgo"
)

// SetHooksAddr returns the address of the fixture's
// gcmock_set_device_hooks, what AttachNCCL takes.
func SetHooksAddr() uintptr { return uintptr(C.hooktest_set_hooks_addr()) }

// CurrentDevice calls the installed current-device hook (-2 if none is).
func CurrentDevice() int { return int(C.hooktest_current_device()) }

// Launch calls the installed launch hook with stream and device, and a C
// function that runs fn, and returns the hook's error message.
func Launch(stream uintptr, device int, fn func()) error {
	h := cgo.NewHandle(fn)
	var msg [256]C.char
	if rc := C.hooktest_launch(C.uintptr_t(stream), C.int(device), C.uintptr_t(h), &msg[0], C.size_t(len(msg))); rc != 0 {
		h.Delete()
		if rc == -2 {
			return errors.New("hooktest: no launch hook installed")
		}
		return errors.New(C.GoString(&msg[0]))
	}
	return nil
}

//export hooktestRun
func hooktestRun(handle C.uintptr_t) {
	h := cgo.Handle(handle)
	defer h.Delete()
	h.Value().(func())()
}
