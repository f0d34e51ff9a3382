package compress_test

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// The decoder fuzz targets take a spec and a payload. Their seed corpora in
// testdata/fuzz hold valid payloads of every registered spec of
// compresstest.DefaultSpecs; rewrite them with -fuzzcorpus after adding a
// codec.
var writeCorpus = flag.Bool("fuzzcorpus", false, "rewrite the seed corpora of the fuzz tests in testdata/fuzz")

// FuzzDecompress feeds arbitrary bytes, checksum and all, to the decoder of
// any spec: the framing checks must reject them cleanly.
func FuzzDecompress(f *testing.F) {
	f.Fuzz(func(t *testing.T, spec string, payload []byte) {
		c, err := compress.Parse(spec)
		if err != nil {
			t.Skip(err)
		}
		compresstest.CheckDecode(t, c, payload)
	})
}

// decoderFamilies groups the specs by decoder: each family has its own
// resealed fuzz target, so that each keeps its own corpus.
var decoderFamilies = map[string]func(s compress.Spec) bool{
	"FuzzResealedDense":     codecsOf(compress.CodecNone, compress.CodecFP16, compress.CodecBF16),
	"FuzzResealedTopK":      func(s compress.Spec) bool { return s.Codec == compress.CodecTopK && s.Chunk == 0 },
	"FuzzResealedChunkTopK": func(s compress.Spec) bool { return s.Codec == compress.CodecTopK && s.Chunk != 0 },
	"FuzzResealedRandomK":   codecsOf(compress.CodecRandomK),
	"FuzzResealedQuant":     codecsOf(compress.CodecInt8, compress.CodecInt4, compress.CodecInt2),
	"FuzzResealedSign":      codecsOf(compress.CodecSign),
}

// codecsOf returns the family of the specs of the codecs cs.
func codecsOf(cs ...compress.Codec) func(s compress.Spec) bool {
	return func(s compress.Spec) bool { return slices.Contains(cs, s.Codec) }
}

// fuzzResealed fixes the body length and the checksum of each mutated
// payload (compresstest.Reseal) so that the mutation reaches the codec's own
// validation and decoder.
func fuzzResealed(f *testing.F, name string) {
	family := decoderFamilies[name]
	registered := false
	for _, spec := range compresstest.DefaultSpecs {
		if c, err := compress.Parse(spec); err == nil && family(c.Spec()) {
			registered = true
		}
	}
	if !registered {
		f.Skipf("no spec of %s's family is registered in this build", name)
	}
	f.Fuzz(func(t *testing.T, spec string, payload []byte) {
		c, err := compress.Parse(spec)
		if err != nil || !family(c.Spec()) {
			t.Skipf("%q is not a spec of %s's family", spec, name)
		}
		p := bytes.Clone(payload)
		compresstest.Reseal(p)
		compresstest.CheckDecode(t, c, p)
	})
}

func FuzzResealedDense(f *testing.F) { fuzzResealed(f, "FuzzResealedDense") }
func FuzzResealedTopK(f *testing.F)  { fuzzResealed(f, "FuzzResealedTopK") }

// FuzzResealedChunkTopK covers chunked top-k's decoder: packed indices per
// chunk, float32 values or the codes of bits= with their chunk headers.
func FuzzResealedChunkTopK(f *testing.F) { fuzzResealed(f, "FuzzResealedChunkTopK") }
func FuzzResealedRandomK(f *testing.F)   { fuzzResealed(f, "FuzzResealedRandomK") }
func FuzzResealedQuant(f *testing.F)     { fuzzResealed(f, "FuzzResealedQuant") }
func FuzzResealedSign(f *testing.F)      { fuzzResealed(f, "FuzzResealedSign") }

// FuzzLoad feeds arbitrary bytes to ErrorFeedback.Load: it fails with a typed
// error leaving the memory as it was, or succeeds with a state that Save and
// Load reproduce exactly.
func FuzzLoad(f *testing.F) {
	f.Fuzz(func(t *testing.T, state []byte) {
		ef := compress.NewErrorFeedback(compresstest.MustParse(t, "none"))
		if err := ef.Load(bytes.NewReader(efState(t, 1, efBucket{id: 1, vals: []float32{0.5, -2}}))); err != nil {
			t.Fatal(err)
		}
		before := snapshot(ef)
		if err := ef.Load(bytes.NewReader(state)); err != nil {
			var ce *compress.CorruptInputError
			var cs *compress.ChecksumError
			var ve *compress.VersionError
			if !errors.As(err, &ce) && !errors.As(err, &cs) && !errors.As(err, &ve) {
				t.Fatalf("Load: untyped error %v", err)
			}
			if !sameMemory(before, snapshot(ef)) {
				t.Fatalf("Load failed (%v) but changed the memory", err)
			}
			return
		}
		saved := save(t, ef)
		again := compress.NewErrorFeedback(compresstest.MustParse(t, "none"))
		if err := again.Load(bytes.NewReader(saved)); err != nil {
			t.Fatalf("reloading a saved state: %v", err)
		}
		if !bytes.Equal(save(t, again), saved) || !sameMemory(snapshot(ef), snapshot(again)) {
			t.Fatalf("Save and Load do not reproduce a loaded state")
		}
	})
}

