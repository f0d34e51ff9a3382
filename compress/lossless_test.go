package compress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"math"
	"math/rand/v2"
	"runtime"
	"testing"
)

// Bodies for the lossless stage, as float32 gradients for the none codec.
func compressibleInput(n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(i%7) - 3
	}
	return x
}

// incompressibleInput returns finite float32 values with uniformly random
// bits: no byte of their encoding is predictable.
func incompressibleInput(n int, seed uint64) []float32 {
	r := rand.New(rand.NewPCG(seed, 1))
	x := make([]float32, n)
	for i := range x {
		for {
			u := r.Uint32()
			if u&0x7f800000 != 0x7f800000 {
				x[i] = math.Float32frombits(u)
				break
			}
		}
	}
	return x
}

// TestLosslessRoundTrip compresses compressible, incompressible and mixed
// bodies through each stage and checks the flag is set exactly when the
// stored body is shorter, and that decoding restores every bit.
func TestLosslessRoundTrip(t *testing.T) {
	const block = huff0Block / 4 // float32 elements per huff0 block
	mixed := append(append(compressibleInput(block), incompressibleInput(block, 3)...), make([]float32, block+100)...)
	cases := []struct {
		name  string
		x     []float32
		saves bool
	}{
		{"compressible", compressibleInput(1000), true},
		{"incompressible", incompressibleInput(1000, 1), false},
		{"one element", []float32{1}, false},
		{"window edge 256", compressibleInput(256), true}, // 1024-byte body: zstd's smallest window
		{"window edge 257", compressibleInput(257), true}, // first body above it
		{"above 4 MiB", compressibleInput(5 << 18), true}, // body larger than the encoder's window
		{"mixed blocks", mixed, true},
	}
	for _, stage := range []string{"zstd", "huff0"} {
		plain := mustParse(t, "none")
		c := mustParse(t, "none:lossless="+stage)
		for _, tc := range cases {
			t.Run(stage+"/"+tc.name, func(t *testing.T) {
				p, err := c.Compress(nil, tc.x, Key{})
				if err != nil {
					t.Fatal(err)
				}
				raw, err := plain.Compress(nil, tc.x, Key{})
				if err != nil {
					t.Fatal(err)
				}
				saved := len(p) < len(raw)
				if flag := Lossless(p[7]); (flag != LosslessNone) != saved || saved && flag.String() != stage {
					t.Errorf("flag %v with %d bytes stored against %d raw", flag, len(p), len(raw))
				}
				if saved != tc.saves {
					t.Errorf("stage saved=%v (%d of %d bytes), want %v", saved, len(p), len(raw), tc.saves)
				}
				if !saved && !bytes.Equal(p[HeaderLen:], raw[HeaderLen:]) {
					t.Errorf("a body the stage could not shorten is not stored as is")
				}
				got := make([]float32, len(tc.x))
				if err := c.Decompress(got, p); err != nil {
					t.Fatal(err)
				}
				for i := range got {
					if math.Float32bits(got[i]) != math.Float32bits(tc.x[i]) {
						t.Fatalf("element %d: got %v, want %v", i, got[i], tc.x[i])
					}
				}
			})
		}
	}
}

// xorCodec is a dense codec with an entropy transform, to check that the
// stage undoes the transform when it stores a body raw and applies its
// inverse on expansion.
type xorCodec struct{ denseCodec }

func (xorCodec) forward(b []byte) {
	for i := range b {
		b[i] ^= 0x5a
	}
}

func (x xorCodec) inverse(b []byte) { x.forward(b) }

func TestLosslessSqueeze(t *testing.T) {
	impl := xorCodec{denseCodec{CodecNone}}
	for _, l := range []Lossless{LosslessZstd, LosslessHuff0} {
		noise := make([]byte, 4096)
		_, _ = rand.NewChaCha8([32]byte{9}).Read(noise)
		body := bytes.Clone(noise)
		if n, ok := l.squeeze(body, impl); ok || !bytes.Equal(body, noise) {
			t.Errorf("%v: squeeze of noise = %d, %v; want false and the body restored unchanged", l, n, ok)
		}
		zeros := make([]byte, 4096)
		body = bytes.Clone(zeros)
		n, ok := l.squeeze(body, impl)
		if !ok || n >= len(zeros) {
			t.Fatalf("%v: squeeze of zeros = %d, %v; want a shorter body", l, n, ok)
		}
		got, err := l.expand(body[:n], len(zeros), impl)
		if err != nil || !bytes.Equal(got, zeros) {
			t.Errorf("%v: expand = %v; want the zeros back", l, err)
		}
	}
}

// allocBound is the most expanding a forged 1000-byte body may allocate:
// the output buffer, a fresh zstd decoder's tables and one block's buffers
// (a few KiB in practice), never what a forged header claims.
const allocBound = 256 << 10

// allocated returns the bytes fn allocates (averaged over a few runs).
func allocated(fn func()) uint64 {
	const runs = 4
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for range runs {
		fn()
	}
	runtime.ReadMemStats(&m1)
	return (m1.TotalAlloc - m0.TotalAlloc) / runs
}

