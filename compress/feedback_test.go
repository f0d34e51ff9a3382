package compress_test

import (
	"bytes"
	"encoding/binary"
	"errors"
	"hash/crc32"
	"math"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

func ramp(n int, scale float32) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = scale * float32(i%13-6) / 7
	}
	return x
}

// primed returns error-feedback memory over fp16 with residuals in buckets
// 2, 7 and 40 (one of them empty) after a few steps.
func primed(t testing.TB) *compress.ErrorFeedback {
	t.Helper()
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "fp16"))
	for step := range uint64(3) {
		for bucket, n := range map[uint64]int{2: 33, 7: 1000, 40: 0} {
			if _, err := f.Compress(nil, ramp(n, 1.001+float32(step)), compress.Key{Bucket: bucket, Step: step}); err != nil {
				t.Fatal(err)
			}
		}
	}
	return f
}

// snapshot captures every residual, bit for bit, to compare memory before
// and after a failed call.
func snapshot(f *compress.ErrorFeedback) map[uint64][]uint32 {
	m := map[uint64][]uint32{}
	for _, id := range f.Buckets() {
		m[id] = math32bits(f.Residual(id))
	}
	return m
}

func sameMemory(a, b map[uint64][]uint32) bool {
	if len(a) != len(b) {
		return false
	}
	for id, e := range a {
		if f, ok := b[id]; !ok || !slices.Equal(e, f) {
			return false
		}
	}
	return true
}

func save(t testing.TB, f *compress.ErrorFeedback) []byte {
	t.Helper()
	var buf bytes.Buffer
	if err := f.Save(&buf); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

func TestFeedbackSaveLoad(t *testing.T) {
	f := primed(t)
	state := save(t, f)
	g := compress.NewErrorFeedback(compresstest.MustParse(t, "fp16"))
	if _, err := g.Compress(nil, ramp(5, 1), compress.Key{Bucket: 99}); err != nil {
		t.Fatal(err)
	}
	if err := g.Load(bytes.NewReader(state)); err != nil {
		t.Fatal(err)
	}
	if !sameMemory(snapshot(f), snapshot(g)) {
		t.Fatalf("loaded memory differs from the saved one: buckets %v vs %v", g.Buckets(), f.Buckets())
	}
	if again := save(t, g); !bytes.Equal(again, state) {
		t.Errorf("Save after Load differs from the original state")
	}
	// Training resumes identically from the loaded state.
	for step := uint64(3); step < 5; step++ {
		key := compress.Key{Bucket: 7, Step: step}
		pf, err1 := f.Compress(nil, ramp(1000, 0.3), key)
		pg, err2 := g.Compress(nil, ramp(1000, 0.3), key)
		if err1 != nil || err2 != nil || !bytes.Equal(pf, pg) {
			t.Fatalf("step %d: payloads after Load differ (%v, %v)", step, err1, err2)
		}
	}
	// An empty memory round-trips too.
	empty := compress.NewErrorFeedback(compresstest.MustParse(t, "none"))
	if err := g.Load(bytes.NewReader(save(t, empty))); err != nil || len(g.Buckets()) != 0 {
		t.Errorf("loading an empty state: %v, buckets %v", err, g.Buckets())
	}
}

// TestFeedbackSaveLoadValues round-trips residuals holding the float32 edge
// values: signed zeros, subnormals, the largest finite.
func TestFeedbackSaveLoadValues(t *testing.T) {
	vals := []float32{0, float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32, -math.SmallestNonzeroFloat32, math.MaxFloat32, -math.MaxFloat32, 1e-40}
	// Compressing with none leaves a zero residual; build the state by hand.
	state := efState(t, 1, efBucket{id: 5, vals: vals})
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "none"))
	if err := f.Load(bytes.NewReader(state)); err != nil {
		t.Fatal(err)
	}
	got := f.Residual(5)
	for i, v := range vals {
		if math.Float32bits(got[i]) != math.Float32bits(v) {
			t.Errorf("residual[%d] = %v, want %v", i, got[i], v)
		}
	}
	if !bytes.Equal(save(t, f), state) {
		t.Errorf("Save does not reproduce the loaded state")
	}
}

