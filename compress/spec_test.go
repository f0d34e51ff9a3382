package compress_test

import (
	"errors"
	"math"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
)

// requireCodec skips t when the codec spec names is not registered yet.
func requireCodec(t *testing.T, spec string) {
	t.Helper()
	name, _, _ := strings.Cut(strings.TrimSpace(spec), ":")
	if !slices.Contains(compress.CodecNames(), name) {
		t.Skipf("codec %q is not registered in this build", name)
	}
}

func TestParseCanonical(t *testing.T) {
	cases := []struct {
		spec, want string
		codec      compress.Codec
	}{
		{"none", "none", compress.CodecNone},
		{"bf16:lossless=none", "bf16", compress.CodecBF16},
		{"none:lossless=zstd", "none:lossless=zstd", compress.CodecNone},
		{"fp16:lossless=huff0", "fp16:lossless=huff0", compress.CodecFP16},
		{"topk:0.01", "topk:0.01", compress.CodecTopK},
		{"topk:.5", "topk:0.5", compress.CodecTopK},
		{"topk:1.", "topk:1", compress.CodecTopK},
		{"topk:0.0100", "topk:0.01", compress.CodecTopK},
		{"topk:1", "topk:1", compress.CodecTopK},
		{"topk:0.5:sampled", "topk:0.5:sampled", compress.CodecTopK},
		{"topk:0.1:sampled:lossless=zstd", "topk:0.1:sampled:lossless=zstd", compress.CodecTopK},
		{"topk:0.02:chunk=4096", "topk:0.02:chunk=4096", compress.CodecTopK},
		{"topk:0.02:chunk=4096:bits=32", "topk:0.02:chunk=4096", compress.CodecTopK},
		{"topk:0.02:bits=32", "topk:0.02", compress.CodecTopK},
		{"topk:0.02:chunk=4096:bits=2", "topk:0.02:chunk=4096:bits=2", compress.CodecTopK},
		{"topk:0.02:bits=2:chunk=4096", "topk:0.02:chunk=4096:bits=2", compress.CodecTopK},
		{"topk:0.02:chunk=4096:bits=2:round=stochastic:seed=0", "topk:0.02:chunk=4096:bits=2", compress.CodecTopK},
		{"topk:0.02:seed=0x10:round=nearest:bits=4:chunk=64:lossless=zstd", "topk:0.02:chunk=64:bits=4:round=nearest:seed=16:lossless=zstd", compress.CodecTopK},
		{"topk:1:chunk=65536:bits=8", "topk:1:chunk=65536:bits=8", compress.CodecTopK},
		{"randomk:0.25", "randomk:0.25", compress.CodecRandomK},
		{"randomk:0.25:seed=0", "randomk:0.25", compress.CodecRandomK},
		{"randomk:0.25:seed=0x10", "randomk:0.25:seed=16", compress.CodecRandomK},
		{"randomk:0.25:seed=0xFFFFFFFFFFFFFFFF", "randomk:0.25:seed=18446744073709551615", compress.CodecRandomK},
		{"int8:bucket=512", "int8", compress.CodecInt8},
		{"int8:round=stochastic", "int8", compress.CodecInt8},
		{"int8:round=nearest", "int8:round=nearest", compress.CodecInt8},
		{"int8:bucket=64", "int8:bucket=64", compress.CodecInt8},
		{"int8:seed=9:lossless=zstd", "int8:seed=9:lossless=zstd", compress.CodecInt8},
		{"int8:lossless=zstd:bucket=512", "int8:lossless=zstd", compress.CodecInt8},
		{"int4:bucket=512:round=stochastic:seed=0", "int4", compress.CodecInt4},
		{"int2:bucket=1", "int2:bucket=1", compress.CodecInt2},
		{"sign:bucket=512", "sign", compress.CodecSign},
		{"sign:bucket=100", "sign:bucket=100", compress.CodecSign},
		{"sign:lossless=huff0", "sign:lossless=huff0", compress.CodecSign},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			requireCodec(t, c.spec)
			got, err := compress.Parse(c.spec)
			if err != nil {
				t.Fatalf("Parse(%q): %v", c.spec, err)
			}
			if got.Spec().String() != c.want || got.Codec() != c.codec {
				t.Errorf("Parse(%q) = %s (%v), want %s (%v)", c.spec, got.Spec(), got.Codec(), c.want, c.codec)
			}
			again, err := compress.Parse(got.Spec().String())
			if err != nil || again.Spec() != got.Spec() {
				t.Errorf("Parse(%q) = %v, %v: the canonical spec does not round-trip", got.Spec(), again, err)
			}
		})
	}
}

