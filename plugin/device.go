package main

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/kernels"
)

// The device entry points (ABI 1.2) on Go values: gc_compress_device and
// the gc_decompress*_device calls run kernels/ on a caller's CUDA stream,
// with error-feedback memory in device memory. In libgradcomp.so (no cuda
// tag) the same code runs and every call that reaches the device fails with
// GC_ERR_NOCUDA (kernels.ErrNoCUDA), after the same argument checks.
//
// Which calls wait for the device: gc_compress_device must return a
// status (a NaN is GC_ERR_NONFINITE) and a payload whose header and CRC32C
// are written by compress's framing on the host, so it waits for the
// caller's stream (up to and including its kernels) and copies the body to
// the host to checksum it. The decompress calls validate every payload on
// the host before anything is written (a corrupt top-k index would
// otherwise scatter out of bounds), so they wait for the stream to deliver
// the payloads, then enqueue the decode and return without waiting for it.
// gc_settle only swaps pointers. State save copies device residuals on
// gradcomp's own stream and waits for it, never for the caller's.

// maxSlots bounds gc_decompress_slots_device's count: far more ranks than
// any job has, and small enough that count × slot length cannot overflow.
const maxSlots = 1 << 16

// deviceContext is one device's primary context with the kernels loaded,
// and a stream of gradcomp's own for copies that must not wait on (or
// delay) a caller's stream.
type deviceContext struct {
	ordinal int
	ctx     *kernels.Context
	own     gpu.Stream
}

// devices holds the contexts opened so far, one per device ordinal, kept
// for the process's life (the primary context is PyTorch's too).
var devices = struct {
	mu   sync.Mutex
	open map[int]*deviceContext
}{open: map[int]*deviceContext{}}

// errNoCUDABuild is what device calls to libgradcomp.so (no cuda tag) fail
// with, saying which library to load instead.
var errNoCUDABuild = fmt.Errorf("this is libgradcomp.so, built without CUDA: device calls need libgradcomp_cuda.so (%w)", kernels.ErrNoCUDA)

// openDevice returns the context of device ordinal, opening it on first use.
// A failure is not cached: a later call tries again.
func openDevice(ordinal int) (*deviceContext, error) {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	if d, ok := devices.open[ordinal]; ok {
		return d, nil
	}
	ctx, err := kernels.Open(ordinal)
	if errors.Is(err, kernels.ErrNoCUDA) {
		return nil, errNoCUDABuild
	}
	if err != nil {
		return nil, err
	}
	s, err := ctx.NewStream()
	if err != nil {
		ctx.Close()
		return nil, err
	}
	d := &deviceContext{ordinal: ordinal, ctx: ctx, own: s}
	devices.open[ordinal] = d
	return d, nil
}

// deviceInfo describes device ordinal (gc_device_info).
func deviceInfo(ordinal int) (kernels.DeviceInfo, error) {
	if ordinal < 0 {
		return kernels.DeviceInfo{}, errorf(errInvalid, "device %d: ordinals start at 0", ordinal)
	}
	d, err := openDevice(ordinal)
	if err != nil {
		return kernels.DeviceInfo{}, err
	}
	return d.ctx.Info(), nil
}

// pointerInfo is what the CUDA driver knows of a device address
// (queryPointer, in devptr_cuda.go; devptr_nocuda.go has none).
type pointerInfo struct {
	device      bool // device (or managed) memory a kernel may read and write
	memoryType  int  // the CUmemorytype, 0 for an address CUDA does not know
	ordinal     int
	start, size uint64 // the allocation holding the address
}

// region is a device buffer an argument names: what (for messages), its
// address and its length in bytes.
type region struct {
	what  string
	p     gpu.Ptr
	bytes uint64
}

