package compress

import (
	"encoding/binary"
	"math"
)

func init() {
	registerCodec(CodecRandomK, codecDef{
		uses: fieldRatio | fieldSeed,
		parse: func(a *specArgs, s *Spec) (err error) {
			if s.Ratio, err = a.ratio(); err != nil {
				return err
			}
			s.Seed, err = a.uintOption("seed")
			return err
		},
		build: func(s Spec) codec { return randomkCodec{ratio: s.Ratio, seedV: s.Seed} },
	})
}

// randomkCodec keeps k = sparseK(ratio, n) elements chosen by stratified
// random sampling (spec randomk:RATIO[:seed=S], default seed 0). Header:
// parameter A = k, parameter B = 0, seed S. Body: the k float32 values,
// little-endian (4k bytes); the indices are not sent, since every rank and
// every backend derives them from (n, k, seed, Key) — see RandomKIndices.
//
// Values are sent unscaled (not multiplied by n/k): the estimate is biased
// toward zero, and error feedback carries what was dropped into later steps,
// which the n/k scaling would instead inflate into a large-variance residual.
//
// A NaN or ±Inf anywhere in the input, selected or not, is a
// *NonFiniteError for the lowest such index, so a non-finite gradient never
// passes silently into error-feedback memory. That check is the one pass
// over the input; under error feedback it also writes the sum e + g the
// picks read (encodeSum), so that a step makes one pass where it made two
// (a sum pass, then the check). Decoding rejects non-finite values in the
// body and sets dst to zero except at the indices, or adds the values
// there.
type randomkCodec struct {
	ratio float64
	seedV uint64
}

// randomkGrain is how many strata a parallel chunk holds at least, and how
// many a chunk handles at a time: it scans or clears their elements, then
// gathers or scatters their picks while those are in cache.
const randomkGrain = 1024

// forStrata calls fn on consecutive blocks [j0, j1) of at most randomkGrain
// of k strata, blocks of one chunk in order, chunks over run.
func forStrata(k int, run runner, fn func(j0, j1 int)) {
	run(k, randomkGrain, func(lo, hi int) {
		for j := lo; j < hi; j += randomkGrain {
			fn(j, min(j+randomkGrain, hi))
		}
	})
}

func (r randomkCodec) id() Codec    { return CodecRandomK }
func (r randomkCodec) seed() uint64 { return r.seedV }

func (r randomkCodec) params(n int) (a, b uint32) { return uint32(sparseK(r.ratio, n)), 0 }

func (r randomkCodec) bodyLen(n int) int { return 4 * sparseK(r.ratio, n) }

func (r randomkCodec) encode(body []byte, src []float32, key Key, run runner) error {
	return r.encodeSum(body, nil, nil, src, key, run)
}

// encodeSum implements sparseCodec: the scan for non-finite values, the
// one pass over all of the input, sets the sum as it reads it
// (firstNonFinite). That pass stays, since it is what writes the sum,
// which error feedback keeps as the residual; the picks then read k
// elements of it from cache.
func (r randomkCodec) encodeSum(body []byte, e, g, sum []float32, key Key, run runner) error {
	n := len(sum)
	k := sparseK(r.ratio, n)
	st := NewRandomStream(r.seedV, key, DomainRandomK)
	var fe firstError
	forStrata(k, run, func(j0, j1 int) {
		lo, hi := stratumStart(j0, n, k), stratumStart(j1, n, k)
		if i := firstNonFinite(sum[lo:hi], addends{e, g}.from(lo)); i >= 0 {
			fe.set(j0, &NonFiniteError{Index: lo + i, Value: sum[lo+i]})
			return
		}
		for j := j0; j < j1; j++ {
			binary.LittleEndian.PutUint32(body[4*j:], math.Float32bits(sum[randomkIndex(st, j, n, k)]))
		}
	})
	return fe.err
}

// encodeResidual is encode that also sets res = src − D: src itself, but
// +0 at the k drawn indices, where D holds src's own values (see
// topkCodec.encodeResidual).
func (r randomkCodec) encodeResidual(body []byte, src []float32, key Key, res []float32, run runner) error {
	if err := r.encode(body, src, key, run); err != nil {
		return err
	}
	copyBlocks(res, src, run)
	n, k := len(src), len(body)/4
	st := NewRandomStream(r.seedV, key, DomainRandomK)
	forStrata(k, run, func(j0, j1 int) {
		for j := j0; j < j1; j++ {
			res[randomkIndex(st, j, n, k)] = 0
		}
	})
	return nil
}

func (r randomkCodec) selected(sel []uint32, body []byte, n int, key Key) []uint32 {
	sel, _ = RandomKIndices(sel, n, len(body)/4, r.seedV, key) // n and k were checked by encode
	return sel
}

func (r randomkCodec) check(body []byte, _ *header) error {
	for i := 0; i+4 <= len(body); i += 4 {
		if binary.LittleEndian.Uint32(body[i:])&nonFiniteKey == nonFiniteKey {
			return &CorruptInputError{Offset: int64(i), Reason: "non-finite random-k value"}
		}
	}
	return nil
}

func (r randomkCodec) decode(dst []float32, body []byte, h *header, add bool, run runner) {
	n, k := len(dst), len(body)/4
	st := NewRandomStream(h.seed, h.key, DomainRandomK)
	forStrata(k, run, func(j0, j1 int) {
		if !add {
			clear(dst[stratumStart(j0, n, k):stratumStart(j1, n, k)])
		}
		for j := j0; j < j1; j++ {
			p := randomkIndex(st, j, n, k)
			v := math.Float32frombits(binary.LittleEndian.Uint32(body[4*j:]))
			if add {
				v += dst[p]
			}
			dst[p] = v
		}
	})
}

// stratumStart returns ⌊j·n/k⌋, the first index of stratum j (64-bit math).
func stratumStart(j, n, k int) int { return int(uint64(j) * uint64(n) / uint64(k)) }

// randomkIndex returns the index random-k picks in stratum j of n elements
// cut into k strata; st is the DomainRandomK stream of (seed, key).
func randomkIndex(st RandomStream, j, n, k int) int {
	lo := stratumStart(j, n, k)
	width := uint64(stratumStart(j+1, n, k) - lo)
	return lo + int((st.Draw(uint64(j))>>32)*width>>32)
}

// RandomKIndices appends to dst the k indices random-k selects out of n
// elements under (seed, key) and returns the extended slice. They ascend
// strictly, one per stratum: stratum j ∈ [0, k) covers [⌊j·n/k⌋,
// ⌊(j+1)·n/k⌋) and contributes
//
//	lo_j + ((draw_j >> 32) · width_j) >> 32
//
// where lo_j and width_j are the stratum's start and length and draw_j is
// NewRandomStream(seed, key, DomainRandomK).Draw(j). Every rank computes the same
// indices for the same arguments, which is what lets a shared-index
// exchange all-reduce the values alone. Unless 0 ≤ k ≤ n ≤ MaxElements it
// returns dst unchanged and a *SizeError.
func RandomKIndices(dst []uint32, n, k int, seed uint64, key Key) ([]uint32, error) {
	switch {
	case n < 0 || int64(n) > MaxElements:
		return dst, &SizeError{What: "random-k element count", Got: int64(n), Want: MaxElements}
	case k < 0 || k > n:
		return dst, &SizeError{What: "random-k index count", Got: int64(k), Want: int64(n)}
	}
	st := NewRandomStream(seed, key, DomainRandomK)
	for j := range k {
		dst = append(dst, uint32(randomkIndex(st, j, n, k)))
	}
	return dst, nil
}