type efBucket struct {
	id   uint64
	n    uint64 // claimed length; len(vals) when 0
	vals []float32
}

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// efState encodes an error-feedback state in the documented checkpoint
// format, with a valid checksum.
func efState(t testing.TB, version byte, buckets ...efBucket) []byte {
	t.Helper()
	b := append([]byte("GCEF"), version)
	b = binary.LittleEndian.AppendUint32(b, uint32(len(buckets)))
	for _, bk := range buckets {
		n := bk.n
		if n == 0 {
			n = uint64(len(bk.vals))
		}
		b = binary.LittleEndian.AppendUint64(b, bk.id)
		b = binary.LittleEndian.AppendUint64(b, n)
		for _, v := range bk.vals {
			b = binary.LittleEndian.AppendUint32(b, math.Float32bits(v))
		}
	}
	return binary.LittleEndian.AppendUint32(b, crc32.Checksum(b, castagnoli))
}

func TestFeedbackLoadErrors(t *testing.T) {
	corrupt := func(off int64, msg string) func(*testing.T, error) {
		return func(t *testing.T, err error) {
			var ce *compress.CorruptInputError
			if !errors.As(err, &ce) || ce.Offset != off || !strings.Contains(err.Error(), msg) {
				t.Fatalf("got %v, want a *CorruptInputError at offset %d saying %q", err, off, msg)
			}
		}
	}
	valid := efState(t, 1, efBucket{id: 3, vals: []float32{1, 2}})
	badCRC := bytes.Clone(valid)
	badCRC[len(badCRC)-1] ^= 1
	badMagic := bytes.Clone(valid)
	badMagic[1] = 'X'
	cases := []struct {
		name  string
		state []byte
		check func(*testing.T, error)
	}{
		{"empty", nil, corrupt(0, "truncated")},
		{"bad magic", badMagic, corrupt(0, `bad error-feedback magic "GXEF"`)},
		{"version 2", efState(t, 2), func(t *testing.T, err error) {
			var ve *compress.VersionError
			if !errors.As(err, &ve) || ve.Got != 2 || ve.Want != 1 || !strings.Contains(err.Error(), "error-feedback state version 2") {
				t.Fatalf("got %v, want a *VersionError for error-feedback state version 2", err)
			}
		}},
		{"checksum", badCRC, func(t *testing.T, err error) {
			var ce *compress.ChecksumError
			if !errors.As(err, &ce) {
				t.Fatalf("got %v, want a *ChecksumError", err)
			}
		}},
		{"no checksum", valid[:len(valid)-4], corrupt(int64(len(valid)-4), "before its checksum")},
		{"duplicate bucket", efState(t, 1, efBucket{id: 3, vals: []float32{1}}, efBucket{id: 3, vals: []float32{2}}), corrupt(9+20, "bucket 3 appears twice")},
		{"NaN", efState(t, 1, efBucket{id: 4, vals: []float32{1, float32(math.NaN())}}), corrupt(9+16+4, "non-finite residual in bucket 4")},
		{"-Inf", efState(t, 1, efBucket{id: 4, vals: []float32{float32(math.Inf(-1))}}), corrupt(9+16, "non-finite residual in bucket 4")},
		{"length > MaxElements", efState(t, 1, efBucket{id: 6, n: 1 << 32}), corrupt(9+8, "bucket 6 length 4294967296 exceeds")},
		{"count past the data", binary.LittleEndian.AppendUint32([]byte("GCEF\x01"), 2), corrupt(9, "truncated")},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := primed(t)
			before := snapshot(f)
			c.check(t, f.Load(bytes.NewReader(c.state)))
			if !sameMemory(before, snapshot(f)) {
				t.Errorf("memory changed although Load failed")
			}
		})
	}
}

