package kernels

import (
	"encoding/binary"
	"fmt"
	"math"
	"strings"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
)

// frameLen is the wire format's header and trailer around a body.
const frameLen = compress.HeaderLen + compress.TrailerLen

// Codec is the device implementation of one compress spec: its kernels
// write the raw bodies compress.Parse(spec) writes (the bytes between a
// payload's header and checksum, before any lossless stage) and decode
// them. It holds no per-call state and is safe for concurrent use.
type Codec struct {
	ref     compress.Compressor
	codec   compress.Codec
	bits    uint32 // 8, 4, 2 (min-max) or 1 (sign)
	bucket  int    // quantization bucket (int8/4/2, sign)
	nearest bool   // round=nearest
	seed    uint64 // stochastic rounding or random-k seed
	sampled bool   // topk:RATIO:sampled
	format  uint32 // dense: fmtF32, fmtF16, fmtBF16
}

// Dense formats (FMT_* in dense.cu).
const (
	fmtF32  = 0
	fmtF16  = 1
	fmtBF16 = 2
)

// NewCodec returns the device codec of spec (which compress.New
// validates). It needs no GPU. A spec the kernels do not implement is an
// *ArgumentError that names the options: top-k's chunk= and bits=
// (chunked top-k, SparseLoCo's compressor) run on the CPU only, in package
// compress; the device never writes a payload of another layout instead.
func NewCodec(spec compress.Spec) (*Codec, error) {
	ref, err := compress.New(spec, compress.WithWorkers(1))
	if err != nil {
		return nil, err
	}
	if err := deviceSupports(ref.Spec()); err != nil {
		return nil, err
	}
	c := &Codec{ref: ref, codec: ref.Codec(), bucket: 512}
	switch c.codec {
	case compress.CodecFP16:
		c.format = fmtF16
	case compress.CodecBF16:
		c.format = fmtBF16
	case compress.CodecInt8:
		c.bits = 8
	case compress.CodecInt4:
		c.bits = 4
	case compress.CodecInt2:
		c.bits = 2
	case compress.CodecSign:
		c.bits = 1
	}
	s := ref.Spec()
	c.bucket, c.nearest, c.seed, c.sampled = s.BucketLen(), s.Nearest, s.Seed, s.Sampled
	return c, nil
}

// deviceSupports returns the *ArgumentError for a valid spec whose options
// have no device kernels, or nil.
func deviceSupports(s compress.Spec) error {
	var opts []string
	if s.Chunk != 0 {
		opts = append(opts, fmt.Sprintf("chunk=%d", s.Chunk))
	}
	if s.Bits != 0 {
		opts = append(opts, fmt.Sprintf("bits=%d", s.Bits))
	}
	if len(opts) == 0 {
		return nil
	}
	return &ArgumentError{Op: "NewCodec(" + s.String() + ")", Reason: fmt.Sprintf("%s %s of %s: not supported on the device "+
		"(chunked top-k runs on the CPU only, in package compress)", plural(len(opts), "option", "options"), strings.Join(opts, " and "), s.Codec)}
}

// plural returns one or many by n.
func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}

// codecOf returns the device codec of a spec string.
func codecOf(spec string) (*Codec, error) {
	s, err := compress.ParseSpec(spec)
	if err != nil {
		return nil, err
	}
	return NewCodec(s)
}

// Spec returns the codec's configuration.
func (c *Codec) Spec() compress.Spec { return c.ref.Spec() }

// Reference returns the CPU compressor of the same spec, which frames and
// validates this codec's bodies (see compress.EncodePayload).
func (c *Codec) Reference() compress.Compressor { return c.ref }

// BodyLen returns the raw body length in bytes for n elements.
func (c *Codec) BodyLen(n int) int { return c.ref.MaxEncodedLen(n) - frameLen }

// sparseK returns k of top-k or random-k for n elements.
func (c *Codec) sparseK(n int) int {
	if c.codec == compress.CodecTopK {
		return c.BodyLen(n) / 8
	}
	return c.BodyLen(n) / 4
}

// aligned reports whether every quantization bucket starts on a code byte.
func (c *Codec) aligned() bool { return c.bucket*int(c.bits)%8 == 0 }

// topkStateLen is sizeof(TopkState) in topk.cu, rounded up to 256 bytes.
const topkStateLen = (3*2048*4 + 5*4 + 255) &^ 255

