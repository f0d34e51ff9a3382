package overlap

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/kernels"
)

// A slot is what one rank puts on the wire for one part of a bucket: its
// head, then the part's payload (the compress wire format), then padding
// up to the slot length every rank uses for the collective. The head is
// the one both backends send (kernels.StatusLen, kernels.GuardLen: the
// device's Encode and Guard kernels write it):
//
//	offset size field
//	0      8    the first NaN or ±Inf: element index (in the bucket) << 32
//	            | its float32 bits; all ones: none
//	8      8    the first finite value the codec cannot represent, the same
//	16     8    Config.Guard only: ρ, a little-endian float64 (ok slots)
//	24     8    Config.Guard only: zero
//	head   -    payload (status ok), zero or stale bytes otherwise
//
// The status lets every rank learn, from the exchange it makes anyway,
// whether some rank could not compress the bucket, so that all of them take
// the dense path together (see the package doc).
func slotHead(guard bool) int {
	if guard {
		return kernels.StatusLen + kernels.GuardLen
	}
	return kernels.StatusLen
}

// The slot statuses.
const (
	statusOK              = 0 // the payload follows
	statusUnrepresentable = 1 // a finite value the codec cannot hold (|x| > 65504 for fp16)
	statusNonFinite       = 2 // a NaN or Inf
)

// status is a decoded slot head.
type status struct {
	code  uint8
	index uint32
	value float32
	rho   float64 // Config.Guard: the accuracy guard's ρ of an ok slot
}

// noWord is a head word that reports nothing.
const noWord = math.MaxUint64

// put writes s as a slot head of slotHead(guard) bytes at b.
func (s status) put(b []byte, guard bool) {
	w := [2]uint64{noWord, noWord}
	switch s.code {
	case statusNonFinite:
		w[0] = uint64(s.index)<<32 | uint64(math.Float32bits(s.value))
	case statusUnrepresentable:
		w[1] = uint64(s.index)<<32 | uint64(math.Float32bits(s.value))
	}
	binary.LittleEndian.PutUint64(b, w[0])
	binary.LittleEndian.PutUint64(b[8:], w[1])
	if guard {
		binary.LittleEndian.PutUint64(b[16:], math.Float64bits(s.rho))
		binary.LittleEndian.PutUint64(b[24:], 0)
	}
}

// readStatus decodes the slot head at b, checking it: a word that reports
// a value of the wrong kind (a finite value as NaN or Inf, or the
// reverse), or a ρ on a failed slot, is a malformed head.
func readStatus(b []byte, guard bool) (status, error) {
	w0, w1 := binary.LittleEndian.Uint64(b), binary.LittleEndian.Uint64(b[8:])
	var s status
	switch {
	case w0 != noWord:
		s = status{code: statusNonFinite, index: uint32(w0 >> 32), value: math.Float32frombits(uint32(w0))}
	case w1 != noWord:
		s = status{code: statusUnrepresentable, index: uint32(w1 >> 32), value: math.Float32frombits(uint32(w1))}
	}
	if v := float64(s.value); s.code != statusOK && (s.code == statusNonFinite) == (!math.IsNaN(v) && !math.IsInf(v, 0)) {
		return s, fmt.Errorf("malformed status: %#016x %#016x reports %v", w0, w1, s.value)
	}
	if guard {
		s.rho = math.Float64frombits(binary.LittleEndian.Uint64(b[16:]))
		if tail := binary.LittleEndian.Uint64(b[24:]); tail != 0 || math.IsNaN(s.rho) || s.rho < 0 || (s.code != statusOK && s.rho != 0) {
			return s, fmt.Errorf("malformed guard block: ρ %v, tail %#x", s.rho, tail)
		}
	}
	return s, nil
}

// noIndex is the index of a status that does not say where (shared-index
// statuses travel as one float32 code per rank).
const noIndex = math.MaxUint32

func (s status) String() string {
	what := "a NaN or Inf"
	if s.code == statusUnrepresentable {
		what = "a value the codec cannot represent"
	}
	if s.index == noIndex {
		return what
	}
	return fmt.Sprintf("%s (%v) at element %d", what, s.value, s.index)
}