// TestParseOptionOrder checks that the order of options does not change the
// compressor: the canonical spec (and so the payload) is the same.
func TestParseOptionOrder(t *testing.T) {
	requireCodec(t, "int4")
	a, err := compress.Parse("int4:bucket=64:round=nearest:seed=3:lossless=huff0")
	if err != nil {
		t.Fatal(err)
	}
	b, err := compress.Parse("int4:lossless=huff0:seed=3:round=nearest:bucket=64")
	if err != nil {
		t.Fatal(err)
	}
	if a.Spec() != b.Spec() {
		t.Errorf("option order changes the canonical spec: %q vs %q", a.Spec(), b.Spec())
	}
}

func TestParseErrors(t *testing.T) {
	cases := []struct {
		spec string
		want string // a part of the message naming the problem
	}{
		{"", "empty codec name"},
		{":lossless=zstd", "empty codec name"},
		{"gzip", `unknown codec "gzip"`},
		{"FP16", `unknown codec "FP16"`},
		{"none:", "empty argument 1"},
		{"none::lossless=zstd", "empty argument 1"},
		{"none:extra", `unexpected argument "extra"`},
		{"fp16:0.5", `unexpected argument "0.5"`},
		{"none:foo=1", `unknown option "foo"`},
		{"none:lossless=lz4", `lossless="lz4"`},
		{"none:lossless=zstd:lossless=zstd", `option "lossless" given twice`},
		{"topk", "needs a ratio"},
		{"topk:0", `ratio "0"`},
		{"topk:1.5", `ratio "1.5"`},
		{"topk:-0.1", `ratio "-0.1"`},
		{"topk:NaN", `ratio "NaN"`},
		{"topk:Inf", `ratio "Inf"`},
		{"topk:abc", `ratio "abc"`},
		{"topk:0.1:sampled:more", `unexpected argument "more"`},
		{"topk:lossless=zstd:0.1", `positional argument "0.1" after an option`},
		{"topk:sampled", `ratio "sampled"`},
		{"topk:0.1:chunk=63", `chunk="63" is not an integer in [64, 65536]`},
		{"topk:0.1:chunk=65537", `chunk="65537"`},
		{"topk:0.1:chunk=0", `chunk="0"`},
		{"topk:0.1:chunk=04096", `chunk="04096"`},
		{"topk:0.1:chunk=4096:chunk=4096", `option "chunk" given twice`},
		{"topk:0.1:chunk=4096:bits=3", `bits="3" is not one of 32|2|4|8`},
		{"topk:0.1:chunk=4096:bits=16", `bits="16"`},
		{"topk:0.1:bits=2", "bits=2 needs chunk=C"},
		{"topk:0.1:sampled:chunk=4096", "sampled does not apply with chunk=C"},
		{"topk:0.1:chunk=4096:round=nearest", "option round applies only to the quantized values of bits=2|4|8"},
		{"topk:0.1:round=nearest", "option round applies only"},
		{"topk:0.1:chunk=4096:seed=3", "option seed applies only"},
		{"topk:0.1:chunk=4096:bits=32:seed=3", "option seed applies only"},
		{"topk:0.1:chunk=4096:bits=2:round=up", `round="up"`},
		{"topk:0.1:chunk=4096:bits=2:seed=x", `seed="x"`},
		{"topk:0.1:chunk=4096:bits=2:bucket=64", `unknown option "bucket"`},
		{"randomk:0.1:seed=-1", `seed="-1"`},
		{"randomk:0.1:sampled", `unexpected argument "sampled"`},
		{"int8:bucket=0", `bucket="0"`},
		{"int8:bucket=-1", `bucket="-1"`},
		{"int8:bucket=abc", `bucket="abc"`},
		{"int8:bucket=64:bucket=64", `option "bucket" given twice`},
		{"int8:round=up", `round="up"`},
		{"int8:0.5", `unexpected argument "0.5"`},
		{"int4:seed=x", `seed="x"`},
		{"sign:round=nearest", `unknown option "round"`},
		{"sign:bucket=0", `bucket="0"`},
		{"powersgd", "needs a rank in [1, 1024]"},
		{"powersgd:0", `a rank "0" is not an integer in [1, 1024]`},
		{"powersgd:1025", `a rank "1025"`},
		{"powersgd:02", `a rank "02"`},
		{"powersgd:2.5", `a rank "2.5"`},
		{"powersgd:2:warm=maybe", `warm="maybe"`},
		{"powersgd:2:min_compression=0.5", `min_compression="0.5"`},
		{"powersgd:2:min_compression=1e3", `min_compression="1e3"`},
		{"powersgd:2:bucket=64", `unknown option "bucket"`},
		{"powersgd:2:3", `unexpected argument "3"`},
		// The lexical rules: printable ASCII, no spaces, plain numbers.
		{"  ", "byte 0"},
		{" fp16", "byte 0"},
		{"fp16 ", "byte 4"},
		{"int8\x00garbage", "byte 4 is 0x00"},
		{"int8\t", "byte 4"},
		{"int8:bucket=64\n", "byte 14"},
		{"topk:0.01\u00a0", "byte 9 is 0xc2"},
		{"int8:=64", `argument 1 ("=64") is not NAME=VALUE`},
		{"int8:bucket=", `argument 1 ("bucket=") is not NAME=VALUE`},
		{"topk:0x1p-3", `ratio "0x1p-3" is not a plain decimal`},
		{"topk:0x0.1", `ratio "0x0.1"`},
		{"topk:1e-2", `ratio "1e-2"`},
		{"topk:1E-2", `ratio "1E-2"`},
		{"topk:+0.5", `ratio "+0.5"`},
		{"topk:0.5.1", `ratio "0.5.1"`},
		{"topk:.", `ratio "."`},
		{"topk:inf", `ratio "inf"`},
		{"topk:nan", `ratio "nan"`},
		{"topk:0_5", `ratio "0_5"`},
		{"topk:1.0000000001", `ratio "1.0000000001"`},
		{"topk:0." + strings.Repeat("0", 320) + "1", "is not a plain decimal"}, // subnormal
		{"topk:0." + strings.Repeat("0", 400) + "1", "is not a plain decimal"}, // rounds to 0
		{"int8:bucket=+64", `bucket="+64"`},
		{"int8:bucket=064", `bucket="064"`},
		{"int8:bucket=0x40", `bucket="0x40"`},
		{"int8:bucket=6_4", `bucket="6_4"`},
		{"int8:seed=010", `seed="010"`},
		{"int8:seed=0o10", `seed="0o10"`},
		{"int8:seed=0b1", `seed="0b1"`},
		{"int8:seed=0x", `seed="0x"`},
		{"int8:seed=0X10", `seed="0X10"`},
		{"int8:seed=1_000", `seed="1_000"`},
		{"int8:seed=0x1_0", `seed="0x1_0"`},
		{"int8:seed=0x10000000000000000", `seed="0x10000000000000000"`},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			if name, _, _ := strings.Cut(strings.TrimSpace(c.spec), ":"); name != "" && !strings.HasPrefix(c.want, "unknown codec") {
				requireCodec(t, c.spec)
			}
			got, err := compress.Parse(c.spec)
			var se *compress.SpecError
			if !errors.As(err, &se) {
				t.Fatalf("Parse(%q) = %v, %v; want a *compress.SpecError", c.spec, got, err)
			}
			if se.Spec != c.spec {
				t.Errorf("SpecError.Spec = %q, want %q", se.Spec, c.spec)
			}
			if !strings.Contains(err.Error(), c.want) || !strings.Contains(err.Error(), strconv.Quote(c.spec)) {
				t.Errorf("Parse(%q): message %q does not name the spec and %q", c.spec, err, c.want)
			}
		})
	}
}

