package main

import (
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/devresid"
)

// deviceMemory is a compressor's device state: the error-feedback buckets
// kept in device memory and a pool of scratch blocks (status words and
// top-k workspace) for calls in flight.
type deviceMemory struct {
	mu      sync.Mutex
	buckets map[uint64]*deviceBucket
	scratch []scratchBlock // free blocks
	closed  bool
}

// deviceBucket is one bucket's error-feedback memory on a device, the
// device engine's kind (devresid): a compress writes the new residual,
// and with GC_DEFER the sum e + g, beside e, so that gc_settle only swaps
// pointers and a failed call leaves e as it was.
type deviceBucket struct {
	mu    sync.Mutex
	dev   *deviceContext
	r     *devresid.Residual
	freed bool // the memory was freed by a state load or a destroy
}

// scratchBlock is device scratch memory of a call: the status block at
// offset 0, the workspace at scratchWork.
type scratchBlock struct {
	dev   *deviceContext
	p     gpu.Ptr
	bytes int
}

// scratchWork is the workspace's offset in a scratch block (the status
// block needs 8-byte alignment, the workspace 256 for its tables).
const scratchWork = 256

// owns reports whether bucket's error-feedback memory is on a device.
func (m *deviceMemory) owns(bucket uint64) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	_, ok := m.buckets[bucket]
	return ok
}

// bucket returns bucket id's device memory for n elements on dev, locked,
// creating it on first use: zero, or the host residual the bucket has (a
// loaded state, or host compresses before), copied on dev's own stream.
func (m *deviceMemory) bucket(host *compress.ErrorFeedback, id uint64, n int, dev *deviceContext) (*deviceBucket, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, errorf(errHandle, "the compressor was destroyed during the call")
	}
	b, ok := m.buckets[id]
	if !ok {
		var err error
		if b, err = newDeviceBucket(host, id, n, dev); err != nil {
			m.mu.Unlock()
			return nil, err
		}
		if m.buckets == nil {
			m.buckets = map[uint64]*deviceBucket{}
		}
		m.buckets[id] = b
	}
	m.mu.Unlock()
	switch {
	case b.r.Len() != n:
		return nil, &compress.SizeError{What: fmt.Sprintf("gradient length for bucket %d", id), Got: int64(n), Want: int64(b.r.Len())}
	case b.dev != dev:
		return nil, errorf(errInvalid, "bucket %d's error-feedback memory is on device %d, the gradient on device %d", id, b.dev.ordinal, dev.ordinal)
	}
	b.mu.Lock()
	if b.freed {
		b.mu.Unlock()
		return nil, errorf(errState, "bucket %d's error-feedback memory was replaced (gc_state_load) or destroyed during the call", id)
	}
	return b, nil
}

// newDeviceBucket allocates bucket id's device memory and fills it from
// host (zero if the host has none), waiting for the copy.
func newDeviceBucket(host *compress.ErrorFeedback, id uint64, n int, dev *deviceContext) (*deviceBucket, error) {
	r, err := devresid.New(dev.ctx, dev.own, n)
	if err != nil {
		return nil, err
	}
	if err = r.LoadFrom(dev.own, host, id); err == nil {
		err = dev.ctx.Synchronize(dev.own)
	}
	if err != nil {
		r.Free() // the first error says what went wrong
		return nil, err
	}
	return &deviceBucket{dev: dev, r: r}, nil
}

// free releases the bucket's device memory (the caller holds b.mu or owns
// b alone) and returns the first failure.
func (b *deviceBucket) free() error {
	b.freed = true
	return b.r.Free()
}

// saveTo copies every device residual into f and returns the buckets
// copied, on each device's own stream (the caller's streams are not
// waited for: a residual is complete when the gc_compress_device that
// wrote it returns).
func (m *deviceMemory) saveTo(f *compress.ErrorFeedback) (map[uint64]bool, error) {
	saved := map[uint64]bool{}
	for id, b := range m.snapshot(false) {
		b.mu.Lock()
		if b.freed { // a concurrent gc_state_load or destroy won
			b.mu.Unlock()
			continue
		}
		err := b.r.SaveTo(b.dev.own, f, id)
		b.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("device %d: %w", b.dev.ordinal, err)
		}
		saved[id] = true
	}
	return saved, nil
}

// reset frees every device bucket (after a state load put them all on the
// host), waiting for calls running on them to finish.
func (m *deviceMemory) reset() error {
	var first error
	for id, b := range m.snapshot(true) {
		b.mu.Lock()
		if err := b.free(); err != nil && first == nil {
			first = fmt.Errorf("freeing bucket %d's device memory: %w", id, err)
		}
		b.mu.Unlock()
	}
	return first
}

// snapshot returns the device buckets (and with forget, drops them from
// m). m.mu is never held while a bucket's lock is awaited: a compress
// holds its bucket's lock while it takes and returns scratch under m.mu.
func (m *deviceMemory) snapshot(forget bool) map[uint64]*deviceBucket {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make(map[uint64]*deviceBucket, len(m.buckets))
	for id, b := range m.buckets {
		out[id] = b
	}
	if forget {
		m.buckets = nil
	}
	return out
}

// close frees everything (gc_compressor_destroy); later device calls fail.
func (m *deviceMemory) close() error {
	first := m.reset()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for _, s := range m.scratch {
		if err := s.dev.ctx.Free(s.p); err != nil && first == nil {
			first = err
		}
	}
	m.scratch = nil
	return first
}

// takeScratch returns a free scratch block of at least bytes on dev (the
// smallest that fits), or a new one.
func (m *deviceMemory) takeScratch(dev *deviceContext, bytes int) (scratchBlock, error) {
	m.mu.Lock()
	best := -1
	for i, s := range m.scratch {
		if s.dev == dev && s.bytes >= bytes && (best < 0 || s.bytes < m.scratch[best].bytes) {
			best = i
		}
	}
	if best >= 0 {
		s := m.scratch[best]
		m.scratch = append(m.scratch[:best], m.scratch[best+1:]...)
		m.mu.Unlock()
		return s, nil
	}
	m.mu.Unlock()
	p, err := dev.ctx.Alloc(bytes)
	return scratchBlock{dev: dev, p: p, bytes: bytes}, err
}

// putScratch returns a block to the pool (or frees it if the compressor was
// destroyed meanwhile). The call that used it has waited for its stream.
func (m *deviceMemory) putScratch(s scratchBlock) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		s.dev.ctx.Free(s.p) // nothing to report it to: the handle is gone
		return
	}
	m.scratch = append(m.scratch, s)
}

// devicePending is a deferred gc_compress_device waiting for gc_settle.
type devicePending struct{ b *deviceBucket }

// Commit installs the new residual s − D(c).
func (p *devicePending) Commit() { p.settle((*devresid.Residual).Commit) }

// Retain installs the sum e + g.
func (p *devicePending) Retain() { p.settle((*devresid.Residual).Retain) }

// Discard keeps e.
func (p *devicePending) Discard() {}

// settle runs install on the bucket's memory unless it was freed.
func (p *devicePending) settle(install func(*devresid.Residual)) {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if !p.b.freed {
		install(p.b.r)
	}
}
