package compress

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"sort"
	"strconv"
)

func init() {
	registerCodec(CodecTopK, codecDef{
		uses:  fieldRatio | fieldSampled | fieldChunk | fieldBits | fieldNearest | fieldSeed,
		parse: parseTopK,
		check: checkTopK,
		build: func(s Spec) codec {
			if s.Chunk != 0 {
				return newChunkTopK(s)
			}
			return topkCodec{ratio: s.Ratio, sampled: s.Sampled}
		},
	})
}

// parseTopK reads top-k's arguments: the ratio, "sampled", and the
// options chunk, bits, and, with bits, round and seed.
func parseTopK(a *specArgs, s *Spec) (err error) {
	if s.Ratio, err = a.ratio(); err != nil {
		return err
	}
	s.Sampled = a.flag("sampled")
	chunk, err := a.intOption("chunk", 0, MinTopKChunk, MaxTopKChunk)
	if err != nil {
		return err
	}
	s.Chunk = int(chunk)
	bits, err := a.enumOption("bits", "32", "2", "4", "8")
	if err != nil {
		return err
	}
	if bits != "32" {
		s.Bits, _ = strconv.Atoi(bits)
	}
	if s.Bits == 0 {
		for _, name := range []string{"round", "seed"} {
			if _, given := a.options[name]; given {
				return fmt.Errorf("option %s applies only to the quantized values of bits=2|4|8, and the kept values are float32 here", name)
			}
		}
		return nil
	}
	round, err := a.enumOption("round", "stochastic", "nearest")
	if err != nil {
		return err
	}
	s.Nearest = round == "nearest"
	s.Seed, err = a.uintOption("seed")
	return err
}

// checkTopK reports why top-k's fields do not go together, or nil.
func checkTopK(s Spec) error {
	switch {
	case s.Chunk != 0 && (s.Chunk < MinTopKChunk || s.Chunk > MaxTopKChunk):
		return fmt.Errorf("chunk %d is not in [%d, %d] (or 0: one selection over the whole input)", s.Chunk, MinTopKChunk, MaxTopKChunk)
	case s.Bits != 0 && s.Bits != 2 && s.Bits != 4 && s.Bits != 8:
		return fmt.Errorf("bits %d is not 2, 4 or 8 (or 0: float32 values)", s.Bits)
	case s.Chunk != 0 && s.Sampled:
		return errors.New("sampled does not apply with chunk=C: each chunk's selection is exact already")
	case s.Bits != 0 && s.Chunk == 0:
		return fmt.Errorf("bits=%d needs chunk=C: the kept values are scaled chunk by chunk", s.Bits)
	case s.Bits == 0 && s.Nearest:
		return errors.New("round=nearest applies only to the quantized values of bits=2|4|8")
	case s.Bits == 0 && s.Seed != 0:
		return errors.New("a seed applies only to the stochastic rounding of bits=2|4|8")
	}
	return nil
}

// sparseK returns how many elements a sparsifying codec keeps out of n:
// 0 for n = 0, else round(ratio·n) clamped to [1, n].
func sparseK(ratio float64, n int) int {
	if n == 0 {
		return 0
	}
	return min(max(int(math.Round(ratio*float64(n))), 1), n)
}

// topkCodec keeps the k = sparseK(ratio, n) elements of largest magnitude
// (spec topk:RATIO[:sampled]; with chunk=C it is chunkTopK). Header:
// parameter A = k, parameter B = 0, seed 0. Body: k uint32 indices, strictly ascending, then the k float32
// values at those indices, all little-endian (8k bytes).
//
// The reference semantics, which every backend must reproduce bit for bit:
// with key(x) = bits(x) & 0x7fffffff (for finite x it orders like |x|), the
// selected set is every element whose key is above T, the k-th largest key,
// plus the lowest-index elements whose key equals T, as many as make k. The
// set is thus a function of the input alone: equal magnitudes break toward
// the lower index, and -0 and +0 tie. A NaN or ±Inf anywhere in the input is
// a *NonFiniteError for the lowest such index.
//
// The exact form is a radix select (see topk_select.go), one pass over
// memory on typical gradients (two before issue 10). The sampled form
// (":sampled") estimates the threshold from a fixed sample, collects the
// elements above it in one pass and runs the exact selection on them; it
// falls back to the exact path when the estimate is off. Its recall (the
// fraction of the exact top-k set it returns) is therefore 1: both forms
// write identical bytes, and either decoder reads both. Under error
// feedback either form's one pass also writes the sum e + g it selects
// from (encodeSum), so that a step makes one pass where it made two.
//
// Decoding validates the indices (strictly ascending, < n) and the values
// (finite) and sets dst to zero except at the indices, or adds the values
// there. With a lossless stage the index section is delta-coded first (see
// forward).
type topkCodec struct {
	ratio   float64
	sampled bool
}