func TestParseOptions(t *testing.T) {
	for _, c := range []struct {
		name string
		opt  compress.Option
		want string
	}{
		{"WithWorkers(0)", compress.WithWorkers(0), "WithWorkers(0)"},
		{"WithWorkers(-3)", compress.WithWorkers(-3), "WithWorkers(-3)"},
		{"WithMinParallel(0)", compress.WithMinParallel(0), "WithMinParallel(0)"},
	} {
		c1, err := compress.Parse("none", c.opt)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Parse with %s = %v, %v; want an error naming %s", c.name, c1, err, c.want)
		}
	}
	if _, err := compress.Parse("none", compress.WithWorkers(1), compress.WithMinParallel(1)); err != nil {
		t.Errorf("valid options rejected: %v", err)
	}
}

func TestCodecNames(t *testing.T) {
	names := compress.CodecNames()
	if !slices.IsSorted(names) {
		t.Errorf("CodecNames() = %v, not sorted", names)
	}
	for _, name := range names {
		c, err := compress.Parse(name)
		if err != nil && !strings.Contains(err.Error(), "ratio") && !strings.Contains(err.Error(), "a rank") {
			t.Errorf("Parse(%q): %v", name, err)
			continue
		}
		if err == nil && c.Codec().String() != name {
			t.Errorf("Parse(%q).Codec().String() = %q", name, c.Codec())
		}
	}
	if got := compress.Codec(200).String(); got != "codec(200)" {
		t.Errorf("Codec(200).String() = %q", got)
	}
}

