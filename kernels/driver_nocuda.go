//go:build !cuda

package kernels

import (
	"time"

	"github.com/gradcomp/gradcomp/gpu"
)

// Context is a device's primary context with gradcomp's kernels loaded. In
// this build (no cuda tag) none can be opened: every method returns
// ErrNoCUDA.
type Context struct{}

// Open returns ErrNoCUDA: this build has no CUDA support.
func Open(ordinal int) (*Context, error) { return nil, ErrNoCUDA }

// Info returns the zero DeviceInfo.
func (c *Context) Info() DeviceInfo { return DeviceInfo{} }

// Close does nothing.
func (c *Context) Close() error { return nil }

func (c *Context) run(gpu.Stream, []step) error { return ErrNoCUDA }

// Alloc returns ErrNoCUDA.
func (c *Context) Alloc(int) (gpu.Ptr, error) { return 0, ErrNoCUDA }

// Free returns ErrNoCUDA (nil for Free(0)).
func (c *Context) Free(p gpu.Ptr) error {
	if p == 0 {
		return nil
	}
	return ErrNoCUDA
}

// CopyIn returns ErrNoCUDA.
func (c *Context) CopyIn(gpu.Stream, gpu.Ptr, []byte) error { return ErrNoCUDA }

// CopyOut returns ErrNoCUDA.
func (c *Context) CopyOut(gpu.Stream, []byte, gpu.Ptr) error { return ErrNoCUDA }

// Copy returns ErrNoCUDA.
func (c *Context) Copy(gpu.Stream, gpu.Ptr, gpu.Ptr, int) error { return ErrNoCUDA }

// NewStream returns ErrNoCUDA.
func (c *Context) NewStream() (gpu.Stream, error) { return 0, ErrNoCUDA }

// DestroyStream returns ErrNoCUDA.
func (c *Context) DestroyStream(gpu.Stream) error { return ErrNoCUDA }

// Synchronize returns ErrNoCUDA.
func (c *Context) Synchronize(gpu.Stream) error { return ErrNoCUDA }

// NewEvent returns ErrNoCUDA.
func (c *Context) NewEvent(bool) (gpu.Event, error) { return 0, ErrNoCUDA }

// DestroyEvent returns ErrNoCUDA.
func (c *Context) DestroyEvent(gpu.Event) error { return ErrNoCUDA }

// Record returns ErrNoCUDA.
func (c *Context) Record(gpu.Event, gpu.Stream) error { return ErrNoCUDA }

// WaitEvent returns ErrNoCUDA.
func (c *Context) WaitEvent(gpu.Stream, gpu.Event) error { return ErrNoCUDA }

// EventQuery returns ErrNoCUDA.
func (c *Context) EventQuery(gpu.Event) (bool, error) { return false, ErrNoCUDA }

// EventSynchronize returns ErrNoCUDA.
func (c *Context) EventSynchronize(gpu.Event) error { return ErrNoCUDA }

// Elapsed returns ErrNoCUDA.
func (c *Context) Elapsed(gpu.Event, gpu.Event) (time.Duration, error) { return 0, ErrNoCUDA }
