package compress

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"sync"
)

// MinTopKChunk and MaxTopKChunk bound top-k's chunk=C. Above 65536 a
// local index would need more than 16 bits, and a chunk (256 KiB of
// float32) would no longer sit in a core's L2 cache while it is selected
// from. Below 64 a chunk's fixed costs — at least one element kept
// whatever the ratio, up to a byte of padding per section, 8 bytes of lo
// and scale with bits= — outweigh what it carries: with bits=2 a chunk of
// one kept element takes 10 bytes, 1.25 bits per input element at C = 64
// and 2.5 at C = 32, more than int2 spends on every element (2.125),
// against 0.30 at C = 4096 and ratio 0.02.
const (
	MinTopKChunk = 64
	MaxTopKChunk = 1 << 16
)

// Header parameter B of top-k (wire.go): 0 for the layout over the whole
// input (topkCodec); for chunkTopK, the chunk length in bits 0-16, the
// value width B in bits 24-27 (0: float32) and, with B, 1 in bit 28 for
// round=nearest. Every other bit is zero.
const (
	topkParamValueShift = 24
	topkParamNearest    = 1 << 28
)

// chunkTopK is top-k chunk by chunk, SparseLoCo's compressor with bits=
// (spec topk:RATIO:chunk=C[:bits=2|4|8[:round=stochastic|nearest][:seed=S]]).
// Header: parameter A = k, the elements kept in all; parameter B as
// above; seed S (0 without bits).
//
// The input of n elements splits into nc = ⌈n/C⌉ chunks of C consecutive
// elements, the last one of c = n − (nc−1)·C ≤ C. A chunk of c elements
// keeps k_c = sparseK(RATIO, c) = clamp(round(RATIO·c), 1, c) of them: a
// last, partial chunk keeps in proportion to its length, as top-k of its
// c elements alone would (a chunk of 1 keeps its element). k, and with it
// the body length, is a function of n: every rank's payload of a bucket
// has the same size, which the engine's all-gather needs.
//
// The reference semantics, which every backend must reproduce bit for
// bit, chunk by chunk (x the chunk, its element i at input index
// base + i; Key the call's compress.Key):
//
//	key(v) = bits(v) & 0x7fffffff    (orders finite values like |v|)
//	a NaN or ±Inf anywhere is a *NonFiniteError for the lowest such index
//	T      = the k_c-th largest key of the chunk
//	kept   = every i with key(x[i]) > T, and the lowest-index i with
//	         key(x[i]) == T, as many as make k_c: top-k's rule (topkCodec)
//	         within the chunk, ties to the lower index, −0 and +0 alike
//
// Without bits the kept values go as they are (float32), and decoding
// gives x[i] at the kept i, +0 elsewhere: a SparseCompressor, whose error
// feedback keeps the residual in place. With bits = B each kept value is
// its sign and a magnitude quantized between the chunk's least and
// greatest kept magnitudes by quantCodec's rules (quant.go, B−1 bits for
// the magnitude, L = 2^(B−1) − 1: 1, 7 or 127), in float32 operations
// that are never fused:
//
//	lo    = float32frombits(T)      the least kept magnitude, ≥ +0
//	hi    = the greatest key of the chunk, as a float32
//	d     = float64(hi) − float64(lo)
//	scale = float32(d / L)
//	inv   = 0 if scale == 0, else float32(min(L / d, MaxFloat32))
//	top   = lo + float32(float32(L) · scale); if it is not finite, the
//	        chunk is a *NonFiniteError at its first element of key hi
//	for each kept i, in index order:
//	  a    = float32frombits(key(x[i]))                          |x[i]|
//	  r    = NewRandomStream(S, Key, DomainRound).Uniform(base + i)  stochastic
//	         0.5                                                    nearest
//	  m    = min(trunc(float32(float32(float32(a − lo) · inv) + r)), L)
//	  code = m | signbit(x[i]) << (B−1)
//	D(code) = ±(lo + float32(float32(m) · scale)), − where the code's
//	          top bit is set (an exact negation)
//
// so that D keeps the sign of x[i], and its magnitude errs by at most
// scale·(1 + 2^-14) (stochastic, unbiased) or scale·(1/2 + 2^-14)
// (nearest) plus a few ulps of hi, as the quantizers do; with B = 2 a
// kept value decodes to ±lo or ±hi. Under error feedback the residual is
// s − D(C(s)) element by element, the quantization error of the kept
// values included (feedbackCodec: per chunk, the pass that reads e and g
// writes their sum, and the body and the residual follow from cache).
//
// Body, with w = ⌈log2 C⌉ = bits.Len(C−1) (12 for C = 4096, 16 for
// 65536), sections in this order, each chunk's part of a section starting
// on a byte (at most 7 bits of padding per chunk and section, zero):
//
//	bits only: nc chunk headers of 8 bytes: lo and scale, float32 bits
//	indices:   per chunk, its k_c local indices (0 ≤ i < c, strictly
//	           ascending) at w bits each, LSB first: ⌈k_c·w/8⌉ bytes
//	values:    per chunk, its k_c values in index order: float32 (4·k_c
//	           bytes) or, with bits, the codes at B bits each, LSB first
//	           (⌈k_c·B/8⌉ bytes)
//
// All chunks but the last have the same sizes, so chunk j's parts lie at
// offsets computed from j alone. At n = 2^20, ratio 0.02, C = 4096 and
// B = 2 (k_c = 82): a body of 256·(8 + 123 + 21) = 38912 bytes, 38972
// with the frame, 107.6 times less than the 4 MiB of float32
// (TestChunkTopKSize); without bits 256·(123 + 328) = 115456 bytes (36.3
// times less), plain topk:0.02 167776 (25 times less).
//
// Decoding validates every chunk (indices in range and strictly
// ascending, padding zero; lo and scale finite and non-negative, top
// finite; float32 values finite) before it writes anything, then sets
// dst to D at the kept indices and +0 elsewhere, or adds D there. The
// chunks are encoded and decoded in parallel; the bytes do not depend on
// the number of workers.
type chunkTopK struct {
	ratio float64
	chunk int  // C
	bits  uint // B: 2, 4 or 8, or 0 for float32 values
	// q holds the magnitudes' quantizer: B−1 bits, the rounding and the
	// seed (bits only).
	q quantCodec
}