// topkLayout is the workspace of a top-k call over tiles tiles.
type topkLayout struct {
	state, cand, count, above, equal, offset gpu.Ptr
	len                                      int
}

func newTopkLayout(work gpu.Ptr, tiles int) topkLayout {
	pad := func(b int) int { return (b + 255) &^ 255 }
	l := topkLayout{state: work}
	off := topkStateLen
	next := func(bytes int) gpu.Ptr {
		p := work + gpu.Ptr(off)
		off += pad(bytes)
		return p
	}
	l.cand = next(4 * tile * tiles)
	l.count = next(4 * tiles)
	l.above = next(4 * tiles)
	l.equal = next(4 * tiles)
	l.offset = next(4 * tiles)
	l.len = off
	return l
}

// WorkspaceLen returns the bytes of device scratch Encode needs for n
// elements: 4 per element for top-k (its candidate lists) plus a little,
// one float per bucket for a min-max code whose buckets share code bytes,
// else 0.
func (c *Codec) WorkspaceLen(n int) int {
	switch {
	case c.codec == compress.CodecTopK && n > 0:
		return newTopkLayout(0, (n+tile-1)/tile).len
	case c.bits > 1 && !c.aligned():
		return 4 * ((n + c.bucket - 1) / c.bucket)
	}
	return 0
}

// StatusLen is the size of the status block Encode reports failures in: two
// uint64 words, the first NaN or ±Inf, the first unrepresentable value.
const StatusLen = 16

// EncodeArgs are the device buffers of one Encode call. All pointers are
// 4-byte aligned device addresses of the current context.
type EncodeArgs struct {
	Body gpu.Ptr // receives the raw body, BodyLen(N) bytes
	Grad gpu.Ptr // N float32: the gradient g
	// Error feedback, optional: with Resid set, the codec encodes
	// s = e + g (rounded once) and ResidOut receives s − D(c), the residual a
	// Commit installs (compress.ErrorFeedback). Resid is only read, so a call
	// that fails leaves the memory as it was; swap the two on success.
	Resid    gpu.Ptr // N float32 e, or 0
	ResidOut gpu.Ptr // N float32, not overlapping Resid; 0 iff Resid is 0
	Work     gpu.Ptr // WorkspaceLen(N) bytes, or 0 when that is 0
	Status   gpu.Ptr // StatusLen bytes, reset by Encode; read with StatusError
	N        int
	Key      compress.Key
}

// check validates a against the codec; op names the call in errors.
func (c *Codec) check(a *EncodeArgs) error {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: "Encode(" + c.Spec().String() + ")", Reason: fmt.Sprintf(format, v...)}
	}
	n := uint64(a.N)
	switch {
	case a.N < 0 || int64(a.N) > compress.MaxElements:
		return bad("element count %d outside [0, %d]", a.N, uint64(compress.MaxElements))
	case a.Status == 0:
		return bad("null status pointer")
	case a.N > 0 && (a.Grad == 0 || a.Body == 0):
		return bad("null gradient or body pointer for %d elements", a.N)
	case (a.Resid == 0) != (a.ResidOut == 0):
		return bad("error feedback needs both Resid and ResidOut (got %#x and %#x)", a.Resid, a.ResidOut)
	case a.Resid != 0 && overlap(a.Resid, a.ResidOut, 4*n):
		return bad("ResidOut %#x overlaps Resid %#x (%d bytes each): a failed call must leave the residual intact", a.ResidOut, a.Resid, 4*n)
	case c.WorkspaceLen(a.N) > 0 && a.Work == 0:
		return bad("null workspace; %d bytes needed", c.WorkspaceLen(a.N))
	}
	for _, p := range []gpu.Ptr{a.Body, a.Grad, a.Resid, a.ResidOut, a.Status} {
		if p%4 != 0 {
			return bad("device pointer %#x is not 4-byte aligned", p)
		}
	}
	if a.Status%8 != 0 || a.Work%8 != 0 {
		return bad("status %#x and workspace %#x must be 8-byte aligned", a.Status, a.Work)
	}
	return nil
}

// overlap reports whether [p, p+n) and [q, q+n) intersect.
func overlap(p, q gpu.Ptr, n uint64) bool { return overlapSpans(p, n, q, n) }

// overlapSpans reports whether [p, p+n) and [q, q+m) intersect.
func overlapSpans(p gpu.Ptr, n uint64, q gpu.Ptr, m uint64) bool {
	return n > 0 && m > 0 && uint64(p) < uint64(q)+m && uint64(q) < uint64(p)+n
}

