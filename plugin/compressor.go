package main

import (
	"bytes"
	"fmt"
	"math"
	"time"
	"unsafe"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/kernels"
	"github.com/gradcomp/gradcomp/overlap"
)

// The core of each export, on Go slices: the exports (exports.go) only turn
// C arguments into these and results back. Errors are *statusError or
// compress's typed errors; statusOf maps them to codes.

// newCompressor parses spec into a compressor with empty error-feedback
// memory; workers ≤ 0 means compress's default (GOMAXPROCS).
func newCompressor(spec string, workers int) (*compressor, error) {
	undo := useWorkers(workers)
	var opts []compress.Option
	if workers > 0 {
		opts = append(opts, compress.WithWorkers(workers))
	}
	c, err := compress.Parse(spec, opts...)
	if err != nil {
		undo()
		return nil, err
	}
	// compress.Parse took the spec, so all NewCodec can refuse is an
	// option the kernels lack (chunked top-k): the host calls work, the
	// device calls return the refusal (checkDeviceSpec).
	codec, deviceErr := kernels.NewCodec(c.Spec())
	return &compressor{c: c, codec: codec, deviceErr: deviceErr, ef: compress.NewErrorFeedback(c), pending: map[uint64]settler{}}, nil
}

// checkFlags validates gc_compress's flags.
func checkFlags(flags uint32) error {
	if flags&^(flagFeedback|flagDefer) != 0 {
		return errorf(errInvalid, "unknown flag bits %#x (GC_FEEDBACK = %d, GC_DEFER = %d)", flags&^(flagFeedback|flagDefer), flagFeedback, flagDefer)
	}
	if flags&flagDefer != 0 && flags&flagFeedback == 0 {
		return errorf(errInvalid, "GC_DEFER needs GC_FEEDBACK (flags %#x)", flags)
	}
	return nil
}

// compress writes the payload of grad under key into dst, which must hold
// MaxEncodedLen(len(grad)) bytes, and returns its length. flags are
// gradcomp.h's GC_FEEDBACK and GC_DEFER. A bucket with a deferred compress
// not yet settled refuses every error-feedback call (GC_ERR_STATE): waiting
// for its settle on the same thread would never end.
func (c *compressor) compress(key compress.Key, flags uint32, grad []float32, dst []byte) (int, error) {
	if err := checkFlags(flags); err != nil {
		return 0, err
	}
	if flags&flagFeedback != 0 && c.dev.owns(key.Bucket) {
		return 0, errorf(errState, "bucket %d's error-feedback memory is in device memory: compress it with gc_compress_device", key.Bucket)
	}
	if need := c.c.MaxEncodedLen(len(grad)); len(dst) < need {
		return 0, errorf(errSize, "destination holds %d bytes; a %s payload of %d elements may need %d (gc_max_encoded_len)", len(dst), c.c.Spec(), len(grad), need)
	}
	var (
		out []byte
		err error
	)
	switch {
	case flags&flagDefer != 0:
		if err := c.claim(key.Bucket, true); err != nil {
			return 0, err
		}
		var p *compress.Pending
		if out, p, err = c.ef.Begin(dst[:0], grad, key); err != nil {
			c.unclaim(key.Bucket)
		} else {
			c.hold(key.Bucket, p)
		}
	case flags&flagFeedback != 0:
		if err := c.claim(key.Bucket, false); err != nil {
			return 0, err
		}
		out, err = c.ef.Compress(dst[:0], grad, key)
	default:
		out, err = c.c.Compress(dst[:0], grad, key)
	}
	if err != nil {
		return 0, fmt.Errorf("bucket %d, step %d: %w", key.Bucket, key.Step, err)
	}
	if len(out) > 0 && unsafe.SliceData(out) != unsafe.SliceData(dst) {
		return 0, errorf(errInternal, "bucket %d: the payload (%d bytes) did not fit the %d bytes MaxEncodedLen promised", key.Bucket, len(out), len(dst))
	}
	return len(out), nil
}