// deviceOf returns the context of the device that holds every region of
// non-zero length: each must be CUDA device memory (or managed memory),
// lie within one allocation and sit on the same device as the others.
func deviceOf(regions ...region) (*deviceContext, error) {
	ordinal := -1
	first := ""
	for _, r := range regions {
		if r.bytes == 0 {
			continue
		}
		info, err := queryPointer(r.p)
		if err != nil {
			return nil, fmt.Errorf("%s %#x: %w", r.what, uintptr(r.p), err)
		}
		if !info.device {
			return nil, errorf(errInvalid, "%s %#x is not CUDA device memory (memory type %d: host memory, or an address CUDA did not allocate)", r.what, uintptr(r.p), info.memoryType)
		}
		if end := uint64(r.p) + r.bytes; end > info.start+info.size || end < uint64(r.p) {
			return nil, errorf(errSize, "%s: %d bytes from %#x run past the end of its allocation (%d bytes from %#x)", r.what, r.bytes, uintptr(r.p), info.size, info.start)
		}
		switch {
		case ordinal < 0:
			ordinal, first = info.ordinal, r.what
		case info.ordinal != ordinal:
			return nil, errorf(errInvalid, "%s is on device %d but %s is on device %d", r.what, info.ordinal, first, ordinal)
		}
	}
	if ordinal < 0 {
		return nil, errorf(errInternal, "no device buffer to locate")
	}
	return openDevice(ordinal)
}

// deviceMemory is a compressor's device state: the error-feedback buckets
// kept in device memory and a pool of scratch blocks (status words and
// top-k workspace) for calls in flight.
type deviceMemory struct {
	mu      sync.Mutex
	buckets map[uint64]*deviceBucket
	scratch []scratchBlock // free blocks
	closed  bool
}

// deviceBucket is one bucket's error-feedback memory on a device. e is the
// residual; eo receives s − D(c) during a compress and s (with GC_DEFER
// only) the sum e + g, so that gc_settle only swaps pointers and a failed
// call leaves e as it was.
type deviceBucket struct {
	mu       sync.Mutex
	dev      *deviceContext
	n        int
	e, eo, s gpu.Ptr
	freed    bool // the memory was freed by a state load or a destroy
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
// With sum it also has the buffer of a deferred compress's sum.
func (m *deviceMemory) bucket(host *compress.ErrorFeedback, id uint64, n int, dev *deviceContext, sum bool) (*deviceBucket, error) {
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
	case b.n != n:
		return nil, &compress.SizeError{What: fmt.Sprintf("gradient length for bucket %d", id), Got: int64(n), Want: int64(b.n)}
	case b.dev != dev:
		return nil, errorf(errInvalid, "bucket %d's error-feedback memory is on device %d, the gradient on device %d", id, b.dev.ordinal, dev.ordinal)
	}
	b.mu.Lock()
	if b.freed {
		b.mu.Unlock()
		return nil, errorf(errState, "bucket %d's error-feedback memory was replaced (gc_state_load) or destroyed during the call", id)
	}
	if sum && b.s == 0 {
		p, err := dev.ctx.Alloc(max(4*n, 4))
		if err != nil {
			b.mu.Unlock()
			return nil, err
		}
		b.s = p
	}
	return b, nil
}

// newDeviceBucket allocates bucket id's device memory and fills the
// residual from host (zero if the host has none), waiting for the copy.
func newDeviceBucket(host *compress.ErrorFeedback, id uint64, n int, dev *deviceContext) (b *deviceBucket, err error) {
	e := host.Residual(id)
	if e != nil && len(e) != n {
		return nil, &compress.SizeError{What: fmt.Sprintf("gradient length for bucket %d (its residual was loaded or made on the host)", id), Got: int64(n), Want: int64(len(e))}
	}
	if e == nil {
		e = make([]float32, n)
	}
	b = &deviceBucket{dev: dev, n: n}
	defer func() {
		if err != nil {
			b.free()
		}
	}()
	for _, p := range []*gpu.Ptr{&b.e, &b.eo} {
		if *p, err = dev.ctx.Alloc(max(4*n, 4)); err != nil {
			return nil, err
		}
	}
	if err := dev.ctx.CopyIn(dev.own, b.e, f32.Bytes(e)); err != nil {
		return nil, err
	}
	return b, dev.ctx.Synchronize(dev.own)
}