// encodePlan returns the operations of Encode.
func (c *Codec) encodePlan(a EncodeArgs) ([]step, error) {
	if err := c.check(&a); err != nil {
		return nil, err
	}
	plan := []step{memset32(a.Status, 0xffffffff, StatusLen/4)}
	n := uint64(a.N)
	if n == 0 {
		return plan, nil
	}
	g, e, eo, body := ptrArg(a.Grad), ptrArg(a.Resid), ptrArg(a.ResidOut), ptrArg(a.Body)
	status := ptrArg(a.Status)
	switch c.codec {
	case compress.CodecNone, compress.CodecFP16, compress.CodecBF16:
		plan = append(plan, elementwise("gc_dense_encode", n, body, g, e, eo, n, uint64(c.format), status))
	case compress.CodecInt8, compress.CodecInt4, compress.CodecInt2:
		nb := (n + uint64(c.bucket) - 1) / uint64(c.bucket)
		base := compress.StreamBase(c.seed, a.Key, compress.DomainRound)
		B, bits, grid, threads := uint64(c.bucket), uint64(c.bits), uint32(min(nb, maxGrid)), bucketThreads(c.bucket)
		if c.aligned() {
			plan = append(plan, launch("gc_quant_encode", grid, threads, body, g, e, eo, n, B, bits, boolArg(c.nearest), base, status))
		} else {
			work := ptrArg(a.Work)
			plan = append(plan,
				launch("gc_quant_range", grid, threads, body, g, e, work, n, B, bits, status),
				elementwise("gc_quant_codes", (n*bits+7)/8, body, g, e, eo, work, n, B, bits, boolArg(c.nearest), base))
		}
	case compress.CodecSign:
		nb := (n + uint64(c.bucket) - 1) / uint64(c.bucket)
		plan = append(plan,
			launch("gc_sign_scale", uint32(min(nb, maxGrid)), 256, body, g, e, n, uint64(c.bucket), status),
			elementwise("gc_sign_bits", (n+7)/8, body, g, e, eo, n, uint64(c.bucket)))
	case compress.CodecRandomK, compress.CodecTopK:
		x := g
		if a.Resid != 0 { // s = e + g, materialized where the residual goes
			plan = append(plan, elementwise("gc_ef_add", n, eo, g, e, n, status))
			x = eo
		} else if c.codec == compress.CodecRandomK {
			plan = append(plan, elementwise("gc_nonfinite", n, g, n, status))
		}
		k := uint64(c.sparseK(a.N))
		if c.codec == compress.CodecRandomK {
			base := compress.StreamBase(c.seed, a.Key, compress.DomainRandomK)
			plan = append(plan, elementwise("gc_randomk_gather", k, body, x, eo, n, k, base))
		} else {
			plan = append(plan, c.topkPlan(a, x, k)...)
		}
	default:
		return nil, &ArgumentError{Op: "Encode", Reason: "no device kernels for codec " + c.codec.String()}
	}
	return plan, nil
}

// Top-k modes and guard masks (MODE_* in topk.cu).
const (
	modeSampled = 1
	modeExact   = 2
	modeAny     = modeSampled | modeExact
)

// The sampled shortcut's parameters: the sample is 1024 runs of 64
// elements; it runs for n ≥ 4·65536 and k ≤ n/8, with the bound at the r-th
// largest sample key, r = ⌈μ + 4√μ⌉ + 1 for μ = 65536·k/n, and falls back
// to the exact path when fewer than k or more than 3·r·n/65536 elements are
// at or above it. These only decide the speed: both paths write the same
// bytes (the exact top-k).
const (
	sampleSize    = 1024 * 64
	sampledMinLen = 4 * sampleSize
)

func sampleParams(n, k uint64) (r, limit uint64) {
	mu := float64(sampleSize) * float64(k) / float64(n)
	r = min(uint64(math.Ceil(mu+4*math.Sqrt(mu)))+1, sampleSize)
	return r, 3 * r * n / sampleSize
}

