package compresstest

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
)

// checkErrorFeedback runs compress.NewErrorFeedback over the backend for a
// few steps on two interleaved buckets of different lengths and checks the
// invariant stated on ErrorFeedback: with s = float32(e_old + g),
// e_new == float32(s − D(c)) bit for bit, where D(c) is the backend's decoding
// of the payload Compress returned (appended after a prefix it must keep).
func checkErrorFeedback(t *testing.T, e *env) {
	f := compress.NewErrorFeedback(e.c)
	prefix := []byte("prefix")
	lengths := map[uint64]int{5: 7, 9: e.info.bucket + 1}
	for step := range uint64(4) {
		for _, bucket := range []uint64{5, 9} {
			n := lengths[bucket]
			g := wide(n, step<<8|bucket)
			old := f.Residual(bucket)
			if old == nil {
				old = make([]float32, n)
			}
			key := compress.Key{Bucket: bucket, Step: step}
			out, err := f.Compress(slices.Clip(prefix), g, key)
			if err != nil {
				t.Fatalf("step %d bucket %d: %v", step, bucket, err)
			}
			if !bytes.Equal(out[:len(prefix)], prefix) {
				t.Fatalf("step %d bucket %d: Compress changed the bytes before the payload", step, bucket)
			}
			d := mustDecompress(t, e.c, out[len(prefix):], n)
			got := f.Residual(bucket)
			r := &report{t: t, what: fmt.Sprintf("step %d bucket %d", step, bucket)}
			for i := range g {
				s := old[i] + g[i]
				if want := s - d[i]; math.Float32bits(got[i]) != math.Float32bits(want) {
					r.errorf("residual[%d] = %v, want float32(%v − %v) = %v", i, got[i], s, d[i], want)
				}
			}
			r.done()
		}
	}
}

// checkDeterminism checks that the backend's payloads are a function of
// (input, spec, key) alone: the same twice in a row, and byte-identical to
// the CPU reference run serially and with 2 and 3 workers splitting even the
// smallest input. Decoding with each of them gives the same bits.
func checkDeterminism(t *testing.T, e *env) {
	var refs []compress.Compressor
	for _, opts := range [][]compress.Option{
		{compress.WithWorkers(1)},
		{compress.WithWorkers(2), compress.WithMinParallel(1)},
		{compress.WithWorkers(3), compress.WithMinParallel(1)},
	} {
		ref, err := compress.Parse(e.spec, opts...)
		if err != nil {
			t.Fatalf("CPU reference: %v", err)
		}
		refs = append(refs, ref)
	}
	key := compress.Key{Bucket: 11, Step: 3}
	for _, n := range e.lengths(true) {
		x := wide(n, 17)
		p := mustCompress(t, e.c, x, key)
		if again := mustCompress(t, e.c, x, key); !bytes.Equal(p, again) {
			t.Errorf("n=%d: two calls with the same input and key give different payloads", n)
		}
		d := mustDecompress(t, e.c, p, n)
		for w, ref := range refs {
			if rp := mustCompress(t, ref, x, key); !bytes.Equal(p, rp) {
				t.Errorf("n=%d: payload differs from the CPU reference with %d worker(s) (lengths %d and %d, first difference at byte %d)",
					n, w+1, len(p), len(rp), firstDiff(p, rp))
			}
			if rd := mustDecompress(t, ref, p, n); !equalBits(d, rd) {
				t.Errorf("n=%d: decoding differs from the CPU reference with %d worker(s)", n, w+1)
			}
		}
	}
}

// checkKeyDependence checks that codecs that draw random numbers decode to
// different values under a different Key.Step or Key.Bucket, and that the
// others decode to the same values whatever the key.
func checkKeyDependence(t *testing.T, e *env) {
	if !e.info.stochastic() && !e.info.keyFree() {
		t.Skipf("%s may or may not draw from the key", e.spec)
	}
	const n = 1000
	x := wide(n, 23)
	base := compress.Key{Bucket: 4, Step: 8}
	d0 := mustDecompress(t, e.c, mustCompress(t, e.c, x, base), n)
	for _, key := range []compress.Key{{Bucket: 4, Step: 9}, {Bucket: 5, Step: 8}} {
		d := mustDecompress(t, e.c, mustCompress(t, e.c, x, key), n)
		switch same := equalBits(d0, d); {
		case e.info.stochastic() && same:
			t.Errorf("key %+v decodes exactly as key %+v: the random stream ignores the key", key, base)
		case e.info.keyFree() && !same:
			t.Errorf("key %+v decodes differently from key %+v, but %s is deterministic", key, base, e.spec)
		}
	}
}