// claim fails if bucket has a deferred compress not settled; with hold it
// then marks the bucket as having one (being computed).
func (c *compressor) claim(bucket uint64, hold bool) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if p, ok := c.pending[bucket]; ok {
		if p == nil {
			return errorf(errState, "bucket %d: another thread's deferred compress of it is running", bucket)
		}
		return errorf(errState, "bucket %d has a deferred compress (GC_DEFER) not settled yet: call gc_settle first", bucket)
	}
	if hold {
		c.pending[bucket] = nil
	}
	return nil
}

// unclaim drops the claim of a deferred compress that failed.
func (c *compressor) unclaim(bucket uint64) {
	c.mu.Lock()
	delete(c.pending, bucket)
	c.mu.Unlock()
}

// hold records the deferred compress of a claimed bucket, for gc_settle.
func (c *compressor) hold(bucket uint64, p settler) {
	c.mu.Lock()
	c.pending[bucket] = p
	c.mu.Unlock()
}

// settle settles bucket's deferred compress with mode (GC_COMMIT, GC_RETAIN
// or GC_DISCARD).
func (c *compressor) settle(bucket uint64, mode int) error {
	if mode != settleCommit && mode != settleRetain && mode != settleDiscard {
		return errorf(errInvalid, "unknown settle mode %d (GC_COMMIT = %d, GC_RETAIN = %d, GC_DISCARD = %d)", mode, settleCommit, settleRetain, settleDiscard)
	}
	c.mu.Lock()
	p, ok := c.pending[bucket]
	if ok && p != nil {
		delete(c.pending, bucket)
	}
	c.mu.Unlock()
	switch {
	case !ok:
		return errorf(errState, "bucket %d has no deferred compress to settle (gc_compress with GC_FEEDBACK | GC_DEFER first)", bucket)
	case p == nil:
		return errorf(errState, "bucket %d: its deferred compress is still running on another thread", bucket)
	}
	switch mode {
	case settleCommit:
		p.Commit()
	case settleRetain:
		p.Retain()
	default:
		p.Discard()
	}
	return nil
}

// payloadLen returns the length of the payload at the start of buf, which
// must lie within buf.
func payloadLen(buf []byte) (int, error) {
	n, err := compress.PayloadLen(buf)
	if err != nil {
		return 0, err
	}
	if n > len(buf) {
		return 0, errorf(errCorrupt, "the header describes a %d-byte payload, but only %d bytes were given", n, len(buf))
	}
	return n, nil
}

// decompress decodes payload into dst (add: adds to dst). A payload shorter
// or longer than its header says is named as such, so a caller who passed a
// whole padded slot learns to pass gc_payload_len's length.
func (c *compressor) decompress(payload []byte, dst []float32, add bool) error {
	if err := checkExact(payload); err != nil {
		return err
	}
	var err error
	if add {
		err = c.c.DecompressAdd(dst, payload)
	} else {
		err = c.c.Decompress(dst, payload)
	}
	return err
}

// checkExact fails if the payload's header describes another length than
// len(payload): a caller who passed a whole padded slot learns to pass
// gc_payload_len's length. A header too short or corrupt to say is left to
// the decoder's own, more precise, checks.
func checkExact(payload []byte) error {
	if n, err := compress.PayloadLen(payload); err == nil && n != len(payload) {
		return errorf(errCorrupt, "%d bytes given, but the payload's header describes %d (a padded slot? pass the length gc_payload_len gives)", len(payload), n)
	}
	return nil
}

// idle fails if any bucket has a deferred compress not settled: saving or
// loading would wait for it (or load under it).
func (c *compressor) idle(doing string) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	for b := range c.pending {
		return errorf(errState, "cannot %s while bucket %d (of %d) has a deferred compress not settled (gc_settle)", doing, b, len(c.pending))
	}
	return nil
}