// sparseChunkTopK is chunkTopK without bits: a sparseCodec.
type sparseChunkTopK struct{ chunkTopK }

// quantChunkTopK is chunkTopK with bits: a feedbackCodec.
type quantChunkTopK struct{ chunkTopK }

// newChunkTopK returns the codec of a valid top-k spec with a chunk.
func newChunkTopK(s Spec) codec {
	t := chunkTopK{ratio: s.Ratio, chunk: s.Chunk, bits: uint(s.Bits)}
	if s.Bits == 0 {
		return &sparseChunkTopK{t}
	}
	t.q = quantCodec{codec: CodecTopK, bits: uint(s.Bits) - 1, nearest: s.Nearest, rngSeed: s.Seed}
	return &quantChunkTopK{t}
}

func (t *chunkTopK) id() Codec    { return CodecTopK }
func (t *chunkTopK) seed() uint64 { return t.q.rngSeed }

func (t *chunkTopK) params(n int) (a, b uint32) {
	b = uint32(t.chunk)
	if t.bits != 0 {
		b |= uint32(t.bits) << topkParamValueShift
		if t.q.nearest {
			b |= topkParamNearest
		}
	}
	return uint32(t.layout(n).k()), b
}

func (t *chunkTopK) bodyLen(n int) int { return t.layout(n).bodyLen }

// chunkLayout is where the parts of a chunked top-k body of n elements
// lie (see chunkTopK).
type chunkLayout struct {
	chunk            int  // C
	chunks           int  // nc = ⌈n/C⌉
	lastLen          int  // elements of the last chunk
	kFull, kLast     int  // elements a full chunk keeps, and the last one
	hdr              int  // bytes of a chunk header: 8 with bits, else 0
	idxBits, valBits uint // w, and 32 or B
	idxLen, valLen   int  // bytes of a full chunk's indices and values
	idxOff, valOff   int  // where the index and the value sections start
	bodyLen          int
}