func (t topkCodec) id() Codec    { return CodecTopK }
func (t topkCodec) seed() uint64 { return 0 }

func (t topkCodec) params(n int) (a, b uint32) { return uint32(sparseK(t.ratio, n)), 0 }

func (t topkCodec) bodyLen(n int) int { return 8 * sparseK(t.ratio, n) }

func (t topkCodec) encode(body []byte, src []float32, key Key, run runner) error {
	return t.encodeSum(body, nil, nil, src, key, run)
}

// encodeSum implements sparseCodec: the first histogram level (or the
// sampled form's collection) sets the sum as it reads it.
func (t topkCodec) encodeSum(body []byte, e, g, sum []float32, _ Key, run runner) error {
	k := sparseK(t.ratio, len(sum))
	if k == 0 {
		return nil
	}
	return selectTopK(body, e, g, sum, k, t.sampled, run)
}

// encodeResidual is encode that also sets res = src − D: src itself, but
// +0 at the k selected indices, where D holds src's own values (s − s is
// +0 for finite s, and s − (+0) is s, −0 included).
func (t topkCodec) encodeResidual(body []byte, src []float32, key Key, res []float32, run runner) error {
	if err := t.encode(body, src, key, run); err != nil {
		return err
	}
	copyBlocks(res, src, run)
	idx := body[:len(body)/2]
	for i := 0; i < len(idx); i += 4 {
		res[binary.LittleEndian.Uint32(idx[i:])] = 0
	}
	return nil
}

func (t topkCodec) selected(sel []uint32, body []byte, _ int, _ Key) []uint32 {
	idx := body[:len(body)/2]
	for i := 0; i < len(idx); i += 4 {
		sel = append(sel, binary.LittleEndian.Uint32(idx[i:]))
	}
	return sel
}

// copyBlocks copies src to dst (of equal length) over run.
func copyBlocks(dst, src []float32, run runner) {
	run(len(src), decodeBlock, func(lo, hi int) { copy(dst[lo:hi], src[lo:hi]) })
}

func (t topkCodec) check(body []byte, h *header) error {
	k := len(body) / 8
	prev := uint32(0)
	for i := range k {
		p := binary.LittleEndian.Uint32(body[4*i:])
		switch {
		case uint64(p) >= h.n:
			return &CorruptInputError{Offset: int64(4 * i), Reason: fmt.Sprintf("top-k index %d is out of range for %d elements", p, h.n)}
		case i > 0 && p <= prev:
			return &CorruptInputError{Offset: int64(4 * i), Reason: fmt.Sprintf("top-k index %d does not ascend from %d", p, prev)}
		}
		prev = p
	}
	vals := body[4*k:]
	for i := range k {
		if binary.LittleEndian.Uint32(vals[4*i:])&nonFiniteKey == nonFiniteKey {
			return &CorruptInputError{Offset: int64(4*k + 4*i), Reason: "non-finite top-k value"}
		}
	}
	return nil
}

// decodeBlock is how many elements of dst a decode clears and scatters
// into before moving on, so the scatter finds them in cache.
const decodeBlock = 1 << 14

func (t topkCodec) decode(dst []float32, body []byte, _ *header, add bool, run runner) {
	k := len(body) / 8
	idx, vals := body[:4*k], body[4*k:]
	run(len(dst), decodeBlock, func(lo, hi int) {
		i := sort.Search(k, func(i int) bool { return binary.LittleEndian.Uint32(idx[4*i:]) >= uint32(lo) })
		for b := lo; b < hi; b += decodeBlock {
			e := min(b+decodeBlock, hi)
			if !add {
				clear(dst[b:e])
			}
			for ; i < k; i++ {
				p := int(binary.LittleEndian.Uint32(idx[4*i:]))
				if p >= e {
					break
				}
				v := math.Float32frombits(binary.LittleEndian.Uint32(vals[4*i:]))
				if add {
					v += dst[p]
				}
				dst[p] = v
			}
		}
	})
}

// forward delta-codes the index section in place, idx[i] − idx[i−1]
// (mod 2^32, idx[−1] = 0): ascending indices become small gaps that the
// lossless stage packs well.
func (t topkCodec) forward(body []byte) {
	idx := body[:len(body)/8*4]
	prev := uint32(0)
	for i := 0; i < len(idx); i += 4 {
		p := binary.LittleEndian.Uint32(idx[i:])
		binary.LittleEndian.PutUint32(idx[i:], p-prev)
		prev = p
	}
}

// inverse undoes forward by a prefix sum (mod 2^32). It runs on untrusted
// bytes before check, which rejects what wrapped around.
func (t topkCodec) inverse(body []byte) {
	idx := body[:len(body)/8*4]
	sum := uint32(0)
	for i := 0; i < len(idx); i += 4 {
		sum += binary.LittleEndian.Uint32(idx[i:])
		binary.LittleEndian.PutUint32(idx[i:], sum)
	}
}