// TestFeedbackLoadTruncatedAndFlipped loads every prefix of a real state and
// the state with each byte flipped: every one fails with a typed error and
// leaves the memory unchanged.
func TestFeedbackLoadTruncatedAndFlipped(t *testing.T) {
	state := save(t, primed(t))
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "fp16"))
	if _, err := f.Compress(nil, ramp(9, 1.5), compress.Key{Bucket: 1}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(f)
	typed := func(err error) bool {
		var ce *compress.CorruptInputError
		var cs *compress.ChecksumError
		var ve *compress.VersionError
		return errors.As(err, &ce) || errors.As(err, &cs) || errors.As(err, &ve)
	}
	for i := range len(state) {
		if err := f.Load(bytes.NewReader(state[:i])); !typed(err) {
			t.Fatalf("first %d of %d bytes: got %v, want a typed error", i, len(state), err)
		}
	}
	for i := range state {
		bad := bytes.Clone(state)
		bad[i] ^= 0x40
		if err := f.Load(bytes.NewReader(bad)); !typed(err) {
			t.Fatalf("byte %d of %d flipped: got %v, want a typed error", i, len(state), err)
		}
	}
	if !sameMemory(before, snapshot(f)) {
		t.Errorf("memory changed although every Load failed")
	}
}

// TestFeedbackLoadHugeLength feeds a state that claims a bucket of 2^32−1
// elements but holds a few bytes: Load must fail having allocated about one
// read chunk, not the claimed 16 GiB.
func TestFeedbackLoadHugeLength(t *testing.T) {
	state := efState(t, 1, efBucket{id: 1, n: compress.MaxElements, vals: []float32{1, 2, 3}})
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "none"))
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	err := f.Load(bytes.NewReader(state))
	runtime.ReadMemStats(&m1)
	var ce *compress.CorruptInputError
	if !errors.As(err, &ce) {
		t.Fatalf("got %v, want a *CorruptInputError", err)
	}
	const limit = 4 << 20 // a 256 KiB read chunk and change
	if got := m1.TotalAlloc - m0.TotalAlloc; got > limit {
		t.Errorf("Load of a %d-byte state claiming 2^32−1 elements allocated %d bytes", len(state), got)
	}
}

// TestFeedbackSizeError changes a bucket's length between calls.
func TestFeedbackSizeError(t *testing.T) {
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "fp16"))
	if _, err := f.Compress(nil, ramp(8, 1.1), compress.Key{Bucket: 4}); err != nil {
		t.Fatal(err)
	}
	before := snapshot(f)
	dst := []byte("keep")
	out, err := f.Compress(dst, ramp(9, 1), compress.Key{Bucket: 4, Step: 1})
	var se *compress.SizeError
	if !errors.As(err, &se) || se.Got != 9 || se.Want != 8 || !strings.Contains(se.What, "bucket 4") {
		t.Fatalf("got %v, want a *SizeError naming bucket 4, 9 vs 8", err)
	}
	if string(out) != "keep" || !sameMemory(before, snapshot(f)) {
		t.Errorf("a failed call changed dst (%q) or the memory", out)
	}
	// Another bucket is independent, and Reset forgets the length.
	if _, err := f.Compress(nil, ramp(9, 1), compress.Key{Bucket: 5}); err != nil {
		t.Errorf("another bucket: %v", err)
	}
	f.Reset()
	if len(f.Buckets()) != 0 || f.Residual(4) != nil {
		t.Fatalf("Reset left buckets %v", f.Buckets())
	}
	if _, err := f.Compress(nil, ramp(9, 1), compress.Key{Bucket: 4}); err != nil {
		t.Errorf("after Reset: %v", err)
	}
}

// TestFeedbackConcurrent compresses several buckets from several goroutines
// (and the same bucket from two of them) while Save and Buckets run; under
// -race it checks the locking, and the result equals a serial run.
func TestFeedbackConcurrent(t *testing.T) {
	const buckets, steps, n = 6, 8, 300
	c := compresstest.MustParse(t, "fp16", compress.WithWorkers(2), compress.WithMinParallel(1))
	f := compress.NewErrorFeedback(c)
	var wg sync.WaitGroup
	for b := range uint64(buckets) {
		wg.Go(func() {
			for s := range uint64(steps) {
				if _, err := f.Compress(nil, ramp(n, float32(b+s)+0.3), compress.Key{Bucket: b, Step: s}); err != nil {
					t.Error(err)
				}
			}
		})
	}
	shared := func() {
		for s := range uint64(steps) {
			if _, err := f.Compress(nil, ramp(n, 0.7), compress.Key{Bucket: 100, Step: s}); err != nil {
				t.Error(err)
			}
		}
	}
	wg.Go(shared)
	wg.Go(shared)
	wg.Go(func() {
		for range steps {
			var buf bytes.Buffer
			if err := f.Save(&buf); err != nil {
				t.Error(err)
			}
			f.Buckets()
		}
	})
	wg.Wait()

	serial := compress.NewErrorFeedback(compresstest.MustParse(t, "fp16"))
	for b := range uint64(buckets) {
		for s := range uint64(steps) {
			if _, err := serial.Compress(nil, ramp(n, float32(b+s)+0.3), compress.Key{Bucket: b, Step: s}); err != nil {
				t.Fatal(err)
			}
		}
	}
	got, want := snapshot(f), snapshot(serial)
	delete(got, 100)
	if !sameMemory(got, want) {
		t.Errorf("concurrent residuals differ from a serial run")
	}
}

