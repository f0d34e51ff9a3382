package compress

import (
	"bytes"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"hash/crc32"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden payloads in testdata/golden")

// sealed returns a copy of p after edit, with the CRC32C recomputed so that
// the framing check under test, not the checksum, sees the edit.
func sealed(p []byte, edit func(p []byte)) []byte {
	q := bytes.Clone(p)
	edit(q)
	end := len(q) - TrailerLen
	binary.LittleEndian.PutUint32(q[end:], crc32.Checksum(q[:end], castagnoli))
	return q
}

// TestWireErrors walks every framing check of parsePayload and decompress and
// checks the typed error, the offset or field it names, and its message.
func TestWireErrors(t *testing.T) {
	none := mustParse(t, "none")
	src := []float32{1, -2, 3.5, 0.25}
	p, err := none.Compress(nil, src, Key{Bucket: 1, Step: 2})
	if err != nil {
		t.Fatal(err)
	}
	fp16p, err := mustParse(t, "fp16").Compress(nil, src, Key{})
	if err != nil {
		t.Fatal(err)
	}
	putU64 := func(off int, v uint64) func([]byte) {
		return func(q []byte) { binary.LittleEndian.PutUint64(q[off:], v) }
	}
	putU32 := func(off int, v uint32) func([]byte) {
		return func(q []byte) { binary.LittleEndian.PutUint32(q[off:], v) }
	}
	corrupt := func(off int64, msg string) func(*testing.T, error) {
		return func(t *testing.T, err error) {
			var ce *CorruptInputError
			if !errors.As(err, &ce) || ce.Offset != off {
				t.Fatalf("got %v, want a *CorruptInputError at offset %d", err, off)
			}
			if !strings.Contains(err.Error(), msg) || !strings.Contains(err.Error(), "offset") {
				t.Errorf("message %q does not say %q and where", err, msg)
			}
		}
	}
	mismatch := func(field, got, want string) func(*testing.T, error) {
		return func(t *testing.T, err error) {
			var me *PayloadMismatchError
			if !errors.As(err, &me) || !strings.Contains(me.Field, field) || me.Got != got || me.Want != want {
				t.Fatalf("got %v, want a *PayloadMismatchError on %s (%s vs %s)", err, field, got, want)
			}
		}
	}
	grown := sealed(append(bytes.Clone(p[:len(p)-TrailerLen]), 0, 0, 0, 0, 0, 0, 0, 0), putU64(48, uint64(len(src)*4+4)))
	cases := []struct {
		name    string
		payload []byte
		dstLen  int
		check   func(*testing.T, error)
	}{
		{"empty", nil, 4, corrupt(0, "shorter than the 60-byte frame")},
		{"short", p[:HeaderLen+TrailerLen-1], 4, corrupt(59, "payload of 59 bytes")},
		{"bad magic", sealed(p, func(q []byte) { q[0] = 'X' }), 4, corrupt(0, `bad magic "XCMP"`)},
		{"bad version", sealed(p, func(q []byte) { q[4] = 7 }), 4, func(t *testing.T, err error) {
			var ve *VersionError
			if !errors.As(err, &ve) || ve.Got != 7 || ve.Want != wireVersion || ve.What != "payload" {
				t.Fatalf("got %v, want a *VersionError for payload version 7", err)
			}
			if !strings.Contains(err.Error(), "payload version 7") {
				t.Errorf("message %q does not name the version", err)
			}
		}},
		{"checksum", func() []byte { q := bytes.Clone(p); q[20] ^= 1; return q }(), 4, func(t *testing.T, err error) {
			var ce *ChecksumError
			if !errors.As(err, &ce) || ce.Got != binary.LittleEndian.Uint32(p[len(p)-4:]) || ce.Got == ce.Want {
				t.Fatalf("got %v, want a *ChecksumError with the stored checksum", err)
			}
			if !strings.Contains(err.Error(), "checksum mismatch") {
				t.Errorf("message %q", err)
			}
		}},
		{"bad dtype", sealed(p, func(q []byte) { q[6] = 2 }), 4, corrupt(6, "unknown source dtype 2")},
		{"flag bits 2-7", sealed(p, func(q []byte) { q[7] = 0x04 }), 4, corrupt(7, "unknown flags 0x04")},
		{"lossless 3", sealed(p, func(q []byte) { q[7] = 3 }), 4, corrupt(7, "unknown flags 0x03")},
		{"count > MaxElements", sealed(p, putU64(8, MaxElements+1)), 4, corrupt(8, fmt.Sprintf("element count 4294967296 exceeds %d", uint64(maxElements)))},
		{"body length field", sealed(p, putU64(48, 15)), 4, corrupt(48, "body length 15, but the frame holds 16 bytes")},
		{"body length huge", sealed(p, putU64(48, 1<<63)), 4, corrupt(48, "body length")},
		{"body too long for codec", grown, 4, corrupt(48, "body of 20 bytes, none needs 16 for 4 elements")},
		{"codec", fp16p, 4, mismatch("codec", "fp16", "none")},
		{"unknown codec", sealed(p, func(q []byte) { q[5] = 99 }), 4, mismatch("codec", "codec(99)", "none")},
		{"parameter A", sealed(p, putU32(16, 5)), 4, mismatch("parameter A", "5", "0")},
		{"parameter B", sealed(p, putU32(20, 1)), 4, mismatch("parameter B", "1", "0")},
		{"seed", sealed(p, putU64(24, 42)), 4, mismatch("seed", "42", "0")},
		{"destination length", p, 5, func(t *testing.T, err error) {
			var se *SizeError
			if !errors.As(err, &se) || se.Got != 5 || se.Want != 4 || se.What != "destination length" {
				t.Fatalf("got %v, want a *SizeError for destination length 5 vs 4", err)
			}
		}},
		{"non-finite body", sealed(p, putU32(HeaderLen+8, 0x7fc00000)), 4, corrupt(HeaderLen+8, "non-finite fp32 value")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			dst := make([]float32, c.dstLen)
			for i := range dst {
				dst[i] = 9
			}
			for _, add := range []bool{false, true} {
				err := none.(feedbackCompressor).decompress(dst, c.payload, add)
				c.check(t, err)
				for i, v := range dst {
					if v != 9 {
						t.Fatalf("add=%v: dst[%d] = %v after a failed decode", add, i, v)
					}
				}
			}
		})
	}
	// The header keys survive the trip: Key and counts are where the format says.
	h, body, err := parsePayload(p)
	if err != nil {
		t.Fatal(err)
	}
	if h.codec != CodecNone || h.n != 4 || h.key != (Key{Bucket: 1, Step: 2}) || len(body) != 16 || h.lossless != LosslessNone {
		t.Errorf("parsePayload = %+v, %d-byte body", h, len(body))
	}
}