// checkNonFinite puts NaN, +Inf and -Inf (and, for fp16 and bf16, a finite
// value the format cannot hold) at the first, a middle and the last index and
// checks for a *compress.NonFiniteError naming that index, with nothing
// appended to dst and the error-feedback residual unchanged. With two bad
// values the lower index is reported.
func checkNonFinite(t *testing.T, e *env) {
	bad := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1))}
	switch e.info.codec {
	case compress.CodecFP16:
		bad = append(bad, 65520, -1e6)
	case compress.CodecBF16:
		bad = append(bad, math.MaxFloat32)
	}
	prefix := []byte("prefix")
	const bucket = 3
	for _, n := range []int{1, 2, 7, e.info.bucket + 1, 1000} {
		f := compress.NewErrorFeedback(e.c)
		if _, err := f.Compress(nil, wide(n, 1), compress.Key{Bucket: bucket}); err != nil {
			t.Fatalf("n=%d: priming error feedback: %v", n, err)
		}
		before := f.Residual(bucket)
		for _, at := range slices.Compact([]int{0, n / 2, n - 1}) {
			for _, v := range bad {
				x := wide(n, 2)
				x[at] = v
				what := fmt.Sprintf("n=%d x[%d]=%v", n, at, v)
				dst := slices.Clip(prefix)
				out, err := e.c.Compress(dst, x, compress.Key{Bucket: bucket, Step: 1})
				wantNonFinite(t, what, err, at)
				if len(out) != len(prefix) || !bytes.Equal(out, prefix) {
					t.Errorf("%s: Compress returned %d bytes, want dst (%d bytes) unchanged", what, len(out), len(prefix))
				}
				out, err = f.Compress(dst, x, compress.Key{Bucket: bucket, Step: 1})
				wantNonFinite(t, what+" (error feedback)", err, at)
				if len(out) != len(prefix) {
					t.Errorf("%s: ErrorFeedback.Compress returned %d bytes, want dst (%d bytes) unchanged", what, len(out), len(prefix))
				}
				if !equalBits(f.Residual(bucket), before) {
					t.Fatalf("%s: the error-feedback residual changed on error", what)
				}
			}
		}
		if n >= 3 {
			x := wide(n, 3)
			x[n/2], x[n-1] = float32(math.Inf(1)), float32(math.NaN())
			_, err := e.c.Compress(nil, x, compress.Key{})
			wantNonFinite(t, fmt.Sprintf("n=%d, two bad values", n), err, n/2)
		}
	}
}

func wantNonFinite(t *testing.T, what string, err error, at int) {
	t.Helper()
	var nf *compress.NonFiniteError
	switch {
	case !errors.As(err, &nf):
		t.Errorf("%s: got error %v, want a *compress.NonFiniteError", what, err)
	case nf.Index != at:
		t.Errorf("%s: NonFiniteError names index %d, want %d", what, nf.Index, at)
	}
}

// sentinel is a NaN with a payload no computation produces, put around
// destination slices to catch writes outside them.
var sentinel = math.Float32frombits(0x7fc0_5a5a)

// guardLen is the number of sentinel elements (or bytes) on each side.
const guardLen = 64

// checkGuards checks that Compress appends into spare capacity without
// touching the bytes before dst's length or past its capacity, writes at most
// MaxEncodedLen(n) bytes (exactly that without a lossless stage), and that
// Decompress and DecompressAdd write only inside dst.
func checkGuards(t *testing.T, e *env) {
	key := compress.Key{Bucket: 2, Step: 5}
	for _, n := range []int{0, 1, 7, e.info.bucket + 1, 1000} {
		x := wide(n, 4)
		want := mustCompress(t, e.c, x, key)
		max := e.c.MaxEncodedLen(n)
		switch {
		case len(want) > max:
			t.Errorf("n=%d: payload of %d bytes exceeds MaxEncodedLen %d", n, len(want), max)
		case !e.info.lossless && len(want) != max:
			t.Errorf("n=%d: payload of %d bytes, want exactly MaxEncodedLen %d without a lossless stage", n, len(want), max)
		}

		const prefix = 7
		buf := make([]byte, prefix+max+guardLen)
		for i := range buf {
			buf[i] = 0xa5
		}
		out, err := e.c.Compress(buf[:prefix:prefix+max], x, key)
		if err != nil {
			t.Fatalf("n=%d: Compress onto a prefix: %v", n, err)
		}
		switch {
		case &out[0] != &buf[0]:
			t.Errorf("n=%d: Compress reallocated although dst had MaxEncodedLen spare capacity", n)
		case !bytes.Equal(out[prefix:], want):
			t.Errorf("n=%d: payload appended after a prefix differs from the payload on nil", n)
		}
		if bytes.Count(buf[:prefix], []byte{0xa5}) != prefix {
			t.Errorf("n=%d: Compress overwrote the bytes before len(dst)", n)
		}
		if bytes.Count(buf[prefix+max:], []byte{0xa5}) != guardLen {
			t.Errorf("n=%d: Compress wrote past cap(dst)", n)
		}

		ref := mustDecompress(t, e.c, want, n)
		for _, add := range []bool{false, true} {
			fbuf := make([]float32, guardLen+n+guardLen)
			for i := range fbuf {
				fbuf[i] = sentinel
			}
			dst := fbuf[guardLen : guardLen+n : guardLen+n]
			wantDst := slices.Clone(ref)
			for i := range dst {
				dst[i] = 1
				if add {
					wantDst[i] = 1 + ref[i]
				}
			}
			if err := decompress(e.c, dst, want, add); err != nil {
				t.Fatalf("n=%d add=%v: %v", n, add, err)
			}
			if !equalBits(dst, wantDst) {
				t.Errorf("n=%d add=%v: decoding into a carved slice differs from decoding into a fresh one", n, add)
			}
			for _, g := range [][]float32{fbuf[:guardLen], fbuf[guardLen+n:]} {
				for i, v := range g {
					if math.Float32bits(v) != math.Float32bits(sentinel) {
						t.Fatalf("n=%d add=%v: a guard element (%d of %d) was overwritten with %v", n, add, i, guardLen, v)
					}
				}
			}
		}
	}
}