// TestFeedbackTwoPhase settles Begin each way and checks the residual
// against its definition, bit for bit, with s = e + g rounded once.
func TestFeedbackTwoPhase(t *testing.T) {
	c := compresstest.MustParse(t, "int4:bucket=16")
	const n = 100
	g := ramp(n, 0.9)
	for _, tc := range []struct {
		name   string
		settle func(p *compress.Pending)
		want   func(e, s, dec []float32) []float32
	}{
		{"commit", (*compress.Pending).Commit, func(_, s, dec []float32) []float32 {
			w := make([]float32, n)
			for i := range w {
				w[i] = s[i] - dec[i]
			}
			return w
		}},
		{"retain", (*compress.Pending).Retain, func(_, s, _ []float32) []float32 { return s }},
		{"discard", (*compress.Pending).Discard, func(e, _, _ []float32) []float32 { return e }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := compress.NewErrorFeedback(c)
			key := compress.Key{Bucket: 3, Step: 1}
			if _, err := f.Compress(nil, ramp(n, 1.7), compress.Key{Bucket: 3}); err != nil {
				t.Fatal(err)
			}
			e := f.Residual(3)
			s := make([]float32, n)
			for i := range s {
				s[i] = e[i] + g[i]
			}
			payload, err := c.Compress(nil, s, key)
			if err != nil {
				t.Fatal(err)
			}
			dec := make([]float32, n)
			if err := c.Decompress(dec, payload); err != nil {
				t.Fatal(err)
			}
			out, p, err := f.Begin([]byte("x"), g, key)
			if err != nil {
				t.Fatal(err)
			}
			if string(out[:1]) != "x" || !bytes.Equal(out[1:], payload) {
				t.Fatalf("Begin's payload differs from Compress of e + g")
			}
			tc.settle(p)
			p.Commit() // a second settlement does nothing
			p.Retain()
			got, want := f.Residual(3), tc.want(e, s, dec)
			for i := range want {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Fatalf("residual[%d] = %v, want %v", i, got[i], want[i])
				}
			}
		})
	}
}

// TestFeedbackBeginHolds: a bucket with an unsettled Begin makes another
// call on it wait; a failed Begin holds nothing and leaves memory as it was.
func TestFeedbackBeginHolds(t *testing.T) {
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "fp16"))
	_, p, err := f.Begin(nil, ramp(8, 1.1), compress.Key{Bucket: 1})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if _, err := f.Compress(nil, ramp(8, 1), compress.Key{Bucket: 1, Step: 1}); err != nil {
			t.Error(err)
		}
	}()
	select {
	case <-done:
		t.Fatal("Compress ran while the bucket's Begin was unsettled")
	case <-time.After(20 * time.Millisecond):
	}
	p.Discard()
	<-done

	before := snapshot(f)
	bad := ramp(8, 1)
	bad[5] = float32(math.NaN())
	out, p, err := f.Begin([]byte("keep"), bad, compress.Key{Bucket: 1, Step: 2})
	var nf *compress.NonFiniteError
	if !errors.As(err, &nf) || nf.Index != 5 || p != nil || string(out) != "keep" {
		t.Fatalf("Begin with a NaN: %q, %v, %v; want dst unchanged, nil, *NonFiniteError at 5", out, p, err)
	}
	if !sameMemory(before, snapshot(f)) {
		t.Errorf("a failed Begin changed the memory")
	}
	if _, err := f.Compress(nil, ramp(8, 1), compress.Key{Bucket: 1, Step: 3}); err != nil {
		t.Errorf("after a failed Begin: %v", err)
	}
}

