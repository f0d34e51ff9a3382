package compresstest

import (
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
)

// Tolerances of the round-trip checks. Each bounds |x − D(C(x))| for one
// element x (or, for sign and sampled top-k, the quantity named).
const (
	// fp16RelTol is half an ulp of IEEE binary16 relative to |x|: with 11
	// significant bits, round to nearest errs by at most 2^-11·|x| in the
	// normal range [2^-14, 65504].
	fp16RelTol = 0x1p-11
	// fp16AbsTol is half the spacing of binary16 subnormals (2^-24): below
	// 2^-14 the error is bounded absolutely, not relatively.
	fp16AbsTol = 0x1p-25
	// bf16RelTol is half an ulp of bfloat16 (8 significant bits) relative to |x|.
	bf16RelTol = 0x1p-8
	// bf16AbsTol is half the spacing of bfloat16 subnormals (2^-133), which
	// share float32's exponent range.
	bf16AbsTol = 0x1p-134
	// quantSlackRel is the float32 slack of min-max quantization, relative to
	// |lo| + |hi| of the bucket: computing hi − lo, the scale, code·scale and
	// lo + code·scale each round once (2^-24 relative to a quantity at most
	// |lo| + |hi|), and the rounding decision itself may land on the far side
	// of a midpoint by as much. 16 such roundings is ample margin, and still
	// a tiny fraction of the quantization step.
	quantSlackRel = 0x1p-20
	// quantSlackAbs is the same slack where values are subnormal and float32
	// rounding errs absolutely (2^-149 per operation), with ample margin.
	quantSlackAbs = 0x1p-126
	// signSumRelTol is the error of sign's scale mean|x|, relative to the
	// exact mean and per element of the bucket: a float32 running sum of m
	// terms errs by at most (m − 1)·2^-24 of Σ|x|, and the division by m once
	// more, so m·2^-24 bounds the whole.
	signSumRelTol = 0x1p-24
	// sampledMinRecall is the least recall sampled top-k must reach: the
	// fraction of its k kept elements whose magnitude reaches the k-th largest.
	sampledMinRecall = 0.95
	// sampledRecallMinK is the smallest k at which the recall bound applies;
	// for fewer kept elements one miss is already more than 5%.
	sampledRecallMinK = 50
)

// withinAbsOrRel reports whether got is within abs, or within rel·|want|, of
// want (gonum's EqualWithinAbsOrRel, relative to the exact value).
func withinAbsOrRel(want, got, abs, rel float64) bool {
	d := math.Abs(want - got)
	return d <= abs || d <= rel*math.Abs(want)
}

// report collects element mismatches of one comparison: the first few are
// reported in full, the rest counted.
type report struct {
	t    *testing.T
	what string
	bad  int
}

const reportMax = 3

func (r *report) errorf(format string, args ...any) {
	r.t.Helper()
	r.bad++
	if r.bad <= reportMax {
		r.t.Errorf("%s: %s", r.what, fmt.Sprintf(format, args...))
	}
}

func (r *report) done() {
	r.t.Helper()
	if r.bad > reportMax {
		r.t.Errorf("%s: %d mismatches in all", r.what, r.bad)
	}
}