func (t *chunkTopK) layout(n int) chunkLayout {
	l := chunkLayout{chunk: t.chunk, idxBits: uint(bits.Len(uint(t.chunk - 1))), valBits: 32}
	if t.bits != 0 {
		l.hdr, l.valBits = 8, t.bits
	}
	if n == 0 {
		return l
	}
	l.chunks = (n + t.chunk - 1) / t.chunk
	l.lastLen = n - (l.chunks-1)*t.chunk
	l.kFull, l.kLast = sparseK(t.ratio, t.chunk), sparseK(t.ratio, l.lastLen)
	l.idxLen, l.valLen = packedLen(l.kFull, l.idxBits), packedLen(l.kFull, l.valBits)
	l.idxOff = l.hdr * l.chunks
	l.valOff = l.idxOff + (l.chunks-1)*l.idxLen + packedLen(l.kLast, l.idxBits)
	l.bodyLen = l.valOff + (l.chunks-1)*l.valLen + packedLen(l.kLast, l.valBits)
	return l
}

// k returns the elements kept in all.
func (l chunkLayout) k() int {
	if l.chunks == 0 {
		return 0
	}
	return (l.chunks-1)*l.kFull + l.kLast
}

// chunkPart is one chunk of a body: its elements and its bytes.
type chunkPart struct {
	base, len, k int    // first element, elements, elements kept
	hdr          []byte // lo and scale (bits only)
	idx, vals    []byte // its index and value bytes
	idxOff       int    // where idx starts in the body
	valOff       int    // where vals starts in the body
}

// part returns chunk j of body.
func (l *chunkLayout) part(body []byte, j int) chunkPart {
	p := chunkPart{base: j * l.chunk, len: l.chunk, k: l.kFull}
	if j == l.chunks-1 {
		p.len, p.k = l.lastLen, l.kLast
	}
	p.hdr = body[l.hdr*j : l.hdr*(j+1)]
	p.idxOff, p.valOff = l.idxOff+j*l.idxLen, l.valOff+j*l.valLen
	p.idx = body[p.idxOff : p.idxOff+packedLen(p.k, l.idxBits)]
	p.vals = body[p.valOff : p.valOff+packedLen(p.k, l.valBits)]
	return p
}

// chunkScratch is the memory one goroutine selects chunks with.
type chunkScratch struct {
	hist [histBins]uint32 // all zero between chunks
	// pos and vals are the candidates of the chunk being selected from:
	// its elements with key ≥ bound, in index order (pos: input index).
	pos  []uint32
	vals []float32
	cand []uint32 // the keys still undecided after the first level
	// bound is what the next chunk collects from: 3/4 of the least
	// magnitude the previous chunk kept, or 0.
	bound uint32
}

var chunkScratchPool = sync.Pool{New: func() any { return new(chunkScratch) }}

// encodeChunks runs enc on every chunk of src, in parallel by run, and
// returns the error of the lowest failing chunk (which holds the lowest
// failing index). Unless e is nil, enc's selection sets the chunk to
// e + g as it first reads it.
func (t *chunkTopK) encodeChunks(body []byte, e, g, src []float32, run runner, enc func(sc *chunkScratch, l *chunkLayout, p chunkPart, x []float32, add addends) error) error {
	l := t.layout(len(src))
	var fe firstError
	run(len(src), t.chunk, func(lo, hi int) {
		sc := chunkScratchPool.Get().(*chunkScratch)
		defer chunkScratchPool.Put(sc)
		sc.bound = 0
		for j := lo / t.chunk; j*t.chunk < hi; j++ {
			p := l.part(body, j)
			add := addends{}
			if e != nil {
				add = addends{e[p.base : p.base+p.len], g[p.base : p.base+p.len]}
			}
			if err := enc(sc, &l, p, src[p.base:p.base+p.len], add); err != nil {
				fe.set(p.base, err)
				return
			}
		}
	})
	return fe.err
}

