package compress

import (
	"fmt"
	"math"
)

// Helpers shared by the bucketed codecs (int8/int4/int2 in quant.go, sign in
// sign.go): the bucket option, bit-packed code access and the checks of
// floats and padding.

const (
	defaultQuantBucket = 512     // elements per quantization bucket
	maxQuantBucket     = 1 << 24 // largest bucket=N a spec may ask for
	expMask            = 0x7f800000
)

// bucketOption consumes the bucket=N option: Spec.Bucket, 0 for the
// default.
func bucketOption(a *specArgs) (int, error) {
	b, err := a.intOption("bucket", defaultQuantBucket, 1, maxQuantBucket)
	if b == defaultQuantBucket {
		b = 0
	}
	return int(b), err
}

// bucketBody is the body layout of the bucketed codecs: nb per-bucket
// headers of hdrSize bytes each (hdr), then the codes of every element at
// bits bits each, packed LSB-first (codes).
type bucketBody struct {
	hdr, codes []byte
	bucket     int  // B, elements per bucket
	hdrSize    int  // bytes per bucket header
	bits       uint // bits per code: 8, 4, 2 or 1
}

// sumChunk is the code bytes after which encode checksums what it has
// written (rounded up to whole groups of 8 buckets): few enough to be in
// L1 still, enough that the calls to the CRC cost little.
const sumChunk = 8192

// encode runs enc over the n elements in chunks [from, to) whose from is a
// multiple of 8·B (a bucket and a byte boundary), in parallel by run, and
// returns the error of the lowest failing chunk. It clears the padding
// bits after the last code. With bs non-nil it checksums each chunk's
// headers and codes into bs right after enc wrote them.
func (l bucketBody) encode(n int, run runner, bs *bodySum, enc func(from, to int) error) error {
	grain := 8 * l.bucket
	step := (sumChunk*8/int(l.bits) + grain - 1) / grain * grain
	var fe firstError
	run(n, grain, func(from, to int) {
		var hs, cs crcSpan
		for a := from; a < to; a += step {
			b := min(a+step, to)
			if err := enc(a, b); err != nil {
				fe.set(a, err)
				return
			}
			if b == n {
				clearPadding(l.codes, n*int(l.bits))
			}
			if bs != nil {
				hs.add(l.hdr[l.hdrSize*(a/l.bucket) : l.hdrSize*numBuckets(b, l.bucket)])
				cs.add(l.codes[a*int(l.bits)/8 : packedLen(b, l.bits)])
			}
		}
		if bs != nil {
			bs.put(from, hs, cs)
		}
	})
	return fe.err
}

// numBuckets returns how many buckets of b elements cover n elements.
func numBuckets(n, b int) int { return (n + b - 1) / b }

// packedLen returns the bytes that n codes of bits bits each occupy.
func packedLen(n int, bits uint) int { return (n*int(bits) + 7) / 8 }

// groupSpan splits the n elements from index s into a head [0, head), the
// whole 8-aligned groups [head, end) and a tail [end, n). Head and tail
// share their code bytes with the neighbouring bucket; the groups own
// theirs, which is where the vector kernels run.
func groupSpan(s, n int) (head, end int) {
	head = min((8-s%8)%8, n)
	return head, head + (n-head)&^7
}

// putCode stores code c of element i into the LSB-first bit stream codes,
// leaving the other bits of its byte as they are. bits divides 8.
func putCode(codes []byte, i int, bits uint, c uint64) {
	off := uint(i) * bits
	m := byte(1<<bits-1) << (off & 7)
	p := &codes[off>>3]
	*p = *p&^m | byte(c)<<(off&7)&m
}

// getCode returns the code of element i of the LSB-first bit stream codes.
func getCode(codes []byte, i int, bits uint) uint8 {
	off := uint(i) * bits
	return codes[off>>3] >> (off & 7) & byte(1<<bits-1)
}

// clearPadding zeroes the bits of the last byte of codes that lie past the
// first nbits bits.
func clearPadding(codes []byte, nbits int) {
	if r := nbits & 7; r != 0 {
		codes[nbits>>3] &= byte(1)<<r - 1
	}
}

// checkPadding reports a *CorruptInputError if a bit of codes past the first
// nbits is set; offset is the position of codes in the body.
func checkPadding(codes []byte, nbits, offset int) error {
	if r := nbits & 7; r != 0 && codes[nbits>>3]>>r != 0 {
		return &CorruptInputError{Offset: int64(offset + nbits>>3), Reason: fmt.Sprintf("nonzero padding bits after the last of %d code bits", nbits)}
	}
	return nil
}

// nonFinite returns the error for the first NaN or ±Inf in x, whose first
// element has index base in the input, or nil if every element is finite.
func nonFinite(x []float32, base int) error {
	for i, v := range x {
		if math.Float32bits(v)&expMask == expMask {
			return &NonFiniteError{Index: base + i, Value: v}
		}
	}
	return nil
}

// addKernel sets dst[i] = a[i] + b[i] (float32) for the length of dst; a
// and b are at least as long, and dst may be a. Error feedback's e + g.
var addKernel = addGeneric

// addGeneric adds 8 elements per iteration, written out, so that the loop
// overhead and the bounds checks are paid once per 8.
func addGeneric(dst, a, b []float32) {
	a, b = a[:len(dst)], b[:len(dst)]
	i := 0
	for ; i+8 <= len(dst); i += 8 {
		d, x, y := (*[8]float32)(dst[i:i+8]), (*[8]float32)(a[i:i+8]), (*[8]float32)(b[i:i+8])
		d[0] = x[0] + y[0]
		d[1] = x[1] + y[1]
		d[2] = x[2] + y[2]
		d[3] = x[3] + y[3]
		d[4] = x[4] + y[4]
		d[5] = x[5] + y[5]
		d[6] = x[6] + y[6]
		d[7] = x[7] + y[7]
	}
	for ; i < len(dst); i++ {
		dst[i] = a[i] + b[i]
	}
}

// subKernel sets res[i] = src[i] − res[i] (float32) for the length of
// res; src is at least as long. Error feedback's residual s − D(c).
var subKernel = subGeneric

func subGeneric(res, src []float32) {
	src = src[:len(res)]
	for i, v := range src {
		res[i] = v - res[i]
	}
}