// checkRoundTrip compresses every input at every length and checks the
// decoded values against the codec's bound:
//
//	none         bit-identical
//	fp16, bf16   |x − D| ≤ max(AbsTol, RelTol·|x|) (round to nearest)
//	topk         exactly k = clamp(round(ratio·n), 1, n) nonzero (0 for n = 0),
//	             bit-identical to x, and the top k by |x| with ties to the
//	             lower index
//	topk:sampled exactly k nonzero, bit-identical to x, recall ≥ sampledMinRecall
//	topk:chunk=C per chunk of c ≤ C elements, exactly k_c = clamp(round(ratio·c),
//	             1, c) nonzero, the chunk's top k_c by |x| with ties to the
//	             lower index; without bits bit-identical to x; with bits=B
//	             the sign of x and, with [lo, hi] the range of the kept
//	             magnitudes, ||x| − |D|| ≤ (hi − lo)/(2^(B−1) − 1), half that
//	             for round=nearest, plus quantSlackRel·(lo + hi) +
//	             quantSlackAbs; at most 2^(B−1) distinct magnitudes
//	randomk      exactly k nonzero, bit-identical to x, at the same positions
//	             for every input compressed under the same key
//	int8/4/2     per bucket of B elements with range [lo, hi]:
//	             |x − D| ≤ (hi − lo)/(2^bits − 1), half that for round=nearest,
//	             plus quantSlackRel·(|lo| + |hi|) + quantSlackAbs; at most
//	             2^bits distinct values
//	sign         D = ±mean|x| of the bucket (one magnitude per bucket),
//	             negative exactly where x < 0
func checkRoundTrip(t *testing.T, e *env) {
	key := compress.Key{Bucket: 1, Step: 2}
	minRecall, recalls := 1.0, 0
	defer func() {
		if recalls > 0 {
			t.Logf("sampled top-k: least recall %.4f over %d inputs", minRecall, recalls)
		}
	}()
	for _, n := range e.lengths(true) {
		var positions []int // random-k: kept positions of the first input
		for i, in := range inputs {
			if n > 1<<16 && in.name != "wide" {
				continue // the large length only needs one input
			}
			x := in.gen(n, uint64(i))
			d := mustDecompress(t, e.c, mustCompress(t, e.c, x, key), n)
			r := &report{t: t, what: fmt.Sprintf("n=%d %s", n, in.name)}
			switch s := e.info; {
			case s.codec == compress.CodecNone:
				for j := range x {
					if math.Float32bits(x[j]) != math.Float32bits(d[j]) {
						r.errorf("element %d: got %v, want %v exactly", j, d[j], x[j])
					}
				}
			case s.codec == compress.CodecFP16:
				checkHalf(r, x, d, fp16AbsTol, fp16RelTol)
			case s.codec == compress.CodecBF16:
				checkHalf(r, x, d, bf16AbsTol, bf16RelTol)
			case s.codec == compress.CodecTopK && s.chunk != 0:
				checkChunkTopK(r, x, d, s)
			case s.codec == compress.CodecTopK:
				recall := checkTopK(r, x, d, kFor(s.ratio, n), s.sampled)
				if s.sampled {
					minRecall, recalls = min(minRecall, recall), recalls+1
				}
			case s.codec == compress.CodecRandomK:
				kept := checkSparse(r, x, d, kFor(s.ratio, n))
				if positions == nil {
					positions = kept
				} else if !slices.Equal(kept, positions) {
					r.errorf("kept positions differ between inputs compressed under the same key")
				}
			case s.quantBits() > 0:
				checkQuant(r, x, d, s.bucket, s.quantBits(), s.nearest)
			case s.codec == compress.CodecSign:
				checkSign(r, x, d, s.bucket)
			default:
				t.Fatalf("no round-trip bound for codec %v", s.codec)
			}
			r.done()
		}
	}
}

func checkHalf(r *report, x, d []float32, abs, rel float64) {
	for j := range x {
		if !withinAbsOrRel(float64(x[j]), float64(d[j]), abs, rel) {
			r.errorf("element %d: got %v for %v, error %g > max(%g, %g·|x|)", j, d[j], x[j], math.Abs(float64(x[j]-d[j])), abs, rel)
		}
	}
}

// kFor is the number of elements top-k and random-k keep of n:
// clamp(round(ratio·n), 1, n), and 0 for n = 0.
func kFor(ratio float64, n int) int {
	if n == 0 {
		return 0
	}
	return min(max(int(math.Round(ratio*float64(n))), 1), n)
}