// TestFeedbackSetResidual checks that SetResidual installs an exact copy
// that Save writes and the next Compress folds in, and refuses bad input.
func TestFeedbackSetResidual(t *testing.T) {
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "int8"))
	e := []float32{0.5, float32(math.Copysign(0, -1)), -3, 1e-30}
	if err := f.SetResidual(7, e); err != nil {
		t.Fatal(err)
	}
	e[0] = 99 // a copy was installed
	got := f.Residual(7)
	if math.Float32bits(got[0]) != math.Float32bits(0.5) || math.Float32bits(got[1]) != 1<<31 {
		t.Fatalf("Residual = %v (bits of [1] %#x), want [0.5 -0 -3 1e-30]", got, math.Float32bits(got[1]))
	}
	var saved bytes.Buffer
	if err := f.Save(&saved); err != nil {
		t.Fatal(err)
	}
	g := compress.NewErrorFeedback(compresstest.MustParse(t, "int8"))
	if err := g.Load(bytes.NewReader(saved.Bytes())); err != nil {
		t.Fatal(err)
	}
	if r := g.Residual(7); !slices.Equal(r, got) {
		t.Fatalf("after Save/Load %v, want %v", r, got)
	}
	if _, err := f.Compress(nil, make([]float32, 3), compress.Key{Bucket: 7}); err == nil {
		t.Fatal("Compress of 3 elements into a 4-element residual: no error")
	}
	var nf *compress.NonFiniteError
	if err := f.SetResidual(7, []float32{1, float32(math.NaN())}); !errors.As(err, &nf) || nf.Index != 1 {
		t.Fatalf("SetResidual with a NaN: %v, want a NonFiniteError at index 1", err)
	}
	if r := f.Residual(7); !slices.Equal(r, got) {
		t.Fatalf("a refused SetResidual changed the memory to %v", r)
	}
}

// TestCommitMasked: for a sparse compressor, CommitMasked zeroes u exactly
// at the indices the payload kept and commits as Commit does; for a dense
// one it leaves u alone.
func TestCommitMasked(t *testing.T) {
	g := ramp(64, 1)
	for _, spec := range []string{"topk:0.125", "randomk:0.125", "int8"} {
		f := compress.NewErrorFeedback(compresstest.MustParse(t, spec))
		ref := compress.NewErrorFeedback(compresstest.MustParse(t, spec))
		key := compress.Key{Bucket: 1, Step: 3}
		p1, pend, err := f.Begin(nil, g, key)
		if err != nil {
			t.Fatal(err)
		}
		u := make([]float32, len(g))
		for i := range u {
			u[i] = 1
		}
		pend.CommitMasked(u)
		p2, err := ref.Compress(nil, g, key)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(p1, p2) || !slices.Equal(f.Residual(1), ref.Residual(1)) {
			t.Errorf("%s: CommitMasked committed differently from Compress", spec)
		}
		d := make([]float32, len(g))
		if err := f.Compressor().Decompress(d, p1); err != nil {
			t.Fatal(err)
		}
		zeroed := 0
		for i := range u {
			kept := d[i] != 0
			if spec == "int8" {
				kept = false // a dense payload masks nothing
			}
			if kept != (u[i] == 0) {
				t.Fatalf("%s: element %d: decoded %v, u %v", spec, i, d[i], u[i])
			}
			if u[i] == 0 {
				zeroed++
			}
		}
		if spec != "int8" && zeroed != 8 {
			t.Errorf("%s: %d elements of u zeroed, want k = 8", spec, zeroed)
		}
	}
}

