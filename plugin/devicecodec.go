package main

import (
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// The device entry points (ABI 1.2) on Go values: gc_compress_device and
// the gc_decompress*_device calls run kernels/ on a caller's CUDA stream,
// with error-feedback memory in device memory (devicememory.go). In libgradcomp.so (no cuda
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

// sumCodec is the codec "none", whose body of e + g is the exact sum a
// deferred compress's Retain installs (the same rounding as the
// compressor's own sum, and the same NaN check).
var sumCodec = sync.OnceValues(func() (*kernels.Codec, error) { return kernels.NewCodec(compress.Spec{Codec: compress.CodecNone}) })

// checkDeviceSpec refuses a spec with a lossless stage: it runs on the host
// and makes payloads of varying length, which device calls do not handle;
// and one whose options the kernels lack (chunked top-k), with
// kernels.NewCodec's error naming them.
func (c *compressor) checkDeviceSpec() error {
	if c.deviceErr != nil {
		return c.deviceErr
	}
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
		if b, err = c.dev.bucket(c.ef, key.Bucket, int(n), dev); err != nil {
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
		b.r.Commit()
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
		a.Resid, a.ResidOut = b.r.Ptr(), b.r.Out()
	}
	payload, err := compress.EncodePayload(c.c, make([]byte, 0, need), n, key, func(body []byte) error {
		if deferred { // the sum into Sum (Out gets zeros, overwritten next)
			none, err := sumCodec()
			if err != nil {
				return err
			}
			sum, err := b.r.Sum()
			if err != nil {
				return err
			}
			if err := none.Encode(dev.ctx, s, kernels.EncodeArgs{Body: sum, Grad: grad, Resid: a.Resid, ResidOut: a.ResidOut, Status: sc.p, N: n, Key: key}); err != nil {
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