// topKRef returns the ascending indices of the k largest |x|, ties to the
// lower index, and the k-th largest magnitude. It sorts (|x| descending,
// index ascending) pairs, which orders the elements exactly as a stable sort
// by descending |x| does; each pair is packed into one uint64 (the magnitude
// bits of a finite float32 order like |x|, and −0 ties with +0) so that the
// sort of a million elements stays fast.
func topKRef(x []float32, k int) ([]int, float32) {
	keys := make([]uint64, len(x))
	for i, v := range x {
		keys[i] = uint64(math.Float32bits(abs32(v))^0x7fffffff)<<32 | uint64(i)
	}
	slices.Sort(keys)
	if k == 0 {
		return []int{}, float32(math.Inf(1))
	}
	keep := make([]int, k)
	for j, key := range keys[:k] {
		keep[j] = int(uint32(key))
	}
	kth := abs32(x[keep[k-1]])
	slices.Sort(keep)
	return keep, kth
}

func abs32(v float32) float32 { return math.Float32frombits(math.Float32bits(v) &^ (1 << 31)) }

// checkSparse checks that d keeps exactly k elements of x (which holds no
// zero) bit for bit and is +0 elsewhere, and returns the kept positions.
func checkSparse(r *report, x, d []float32, k int) []int {
	kept := []int{}
	for j := range d {
		switch {
		case d[j] != 0:
			kept = append(kept, j)
			if math.Float32bits(d[j]) != math.Float32bits(x[j]) {
				r.errorf("kept element %d: got %v, want %v exactly", j, d[j], x[j])
			}
		case math.Float32bits(d[j]) != 0:
			r.errorf("dropped element %d decodes to %v, want +0", j, d[j])
		}
	}
	if len(kept) != k {
		r.errorf("%d elements kept, want k = %d", len(kept), k)
	}
	return kept
}

// checkTopK checks the sparse shape of a top-k result. Exact top-k must keep
// the reference set; for sampled top-k it returns the recall (the fraction of
// kept elements whose magnitude reaches the k-th largest) and checks it
// against sampledMinRecall once k ≥ sampledRecallMinK.
func checkTopK(r *report, x, d []float32, k int, sampled bool) float64 {
	kept := checkSparse(r, x, d, k)
	ref, kth := topKRef(x, k)
	if !sampled {
		if !slices.Equal(kept, ref) {
			i := 0
			for i < min(len(kept), len(ref)) && kept[i] == ref[i] {
				i++
			}
			r.errorf("kept set is not the top %d by |x| with ties to the lower index: first difference at rank %d (kept %v, reference %v)",
				k, i, kept[i:min(i+4, len(kept))], ref[i:min(i+4, len(ref))])
		}
		return 1
	}
	if k == 0 {
		return 1
	}
	hits := 0
	for _, j := range kept {
		if abs32(x[j]) >= kth {
			hits++
		}
	}
	recall := float64(hits) / float64(k)
	if k >= sampledRecallMinK && recall < sampledMinRecall {
		r.errorf("recall %.4f below %.2f (k = %d)", recall, sampledMinRecall, k)
	}
	return recall
}