// topkPlan returns the selection of the k largest magnitudes of x (N
// float32, the gradient or e + g) into the body; with error feedback x is
// ResidOut, zeroed at the selected indices.
func (c *Codec) topkPlan(a EncodeArgs, x uint64, k uint64) []step {
	n := uint64(a.N)
	tiles := (n + tile - 1) / tile
	w := newTopkLayout(a.Work, int(tiles))
	st, cand, count, status := ptrArg(w.state), ptrArg(w.cand), ptrArg(w.count), ptrArg(a.Status)
	tgrid := uint32(min(tiles, 4096))
	sampled := c.sampled && n >= sampledMinLen && k <= n/8
	mode := uint64(modeExact)
	if sampled {
		mode = modeSampled
	}
	plan := []step{launch("gc_topk_init", 1, 256, st, mode, k)}
	if sampled {
		r, limit := sampleParams(n, k)
		plan = append(plan,
			launch("gc_topk_sample", 1, 1024, st, x, n, r),
			launch("gc_topk_collect", tgrid, tileThreads, st, x, n, cand, count, status, 0, modeSampled),
			launch("gc_topk_check", 1, 256, st, k, limit))
	}
	plan = append(plan,
		launch("gc_topk_hist_input", uint32(min(gridFor(n, elemThreads), 2048)), elemThreads, st, x, n, status, modeExact),
		launch("gc_topk_select", 1, 256, st, 0, modeAny),
		launch("gc_topk_collect", tgrid, tileThreads, st, x, n, cand, count, status, 1, modeExact))
	if sampled {
		plan = append(plan, launch("gc_topk_cand_hist", tgrid, tileThreads, st, x, n, cand, count, 1, modeSampled))
	}
	eo := ptrArg(a.ResidOut)
	return append(plan,
		launch("gc_topk_select", 1, 256, st, 1, modeAny),
		launch("gc_topk_cand_hist", tgrid, tileThreads, st, x, n, cand, count, 2, modeAny),
		launch("gc_topk_select", 1, 256, st, 2, modeAny),
		launch("gc_topk_count", tgrid, tileThreads, st, x, n, cand, count, ptrArg(w.above), ptrArg(w.equal)),
		launch("gc_topk_scan", 1, 1024, st, tiles, ptrArg(w.above), ptrArg(w.equal), ptrArg(w.offset)),
		launch("gc_topk_write", tgrid, tileThreads, st, x, n, cand, count, ptrArg(w.equal), ptrArg(w.offset),
			ptrArg(a.Body), ptrArg(a.Body)+4*k, eo, k))
}

// StatusError returns the *compress.NonFiniteError an Encode status block
// (StatusLen bytes copied from the device after the stream passed the
// call) records, or nil: the first NaN or ±Inf if there is one, else the
// first value the codec cannot represent.
func StatusError(status []byte) error {
	if len(status) != StatusLen {
		return &ArgumentError{Op: "StatusError", Reason: fmt.Sprintf("status block of %d bytes, want %d", len(status), StatusLen)}
	}
	for w := 0; w < 2; w++ {
		if v := binary.LittleEndian.Uint64(status[8*w:]); v != math.MaxUint64 {
			return &compress.NonFiniteError{Index: int(v >> 32), Value: math.Float32frombits(uint32(v))}
		}
	}
	return nil
}

// DecodeArgs are the device buffers of one Decode call.
type DecodeArgs struct {
	Dst gpu.Ptr // N float32, 4-byte aligned
	N   int
	// Add adds the decoded values to Dst; otherwise Dst is set to the first
	// body's values and the others are added.
	Add bool
	// Bodies are raw bodies (compress.DecodePayload's, validated there) of
	// this codec for N elements, summed in this order.
	Bodies []gpu.Ptr
	// Key is the key random-k bodies were written under (they share it in a
	// shared-index exchange); other codecs ignore it.
	Key compress.Key
}

