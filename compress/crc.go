package compress

import (
	"hash/crc32"
	"slices"
	"sync"
)

// The payload checksum (CRC32C) computed piece by piece: a codec that writes
// its body in chunks checksums each chunk while it is in cache and the
// pieces combine into the CRC32C of the whole, the value crc32.Checksum
// returns for the concatenation; the wire format does not change.

// castagnoliPoly is the Castagnoli polynomial, bit-reversed.
const castagnoliPoly = 0x82f63b78

// mulModP returns a·b modulo the Castagnoli polynomial, both operands and
// the result being bit-reversed polynomials over GF(2) (bit 31 is x^0).
func mulModP(a, b uint32) uint32 {
	var p uint32
	for m := uint32(1) << 31; m != 0; m >>= 1 {
		if a&m != 0 {
			p ^= b
		}
		b = b>>1 ^ castagnoliPoly&-(b&1)
	}
	return p
}

// x2k[k] is x^(2^k) modulo the polynomial: x2k[0] = x, x2k[k+1] = x2k[k]².
var x2k = func() (t [64]uint32) {
	t[0] = 1 << 30
	for k := 1; k < len(t); k++ {
		t[k] = mulModP(t[k-1], t[k-1])
	}
	return t
}()

// crcCombine returns the CRC32C of A‖B given crcA of A, crcB of B and n =
// len(B): crcA shifted past n zero bytes (multiplied by x^(8n)), xored with
// crcB. (zlib's crc32_combine; the pre- and post-conditioning cancel.)
func crcCombine(crcA, crcB uint32, n int) uint32 {
	return mulModP(xPow(8*n), crcA) ^ crcB
}

// xPow returns x^e modulo the polynomial (e ≥ 0).
func xPow(e int) uint32 {
	p := uint32(1) << 31 // x^0
	for k := 0; e != 0; k, e = k+1, e>>1 {
		if e&1 != 0 {
			p = mulModP(x2k[k], p)
		}
	}
	return p
}

// crcUpdate returns crc32.Update(crc, castagnoli, p), the CRC32C of p
// continuing crc. On amd64 with VPCLMULQDQ it runs a carry-less-multiply
// fold and the CRC32 instruction on parts of p at once (simd_amd64.go).
var crcUpdate = crcUpdateGeneric

func crcUpdateGeneric(crc uint32, p []byte) uint32 { return crc32.Update(crc, castagnoli, p) }

// crcSpan is the CRC32C of a contiguous run of bytes and its length.
type crcSpan struct {
	crc uint32
	n   int
}

// add extends s by p, which follows it.
func (s *crcSpan) add(p []byte) {
	s.crc = crcUpdate(s.crc, p)
	s.n += len(p)
}

// then returns the span of s followed by t.
func (s crcSpan) then(t crcSpan) crcSpan {
	return crcSpan{crcCombine(s.crc, t.crc, t.n), s.n + t.n}
}

// bodySum collects the CRC32C of a body that a codec writes as regions
// (quantizers: bucket headers, then codes), each region chunk by chunk,
// the chunks of a region possibly from several goroutines: a chunk is a
// crcSpan per region, keyed by the index of its first element.
type bodySum struct {
	mu     sync.Mutex
	chunks map[int][]crcSpan
}

// put records the spans of the chunk that starts at element from.
func (b *bodySum) put(from int, spans ...crcSpan) {
	b.mu.Lock()
	if b.chunks == nil {
		b.chunks = map[int][]crcSpan{}
	}
	b.chunks[from] = spans
	b.mu.Unlock()
}

// sum returns the CRC32C of the body: region by region, the chunks of each
// in increasing order of their first element.
func (b *bodySum) sum() crcSpan {
	froms := make([]int, 0, len(b.chunks))
	regions := 0
	for from, spans := range b.chunks {
		froms = append(froms, from)
		regions = len(spans)
	}
	slices.Sort(froms)
	var all crcSpan
	for r := range regions {
		for _, from := range froms {
			all = all.then(b.chunks[from][r])
		}
	}
	return all
}

// checksum returns crc32.Checksum(p, castagnoli) of a p that is likely not
// in cache (a decoder's first pass over a payload). On amd64 with
// VPCLMULQDQ it reads two streams and prefetches (simd_amd64.go).
var checksum = checksumGeneric

// checksumBlock is how far checksumGeneric reads ahead of the CRC.
const checksumBlock = 4096

// checksumGeneric touches one byte of every cache line of the next block
// before it checksums the current one, so that memory serves those lines
// while the CRC instructions run: about 1.3× the speed of one
// crc32.Checksum call on a payload not in cache (measured, 64 MiB on the
// AVX2 EPYC).
func checksumGeneric(p []byte) uint32 {
	var crc uint32
	for len(p) > 0 {
		blk := p[:min(checksumBlock, len(p))]
		next := p[len(blk):]
		next = next[:min(checksumBlock, len(next))]
		var touched byte
		for i := 0; i < len(next); i += 64 {
			touched |= next[i]
		}
		keep(touched)
		crc = crc32.Update(crc, castagnoli, blk)
		p = p[len(blk):]
	}
	return crc
}

// keep is a call the compiler cannot drop, so that checksumGeneric's reads
// ahead stay in the program.
//
//go:noinline
func keep(byte) {}