// checkChunkTopK checks chunked top-k chunk by chunk: the kept set, and
// the kept values exactly or within the bound of their quantization.
func checkChunkTopK(r *report, x, d []float32, s specInfo) {
	for lo := 0; lo < len(x); lo += s.chunk {
		hi := min(lo+s.chunk, len(x))
		cx, cd := x[lo:hi], d[lo:hi]
		k := kFor(s.ratio, hi-lo)
		var kept []int
		if s.bits == 0 {
			kept = checkSparse(r, cx, cd, k)
		} else {
			for j := range cd {
				switch {
				case cd[j] != 0:
					kept = append(kept, j)
				case math.Float32bits(cd[j]) != 0:
					r.errorf("dropped element %d decodes to %v, want +0", lo+j, cd[j])
				}
			}
			if len(kept) != k {
				r.errorf("chunk at %d: %d elements kept, want k = %d", lo, len(kept), k)
			}
		}
		if ref, _ := topKRef(cx, k); !slices.Equal(kept, ref) {
			r.errorf("chunk at %d: kept set %v… is not the top %d by |x| with ties to the lower index (%v…)", lo, kept[:min(4, len(kept))], k, ref[:min(4, len(ref))])
			continue
		}
		if s.bits == 0 || len(kept) == 0 {
			continue
		}
		mn, mx := math.Inf(1), 0.0
		for _, j := range kept {
			a := math.Abs(float64(cx[j]))
			mn, mx = min(mn, a), max(mx, a)
		}
		bound := (mx - mn) / float64(int(1)<<(s.bits-1)-1)
		if s.nearest {
			bound /= 2
		}
		bound += quantSlackRel*(mn+mx) + quantSlackAbs
		distinct := map[float32]bool{}
		for _, j := range kept {
			distinct[abs32(cd[j])] = true
			if math.Signbit(float64(cd[j])) != math.Signbit(float64(cx[j])) {
				r.errorf("element %d: decoded %v has the wrong sign for %v", lo+j, cd[j], cx[j])
			}
			if err := math.Abs(math.Abs(float64(cx[j])) - math.Abs(float64(cd[j]))); !(err <= bound) {
				r.errorf("element %d: got %v for %v, magnitude error %g > %g (kept magnitudes [%g, %g])", lo+j, cd[j], cx[j], err, bound, mn, mx)
			}
		}
		if len(distinct) > 1<<(s.bits-1) {
			r.errorf("chunk at %d decodes to %d distinct magnitudes, more than 2^%d", lo, len(distinct), s.bits-1)
		}
	}
}

// checkQuant checks min-max quantization bucket by bucket.
func checkQuant(r *report, x, d []float32, bucket, bits int, nearest bool) {
	levels := float64(int(1)<<bits - 1)
	for lo := 0; lo < len(x); lo += bucket {
		hi := min(lo+bucket, len(x))
		mn, mx := float64(slices.Min(x[lo:hi])), float64(slices.Max(x[lo:hi]))
		bound := (mx - mn) / levels
		if nearest {
			bound /= 2
		}
		bound += quantSlackRel*(math.Abs(mn)+math.Abs(mx)) + quantSlackAbs
		distinct := map[uint32]bool{}
		for j := lo; j < hi; j++ {
			distinct[math.Float32bits(d[j])] = true
			if err := math.Abs(float64(x[j]) - float64(d[j])); !(err <= bound) {
				r.errorf("element %d: got %v for %v, error %g > %g (bucket [%g, %g])", j, d[j], x[j], err, bound, mn, mx)
			}
		}
		if len(distinct) > 1<<bits {
			r.errorf("bucket at %d decodes to %d distinct values, more than 2^%d", lo, len(distinct), bits)
		}
	}
}

// checkSign checks that each bucket decodes to ±mean|x|, with the sign of x.
func checkSign(r *report, x, d []float32, bucket int) {
	for lo := 0; lo < len(x); lo += bucket {
		hi := min(lo+bucket, len(x))
		sum := 0.0
		for _, v := range x[lo:hi] {
			sum += math.Abs(float64(v))
		}
		m := hi - lo
		mean := sum / float64(m)
		tol := signSumRelTol * float64(m) * mean
		scale := abs32(d[lo])
		if math.Abs(float64(scale)-mean) > tol {
			r.errorf("bucket at %d: scale %v, want mean|x| = %v within %g", lo, scale, mean, tol)
		}
		for j := lo; j < hi; j++ {
			if abs32(d[j]) != scale {
				r.errorf("element %d: magnitude %v differs from its bucket's scale %v", j, abs32(d[j]), scale)
			}
			if math.Signbit(float64(d[j])) != (x[j] < 0) {
				r.errorf("element %d: decoded %v has the wrong sign for %v", j, d[j], x[j])
			}
		}
	}
}
