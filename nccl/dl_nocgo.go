//go:build !cgo

package nccl

import "unsafe"

// Without cgo nothing can be loaded: Open fails with ErrNoCgo, so no
// Library, and none of the functions below past dlopen, is ever reached.

const cgoEnabled = false

func dlopen(string, bool) (uintptr, error) { return 0, ErrNoCgo }
func dlsym(uintptr, string) uintptr        { return 0 }
func dlpath(uintptr) string                { return "" }
func dlhandlePath(uintptr) string          { return "" }
func dlclose(uintptr)                      {}
func ccall(uintptr, fnID, *[7]uintptr, unsafe.Pointer, unsafe.Pointer) Result {
	return ResultInternalError
}
func cstring(uintptr, fnID, uintptr) string { return "" }

func cudaBind(*[4]uintptr, int) (code, step int) { return -1, 0 }
func cudaErrorName(uintptr, int) string          { return "" }

type commSlot struct{}

func newCommSlot() commSlot          { return commSlot{} }
func (commSlot) ptr() unsafe.Pointer { return nil }
func (commSlot) load() uintptr       { return 0 }
func (commSlot) free()               {}