// TestWireLosslessErrors checks that a lossless body that fails to expand is
// reported at the body offset, and that a body failing the codec's check
// after expansion says so.
func TestWireLosslessErrors(t *testing.T) {
	c := mustParse(t, "none:lossless=zstd")
	src := make([]float32, 256)
	for i := range src {
		src[i] = float32(i % 3)
	}
	p, err := c.Compress(nil, src, Key{})
	if err != nil {
		t.Fatal(err)
	}
	if p[7] != byte(LosslessZstd) {
		t.Fatalf("a compressible body was stored raw (flags %#x)", p[7])
	}
	bad := sealed(p, func(q []byte) { q[HeaderLen+len(q[HeaderLen:])/2] ^= 0xff })
	err = c.Decompress(make([]float32, len(src)), bad)
	var ce *CorruptInputError
	if !errors.As(err, &ce) || ce.Offset != HeaderLen || !strings.Contains(err.Error(), "zstd stage") {
		t.Errorf("corrupt zstd body: got %v, want a *CorruptInputError at offset %d naming the zstd stage", err, HeaderLen)
	}

	// A zstd body that expands to a valid length but holds a NaN.
	raw := make([]byte, 4*len(src))
	binary.LittleEndian.PutUint32(raw[40:], 0x7fc00000)
	nan := append(bytes.Clone(p[:HeaderLen]), zstdEncoder().EncodeAll(raw, nil)...)
	nan = sealed(append(nan, 0, 0, 0, 0), func(q []byte) {
		binary.LittleEndian.PutUint64(q[48:], uint64(len(q)-HeaderLen-TrailerLen))
	})
	err = c.Decompress(make([]float32, len(src)), nan)
	if !errors.As(err, &ce) || ce.Offset != 40 || !strings.Contains(err.Error(), "after the zstd stage") {
		t.Errorf("NaN behind zstd: got %v, want a *CorruptInputError at body offset 40 after the zstd stage", err)
	}
}