// selectChunk selects the k kept elements of the chunk x (1 ≤ k ≤
// len(x)), whose first element has input index base, first setting x to
// e + g unless add is none. It returns T, the k-th largest key, take, how
// many of the elements with key T are kept (the lowest-index ones, at
// least 1), and hi, the largest key; the kept elements are the
// candidates (sc.pos, sc.vals) with a key above T and the first take with
// key T. A NaN or ±Inf in x is a *NonFiniteError for the first one.
//
// It is the radix select of topk_select.go on one chunk, on candidates:
// one pass (collectAtLeast, which sums e + g as it reads) copies the
// elements with a key at or above sc.bound and counts their top 11 key
// bits. If that makes at least k, the k largest keys are among them;
// otherwise (a chunk of smaller values than the one before) a second pass
// takes every element. The bin of the k-th largest top digit leaves the
// undecided candidates; sorted if they are few, else by histograms of
// their next 11 and last 9 key bits, they settle T. The bound changes only
// the speed, never the selection.
func (sc *chunkScratch) selectChunk(x []float32, add addends, k, base int) (t uint32, take int, hi uint32, err error) {
	h := &sc.hist
	sc.pos, sc.vals = collectAtLeast(h, sc.pos[:0], sc.vals[:0], x, add, base, sc.bound)
	if len(sc.vals) < k {
		sc.clearHist(sc.vals)
		sc.pos, sc.vals = collectAtLeast(h, sc.pos[:0], sc.vals[:0], x, addends{}, base, 0)
	}
	for _, v := range sc.vals {
		hi = max(hi, magKey(v))
	}
	if hi >= nonFiniteKey {
		sc.clearHist(sc.vals)
		for o, v := range sc.vals {
			if magKey(v) >= nonFiniteKey {
				return 0, 0, 0, &NonFiniteError{Index: int(sc.pos[o]), Value: v}
			}
		}
	}
	need := k
	b := pickBin(h[:hi>>20+1], &need)
	sc.clearHist(sc.vals)
	cand := sc.cand[:0]
	for _, v := range sc.vals {
		if u := magKey(v); u>>20 == b {
			cand = append(cand, u)
		}
	}
	if len(cand) <= sortedCands {
		// Few undecided: sorted, the need-th largest is T.
		slices.Sort(cand)
		top := cand[len(cand)-need:] // the need largest, T the least of them
		t = top[0]
		for take < len(top) && top[take] == t {
			take++
		}
		sc.cand = cand[:0]
		sc.bound = math.Float32bits(math.Float32frombits(t) * 0.75)
		return t, take, hi, nil
	}
	prefix := b
	for _, lv := range radixLevels[1:] {
		mask := uint32(1)<<lv.bits - 1
		top := uint32(0)
		for _, u := range cand {
			d := u >> lv.shift & mask
			h[d]++
			top = max(top, d)
		}
		b = pickBin(h[:top+1], &need)
		m := 0
		for _, u := range cand {
			d := u >> lv.shift & mask
			h[d] = 0
			cand[m] = u
			m += int((d ^ b - 1) >> 31) // 1 iff equal: both sides < 2^31
		}
		cand = cand[:m]
		prefix = prefix<<lv.bits | b
	}
	sc.cand = cand[:0]
	sc.bound = math.Float32bits(math.Float32frombits(prefix) * 0.75)
	return prefix, need, hi, nil
}

// sortedCands is how many undecided keys selectChunk sorts rather than
// histograms: fewer than a histogram's bins cost to scan.
const sortedCands = 64

// clearHist zeroes the bins of sc.hist that the top digits of vals count
// in, which are all that collectAtLeast set.
func (sc *chunkScratch) clearHist(vals []float32) {
	for _, v := range vals {
		sc.hist[magKey(v)>>20] = 0
	}
}

// pickBin returns the bin of h holding the need-th largest count from the
// top and lowers need by the counts of the bins above it.
func pickBin(h []uint32, need *int) uint32 {
	b, in := len(h)-1, 0
	for in+int(h[b]) < *need {
		in += int(h[b])
		b--
	}
	*need -= in
	return uint32(b)
}

// forKept calls f(i, v) for each kept element of the chunk at input index
// base, in index order (i counted in the chunk, v its value): the
// candidates with a key above t and the first take with key t.
func (sc *chunkScratch) forKept(base int, t uint32, take int, f func(i int, v float32)) {
	for o, v := range sc.vals {
		u := magKey(v)
		if u < t || u == t && take == 0 {
			continue
		}
		if u == t {
			take--
		}
		f(int(sc.pos[o])-base, v)
	}
}

// bitWriter writes values of up to 32 bits LSB first into out from its
// first byte on; flush writes the last partial byte, its high bits zero.
type bitWriter struct {
	out []byte
	acc uint64
	n   uint // bits in acc
	o   int  // bytes written
}

func (w *bitWriter) put(v uint64, width uint) {
	w.acc |= v << w.n
	w.n += width
	for w.n >= 8 {
		w.out[w.o] = byte(w.acc)
		w.o++
		w.acc >>= 8
		w.n -= 8
	}
}

func (w *bitWriter) flush() {
	if w.n > 0 {
		w.out[w.o] = byte(w.acc)
	}
}

// bitReader reads what bitWriter wrote.
type bitReader struct {
	in  []byte
	acc uint64
	n   uint
	o   int
}

