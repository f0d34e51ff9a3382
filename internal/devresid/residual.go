// Package devresid is error-feedback memory in device memory, the one
// implementation behind the device engine (overlap.DeviceEngine) and the
// plugin's device compressor calls (gc_compress_device).
//
// A Residual is one bucket's memory e. The kernels never overwrite e: a
// compress reads e (Ptr) and writes the new residual beside it (Out), and
// a deferred compress also writes the sum e + g (Sum). Settling only
// swaps pointers: Commit installs the new residual, Retain the sum, and
// leaving both alone keeps e (a failed step, a discarded compress). So a
// compress that fails, or is never settled, leaves e as it was.
package devresid

import (
	"errors"
	"fmt"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
)

// Device is what a Residual needs of a GPU: its memory.
type Device = gpu.Memory

// Residual is one bucket's error-feedback memory of n float32 on a
// device. Its methods are not safe for concurrent use. A nil *Residual
// is no memory: Ptr and Out are 0 and Commit does nothing.
type Residual struct {
	dev         Device
	n           int
	e, out, sum gpu.Ptr
}

// minFloats is the smallest allocation in floats: a memory of a few
// elements (or none) still gets buffers a kernel may be handed.
const minFloats = 4

// New allocates the memory and the buffer its kernels write, and zeroes
// the memory on stream s (enqueued: work later on s sees zeros).
func New(dev Device, s gpu.Stream, n int) (r *Residual, err error) {
	r = &Residual{dev: dev, n: n}
	defer func() {
		if err != nil {
			err = errors.Join(err, r.Free())
		}
	}()
	bytes := 4 * max(n, minFloats)
	for _, p := range []*gpu.Ptr{&r.e, &r.out} {
		if *p, err = dev.Alloc(bytes); err != nil {
			return nil, fmt.Errorf("devresid: allocating %d bytes of error-feedback memory: %w", bytes, err)
		}
	}
	if err := dev.CopyIn(s, r.e, make([]byte, bytes)); err != nil {
		return nil, fmt.Errorf("devresid: zeroing error-feedback memory: %w", err)
	}
	return r, nil
}

// Len is the memory's length in elements.
func (r *Residual) Len() int { return r.n }

// Ptr is the memory e, which a compress reads (kernels' Resid).
func (r *Residual) Ptr() gpu.Ptr {
	if r == nil {
		return 0
	}
	return r.e
}

// Out is the buffer a compress writes the new residual to (kernels'
// ResidOut), which Commit installs.
func (r *Residual) Out() gpu.Ptr {
	if r == nil {
		return 0
	}
	return r.out
}

// Sum is the buffer a deferred compress writes e + g to, which Retain
// installs; it is allocated on first use.
func (r *Residual) Sum() (gpu.Ptr, error) {
	if r.sum == 0 {
		p, err := r.dev.Alloc(4 * max(r.n, minFloats))
		if err != nil {
			return 0, fmt.Errorf("devresid: allocating the %d-element sum buffer: %w", r.n, err)
		}
		r.sum = p
	}
	return r.sum, nil
}

// Commit installs the new residual Out holds (e ← x − D(C(x))).
func (r *Residual) Commit() {
	if r != nil {
		r.e, r.out = r.out, r.e
	}
}

// Retain installs the sum Sum holds (e ← e + g); without a sum buffer
// it keeps e.
func (r *Residual) Retain() {
	if r.sum != 0 {
		r.e, r.sum = r.sum, r.e
	}
}

// SaveTo copies the memory to the host, on stream s (waiting for it),
// as bucket id's residual in f.
func (r *Residual) SaveTo(s gpu.Stream, f *compress.ErrorFeedback, id uint64) error {
	e := make([]float32, r.n)
	if err := r.dev.CopyOut(s, f32.Bytes(e), r.e); err != nil {
		return fmt.Errorf("devresid: copying bucket %d's residual from the device: %w", id, err)
	}
	return f.SetResidual(id, e)
}

// LoadFrom copies bucket id's residual in f (zeros if f holds none) into
// the memory on stream s (enqueued).
func (r *Residual) LoadFrom(s gpu.Stream, f *compress.ErrorFeedback, id uint64) error {
	e := f.Residual(id)
	switch {
	case e == nil:
		e = make([]float32, r.n)
	case len(e) != r.n:
		return &compress.SizeError{What: fmt.Sprintf("bucket %d's host residual for its device memory", id), Got: int64(len(e)), Want: int64(r.n)}
	}
	if err := r.dev.CopyIn(s, r.e, f32.Bytes(e)); err != nil {
		return fmt.Errorf("devresid: copying bucket %d's residual to the device: %w", id, err)
	}
	return nil
}

// Free releases the device buffers (none may be in use on a stream) and
// returns the first failure.
func (r *Residual) Free() error {
	var first error
	for _, p := range []*gpu.Ptr{&r.e, &r.out, &r.sum} {
		if *p == 0 {
			continue
		}
		if err := r.dev.Free(*p); err != nil && first == nil {
			first = fmt.Errorf("devresid: freeing error-feedback memory: %w", err)
		}
		*p = 0
	}
	return first
}
