package main

import (
	"fmt"
	"runtime/cgo"
	"sync"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/kernels"
)

// compressor is what a gc_compressor handle refers to: a compressor, its
// error-feedback memory (host buckets in ef, device buckets in dev) and the
// deferred compresses not settled yet.
type compressor struct {
	c     compress.Compressor
	codec *kernels.Codec // the device kernels of c's spec (device.go), nil with deviceErr
	// deviceErr is why the kernels do not implement c's spec (a
	// *kernels.ArgumentError naming the options, e.g. top-k's chunk=), or
	// nil: every device call returns it.
	deviceErr error
	ef        *compress.ErrorFeedback
	dev       deviceMemory

	mu sync.Mutex
	// pending holds, per bucket, the deferred compress (GC_DEFER) waiting
	// for gc_settle, host (*compress.Pending) or device (*devicePending).
	// A nil value is one being computed: the bucket is claimed, so a second
	// deferred compress of it fails at once instead of waiting forever on
	// the bucket's lock.
	pending map[uint64]settler
}

// settler is a deferred compress waiting for gc_settle.
type settler interface {
	Commit()
	Retain()
	Discard()
}

// handles is the registry of live handles: compressors, hosted transports,
// engines and outer loops. A handle is a runtime/cgo.Handle whose Value is called only
// after the registry has confirmed it is live, so an unknown or destroyed
// value is an error, never cgo's panic.
var handles = struct {
	mu   sync.RWMutex
	live map[cgo.Handle]struct{}
}{live: map[cgo.Handle]struct{}{}}

// newHandle registers v and returns its handle, never 0.
func newHandle(v any) uint64 {
	h := cgo.NewHandle(v)
	handles.mu.Lock()
	handles.live[h] = struct{}{}
	handles.mu.Unlock()
	return uint64(h)
}

// lookupAs returns the value of a live handle of type T, named kind in
// errors.
func lookupAs[T any](h uint64, kind string) (T, error) {
	handles.mu.RLock()
	defer handles.mu.RUnlock()
	return liveValue[T](h, kind)
}

// lookupKind is lookupAs whose error is the ABI's GC_ERR_HANDLE.
func lookupKind[T any](h uint64, kind string) (T, error) {
	v, err := lookupAs[T](h, kind)
	if err != nil {
		return v, errorf(errHandle, "%v", err)
	}
	return v, nil
}

// withHandle runs call on the value of kind at handle h and returns fn's
// status: GC_OK, or the error's (recorded as the thread's last error; a
// handle that is not a live kind is GC_ERR_HANDLE).
func withHandle[T any](fn string, h uint64, kind string, call func(T) error) int {
	v, err := lookupKind[T](h, kind)
	if err == nil {
		err = call(v)
	}
	if err != nil {
		return int(failErr(fn, err))
	}
	return int(statusOK)
}

// liveValue is lookupAs under handles.mu.
func liveValue[T any](h uint64, kind string) (T, error) {
	var zero T
	if _, ok := handles.live[cgo.Handle(h)]; !ok {
		return zero, fmt.Errorf("handle %d is not a live %s (never created, or destroyed)", h, kind)
	}
	v, ok := cgo.Handle(h).Value().(T)
	if !ok {
		return zero, fmt.Errorf("handle %d is a %T, not a %s", h, cgo.Handle(h).Value(), kind)
	}
	return v, nil
}

// releaseAs unregisters the live handle h of type T and returns its value.
// Calls already running on it finish normally.
func releaseAs[T any](h uint64, kind string) (T, error) {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	v, err := liveValue[T](h, kind)
	if err != nil {
		return v, err
	}
	delete(handles.live, cgo.Handle(h))
	cgo.Handle(h).Delete()
	return v, nil
}

// lookup returns the compressor of a live handle.
func lookup(h uint64) (*compressor, error) { return lookupAs[*compressor](h, "compressor") }

// release unregisters the compressor handle h. Device calls still running
// on a bucket finish before its memory is freed (by the caller, with
// dev.close), and later ones fail.
func release(h uint64) (*compressor, error) { return releaseAs[*compressor](h, "compressor") }

// liveHandles returns how many handles are live.
func liveHandles() int {
	handles.mu.RLock()
	defer handles.mu.RUnlock()
	return len(handles.live)
}