// TestFeedbackFlush: Flush hands e + g to the caller; Commit empties the
// memory, Retain keeps e + g, Discard keeps e; a non-finite sum leaves
// grad and memory untouched and holds nothing.
func TestFeedbackFlush(t *testing.T) {
	const n = 100
	for _, spec := range []string{"topk:0.05", "int4:bucket=16"} {
		for _, tc := range []struct {
			name   string
			settle func(p *compress.Pending)
			want   func(e, s []float32) []float32
		}{
			{"commit", (*compress.Pending).Commit, func(e, _ []float32) []float32 { return make([]float32, len(e)) }},
			{"commit masked", func(p *compress.Pending) { p.CommitMasked(make([]float32, n)) }, func(e, _ []float32) []float32 { return make([]float32, len(e)) }},
			{"retain", (*compress.Pending).Retain, func(_, s []float32) []float32 { return s }},
			{"discard", (*compress.Pending).Discard, func(e, _ []float32) []float32 { return e }},
		} {
			t.Run(spec+"/"+tc.name, func(t *testing.T) {
				f := compress.NewErrorFeedback(compresstest.MustParse(t, spec))
				if _, err := f.Compress(nil, ramp(n, 1.7), compress.Key{Bucket: 3}); err != nil {
					t.Fatal(err)
				}
				e := f.Residual(3)
				g := ramp(n, 0.9)
				s := make([]float32, n)
				for i := range s {
					s[i] = e[i] + g[i]
				}
				p, err := f.Flush(g, compress.Key{Bucket: 3, Step: 1})
				if err != nil {
					t.Fatal(err)
				}
				if p.HeldBack() != 0 {
					t.Errorf("a flush holds back %v, want 0", p.HeldBack())
				}
				if !slices.Equal(g, s) {
					t.Fatal("Flush did not leave e + g in grad")
				}
				tc.settle(p)
				if got, want := f.Residual(3), tc.want(e, s); !slices.Equal(got, want) {
					t.Fatalf("residual after %s: %v, want %v", tc.name, got[:4], want[:4])
				}
			})
		}
	}
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "topk:0.05"))
	if _, err := f.Compress(nil, ramp(n, 1.7), compress.Key{Bucket: 0}); err != nil {
		t.Fatal(err)
	}
	e := f.Residual(0)
	g := ramp(n, 0.5)
	g[7], g[9] = float32(math.Inf(1)), float32(math.NaN())
	before := slices.Clone(g)
	p, err := f.Flush(g, compress.Key{Bucket: 0, Step: 1})
	var nf *compress.NonFiniteError
	if !errors.As(err, &nf) || nf.Index != 7 || p != nil {
		t.Fatalf("Flush of a gradient with Inf at 7: %v, %v; want a *NonFiniteError at 7 and no Pending", p, err)
	}
	if !slices.Equal(math32bits(g), math32bits(before)) || !slices.Equal(f.Residual(0), e) {
		t.Fatal("a refused Flush changed grad or the memory")
	}
	if _, err := f.Flush(make([]float32, n+1), compress.Key{Bucket: 0}); err == nil {
		t.Fatal("Flush of another length: no error")
	}
}

// TestHeldBack: Pending.HeldBack is the norm of the residual Commit
// installs, for dense and sparse codecs.
func TestHeldBack(t *testing.T) {
	for _, spec := range []string{"topk:0.1", "randomk:0.1", "int8", "sign", "fp16"} {
		f := compress.NewErrorFeedback(compresstest.MustParse(t, spec))
		g := ramp(257, 1.3)
		_, p, err := f.Begin(nil, g, compress.Key{Bucket: 2, Step: 5})
		if err != nil {
			t.Fatal(err)
		}
		got := p.HeldBack()
		p.Commit()
		var sum float64
		for _, v := range f.Residual(2) {
			sum += float64(v) * float64(v)
		}
		if want := math.Sqrt(sum); math.Abs(got-want) > 1e-12*max(want, 1) {
			t.Errorf("%s: HeldBack %v, the committed residual's norm %v", spec, got, want)
		}
		if spec != "fp16" && got == 0 {
			t.Errorf("%s: HeldBack 0 for a lossy codec", spec)
		}
	}
}

func math32bits(x []float32) []uint32 {
	out := make([]uint32, len(x))
	for i, v := range x {
		out[i] = math.Float32bits(v)
	}
	return out
}