// goldenSpecs are the specs whose payloads are pinned byte for byte in
// testdata/golden: a change to the wire format, a codec's body layout or the
// random stream shows up as a diff there. A new version of the zstd or huff0
// encoder may also change the lossless ones; rerun with -update and review.
var goldenSpecs = []string{
	"none", "fp16", "bf16", "fp16:lossless=huff0", "bf16:lossless=huff0",
	"topk:0.05", "topk:0.05:lossless=zstd", "topk:0.05:sampled",
	"randomk:0.1:seed=42", "randomk:0.1:lossless=zstd", // zstd cannot shorten it: stored raw
	"int8", "int8:round=nearest:lossless=huff0", "int4:bucket=64:seed=5", "int2:seed=9",
	"sign", "sign:bucket=100",
}

// goldenInput returns the fixed gradient behind the golden payloads: u³ for
// u uniform in [-1, 1) from the PCG stream, heavy-tailed like a gradient so
// that the lossless stages find something to shorten, computed with single
// IEEE float32 operations only (no library function or fused operation whose
// last bit could differ between platforms). Every tenth value repeats a
// magnitude, so that top-k tie-breaking is pinned too.
func goldenInput() []float32 {
	r := rand.New(rand.NewPCG(2024, 7))
	x := make([]float32, 1000)
	for i := range x {
		u := float32(int32(r.Uint32())) * 0x1p-31
		x[i] = float32(float32(u*u)*u) * 4
		if i%10 == 0 {
			x[i] = float32(i%3) - 1.5
		}
	}
	return x
}

func goldenPath(spec string) string {
	name := strings.NewReplacer(":", "_", "=", "-").Replace(spec)
	return filepath.Join("testdata", "golden", name+".bin")
}

