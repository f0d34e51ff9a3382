package main

import (
	"bytes"
	"fmt"
	"unsafe"

	"github.com/gradcomp/gradcomp/compress"
)

// The core of each export, on Go slices: the exports (exports.go) only turn
// C arguments into these and results back. Errors are *statusError or
// compress's typed errors; statusOf maps them to codes.

// newCompressor parses spec into a compressor with empty error-feedback
// memory; workers ≤ 0 means compress's default (GOMAXPROCS).
func newCompressor(spec string, workers int) (*compressor, error) {
	var opts []compress.Option
	if workers > 0 {
		opts = append(opts, compress.WithWorkers(workers))
	}
	c, err := compress.Parse(spec, opts...)
	if err != nil {
		return nil, err
	}
	return &compressor{c: c, ef: compress.NewErrorFeedback(c), pending: map[uint64]*compress.Pending{}}, nil
}

// compress writes the payload of grad under key into dst, which must hold
// MaxEncodedLen(len(grad)) bytes, and returns its length. flags are
// gradcomp.h's GC_FEEDBACK and GC_DEFER. A bucket with a deferred compress
// not yet settled refuses every error-feedback call (GC_ERR_STATE): waiting
// for its settle on the same thread would never end.
func (c *compressor) compress(key compress.Key, flags uint32, grad []float32, dst []byte) (int, error) {
	if flags&^(flagFeedback|flagDefer) != 0 {
		return 0, errorf(errInvalid, "unknown flag bits %#x (GC_FEEDBACK = %d, GC_DEFER = %d)", flags&^(flagFeedback|flagDefer), flagFeedback, flagDefer)
	}
	if flags&flagDefer != 0 && flags&flagFeedback == 0 {
		return 0, errorf(errInvalid, "GC_DEFER needs GC_FEEDBACK (flags %#x)", flags)
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
		out, p, err = c.ef.Begin(dst[:0], grad, key)
		c.mu.Lock()
		if err != nil {
			delete(c.pending, key.Bucket)
		} else {
			c.pending[key.Bucket] = p
		}
		c.mu.Unlock()
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
	if n, err := compress.PayloadLen(payload); err == nil && n != len(payload) {
		return errorf(errCorrupt, "%d bytes given, but the payload's header describes %d (a padded slot? pass the length gc_payload_len gives)", len(payload), n)
	}
	var err error
	if add {
		err = c.c.DecompressAdd(dst, payload)
	} else {
		err = c.c.Decompress(dst, payload)
	}
	return err
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

// state returns the error-feedback memory in compress's checkpoint format.
func (c *compressor) state() ([]byte, error) {
	if err := c.idle("save the error-feedback state"); err != nil {
		return nil, err
	}
	var b bytes.Buffer
	if err := c.ef.Save(&b); err != nil {
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
// memory before c's is replaced.
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
	return c.ef.Load(bytes.NewReader(src))
}