// TestCompressFeedbackSizes: Parse's quantizers and sign are
// FeedbackCompressors, top-k is not (its sparse form is a
// SparseFeedbackCompressor, as random-k's), and slices of another length
// than g are a *SizeError with dst (and sel) unchanged.
func TestCompressFeedbackSizes(t *testing.T) {
	for _, spec := range []string{"int8", "int4", "int2", "sign"} {
		fc, ok := compresstest.MustParse(t, spec).(compress.FeedbackCompressor)
		if !ok {
			t.Fatalf("%s is not a compress.FeedbackCompressor", spec)
		}
		n := 100
		ok4 := func(k int) []float32 { return make([]float32, k) }
		for i, args := range [][4][]float32{{ok4(9), ok4(n), ok4(n), ok4(n)}, {ok4(n), ok4(n), ok4(9), ok4(n)}, {ok4(n), ok4(n), ok4(n), ok4(9)}} {
			out, err := fc.CompressFeedback([]byte("x"), args[0], args[1], args[2], compress.Key{}, args[3])
			var se *compress.SizeError
			if !errors.As(err, &se) || string(out) != "x" {
				t.Errorf("%s, case %d: %q, %v; want a *SizeError and dst unchanged", spec, i, out, err)
			}
		}
	}
	if _, ok := compresstest.MustParse(t, "topk:0.1").(compress.FeedbackCompressor); ok {
		t.Error("topk:0.1 is a compress.FeedbackCompressor")
	}
	for _, spec := range []string{"topk:0.1", "topk:0.1:sampled", "randomk:0.1"} {
		sc, ok := compresstest.MustParse(t, spec).(compress.SparseFeedbackCompressor)
		if !ok {
			t.Fatalf("%s is not a compress.SparseFeedbackCompressor", spec)
		}
		n := 100
		for i, args := range [][3][]float32{{make([]float32, 9), make([]float32, n), make([]float32, n)}, {make([]float32, n), make([]float32, n), make([]float32, 9)}} {
			out, sel, err := sc.CompressSelectFeedback([]byte("x"), args[0], args[1], args[2], compress.Key{}, []uint32{7})
			var se *compress.SizeError
			if !errors.As(err, &se) || string(out) != "x" || len(sel) != 1 {
				t.Errorf("%s, case %d: %q, %v, %v; want a *SizeError, dst and sel unchanged", spec, i, out, sel, err)
			}
		}
	}
}