// checkDecompressAdd checks that DecompressAdd leaves dst[i] = prev[i] + D[i]
// in float32 arithmetic, bit for bit.
func checkDecompressAdd(t *testing.T, e *env) {
	key := compress.Key{Bucket: 6, Step: 1}
	for _, n := range e.lengths(false) {
		p := mustCompress(t, e.c, wide(n, 5), key)
		d := mustDecompress(t, e.c, p, n)
		prev := ties(n, 6)
		got := slices.Clone(prev)
		if err := e.c.DecompressAdd(got, p); err != nil {
			t.Fatalf("n=%d: %v", n, err)
		}
		r := &report{t: t, what: fmt.Sprintf("n=%d", n)}
		for i := range got {
			if want := prev[i] + d[i]; math.Float32bits(got[i]) != math.Float32bits(want) {
				r.errorf("element %d: got %v, want %v + %v = %v", i, got[i], prev[i], d[i], want)
			}
		}
		r.done()
	}
}

// checkBadInput feeds Decompress and DecompressAdd payloads they must reject:
// a wrong destination length (*compress.SizeError), another codec's payload
// (*compress.PayloadMismatchError), every truncation of a payload, every byte
// flipped (a *compress.ChecksumError, or the *compress.CorruptInputError or
// *compress.VersionError of the magic and version checks that precede it),
// and every byte changed with the checksum recomputed (an error or a finite
// decoding; with -short, every 7th byte of the larger payload). None may
// panic, and on error dst is untouched.
func checkBadInput(t *testing.T, e *env) {
	const n = 7
	key := compress.Key{Bucket: 8, Step: 2}
	p := mustCompress(t, e.c, wide(n, 7), key)

	t.Run("Size", func(t *testing.T) {
		for _, m := range []int{0, n - 1, n + 1} {
			var se *compress.SizeError
			err := decodeUntouched(t, e.c, make([]float32, m), p, fmt.Sprintf("%d-element payload into %d elements", n, m))
			if !errors.As(err, &se) {
				t.Errorf("%d-element payload into %d elements: got %v, want a *compress.SizeError", n, m, err)
			}
		}
	})

	t.Run("OtherCodec", func(t *testing.T) {
		other := "none"
		if e.info.codec == compress.CodecNone {
			other = "fp16"
		}
		oc, err := e.new(other)
		if err != nil {
			t.Skipf("backend lacks %s: %v", other, err)
		}
		var me *compress.PayloadMismatchError
		err = decodeUntouched(t, e.c, make([]float32, n), mustCompress(t, oc, wide(n, 7), key), other+" payload")
		if !errors.As(err, &me) {
			t.Errorf("%s payload: got %v, want a *compress.PayloadMismatchError", other, err)
		}
	})

	// A larger payload of a compressible input exercises the lossless stage.
	long := mustCompress(t, e.c, ties(e.info.bucket+1, 8), key)

	t.Run("Truncated", func(t *testing.T) {
		for _, q := range [][]byte{p, long} {
			for i := range len(q) {
				if err := decodeUntouched(t, e.c, make([]float32, payloadLen(q)), q[:i], fmt.Sprintf("first %d of %d bytes", i, len(q))); err == nil {
					t.Fatalf("first %d of %d bytes decode without error", i, len(q))
				}
			}
		}
	})

	t.Run("Flipped", func(t *testing.T) {
		for _, q := range [][]byte{p, long} {
			for i := range q {
				bad := slices.Clone(q)
				bad[i] ^= 0x10
				err := decodeUntouched(t, e.c, make([]float32, payloadLen(q)), bad, fmt.Sprintf("byte %d of %d flipped", i, len(q)))
				var ce *compress.ChecksumError
				var ie *compress.CorruptInputError
				var ve *compress.VersionError
				if !errors.As(err, &ce) && !errors.As(err, &ie) && !errors.As(err, &ve) {
					t.Fatalf("byte %d of %d flipped: got %v, want a *compress.ChecksumError", i, len(q), err)
				}
			}
		}
	})

	t.Run("Resealed", func(t *testing.T) {
		for _, q := range [][]byte{p, long} {
			m := payloadLen(q)
			stride := 1
			if testing.Short() && len(q) > len(p) {
				stride = 7 // -short: every 7th byte of the long payload
			}
			for i := 5; i < len(q)-trailerLen; i += stride {
				if i >= bodyLenOff && i < headerLen {
					continue // Reseal rewrites the body length
				}
				// 0x7e and 0x7f in a float's high byte make it huge but finite.
				for _, v := range []byte{0x00, 0xff, 0x7e, 0x7f, q[i] ^ 0x01, q[i] ^ 0x80} {
					bad := slices.Clone(q)
					bad[i] = v
					Reseal(bad)
					decodeFinite(t, e.c, m, bad, fmt.Sprintf("byte %d of %d set to %#02x, checksum fixed", i, len(q), v))
				}
			}
		}
	})
}