func (r *bitReader) get(width uint) uint32 {
	for r.n < width {
		r.acc |= uint64(r.in[r.o]) << r.n
		r.o++
		r.n += 8
	}
	v := uint32(r.acc & (1<<width - 1))
	r.acc >>= width
	r.n -= width
	return v
}

// encode implements codec.
func (t *sparseChunkTopK) encode(body []byte, src []float32, key Key, run runner) error {
	return t.encodeSum(body, nil, nil, src, key, run)
}

// encodeSum implements sparseCodec: each chunk is set to e + g right
// before it is selected from, while it is in cache.
func (t *sparseChunkTopK) encodeSum(body []byte, e, g, sum []float32, _ Key, run runner) error {
	return t.encodeChunks(body, e, g, sum, run, func(sc *chunkScratch, l *chunkLayout, p chunkPart, x []float32, add addends) error {
		th, take, _, err := sc.selectChunk(x, add, p.k, p.base)
		if err != nil {
			return err
		}
		iw := bitWriter{out: p.idx}
		o := 0
		sc.forKept(p.base, th, take, func(i int, v float32) {
			iw.put(uint64(i), l.idxBits)
			binary.LittleEndian.PutUint32(p.vals[4*o:], math.Float32bits(v))
			o++
		})
		iw.flush()
		return nil
	})
}

// encodeResidual implements residualCodec: res is src with +0 at the
// kept indices (s − s is +0 for finite s, and s − (+0) is s).
func (t *sparseChunkTopK) encodeResidual(body []byte, src []float32, key Key, res []float32, run runner) error {
	if err := t.encode(body, src, key, run); err != nil {
		return err
	}
	copyBlocks(res, src, run)
	t.forIndices(body, len(src), func(i int) { res[i] = 0 })
	return nil
}

// selected implements sparseCodec.
func (t *sparseChunkTopK) selected(sel []uint32, body []byte, n int, _ Key) []uint32 {
	t.forIndices(body, n, func(i int) { sel = append(sel, uint32(i)) })
	return sel
}

// forIndices calls f with the input index of every element the valid
// body of n elements keeps, in increasing order.
func (t *chunkTopK) forIndices(body []byte, n int, f func(i int)) {
	l := t.layout(n)
	for j := range l.chunks {
		p := l.part(body, j)
		r := bitReader{in: p.idx}
		for range p.k {
			f(p.base + int(r.get(l.idxBits)))
		}
	}
}

// encode implements codec.
func (t *quantChunkTopK) encode(body []byte, src []float32, key Key, run runner) error {
	return t.encodeFeedback(body, nil, nil, src, key, nil, run, nil)
}

// encodeFeedback implements feedbackCodec: per chunk, e + g (unless e is
// nil), the selection, the codes and, unless res is nil, the residual
// s − D, while the chunk is in cache. It does not checksum into bs.
func (t *quantChunkTopK) encodeFeedback(body []byte, e, g, src []float32, key Key, res []float32, run runner, _ *bodySum) error {
	keys := lanes32(NewRandomStream(t.q.rngSeed, key, DomainRound).base)
	levels, sign := t.q.levels(), t.bits-1
	return t.encodeChunks(body, e, g, src, run, func(sc *chunkScratch, l *chunkLayout, p chunkPart, x []float32, add addends) error {
		th, take, top, err := sc.selectChunk(x, add, p.k, p.base)
		if err != nil {
			return err
		}
		lo, hi := math.Float32frombits(th), math.Float32frombits(top)
		scale, inv, ok := t.q.scales(lo, hi)
		if !ok {
			i := firstAtLeast(x, top)
			return &NonFiniteError{Index: p.base + i, Value: x[i]}
		}
		putScales(p.hdr, lo, scale)
		if res != nil {
			copy(res[p.base:p.base+p.len], x)
		}
		iw, cw := bitWriter{out: p.idx}, bitWriter{out: p.vals}
		sc.forKept(p.base, th, take, func(i int, v float32) {
			iw.put(uint64(i), l.idxBits)
			a := math.Float32frombits(magKey(v))
			m := quantCode(a, lo, inv, t.q.uniformBits(keys, p.base+i), levels)
			neg := math.Float32bits(v) >> 31
			cw.put(m|uint64(neg)<<sign, t.bits)
			if res != nil {
				res[p.base+i] = v - withSign(dequant(uint8(m), lo, scale), neg)
			}
		})
		iw.flush()
		cw.flush()
		return nil
	})
}