// statusOf maps a compression error to a slot status: a *NonFiniteStepError
// becomes a status, anything else is returned as a failure.
func statusOf(err error) (status, error) {
	var nf *compress.NonFiniteError
	if !errors.As(err, &nf) {
		return status{}, err
	}
	s := status{code: statusNonFinite, index: uint32(nf.Index), value: nf.Value}
	if v := float64(nf.Value); !math.IsNaN(v) && !math.IsInf(v, 0) {
		s.code = statusUnrepresentable
	}
	return s, nil
}

// parts is the compress.Compressor the engine hands to error-feedback
// memory: it cuts a bucket of n elements into count parts, part j being
// elements [j·n/count, (j+1)·n/count), compresses part j with inner under
// partKey(key, j), and writes the count slots back to back, each
// slotLen(n) bytes. With count = Size() this is exactly the send buffer of
// an all-to-all: part j goes to rank j. Decompress decodes every part.
//
// It is internal: Spec and Codec are inner's, and its payloads are only
// read back by the engine. It needs inner's payload length to be exact
// (no lossless stage).
type parts struct {
	inner compress.Compressor
	count int
	// Key derivation: shared keeps the engine's key (random-k indices must be
	// the same on every rank); otherwise the key is tagged with the writer's
	// rank and the part (stage 1) or the owner (stage 2), so that stochastic
	// rounding draws differ between ranks and parts.
	shared      bool
	stage       int // 1 or 2
	rank, ranks int
	guard       bool // Config.Guard: the slot heads carry ρ
}

// head is the length of p's slot heads (slotHead).
func (p *parts) head() int { return slotHead(p.guard) }

// bounds returns part j of n elements.
func (p *parts) bounds(n, j int) (lo, hi int) { return j * n / p.count, (j + 1) * n / p.count }

// slotLen returns the slot length for a bucket of n elements: room for the
// largest part.
func (p *parts) slotLen(n int) int {
	return p.head() + p.inner.MaxEncodedLen((n+p.count-1)/p.count)
}

// partKey returns the compress.Key of part j (see the package doc).
func (p *parts) partKey(key compress.Key, j int) compress.Key {
	if p.shared {
		return key
	}
	tag := uint64(1 + p.rank*p.ranks + j)
	if p.stage == 2 {
		tag = uint64(1 + p.ranks*p.ranks + p.rank)
	}
	return compress.Key{Bucket: tag<<32 | key.Bucket, Step: key.Step}
}

func (p *parts) Spec() compress.Spec     { return p.inner.Spec() }
func (p *parts) Codec() compress.Codec   { return p.inner.Codec() }
func (p *parts) MaxEncodedLen(n int) int { return p.count * p.slotLen(n) }
func (p *parts) String() string          { return fmt.Sprintf("%s in %d parts", p.inner.Spec(), p.count) }

// Compress appends count slots to dst, each with status ok. A part's
// *NonFiniteStepError comes back with Index counted in the whole bucket.
func (p *parts) Compress(dst []byte, src []float32, key compress.Key) ([]byte, error) {
	return p.compress(dst, len(src), key, func(into []byte, lo, hi int, pkey compress.Key) ([]byte, error) {
		return p.inner.Compress(into, src[lo:hi], pkey)
	})
}

// CompressResidual is Compress that also sets res to src minus the
// decoded parts (compress.ResidualCompressor), part by part with inner's
// fused path: error-feedback memory over parts pays no decoding pass.
func (p *parts) CompressResidual(dst []byte, src []float32, key compress.Key, res []float32) ([]byte, error) {
	if len(res) != len(src) {
		return dst, &compress.SizeError{What: "residual length", Got: int64(len(res)), Want: int64(len(src))}
	}
	return p.compress(dst, len(src), key, func(into []byte, lo, hi int, pkey compress.Key) ([]byte, error) {
		return compress.CompressResidual(p.inner, into, src[lo:hi], pkey, res[lo:hi])
	})
}

// sparseParts is parts over a compress.SparseCompressor, and one itself,
// so that error-feedback memory over parts keeps residuals in place.
type sparseParts struct{ *parts }