// TestSpecFields checks the typed Spec that ParseSpec returns: its fields,
// defaults as zero values (one value per configuration), and the
// canonical round trip ParseSpec(s.String()) == s.
func TestSpecFields(t *testing.T) {
	cases := []struct {
		spec string
		want compress.Spec
	}{
		{"none", compress.Spec{Codec: compress.CodecNone}},
		{"bf16:lossless=zstd", compress.Spec{Codec: compress.CodecBF16, Lossless: compress.LosslessZstd}},
		{"topk:0.010:sampled", compress.Spec{Codec: compress.CodecTopK, Ratio: 0.01, Sampled: true}},
		{"randomk:0.25:seed=0x10", compress.Spec{Codec: compress.CodecRandomK, Ratio: 0.25, Seed: 16}},
		{"int8:bucket=512:round=stochastic:seed=0", compress.Spec{Codec: compress.CodecInt8}},
		{"int4:bucket=64:round=nearest:seed=3:lossless=huff0",
			compress.Spec{Codec: compress.CodecInt4, Bucket: 64, Nearest: true, Seed: 3, Lossless: compress.LosslessHuff0}},
		{"sign:bucket=100", compress.Spec{Codec: compress.CodecSign, Bucket: 100}},
		{"powersgd:2", compress.Spec{Codec: compress.CodecPowerSGD, Rank: 2}},
		{"powersgd:4:warm=off:min_compression=1.5:seed=7",
			compress.Spec{Codec: compress.CodecPowerSGD, Rank: 4, Cold: true, MinCompression: 1.5, Seed: 7}},
		{"powersgd:1:warm=on:min_compression=2", compress.Spec{Codec: compress.CodecPowerSGD, Rank: 1}},
	}
	for _, c := range cases {
		t.Run(c.spec, func(t *testing.T) {
			got, err := compress.ParseSpec(c.spec)
			if err != nil || got != c.want {
				t.Fatalf("ParseSpec(%q) = %+v, %v; want %+v", c.spec, got, err, c.want)
			}
			again, err := compress.ParseSpec(got.String())
			if err != nil || again != got {
				t.Errorf("ParseSpec(%q) = %+v, %v: the canonical form does not round-trip", got.String(), again, err)
			}
			comp, err := compress.New(got)
			var se *compress.SpecError
			switch {
			case got.Codec == compress.CodecPowerSGD:
				// An exchange of the engine, not a payload codec.
				if !errors.As(err, &se) || !strings.Contains(err.Error(), "strategy low-rank") {
					t.Errorf("New(%+v) = %v, %v; want a *SpecError pointing to the engine", got, comp, err)
				}
			case err != nil || comp.Spec() != got:
				t.Errorf("New(%+v) = %v, %v", got, comp, err)
			}
		})
	}
	// A Spec built in code: the default bucket written out is the same
	// configuration.
	comp, err := compress.New(compress.Spec{Codec: compress.CodecInt8, Bucket: 512})
	if err != nil || comp.Spec() != (compress.Spec{Codec: compress.CodecInt8}) {
		t.Errorf("New(int8, Bucket 512) = %+v, %v; want the default spec", comp.Spec(), err)
	}
}