// decodeUntouched runs Decompress and DecompressAdd on p into copies of dst,
// turning a panic into a test failure, and on error checks that the copy is
// unchanged. It leaves Decompress's result in dst and returns its error; the
// two calls must agree on failing.
func decodeUntouched(t *testing.T, c compress.Compressor, dst []float32, p []byte, what string) error {
	t.Helper()
	var errs [2]error
	for i, add := range []bool{false, true} {
		work := make([]float32, len(dst))
		for j := range work {
			work[j] = float32(j) + 0.5
		}
		orig := slices.Clone(work)
		func() {
			defer func() {
				if r := recover(); r != nil {
					t.Fatalf("%s: decoding (add=%v) panicked: %v", what, add, r)
				}
			}()
			errs[i] = decompress(c, work, p, add)
		}()
		if errs[i] != nil && !equalBits(work, orig) {
			t.Errorf("%s: dst changed although decoding (add=%v) failed with %v", what, add, errs[i])
		}
		if !add {
			copy(dst, work)
		}
	}
	if (errs[0] == nil) != (errs[1] == nil) {
		t.Errorf("%s: Decompress returned %v but DecompressAdd %v", what, errs[0], errs[1])
	}
	return errs[0]
}

// decodeFinite is decodeUntouched into n elements that, on success, also
// checks every decoded value is finite: a decoder validates its input, so no
// payload, however forged, spreads NaN or Inf into a gradient.
func decodeFinite(t *testing.T, c compress.Compressor, n int, p []byte, what string) {
	t.Helper()
	dst := make([]float32, n)
	if decodeUntouched(t, c, dst, p, what) != nil {
		return
	}
	for j, x := range dst {
		if math.IsNaN(float64(x)) || math.IsInf(float64(x), 0) {
			t.Fatalf("%s: decodes without error to a non-finite value %v at %d", what, x, j)
		}
	}
}

// maxCheckLen bounds the destination CheckDecode allocates, whatever the
// header claims.
const maxCheckLen = 1 << 16

// CheckDecode is the body of a decoder fuzz target: it decodes arbitrary
// bytes p with c into destinations of the length p's header claims, one
// element fewer and more, and none (lengths above 65536 are left out). Every
// Decompress and DecompressAdd call must return without panicking, both must
// agree on failing, a failed call must leave dst untouched, and a successful
// one must decode finite values only.
func CheckDecode(t *testing.T, c compress.Compressor, p []byte) {
	t.Helper()
	claimed := 0
	if len(p) >= countOff+8 {
		claimed = int(min(binary.LittleEndian.Uint64(p[countOff:]), maxCheckLen+1))
	}
	ns := []int{0, claimed - 1, claimed, claimed + 1}
	slices.Sort(ns)
	for _, n := range slices.Compact(ns) {
		if n >= 0 && n <= maxCheckLen {
			decodeFinite(t, c, n, p, fmt.Sprintf("%d-byte input into %d elements", len(p), n))
		}
	}
}

func decompress(c compress.Compressor, dst []float32, p []byte, add bool) error {
	if add {
		return c.DecompressAdd(dst, p)
	}
	return c.Decompress(dst, p)
}

func equalBits(a, b []float32) bool {
	return slices.EqualFunc(a, b, func(x, y float32) bool { return math.Float32bits(x) == math.Float32bits(y) })
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