// decodePlan returns the operations of Decode.
func (c *Codec) decodePlan(a DecodeArgs) ([]step, error) {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: "Decode(" + c.Spec().String() + ")", Reason: fmt.Sprintf(format, v...)}
	}
	switch {
	case a.N < 0 || int64(a.N) > compress.MaxElements:
		return nil, bad("element count %d outside [0, %d]", a.N, uint64(compress.MaxElements))
	case len(a.Bodies) == 0:
		return nil, bad("no bodies")
	case a.N > 0 && a.Dst == 0:
		return nil, bad("null destination for %d elements", a.N)
	case a.Dst%4 != 0:
		return nil, bad("destination %#x is not 4-byte aligned", a.Dst)
	}
	for i, b := range a.Bodies {
		if a.N > 0 && c.BodyLen(a.N) > 0 && (b == 0 || b%4 != 0) {
			return nil, bad("body %d at %#x is null or not 4-byte aligned", i, b)
		}
	}
	n := uint64(a.N)
	if n == 0 {
		return nil, nil
	}
	dst := ptrArg(a.Dst)
	var plan []step
	switch c.codec {
	case compress.CodecNone, compress.CodecFP16, compress.CodecBF16:
		for i, b := range a.Bodies {
			plan = append(plan, elementwise("gc_dense_decode", n, dst, ptrArg(b), n, uint64(c.format), boolArg(a.Add || i > 0)))
		}
	case compress.CodecInt8, compress.CodecInt4, compress.CodecInt2, compress.CodecSign:
		for i := 0; i < len(a.Bodies); i += 8 {
			chunk := a.Bodies[i:min(i+8, len(a.Bodies))]
			args := []uint64{dst, n, uint64(c.bucket), uint64(c.bits), boolArg(a.Add || i > 0), uint64(len(chunk))}
			for j := range 8 {
				var p gpu.Ptr
				if j < len(chunk) {
					p = chunk[j]
				}
				args = append(args, ptrArg(p))
			}
			plan = append(plan, elementwise("gc_dequant", n, args...))
		}
	case compress.CodecTopK, compress.CodecRandomK:
		k := uint64(c.sparseK(a.N))
		if !a.Add {
			plan = append(plan, memset32(a.Dst, 0, n))
		}
		var base uint64
		if c.codec == compress.CodecRandomK {
			base = compress.StreamBase(c.seed, a.Key, compress.DomainRandomK)
		}
		for i, b := range a.Bodies {
			idx, vals := ptrArg(b), ptrArg(b)+4*k
			if c.codec == compress.CodecRandomK {
				idx, vals = 0, ptrArg(b)
			}
			plan = append(plan, elementwise("gc_sparse_scatter", k, dst, idx, vals, n, k, base, boolArg(a.Add || i > 0)))
		}
	default:
		return nil, bad("no device kernels for codec %s", c.codec)
	}
	return plan, nil
}

// MaskArgs are the device buffers of one Mask call.
type MaskArgs struct {
	U gpu.Ptr // N float32, 4-byte aligned: zeroed where the payload sent
	N int
	// Body is the raw body this codec's Encode wrote for N elements
	// under Key: top-k's indices are read from it, random-k's are drawn
	// from Key (Body is then unused and may be 0).
	Body gpu.Ptr
	Key  compress.Key
	// Gate, optional: StatusLen bytes, 8-byte aligned (an Average's Out);
	// the mask applies only if neither of its words records a failure.
	Gate gpu.Ptr
}

// maskPlan returns the operations of Mask.
func (c *Codec) maskPlan(a MaskArgs) ([]step, error) {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: "Mask(" + c.Spec().String() + ")", Reason: fmt.Sprintf(format, v...)}
	}
	topk := c.codec == compress.CodecTopK
	switch {
	case !topk && c.codec != compress.CodecRandomK:
		return nil, bad("codec %s sends no index set: only top-k and random-k masks", c.codec)
	case a.N < 0 || int64(a.N) > compress.MaxElements:
		return nil, bad("element count %d outside [0, %d]", a.N, uint64(compress.MaxElements))
	case a.N > 0 && (a.U == 0 || a.U%4 != 0):
		return nil, bad("velocity %#x is null or not 4-byte aligned", a.U)
	case topk && a.N > 0 && (a.Body == 0 || a.Body%4 != 0):
		return nil, bad("body %#x is null or not 4-byte aligned", a.Body)
	case a.Gate%8 != 0:
		return nil, bad("gate status %#x is not 8-byte aligned", a.Gate)
	}
	k := uint64(c.sparseK(a.N))
	if a.N == 0 || k == 0 {
		return nil, nil
	}
	idx, base := ptrArg(a.Body), uint64(0)
	if !topk {
		idx, base = 0, compress.StreamBase(c.seed, a.Key, compress.DomainRandomK)
	}
	return []step{elementwise("gc_sparse_mask", k, ptrArg(a.U), idx, uint64(a.N), k, base, ptrArg(a.Gate))}, nil
}

// Mask enqueues on s momentum factor masking for one payload of this
// sparse codec (see MaskArgs) and returns without waiting: U[i] = 0 at
// every index i the payload sent, as compress.Pending.CommitMasked does,
// unless a.Gate records a failure.
func (c *Codec) Mask(ctx *Context, s gpu.Stream, a MaskArgs) error {
	plan, err := c.maskPlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}