// free releases the bucket's device memory (the caller holds b.mu or owns
// b alone) and returns the first failure.
func (b *deviceBucket) free() error {
	var first error
	for _, p := range []*gpu.Ptr{&b.e, &b.eo, &b.s} {
		if err := b.dev.ctx.Free(*p); err != nil && first == nil {
			first = err
		}
		*p = 0
	}
	b.freed = true
	return first
}

// residuals copies every device residual to the host, on each device's own
// stream (the caller's streams are not waited for: a residual is complete
// when the gc_compress_device that wrote it returns).
func (m *deviceMemory) residuals() (map[uint64][]float32, error) {
	out := make(map[uint64][]float32)
	for id, b := range m.snapshot(false) {
		e := make([]float32, b.n)
		b.mu.Lock()
		if b.freed { // a concurrent gc_state_load or destroy won
			b.mu.Unlock()
			continue
		}
		err := b.dev.ctx.CopyOut(b.dev.own, f32.Bytes(e), b.e)
		b.mu.Unlock()
		if err != nil {
			return nil, fmt.Errorf("copying bucket %d's residual from device %d: %w", id, b.dev.ordinal, err)
		}
		out[id] = e
	}
	return out, nil
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

// Commit installs s − D(c): e ← eo.
func (p *devicePending) Commit() { p.swap(&p.b.eo) }

// Retain installs the sum: e ← s.
func (p *devicePending) Retain() { p.swap(&p.b.s) }

// Discard keeps e.
func (p *devicePending) Discard() {}

func (p *devicePending) swap(with *gpu.Ptr) {
	p.b.mu.Lock()
	defer p.b.mu.Unlock()
	if !p.b.freed {
		p.b.e, *with = *with, p.b.e
	}
}

// sumCodec is the codec "none", whose body of e + g is the exact sum a
// deferred compress's Retain installs (the same rounding as the
// compressor's own sum, and the same NaN check).
var sumCodec = sync.OnceValues(func() (*kernels.Codec, error) { return kernels.NewCodec(compress.Spec{Codec: compress.CodecNone}) })

// checkDeviceSpec refuses a spec with a lossless stage: it runs on the host
// and makes payloads of varying length, which device calls do not handle.
func (c *compressor) checkDeviceSpec() error {
	if s := c.c.Spec(); s.Lossless != compress.LosslessNone {
		return errorf(errInvalid, "%s: device calls do not support a lossless stage (it runs on the host); use the spec without lossless=%v", s, s.Lossless)
	}
	return nil
}

// aligned4 checks that p is 4-byte aligned, as the kernels need.
func aligned4(what string, p gpu.Ptr) error {
	if p%4 != 0 {
		return errorf(errInvalid, "%s %#x is not 4-byte aligned", what, uintptr(p))
	}
	return nil
}

// compressDevice writes the payload of the n float32 at grad under key into
// dst (capacity bytes of device memory) on stream s and returns its length.
// flags are gc_compress's. It waits for s (see the top of this file). On
// error nothing of the bucket's residual has changed and dst's bytes are
// unspecified.
func (c *compressor) compressDevice(key compress.Key, flags uint32, grad gpu.Ptr, n uint64, dst gpu.Ptr, capacity uint64, s gpu.Stream) (int, error) {
	if err := checkFlags(flags); err != nil {
		return 0, err
	}
	switch {
	case n > compress.MaxElements:
		return 0, errorf(errInvalid, "grad: %d elements exceeds the payload limit %d", n, uint64(compress.MaxElements))
	case grad == 0 && n > 0:
		return 0, errorf(errInvalid, "null grad with %d elements", n)
	case dst == 0:
		return 0, errorf(errInvalid, "null dst (a payload has at least %d bytes)", compress.HeaderLen+compress.TrailerLen)
	}
	if err := aligned4("grad", grad); err != nil {
		return 0, err
	}
	if err := aligned4("dst", dst); err != nil {
		return 0, err
	}
	if err := c.checkDeviceSpec(); err != nil {
		return 0, err
	}
	need := c.c.MaxEncodedLen(int(n))
	if capacity < uint64(need) {
		return 0, errorf(errSize, "dst holds %d bytes; a %s payload of %d elements needs %d (gc_max_encoded_len)", capacity, c.c.Spec(), n, need)
	}
	dev, err := deviceOf(region{"grad", grad, 4 * n}, region{"dst", dst, uint64(need)})
	if err != nil {
		return 0, err
	}
	feedback, deferred := flags&flagFeedback != 0, flags&flagDefer != 0
	var b *deviceBucket
	if feedback {
		if err := c.claim(key.Bucket, deferred); err != nil {
			return 0, err
		}
		if b, err = c.dev.bucket(c.ef, key.Bucket, int(n), dev, deferred); err != nil {
			if deferred {
				c.unclaim(key.Bucket)
			}
			return 0, fmt.Errorf("bucket %d, step %d: %w", key.Bucket, key.Step, err)
		}
		defer b.mu.Unlock()
	}
	m, err := c.encodeDevice(dev, s, key, grad, int(n), dst, need, b, deferred)
	if err != nil {
		if deferred {
			c.unclaim(key.Bucket)
		}
		return 0, fmt.Errorf("bucket %d, step %d: %w", key.Bucket, key.Step, err)
	}
	switch {
	case deferred:
		c.hold(key.Bucket, &devicePending{b: b})
	case feedback:
		b.e, b.eo = b.eo, b.e
	}
	return m, nil
}

// encodeDevice runs the kernels of one compress (with b's residual, if b
// is not nil, and its sum with deferred), waits for s, frames the body on
// the host and writes the header and checksum around it in dst.
func (c *compressor) encodeDevice(dev *deviceContext, s gpu.Stream, key compress.Key, grad gpu.Ptr, n int, dst gpu.Ptr, need int, b *deviceBucket, deferred bool) (m int, err error) {
	sc, err := c.dev.takeScratch(dev, scratchWork+c.codec.WorkspaceLen(n))
	if err != nil {
		return 0, err
	}
	defer c.dev.putScratch(sc)
	a := kernels.EncodeArgs{Body: dst + compress.HeaderLen, Grad: grad, Status: sc.p, N: n, Key: key}
	if c.codec.WorkspaceLen(n) > 0 {
		a.Work = sc.p + scratchWork
	}
	if b != nil {
		a.Resid, a.ResidOut = b.e, b.eo
	}
	payload, err := compress.EncodePayload(c.c, make([]byte, 0, need), n, key, func(body []byte) error {
		if deferred { // the sum into b.s (eo gets zeros, overwritten next)
			none, err := sumCodec()
			if err != nil {
				return err
			}
			if err := none.Encode(dev.ctx, s, kernels.EncodeArgs{Body: b.s, Grad: grad, Resid: b.e, ResidOut: b.eo, Status: sc.p, N: n, Key: key}); err != nil {
				return err
			}
		}
		if err := c.codec.Encode(dev.ctx, s, a); err != nil {
			return err
		}
		status := make([]byte, kernels.StatusLen)
		if err := dev.ctx.CopyOut(s, status, a.Status); err != nil { // waits for s
			return err
		}
		if err := kernels.StatusError(status); err != nil {
			return err
		}
		return dev.ctx.CopyOut(s, body, a.Body)
	})
	if err != nil {
		return 0, err
	}
	if len(payload) != need {
		return 0, errorf(errInternal, "the framed payload has %d bytes, %d expected", len(payload), need)
	}
	if err := dev.ctx.CopyIn(s, dst, payload[:compress.HeaderLen]); err != nil {
		return 0, err
	}
	end := need - compress.TrailerLen
	if err := dev.ctx.CopyIn(s, dst+gpu.Ptr(end), payload[end:]); err != nil {
		return 0, err
	}
	return need, nil
}

// decompressDevice decodes count payloads, one at the start of each slot of
// slotLen bytes from p (with exact, count is 1 and slotLen is the payload's
// exact length), into the n float32 at dst on stream s: dst = the sum of
// their values in slot order, or dst += it with add. Every payload is
// copied to the host and validated before the decode is enqueued; the call
// returns without waiting for the decode.
func (c *compressor) decompressDevice(p gpu.Ptr, slotLen, count uint64, exact bool, dst gpu.Ptr, n uint64, add bool, s gpu.Stream) error {
	switch {
	case count < 1 || count > maxSlots:
		return errorf(errInvalid, "count = %d payloads, want 1 to %d", count, maxSlots)
	case slotLen > maxBuffer/maxSlots:
		return errorf(errInvalid, "%d bytes is not a plausible payload length", slotLen)
	case !exact && slotLen%4 != 0:
		return errorf(errInvalid, "slot length %d is not a multiple of 4 (every payload's body must stay 4-byte aligned)", slotLen)
	case p == 0:
		return errorf(errInvalid, "null payload")
	case n > compress.MaxElements:
		return errorf(errInvalid, "dst: %d elements exceeds the payload limit %d", n, uint64(compress.MaxElements))
	case dst == 0 && n > 0:
		return errorf(errInvalid, "null dst with %d elements", n)
	}
	if err := aligned4("payload", p); err != nil {
		return err
	}
	if err := aligned4("dst", dst); err != nil {
		return err
	}
	if err := c.checkDeviceSpec(); err != nil {
		return err
	}
	dev, err := deviceOf(region{"payload", p, slotLen * count}, region{"dst", dst, 4 * n})
	if err != nil {
		return err
	}
	host := make([]byte, slotLen*count)
	if err := dev.ctx.CopyOut(s, host, p); err != nil { // waits for s
		return err
	}
	bodies := make([]gpu.Ptr, count)
	keys := make([]compress.Key, count)
	for i := range count {
		slot := host[i*slotLen : (i+1)*slotLen]
		h, err := c.openPayload(slot, int(n), exact)
		if err != nil {
			if exact {
				return err
			}
			return fmt.Errorf("payload %d (slot at byte %d): %w", i, i*slotLen, err)
		}
		bodies[i] = p + gpu.Ptr(i*slotLen+compress.HeaderLen)
		keys[i] = h.Key
	}
	if c.c.Codec() != compress.CodecRandomK {
		return c.codec.Decode(dev.ctx, s, kernels.DecodeArgs{Dst: dst, N: int(n), Add: add, Bodies: bodies})
	}
	for i := range bodies { // random-k's indices come from each payload's key
		a := kernels.DecodeArgs{Dst: dst, N: int(n), Add: add || i > 0, Bodies: bodies[i : i+1], Key: keys[i]}
		if err := c.codec.Decode(dev.ctx, s, a); err != nil {
			return err
		}
	}
	return nil
}

// openPayload validates the payload at the start of slot for n elements as
// gc_decompress does (exact: slot is the payload, its exact length) and
// returns its header. Its body must not have been through a lossless stage.
func (c *compressor) openPayload(slot []byte, n int, exact bool) (compress.Header, error) {
	payload := slot
	if exact {
		if err := checkExact(slot); err != nil {
			return compress.Header{}, err
		}
	} else {
		m, err := payloadLen(slot)
		if err != nil {
			return compress.Header{}, err
		}
		payload = slot[:m]
	}
	h, _, err := compress.DecodePayload(c.c, payload, n)
	if err != nil {
		return compress.Header{}, err
	}
	if h.Lossless != compress.LosslessNone {
		return compress.Header{}, errorf(errInvalid, "the payload's body went through the %s stage; device decoding needs raw bodies", h.Lossless)
	}
	return h, nil
}