// TestSpecValidate checks that New refuses a Spec that no spec string
// could produce, with a *SpecError naming the field.
func TestSpecValidate(t *testing.T) {
	cases := []struct {
		spec compress.Spec
		want string
	}{
		{compress.Spec{}, "unknown codec codec(0)"},
		{compress.Spec{Codec: 42}, "unknown codec codec(42)"},
		{compress.Spec{Codec: compress.CodecInt8, Ratio: 0.5}, "Ratio does not apply to int8"},
		{compress.Spec{Codec: compress.CodecSign, Seed: 1}, "Seed does not apply to sign"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Seed: 1}, "a seed applies only to the stochastic rounding of bits=2|4|8"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Chunk: 64, Nearest: true}, "round=nearest applies only"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Chunk: 32}, "chunk 32 is not in [64, 65536]"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Chunk: -1}, "chunk -1"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Chunk: 1 << 17}, "chunk 131072"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Chunk: 64, Bits: 3}, "bits 3 is not 2, 4 or 8"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Chunk: 64, Bits: 32}, "bits 32 is not 2, 4 or 8"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Bits: 2}, "bits=2 needs chunk=C"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.5, Chunk: 64, Sampled: true}, "sampled does not apply"},
		{compress.Spec{Codec: compress.CodecInt8, Chunk: 64}, "Chunk does not apply to int8"},
		{compress.Spec{Codec: compress.CodecRandomK, Ratio: 0.5, Bits: 2}, "Bits does not apply to randomk"},
		{compress.Spec{Codec: compress.CodecSign, Nearest: true}, "Nearest does not apply to sign"},
		{compress.Spec{Codec: compress.CodecRandomK, Ratio: 0.5, Sampled: true}, "Sampled does not apply to randomk"},
		{compress.Spec{Codec: compress.CodecNone, Bucket: 64}, "Bucket does not apply to none"},
		{compress.Spec{Codec: compress.CodecTopK}, "ratio 0 is not a normal number"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 1.5}, "ratio 1.5"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: math.NaN()}, "ratio NaN"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 5e-324}, "ratio 5e-324"},
		{compress.Spec{Codec: compress.CodecInt4, Bucket: -1}, "bucket -1"},
		{compress.Spec{Codec: compress.CodecInt4, Bucket: 1<<24 + 1}, "bucket 16777217"},
		{compress.Spec{Codec: compress.CodecFP16, Lossless: 7}, "unknown lossless stage lossless(7)"},
		{compress.Spec{Codec: compress.CodecPowerSGD}, "rank 0 is not in [1, 1024]"},
		{compress.Spec{Codec: compress.CodecPowerSGD, Rank: 1025}, "rank 1025"},
		{compress.Spec{Codec: compress.CodecPowerSGD, Rank: 2, MinCompression: 0.5}, "min_compression 0.5"},
		{compress.Spec{Codec: compress.CodecPowerSGD, Rank: 2, MinCompression: math.NaN()}, "min_compression NaN"},
		{compress.Spec{Codec: compress.CodecInt8, Rank: 2}, "Rank does not apply to int8"},
		{compress.Spec{Codec: compress.CodecTopK, Ratio: 0.1, Cold: true}, "Cold does not apply to topk"},
	}
	for _, c := range cases {
		_, err := compress.New(c.spec)
		var se *compress.SpecError
		if !errors.As(err, &se) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("New(%+v) = %v; want a *SpecError saying %q", c.spec, err, c.want)
		}
	}
}
