package compress

import (
	"encoding/binary"
	"fmt"
	"math"
	"sort"
	"sync"
)

// Average divides dst by n (n ≥ 1) in float32, dst[i] = dst[i] /
// float32(n), and returns the index of its first non-finite element, or
// −1. For n a power of two it multiplies by 1/n instead, which rounds the
// same real number once and so gives the same bits, faster.
func Average(dst []float32, n int) int {
	// One pass: the largest magnitude bits seen tell whether a second
	// pass must look for the first non-finite element.
	var top uint32
	d := float32(n)
	switch {
	case n == 1:
		top = nonFiniteBits
	case n&(n-1) == 0:
		inv := 1 / d
		for i, v := range dst {
			v *= inv
			dst[i] = v
			top = max(top, math.Float32bits(v)&0x7fffffff)
		}
	default:
		for i, v := range dst {
			v /= d
			dst[i] = v
			top = max(top, math.Float32bits(v)&0x7fffffff)
		}
	}
	if top >= nonFiniteBits {
		for i, v := range dst {
			if math.Float32bits(v)&nonFiniteBits == nonFiniteBits {
				return i
			}
		}
	}
	return -1
}

// nonFiniteBits is the float32 exponent field: all ones in Inf and NaN.
const nonFiniteBits = 0x7f800000

// PayloadError is the failure of one payload among several
// (DecompressAverage): Index is its position in the list.
type PayloadError struct {
	Index int
	Err   error
}

func (e *PayloadError) Error() string { return fmt.Sprintf("compress: payload %d: %v", e.Index, e.Err) }

// Unwrap returns the payload's own error.
func (e *PayloadError) Unwrap() error { return e.Err }

// DecompressAverage sets dst to the average of what the payloads decode
// to, as clearing dst, calling c.DecompressAdd with each payload in turn
// and then Average(dst, len(payloads)) would, bit for bit, and returns
// Average's index of the first non-finite element (or −1). It is the
// rank average of an all-gather of payloads. A failure of payload q is a
// *PayloadError with Index q. With a compressor Parse returned, every
// payload is validated before dst is written, so on error dst is
// untouched, and top-k payloads are summed and averaged block by block,
// so that their scattered additions find dst in cache: one pass over dst
// instead of a clear, N scatters that miss the cache and an average. With
// another Compressor dst is unspecified on error. len(payloads) ≥ 1.
func DecompressAverage(c Compressor, dst []float32, payloads [][]byte) (int, error) {
	if len(payloads) == 0 {
		return -1, &SizeError{What: "payload count", Got: 0, Want: 1}
	}
	if a, ok := c.(interface {
		decompressAverage(dst []float32, payloads [][]byte) (int, error)
	}); ok {
		return a.decompressAverage(dst, payloads)
	}
	for q, p := range payloads {
		decode := c.DecompressAdd
		if q == 0 {
			decode = c.Decompress
		}
		if err := decode(dst, p); err != nil {
			return -1, &PayloadError{Index: q, Err: err}
		}
	}
	return Average(dst, len(payloads)), nil
}

// decompressAverage is DecompressAverage for a compressor of this package.
func (c *compressor) decompressAverage(dst []float32, payloads [][]byte) (int, error) {
	bodies := make([][]byte, len(payloads))
	heads := make([]*header, len(payloads))
	for q, p := range payloads {
		h, body, err := c.open(p, len(dst))
		if err != nil {
			return -1, &PayloadError{Index: q, Err: err}
		}
		heads[q], bodies[q] = h, body
	}
	run := c.runner(len(dst))
	switch impl := c.impl.(type) {
	case topkCodec:
		return impl.average(dst, bodies, run), nil
	case rangeDecoder:
		return averageRanges(impl, dst, bodies, run), nil
	}
	for q, body := range bodies {
		c.impl.decode(dst, body, heads[q], q > 0, run)
	}
	return Average(dst, len(payloads)), nil
}

// averageBlocks is the block loop of a DecompressAverage that works block
// by block: it splits dst into ranges that start at multiples of grain, in
// parallel by run; for each range fill returns the function that sets a
// block dst[b:e] to the sum of the n bodies (blocks of at least
// decodeBlock elements, a multiple of grain), which averageBlocks then
// averages while it is in cache. It returns Average's index of the first
// non-finite element of dst, or −1.
func averageBlocks(dst []float32, n, grain int, run runner, fill func(lo, hi int) func(b, e int)) int {
	block := (decodeBlock + grain - 1) / grain * grain
	var mu sync.Mutex // guards first: the lowest range's first non-finite element
	first := -1
	run(len(dst), grain, func(lo, hi int) {
		sum := fill(lo, hi)
		found := -1
		for b := lo; b < hi; b += block {
			e := min(b+block, hi)
			sum(b, e)
			if j := Average(dst[b:e], n); j >= 0 && found < 0 {
				found = b + j
			}
		}
		if found >= 0 {
			mu.Lock()
			if first < 0 || found < first {
				first = found
			}
			mu.Unlock()
		}
	})
	return first
}

// averageRanges is DecompressAverage of validated bodies of a
// rangeDecoder: each block decoded from the first body, the others added,
// in body order.
func averageRanges(r rangeDecoder, dst []float32, bodies [][]byte, run runner) int {
	return averageBlocks(dst, len(bodies), r.decodeGrain(), run, func(int, int) func(b, e int) {
		return func(b, e int) {
			for q, body := range bodies {
				r.decodeRange(dst, body, b, e, q > 0)
			}
		}
	})
}

// average is DecompressAverage of validated top-k bodies: for each block
// of dst it clears the block and adds every body's values that fall in
// it, in body order.
func (t topkCodec) average(dst []float32, bodies [][]byte, run runner) int {
	return averageBlocks(dst, len(bodies), decodeBlock, run, func(lo, _ int) func(b, e int) {
		next := make([]int, len(bodies)) // per body, its first index at or above the block
		for q, body := range bodies {
			k := len(body) / 8
			next[q] = sort.Search(k, func(i int) bool { return binary.LittleEndian.Uint32(body[4*i:]) >= uint32(lo) })
		}
		return func(b, e int) {
			clear(dst[b:e])
			for q, body := range bodies {
				k := len(body) / 8
				idx, vals := body[:4*k], body[4*k:]
				i := next[q]
				for ; i < k; i++ {
					p := int(binary.LittleEndian.Uint32(idx[4*i:]))
					if p >= e {
						break
					}
					dst[p] += math.Float32frombits(binary.LittleEndian.Uint32(vals[4*i:]))
				}
				next[q] = i
			}
		}
	})
}
