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
	codec *kernels.Codec // the device kernels of c's spec (device.go)
	ef    *compress.ErrorFeedback
	dev   deviceMemory

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

// handles is the registry of live handles. A handle is a runtime/cgo.Handle
// whose Value is called only after the registry has confirmed it is live, so
// an unknown or destroyed value is an error, never cgo's panic.
var handles = struct {
	mu   sync.RWMutex
	live map[cgo.Handle]struct{}
}{live: map[cgo.Handle]struct{}{}}

// newHandle registers c and returns its handle, never 0.
func newHandle(c *compressor) uint64 {
	h := cgo.NewHandle(c)
	handles.mu.Lock()
	handles.live[h] = struct{}{}
	handles.mu.Unlock()
	return uint64(h)
}

// lookup returns the compressor of a live handle.
func lookup(h uint64) (*compressor, error) {
	handles.mu.RLock()
	defer handles.mu.RUnlock()
	if _, ok := handles.live[cgo.Handle(h)]; !ok {
		return nil, fmt.Errorf("handle %d is not a live compressor (never created, or destroyed)", h)
	}
	return cgo.Handle(h).Value().(*compressor), nil
}

// release unregisters h and frees its device memory, if it has any. Host
// calls already running on it finish normally; device calls still running
// on a bucket finish before its memory is freed, and later ones fail.
func release(h uint64) (*compressor, error) {
	handles.mu.Lock()
	defer handles.mu.Unlock()
	if _, ok := handles.live[cgo.Handle(h)]; !ok {
		return nil, fmt.Errorf("handle %d is not a live compressor (never created, or destroyed)", h)
	}
	c := cgo.Handle(h).Value().(*compressor)
	delete(handles.live, cgo.Handle(h))
	cgo.Handle(h).Delete()
	return c, nil
}

// liveHandles returns how many handles are live.
func liveHandles() int {
	handles.mu.RLock()
	defer handles.mu.RUnlock()
	return len(handles.live)
}