// withSign returns a, negated if neg is 1.
func withSign(a float32, neg uint32) float32 {
	return math.Float32frombits(math.Float32bits(a) ^ neg<<31)
}

func (t *chunkTopK) check(body []byte, h *header) error {
	l := t.layout(int(h.n))
	levels := float32(t.q.levels())
	for j := range l.chunks {
		p := l.part(body, j)
		if t.bits != 0 {
			lb, sb := binary.LittleEndian.Uint32(p.hdr), binary.LittleEndian.Uint32(p.hdr[4:])
			lo, scale := math.Float32frombits(lb), math.Float32frombits(sb)
			switch top := lo + float32(levels*scale); {
			case lb >= expMask: // sign bit set, Inf or NaN
				return &CorruptInputError{Offset: int64(8 * j), Reason: fmt.Sprintf("top-k chunk %d least magnitude %v is not a finite non-negative number", j, lo)}
			case sb >= expMask:
				return &CorruptInputError{Offset: int64(8*j + 4), Reason: fmt.Sprintf("top-k chunk %d scale %v is not a finite non-negative number", j, scale)}
			case math.Float32bits(top)&expMask == expMask:
				return &CorruptInputError{Offset: int64(8*j + 4), Reason: fmt.Sprintf("top-k chunk %d largest magnitude %v + %d·%v overflows float32", j, lo, t.q.levels(), scale)}
			}
		}
		r := bitReader{in: p.idx}
		prev := -1
		for i := range p.k {
			at := int64(p.idxOff + i*int(l.idxBits)/8)
			switch x := int(r.get(l.idxBits)); {
			case x >= p.len:
				return &CorruptInputError{Offset: at, Reason: fmt.Sprintf("top-k chunk %d index %d is out of range for its %d elements", j, x, p.len)}
			case x <= prev:
				return &CorruptInputError{Offset: at, Reason: fmt.Sprintf("top-k chunk %d index %d does not ascend from %d", j, x, prev)}
			default:
				prev = x
			}
		}
		if r.acc != 0 {
			return &CorruptInputError{Offset: int64(p.idxOff + len(p.idx) - 1), Reason: fmt.Sprintf("top-k chunk %d: nonzero padding bits after its indices", j)}
		}
		if t.bits != 0 {
			if err := checkPadding(p.vals, p.k*int(t.bits), p.valOff); err != nil {
				return err
			}
			continue
		}
		for i := range p.k {
			if binary.LittleEndian.Uint32(p.vals[4*i:])&nonFiniteKey == nonFiniteKey {
				return &CorruptInputError{Offset: int64(p.valOff + 4*i), Reason: fmt.Sprintf("top-k chunk %d: non-finite value", j)}
			}
		}
	}
	return nil
}

func (t *chunkTopK) decode(dst []float32, body []byte, _ *header, add bool, run runner) {
	decodeRanges(t, dst, body, add, run)
}

// decodeGrain implements rangeDecoder: ranges start on a chunk.
func (t *chunkTopK) decodeGrain() int { return t.chunk }

// decodeRange implements rangeDecoder: the chunks of dst[from:to], each
// cleared (unless add) and then given its kept values.
func (t *chunkTopK) decodeRange(dst []float32, body []byte, from, to int, add bool) {
	l := t.layout(len(dst))
	sign := t.bits - 1
	for j := from / t.chunk; j*t.chunk < to; j++ {
		p := l.part(body, j)
		x := dst[p.base : p.base+p.len]
		if !add {
			clear(x)
		}
		ir := bitReader{in: p.idx}
		if t.bits == 0 {
			for o := range p.k {
				setOrAdd(&x[ir.get(l.idxBits)], math.Float32frombits(binary.LittleEndian.Uint32(p.vals[4*o:])), add)
			}
			continue
		}
		lo := math.Float32frombits(binary.LittleEndian.Uint32(p.hdr))
		scale := math.Float32frombits(binary.LittleEndian.Uint32(p.hdr[4:]))
		cr := bitReader{in: p.vals}
		for range p.k {
			i, c := ir.get(l.idxBits), cr.get(t.bits)
			setOrAdd(&x[i], withSign(dequant(uint8(c&(1<<sign-1)), lo, scale), c>>sign), add)
		}
	}
}