// state returns the error-feedback memory in compress's checkpoint format:
// the host buckets and the device buckets (copied to the host), in one
// state that either library loads.
func (c *compressor) state() ([]byte, error) {
	if err := c.idle("save the error-feedback state"); err != nil {
		return nil, err
	}
	f := compress.NewErrorFeedback(c.c)
	onDevice, err := c.dev.saveTo(f)
	if err != nil {
		return nil, err
	}
	if len(onDevice) == 0 {
		f = c.ef // every bucket is on the host
	} else {
		for _, id := range c.ef.Buckets() {
			if onDevice[id] {
				continue // the host copy is from before it moved
			}
			if err := f.SetResidual(id, c.ef.Residual(id)); err != nil {
				return nil, fmt.Errorf("bucket %d's host residual: %w", id, err)
			}
		}
	}
	var b bytes.Buffer
	if err := f.Save(&b); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// saveState writes the state into dst and returns its length; a dst too
// small is GC_ERR_SIZE, with the length it needs returned all the same.
func (c *compressor) saveState(dst []byte) (int, error) {
	s, err := c.state()
	if err != nil {
		return 0, err
	}
	if len(dst) < len(s) {
		return len(s), errorf(errSize, "destination holds %d bytes, the state needs %d (gc_state_size)", len(dst), len(s))
	}
	return copy(dst, s), nil
}

// loadState replaces the error-feedback memory with a saved one, validated
// whole first: compress's Load checks everything up to the state's
// checksum, and bytes after it are refused too, so it is tried on scratch
// memory before c's is replaced. Every bucket lands in host memory; device
// buckets are freed, and a bucket moves back to the device on its next
// gc_compress_device.
func (c *compressor) loadState(src []byte) error {
	if err := c.idle("load an error-feedback state"); err != nil {
		return err
	}
	r := bytes.NewReader(src)
	if err := compress.NewErrorFeedback(c.c).Load(r); err != nil {
		return err
	}
	if r.Len() > 0 {
		return &compress.CorruptInputError{Offset: int64(len(src) - r.Len()), Reason: fmt.Sprintf("%d bytes after the end of the error-feedback state", r.Len())}
	}
	if err := c.ef.Load(bytes.NewReader(src)); err != nil {
		return err
	}
	return c.dev.reset()
}

// maxLatency bounds gc_decide's latency argument: beyond it a link is not
// worth modelling, and seconds near time.Duration's range would overflow.
const maxLatency = time.Hour

// decide is the cost model's prediction for one bucket of n elements among
// world ranks with the named strategy over a link of bandwidth bytes/s and
// latency seconds (overlap.Predict). Predict's own refusals (a strategy
// that cannot carry c's codec) are GC_ERR_INVALID: every other argument is
// checked here first.
func (c *compressor) decide(strategy string, n uint64, world int, bandwidth, latency float64) (overlap.Prediction, error) {
	s, err := overlap.ParseStrategy(strategy)
	switch {
	case err != nil:
		return overlap.Prediction{}, errorf(errInvalid, "%v", err)
	case n < 1 || n > compress.MaxElements:
		return overlap.Prediction{}, errorf(errInvalid, "n = %d elements, want 1 to %d", n, uint64(compress.MaxElements))
	case world < 1 || world > overlap.MaxPredictWorld:
		return overlap.Prediction{}, errorf(errInvalid, "world = %d ranks, want 1 to %d", world, overlap.MaxPredictWorld)
	case !(bandwidth > 0):
		return overlap.Prediction{}, errorf(errInvalid, "bandwidth = %v bytes/s, want > 0 (+inf for a link of negligible transfer time)", bandwidth)
	case !(latency >= 0 && latency <= maxLatency.Seconds()):
		return overlap.Prediction{}, errorf(errInvalid, "latency = %v s, want 0 to %v", latency, maxLatency.Seconds())
	}
	lat := time.Duration(math.Round(latency * float64(time.Second)))
	p, err := overlap.Predict(c.c, s, int(n), world, overlap.Link{Bandwidth: bandwidth, Latency: lat})
	if err != nil {
		return overlap.Prediction{}, errorf(errInvalid, "%s, %d elements, %d ranks: %v", c.c.Spec(), n, world, err)
	}
	return p, nil
}