// TestGolden compares payloads of a fixed input with the files in
// testdata/golden. Run with -update to rewrite them after an intended change.
func TestGolden(t *testing.T) {
	x := goldenInput()
	key := Key{Bucket: 3, Step: 17}
	for _, spec := range goldenSpecs {
		t.Run(spec, func(t *testing.T) {
			name, _, _ := strings.Cut(spec, ":")
			if _, ok := codecByName(name); !ok {
				t.Skipf("codec %q is not registered in this build", name)
			}
			c := mustParse(t, spec)
			got, err := c.Compress(nil, x, key)
			if err != nil {
				t.Fatal(err)
			}
			path := goldenPath(spec)
			if *update {
				if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if errors.Is(err, os.ErrNotExist) {
				t.Skipf("no golden file %s yet: run go test -run TestGolden -update", path)
			}
			if err != nil {
				t.Fatal(err)
			}
			if !bytes.Equal(got, want) {
				i := 0
				for i < min(len(got), len(want)) && got[i] == want[i] {
					i++
				}
				t.Fatalf("payload differs from %s (%d vs %d bytes) from byte %d on", path, len(got), len(want), i)
			}
			if err := c.Decompress(make([]float32, len(x)), want); err != nil {
				t.Errorf("the golden payload does not decode: %v", err)
			}
		})
	}
}

// TestParseHeader reads back every header field and the body of a payload,
// and rejects what parsePayload rejects.
func TestParseHeader(t *testing.T) {
	c, err := Parse("randomk:0.25:seed=9")
	if err != nil {
		t.Fatal(err)
	}
	src := []float32{1, -2, 3, -4, 5, -6, 7, -8}
	key := Key{Bucket: 5, Step: 77}
	p, err := c.Compress(nil, src, key)
	if err != nil {
		t.Fatal(err)
	}
	h, body, err := ParseHeader(p)
	want := Header{Codec: CodecRandomK, Elements: 8, ParamA: 2, Seed: 9, Key: key}
	if err != nil || h != want || len(body) != 8 || &body[0] != &p[HeaderLen] {
		t.Fatalf("ParseHeader = %+v, %d-byte body, %v; want %+v and the 8-byte body in place", h, len(body), err, want)
	}
	idx, err := RandomKIndices(nil, 8, 2, h.Seed, h.Key)
	if err != nil {
		t.Fatal(err)
	}
	for j, i := range idx {
		if v := math.Float32frombits(binary.LittleEndian.Uint32(body[4*j:])); v != src[i] {
			t.Errorf("value %d = %v, want src[%d] = %v", j, v, i, src[i])
		}
	}
	var ce *ChecksumError
	if _, _, err := ParseHeader(append(bytes.Clone(p[:len(p)-1]), p[len(p)-1]^1)); !errors.As(err, &ce) {
		t.Errorf("flipped checksum: got %v, want *ChecksumError", err)
	}
}

// TestPayloadLen reads the length of payloads of several codecs, with and
// without a lossless stage, from their header alone and from padded slots,
// and checks the errors of short, foreign, newer and absurd headers.
func TestPayloadLen(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	src := make([]float32, 3000)
	for i := range src {
		src[i] = float32(rng.NormFloat64())
	}
	for _, spec := range []string{"none", "topk:0.01", "int4", "sign", "topk:0.05:lossless=zstd"} {
		p, err := mustParse(t, spec).Compress(nil, src, Key{Bucket: 1})
		if err != nil {
			t.Fatal(err)
		}
		slot := append(bytes.Clone(p), make([]byte, 100)...)
		for _, b := range [][]byte{p, p[:HeaderLen], slot} {
			if n, err := PayloadLen(b); err != nil || n != len(p) {
				t.Errorf("%s: PayloadLen of %d bytes = %d, %v; want %d", spec, len(b), n, err, len(p))
			}
		}
	}
	p, err := mustParse(t, "none").Compress(nil, src[:4], Key{})
	if err != nil {
		t.Fatal(err)
	}
	var ce *CorruptInputError
	if _, err := PayloadLen(p[:HeaderLen-1]); !errors.As(err, &ce) || ce.Offset != HeaderLen-1 {
		t.Errorf("short prefix: got %v, want a *CorruptInputError at offset %d", err, HeaderLen-1)
	}
	bad := bytes.Clone(p)
	bad[0] = 'X'
	if _, err := PayloadLen(bad); !errors.As(err, &ce) || ce.Offset != 0 {
		t.Errorf("bad magic: got %v, want a *CorruptInputError at offset 0", err)
	}
	bad = bytes.Clone(p)
	bad[4] = wireVersion + 1
	var ve *VersionError
	if _, err := PayloadLen(bad); !errors.As(err, &ve) {
		t.Errorf("newer version: got %v, want a *VersionError", err)
	}
	bad = bytes.Clone(p)
	binary.LittleEndian.PutUint64(bad[48:], math.MaxUint64-1)
	if _, err := PayloadLen(bad); !errors.As(err, &ce) || ce.Offset != 48 {
		t.Errorf("absurd body length: got %v, want a *CorruptInputError at offset 48", err)
	}
}