// TestFeedbackBeginResidual: the caller's residual is what Commit
// installs; Retain keeps e + g, Discard e; a wrong length is a
// *SizeError, and the bucket is held until settled.
func TestFeedbackBeginResidual(t *testing.T) {
	none, err := compress.Parse("none")
	if err != nil {
		t.Fatal(err)
	}
	f := compress.NewErrorFeedback(none)
	key := compress.Key{Bucket: 3}
	if err := f.SetResidual(3, []float32{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	s, res, p, err := f.BeginResidual([]float32{10, 20, 30}, key)
	if err != nil || !slices.Equal(s, []float32{11, 22, 33}) || len(res) != 3 {
		t.Fatalf("BeginResidual = %v, %v, %v", s, res, err)
	}
	held := make(chan []float32)
	go func() { held <- f.Residual(3) }() // waits for the settle
	copy(res, []float32{-1, 0, 5})
	select {
	case r := <-held:
		t.Fatalf("Residual returned %v before the Pending was settled", r)
	case <-time.After(20 * time.Millisecond):
	}
	p.Commit()
	if r := <-held; !slices.Equal(r, []float32{-1, 0, 5}) {
		t.Fatalf("after Commit: %v, want the caller's residual", r)
	}
	_, _, p, _ = f.BeginResidual([]float32{1, 1, 1}, key)
	p.Retain()
	if r := f.Residual(3); !slices.Equal(r, []float32{0, 1, 6}) {
		t.Fatalf("after Retain: %v, want e + g", r)
	}
	_, _, p, _ = f.BeginResidual([]float32{100, 100, 100}, key)
	p.Discard()
	if r := f.Residual(3); !slices.Equal(r, []float32{0, 1, 6}) {
		t.Fatalf("after Discard: %v, want e unchanged", r)
	}
	var se *compress.SizeError
	if _, _, _, err := f.BeginResidual(make([]float32, 4), key); !errors.As(err, &se) {
		t.Fatalf("BeginResidual of another length: %v, want a *SizeError", err)
	}
}

// TestPendingScale: after Scale(c), Commit installs c·(s − D(c)), each
// element one float32 product, and CommitMasked masks as without it;
// Retain and Discard are unaffected; HeldBack measures the scaled
// residual; after the settlement, and on a Flush's Pending, Scale does
// nothing.
func TestPendingScale(t *testing.T) {
	const c = float32(0.7)
	g := ramp(257, 1.3)
	for _, spec := range []string{"topk:0.1", "randomk:0.1", "int8", "int4:bucket=16", "sign", "fp16"} {
		key := compress.Key{Bucket: 2, Step: 5}
		begin := func(f *compress.ErrorFeedback) *compress.Pending {
			t.Helper()
			// A first step leaves memory, so that s = e + g.
			if _, err := f.Compress(nil, ramp(257, 0.4), compress.Key{Bucket: 2, Step: 4}); err != nil {
				t.Fatal(err)
			}
			_, p, err := f.Begin(nil, g, key)
			if err != nil {
				t.Fatal(err)
			}
			return p
		}
		ref := compress.NewErrorFeedback(compresstest.MustParse(t, spec))
		rp := begin(ref)
		held := rp.HeldBack()
		u0 := make([]float32, len(g))
		for i := range u0 {
			u0[i] = 1
		}
		rp.CommitMasked(u0)
		want := ref.Residual(2)
		for i, v := range want {
			want[i] = c * v
		}
		f := compress.NewErrorFeedback(compresstest.MustParse(t, spec))
		p := begin(f)
		p.Scale(c)
		if got, w := p.HeldBack(), float64(c)*held; math.Abs(got-w) > 1e-6*max(w, 1e-30) {
			t.Errorf("%s: HeldBack after Scale %v, want about %v", spec, got, w)
		}
		u := make([]float32, len(g))
		for i := range u {
			u[i] = 1
		}
		p.CommitMasked(u)
		p.Scale(2) // settled: nothing
		if got := f.Residual(2); !slices.Equal(math32bits(got), math32bits(want)) {
			t.Errorf("%s: residual after Scale and Commit %v, want %v", spec, got[:6], want[:6])
		}
		if !slices.Equal(u, u0) {
			t.Errorf("%s: CommitMasked after Scale masked u differently", spec)
		}
		for _, settle := range []func(*compress.Pending){(*compress.Pending).Retain, (*compress.Pending).Discard} {
			f, plain := compress.NewErrorFeedback(compresstest.MustParse(t, spec)), compress.NewErrorFeedback(compresstest.MustParse(t, spec))
			p, q := begin(f), begin(plain)
			p.Scale(c)
			settle(p)
			settle(q)
			if !slices.Equal(math32bits(f.Residual(2)), math32bits(plain.Residual(2))) {
				t.Errorf("%s: Scale changed what Retain or Discard keeps", spec)
			}
		}
	}
	f := compress.NewErrorFeedback(compresstest.MustParse(t, "topk:0.05"))
	if _, err := f.Compress(nil, ramp(100, 1.7), compress.Key{Bucket: 3}); err != nil {
		t.Fatal(err)
	}
	p, err := f.Flush(ramp(100, 0.9), compress.Key{Bucket: 3, Step: 1})
	if err != nil {
		t.Fatal(err)
	}
	p.Scale(c)
	p.Commit()
	if got := f.Residual(3); !slices.Equal(got, make([]float32, 100)) {
		t.Errorf("a flush's Commit after Scale left %v, want zeros", got[:4])
	}
	none := compress.NewErrorFeedback(compresstest.MustParse(t, "none"))
	_, res, p, err := none.BeginResidual([]float32{1, 2, 3}, compress.Key{})
	if err != nil {
		t.Fatal(err)
	}
	copy(res, []float32{2, -4, 0.3})
	p.Scale(0.5)
	p.Commit()
	if got := none.Residual(0); !slices.Equal(got, []float32{1, -2, 0.5 * float32(0.3)}) {
		t.Errorf("BeginResidual's residual after Scale: %v, want 1 -2 0.15", got)
	}
}