// FuzzParse checks that Parse never panics, rejects with a *SpecError that
// quotes the spec, and that an accepted spec's canonical form parses to a
// compressor writing identical payloads.
func FuzzParse(f *testing.F) {
	for _, s := range compresstest.DefaultSpecs {
		f.Add(s)
	}
	for _, s := range []string{"", ":", "topk:1.5", "topk:0x1p-3", "int8:bucket=0", "none:lossless=zstd:lossless=zstd",
		"randomk:0.1:seed=0xffffffffffffffff", "topk:lossless=zstd:0.1", "sign:bucket=1:lossless=huff0",
		"topk:0.1:bits=2", "topk:0.1:chunk=64:round=nearest", "topk:0.1:sampled:chunk=64", "topk:0.02:chunk=65536:bits=8:seed=0x9"} {
		f.Add(s)
	}
	x := []float32{0.5, -1.25, 3, 0.01, -7, 2.5, 0.125, -0.75, 1, 4}
	f.Fuzz(func(t *testing.T, spec string) {
		c, err := compress.Parse(spec)
		if err != nil {
			var se *compress.SpecError
			if !errors.As(err, &se) || se.Spec != spec {
				t.Fatalf("Parse(%q): %v is not a *SpecError quoting the spec", spec, err)
			}
			return
		}
		c2, err := compress.Parse(c.Spec().String())
		if err != nil || c2.Spec() != c.Spec() {
			t.Fatalf("Parse(%q).Spec() = %q does not round-trip: %v", spec, c.Spec(), err)
		}
		key := compress.Key{Bucket: 1, Step: 2}
		p1, err1 := c.Compress(nil, x, key)
		p2, err2 := c2.Compress(nil, x, key)
		if err1 != nil || err2 != nil || !bytes.Equal(p1, p2) {
			t.Fatalf("%q and its canonical form %q write different payloads (%v, %v)", spec, c.Spec(), err1, err2)
		}
	})
}

// TestWriteFuzzCorpus rewrites the seed files (named seed-*) of the fuzz
// targets from the specs this build registers. It runs only with -fuzzcorpus.
func TestWriteFuzzCorpus(t *testing.T) {
	if !*writeCorpus {
		t.Skip("run with -fuzzcorpus to rewrite testdata/fuzz")
	}
	seeds := map[string][][]byte{} // target -> files
	for _, spec := range compresstest.DefaultSpecs {
		c, err := compress.Parse(spec)
		if err != nil {
			continue
		}
		sizes := []int{0, 7, 64} // small: the fuzzer minimizes what it derives from them
		if strings.Contains(spec, "lossless=") {
			n, err := losslessSeedLen(c)
			if err != nil {
				t.Fatalf("%s: %v", spec, err)
			}
			sizes = append(sizes, n)
		}
		for _, n := range sizes {
			p, err := c.Compress(nil, ramp(n, 1.3), compress.Key{Bucket: 5, Step: uint64(n)})
			if err != nil {
				t.Fatal(err)
			}
			file := corpusFile(spec, p)
			seeds["FuzzDecompress"] = append(seeds["FuzzDecompress"], file)
			for name, family := range decoderFamilies {
				if family(c.Spec()) {
					seeds[name] = append(seeds[name], file)
				}
			}
		}
	}
	for _, state := range [][]byte{
		efState(t, 1),
		efState(t, 1, efBucket{id: 2, vals: []float32{0.5, -1e-3, 3}}, efBucket{id: 7, vals: []float32{2}}, efBucket{id: 40}),
	} {
		seeds["FuzzLoad"] = append(seeds["FuzzLoad"], corpusFile(state))
	}
	for target, files := range seeds {
		dir := filepath.Join("testdata", "fuzz", target)
		old, _ := filepath.Glob(filepath.Join(dir, "seed-*"))
		for _, f := range old {
			if err := os.Remove(f); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		for i, file := range files {
			if err := os.WriteFile(filepath.Join(dir, fmt.Sprintf("seed-%03d", i)), file, 0o644); err != nil {
				t.Fatal(err)
			}
		}
		t.Logf("%s: %d seeds", target, len(files))
	}
}

// losslessSeedLen is the smallest length, of a few, whose ramp the
// compressor c (a spec with a lossless stage) sends through that stage: the
// stage is kept only where it saves bytes, which a short payload's rarely
// does.
func losslessSeedLen(c compress.Compressor) (int, error) {
	for _, n := range []int{64, 256, 1024, 4096, 16384} {
		p, err := c.Compress(nil, ramp(n, 1.3), compress.Key{Bucket: 5, Step: uint64(n)})
		if err != nil {
			return 0, err
		}
		if p[7] != 0 { // the header's lossless flags
			return n, nil
		}
	}
	return 0, fmt.Errorf("no ramp of up to 16384 elements keeps the lossless stage")
}

// corpusFile encodes fuzz arguments in the "go test fuzz v1" format.
func corpusFile(args ...any) []byte {
	var b strings.Builder
	b.WriteString("go test fuzz v1\n")
	for _, a := range args {
		switch v := a.(type) {
		case string:
			fmt.Fprintf(&b, "string(%q)\n", v)
		case []byte:
			fmt.Fprintf(&b, "[]byte(%q)\n", v)
		}
	}
	return []byte(b.String())
}
