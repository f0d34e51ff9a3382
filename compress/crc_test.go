package compress

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

// TestCRCCombine: the checksum of A‖B from those of A and B is
// crc32.Checksum of the concatenation, for splits anywhere (empty parts
// included) of random lengths.
func TestCRCCombine(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, n := range []int{0, 1, 2, 7, 64, 1000, 65537} {
		p := make([]byte, n)
		for i := range p {
			p[i] = byte(r.Uint32())
		}
		want := crc32.Checksum(p, castagnoli)
		for _, cut := range []int{0, n / 3, n / 2, n - 1, n} {
			cut = max(cut, 0)
			var a, b crcSpan
			a.add(p[:cut])
			b.add(p[cut:])
			if got := a.then(b); got.crc != want || got.n != n {
				t.Errorf("n=%d cut=%d: combined %#x (%d bytes), want %#x", n, cut, got.crc, got.n, want)
			}
		}
	}
}

// TestBodySumMatchesChecksum: the bucketed and the dense codecs checksum
// their body chunk by chunk while they encode; the trailer must be
// crc32.Checksum of the frame (stale bytes in dst beyond its length
// included), for lengths around the checksum chunk, any bucket size and
// worker count.
func TestBodySumMatchesChecksum(t *testing.T) {
	x := testDistributions(3*8*sumChunk+5, 9)["student2"] // three chunks of sign
	var specs []string
	for _, codec := range []string{"int8", "int4", "int2", "sign"} {
		for _, bucket := range []int{1, 3, 512, 3000} {
			specs = append(specs, fmt.Sprintf("%s:bucket=%d", codec, bucket))
		}
	}
	for _, spec := range append(specs, "none", "fp16", "bf16") {
		for _, n := range []int{0, 1, 7, sumChunk - 1, sumChunk, sumChunk + 1, 8*sumChunk + 1, len(x)} {
			for _, w := range []int{1, 3} {
				c := mustParse(t, spec, WithWorkers(w), WithMinParallel(1))
				dst := bytes.Repeat([]byte{0xff}, 1+c.MaxEncodedLen(n))[:1] // stale bits past len
				p, err := c.Compress(dst, x[:n], Key{Bucket: 1, Step: 2})
				if err != nil {
					t.Fatal(err)
				}
				end := len(p) - TrailerLen
				if got, want := binary.LittleEndian.Uint32(p[end:]), crc32.Checksum(p[1:end], castagnoli); got != want {
					t.Fatalf("%s n=%d workers=%d: trailer %#x, want %#x", spec, n, w, got, want)
				}
			}
		}
	}
}

// TestChecksum: checksum and checksumGeneric, which read ahead, are
// crc32.Checksum, for lengths around the latter's block.
func TestChecksum(t *testing.T) {
	p := make([]byte, 3*checksumBlock+65)
	for i := range p {
		p[i] = byte(i*131 + i>>8)
	}
	for _, n := range []int{0, 1, 63, 64, checksumBlock - 1, checksumBlock, checksumBlock + 1, 2 * checksumBlock, len(p)} {
		want := crc32.Checksum(p[:n], castagnoli)
		if got := checksum(p[:n]); got != want {
			t.Errorf("checksum of %d bytes = %#x, want %#x", n, got, want)
		}
		if got := checksumGeneric(p[:n]); got != want {
			t.Errorf("checksumGeneric of %d bytes = %#x, want %#x", n, got, want)
		}
	}
}

// TestChecksumSplit: checksum is crc32.Checksum around the length from
// which the AVX2 build reads two streams, and for lengths that do not halve
// into whole 128-byte steps.
func TestChecksumSplit(t *testing.T) {
	p := make([]byte, 1<<21+300)
	for i := range p {
		p[i] = byte(i*131 + i>>8 + i>>17)
	}
	for _, n := range []int{1<<20 - 1, 1 << 20, 1<<20 + 1, 1<<20 + 255, 1<<21 + 300} {
		if got, want := checksum(p[:n]), crc32.Checksum(p[:n], castagnoli); got != want {
			t.Errorf("checksum of %d bytes = %#x, want %#x", n, got, want)
		}
	}
}

// TestCRCUpdate: crcUpdate (on amd64 with VPCLMULQDQ: blocks of 7936
// bytes folded and CRC32-instructed at once, then 128-byte fold steps) is
// crc32.Update for every length up to a few fold steps, lengths around
// one and more blocks, odd alignments, and initial values 0, all ones and
// random.
func TestCRCUpdate(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	p := make([]byte, 4*8192+8)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	lengths := []int{7935, 7936, 7937, 7936 + 128, 8192, 2*7936 - 1, 2 * 7936, 2*7936 + 255, 4 * 8192}
	for n := 0; n <= 1100; n++ {
		lengths = append(lengths, n)
	}
	for _, n := range lengths {
		for _, crc := range []uint32{0, ^uint32(0), r.Uint32()} {
			q := p[n%8 : n%8+n]
			if got, want := crcUpdate(crc, q), crc32.Update(crc, castagnoli, q); got != want {
				t.Fatalf("crcUpdate(%#x, %d bytes) = %#x, want %#x", crc, n, got, want)
			}
		}
	}
}