// CompressSelect implements compress.SparseCompressor: the indices are the
// bucket's (each part's offset added).
func (p sparseParts) CompressSelect(dst []byte, src []float32, key compress.Key, sel []uint32) ([]byte, []uint32, error) {
	sc := p.inner.(compress.SparseCompressor)
	return p.compressSelect(dst, len(src), key, sel, func(into []byte, lo, hi int, pkey compress.Key, sel []uint32) ([]byte, []uint32, error) {
		return sc.CompressSelect(into, src[lo:hi], pkey, sel)
	})
}

// compressSelect is compress for a sparse inner compressor: part also
// appends to sel the indices its payload keeps, counted in the part, and
// compressSelect adds the part's offset to them. On error dst and sel are
// returned unchanged.
func (p sparseParts) compressSelect(dst []byte, n int, key compress.Key, sel []uint32,
	part func(into []byte, lo, hi int, pkey compress.Key, sel []uint32) ([]byte, []uint32, error)) ([]byte, []uint32, error) {
	m := len(sel)
	out, err := p.compress(dst, n, key, func(into []byte, lo, hi int, pkey compress.Key) ([]byte, error) {
		from := len(sel)
		payload, more, err := part(into, lo, hi, pkey, sel)
		for i := from; i < len(more); i++ {
			more[i] += uint32(lo)
		}
		sel = more
		return payload, err
	})
	if err != nil {
		return dst, sel[:m], err
	}
	return out, sel, nil
}

// sparseFeedbackParts is parts over a compress.SparseFeedbackCompressor
// (top-k, random-k), and one itself, so that error-feedback memory over
// parts folds e + g into the parts' first pass and keeps residuals in
// place.
type sparseFeedbackParts struct{ sparseParts }

// CompressSelectFeedback implements compress.SparseFeedbackCompressor,
// part by part.
func (p sparseFeedbackParts) CompressSelectFeedback(dst []byte, e, g, sum []float32, key compress.Key, sel []uint32) ([]byte, []uint32, error) {
	if err := sameLengths(len(g), e, sum); err != nil {
		return dst, sel, err
	}
	sfc := p.inner.(compress.SparseFeedbackCompressor)
	return p.compressSelect(dst, len(g), key, sel, func(into []byte, lo, hi int, pkey compress.Key, sel []uint32) ([]byte, []uint32, error) {
		return sfc.CompressSelectFeedback(into, e[lo:hi], g[lo:hi], sum[lo:hi], pkey, sel)
	})
}

// feedbackParts is parts over a compress.FeedbackCompressor, and one
// itself, so that error-feedback memory over parts folds e + g into the
// parts' first pass.
type feedbackParts struct{ *parts }

// CompressFeedback implements compress.FeedbackCompressor, part by part.
func (p feedbackParts) CompressFeedback(dst []byte, e, g, sum []float32, key compress.Key, res []float32) ([]byte, error) {
	if err := sameLengths(len(g), e, sum, res); err != nil {
		return dst, err
	}
	fc := p.inner.(compress.FeedbackCompressor)
	return p.compress(dst, len(g), key, func(into []byte, lo, hi int, pkey compress.Key) ([]byte, error) {
		return fc.CompressFeedback(into, e[lo:hi], g[lo:hi], sum[lo:hi], pkey, res[lo:hi])
	})
}

// sameLengths returns a *compress.SizeError unless every one of the
// error-feedback slices s has the gradient's length n.
func sameLengths(n int, s ...[]float32) error {
	for _, x := range s {
		if len(x) != n {
			return &compress.SizeError{What: "error-feedback slice length", Got: int64(len(x)), Want: int64(n)}
		}
	}
	return nil
}

// forMemory returns p as error-feedback memory is to see it: a
// compress.SparseFeedbackCompressor, SparseCompressor or
// FeedbackCompressor when its inner compressor is one, so that the
// memory takes the inner one's fused path.
func (p *parts) forMemory() compress.Compressor {
	switch p.inner.(type) {
	case compress.SparseFeedbackCompressor:
		return sparseFeedbackParts{sparseParts{p}}
	case compress.SparseCompressor:
		return sparseParts{p}
	case compress.FeedbackCompressor:
		return feedbackParts{p}
	}
	return p
}