// zstdFrame returns a zstd frame with the given frame-header descriptor and
// header fields, holding one raw block of size zero bytes.
func zstdFrame(size int, header ...byte) []byte {
	f := append([]byte{0x28, 0xb5, 0x2f, 0xfd}, header...)
	f = append(f, byte(1|size<<3), byte(size>>5), byte(size>>13)) // last raw block
	return append(f, make([]byte, size)...)
}

func TestLosslessCorrupt(t *testing.T) {
	const raw = 1000
	body := make([]byte, raw)
	for i := range body {
		body[i] = byte(i % 5)
	}
	enc := zstdEncoder()
	zs := enc.EncodeAll(body, nil)
	hf := huff0Pack(body)
	if hf == nil || hf[0] != huff0Huff {
		t.Fatalf("huff0Pack did not produce a huff0 block for a compressible body")
	}
	fcs := binary.LittleEndian.AppendUint64(nil, 1<<40)
	huffBlock := func(mode byte, size uint32, data []byte) []byte {
		return append(binary.LittleEndian.AppendUint32([]byte{mode}, size), data...)
	}
	cases := []struct {
		name   string
		stage  Lossless
		stored []byte
		raw    int
	}{
		{"zstd empty", LosslessZstd, nil, raw},
		{"zstd truncated to its magic", LosslessZstd, zs[:4], raw},
		{"zstd truncated by half", LosslessZstd, zs[:len(zs)/2], raw},
		{"zstd truncated by one", LosslessZstd, zs[:len(zs)-1], raw},
		{"zstd extended with garbage", LosslessZstd, append(bytes.Clone(zs), 1, 2, 3, 4, 5, 6, 7, 8), raw},
		{"zstd followed by a second frame", LosslessZstd, append(bytes.Clone(zs), enc.EncodeAll([]byte{1}, nil)...), raw},
		{"zstd garbage", LosslessZstd, bytes.Repeat([]byte{0xde, 0xad, 0xbe, 0xef}, 64), raw},
		{"zstd longer than raw", LosslessZstd, enc.EncodeAll(append(bytes.Clone(body), 0), nil), raw},
		{"zstd shorter than raw", LosslessZstd, enc.EncodeAll(body[:raw-1], nil), raw},
		{"zstd window 512 MiB", LosslessZstd, zstdFrame(raw, 0x00, 0x98), raw},
		{"zstd window 4 MiB for 1000 bytes", LosslessZstd, zstdFrame(raw, 0x00, 0x60), raw},
		{"zstd single segment of 2^40", LosslessZstd, zstdFrame(raw, append([]byte{0xe0}, fcs...)...), raw},
		{"zstd content size 2^40, 1 KiB window", LosslessZstd, zstdFrame(raw, append([]byte{0xc0, 0x00}, fcs...)...), raw},
		{"huff0 empty", LosslessHuff0, nil, raw},
		{"huff0 header truncated", LosslessHuff0, hf[:3], raw},
		{"huff0 block truncated", LosslessHuff0, hf[:len(hf)-1], raw},
		{"huff0 extended", LosslessHuff0, append(bytes.Clone(hf), 0), raw},
		{"huff0 second block", LosslessHuff0, append(bytes.Clone(hf), huffBlock(huff0RLE, 1, []byte{7})...), raw},
		{"huff0 size past the end", LosslessHuff0, huffBlock(huff0Raw, 1<<32-1, body), raw},
		{"huff0 raw block too short", LosslessHuff0, huffBlock(huff0Raw, raw-1, body[:raw-1]), raw},
		{"huff0 RLE of two bytes", LosslessHuff0, huffBlock(huff0RLE, 2, []byte{1, 1}), raw},
		{"huff0 RLE of nothing", LosslessHuff0, huffBlock(huff0RLE, 0, nil), raw},
		{"huff0 unknown mode", LosslessHuff0, huffBlock(7, 4, []byte{1, 2, 3, 4}), raw},
		{"huff0 block decodes short", LosslessHuff0, hf, raw + 1},
		{"huff0 block decodes long", LosslessHuff0, hf, raw - 1},
		{"huff0 garbage table", LosslessHuff0, huffBlock(huff0Huff, 8, bytes.Repeat([]byte{0xff}, 8)), raw},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			var err error
			n := allocated(func() { _, err = c.stage.expand(c.stored, c.raw, denseCodec{CodecNone}) })
			if n > allocBound {
				t.Errorf("expanding a forged %d-byte body allocated %d bytes", c.raw, n)
			}
			var ce *CorruptInputError
			if !errors.As(err, &ce) || ce.Offset != HeaderLen {
				t.Errorf("got %v, want a *CorruptInputError at offset %d", err, HeaderLen)
			}
		})
	}
	// The intact streams expand, so the cases above fail for their defect.
	for _, l := range []Lossless{LosslessZstd, LosslessHuff0} {
		stored := zs
		if l == LosslessHuff0 {
			stored = hf
		}
		if got, err := l.expand(stored, raw, denseCodec{CodecNone}); err != nil || !bytes.Equal(got, body) {
			t.Errorf("%v: intact stream: %v", l, err)
		}
	}
}