// compress appends count slots for n elements under key to dst, each
// with status ok and the payload part writes for its elements [lo, hi)
// (into: the slot's payload area, empty; pkey: the part's key). A
// *compress.NonFiniteError comes back with Index counted in the whole
// bucket.
func (p *parts) compress(dst []byte, n int, key compress.Key, part func(into []byte, lo, hi int, pkey compress.Key) ([]byte, error)) ([]byte, error) {
	stride := p.slotLen(n)
	start := len(dst)
	out := dst
	if cap(out)-start < p.count*stride {
		out = make([]byte, start, start+p.count*stride)
		copy(out, dst)
	}
	out = out[:start+p.count*stride]
	for j := range p.count {
		lo, hi := p.bounds(n, j)
		slot := out[start+j*stride : start+(j+1)*stride]
		status{}.put(slot, p.guard)
		payload, err := part(slot[p.head():p.head()], lo, hi, p.partKey(key, j))
		if err != nil {
			var nf *compress.NonFiniteError
			if errors.As(err, &nf) {
				err = &compress.NonFiniteError{Index: lo + nf.Index, Value: nf.Value}
			}
			return dst, err
		}
		if len(payload) > stride-p.head() || &payload[0] != &slot[p.head()] {
			return dst, fmt.Errorf("overlap: %s wrote a %d-byte payload for %d elements outside its %d-byte slot", p.inner.Spec(), len(payload), hi-lo, stride-p.head())
		}
	}
	return out, nil
}

// Decompress sets dst to the parts decoded from the count slots in payload.
func (p *parts) Decompress(dst []float32, payload []byte) error {
	return p.decompress(dst, payload, false)
}

// DecompressAdd adds the decoded parts to dst.
func (p *parts) DecompressAdd(dst []float32, payload []byte) error {
	return p.decompress(dst, payload, true)
}

func (p *parts) decompress(dst []float32, payload []byte, add bool) error {
	n, stride := len(dst), p.slotLen(len(dst))
	if len(payload) != p.count*stride {
		return &compress.SizeError{What: fmt.Sprintf("%d slots for %d elements", p.count, n), Got: int64(len(payload)), Want: int64(p.count * stride)}
	}
	for j := range p.count {
		lo, hi := p.bounds(n, j)
		if err := p.decodeSlot(dst[lo:hi], payload[j*stride:(j+1)*stride], add); err != nil {
			return err
		}
	}
	return nil
}

// averageSlots sets dst to the average of the count payloads of p's
// inner compressor in buf's slots (compress.DecompressAverage, rank order)
// and returns the index of its first non-finite element, or −1. A
// payload's failure is named by what, a format with the rank's %d.
func (p *parts) averageSlots(dst []float32, buf []byte, count int, what string) (int, error) {
	stride := len(buf) / count
	end := p.head() + p.inner.MaxEncodedLen(len(dst))
	if stride < end {
		return -1, &compress.SizeError{What: "slot length", Got: int64(stride), Want: int64(end)}
	}
	payloads := make([][]byte, count)
	for q := range payloads {
		payloads[q] = buf[q*stride+p.head() : q*stride+end]
	}
	bad, err := compress.DecompressAverage(p.inner, dst, payloads)
	var pe *compress.PayloadError
	if errors.As(err, &pe) {
		return -1, fmt.Errorf(what+": %w", pe.Index, pe.Err)
	}
	return bad, err
}

// decodeSlot sets (or adds to) dst the payload of p's inner compressor in
// slot, which holds at least the head and the payload for len(dst)
// elements.
func (p *parts) decodeSlot(dst []float32, slot []byte, add bool) error {
	end := p.head() + p.inner.MaxEncodedLen(len(dst))
	if len(slot) < end {
		return &compress.SizeError{What: "slot length", Got: int64(len(slot)), Want: int64(end)}
	}
	if add {
		return p.inner.DecompressAdd(dst, slot[p.head():end])
	}
	return p.inner.Decompress(dst, slot[p.head():end])
}

// coder compresses through error-feedback memory, or straight through
// when error feedback is off (ef == nil).
type coder struct {
	p  *parts
	ef *compress.ErrorFeedback
}

// begin compresses src under key into dst; the Pending is nil without
// error feedback.
func (c coder) begin(dst []byte, src []float32, key compress.Key) ([]byte, *compress.Pending, error) {
	if c.ef == nil {
		out, err := c.p.Compress(dst, src, key)
		return out, nil, err
	}
	return c.ef.Begin(dst, src, key)
}
