package compress

import (
	"encoding/binary"
	"errors"
	"math"
	"slices"
	"testing"
)

// TestRandomKIndices checks the index contract: one index per stratum, in
// the stratum, by the documented formula, the same for the same (seed, key)
// and different for another seed, bucket or step.
func TestRandomKIndices(t *testing.T) {
	for _, n := range []int{1, 2, 7, 100, 1000, 65537} {
		for _, k := range []int{0, 1, max(n/3, 1), n} {
			key := Key{Bucket: 5, Step: 9}
			idx, err := RandomKIndices([]uint32{77}, n, k, 42, key)
			if err != nil {
				t.Fatal(err)
			}
			if idx[0] != 77 || len(idx) != k+1 {
				t.Fatalf("n=%d k=%d: did not append %d indices to dst", n, k, k)
			}
			idx = idx[1:]
			st := NewRandomStream(42, key, DomainRandomK)
			for j, p := range idx {
				lo, hi := uint64(j)*uint64(n)/uint64(k), uint64(j+1)*uint64(n)/uint64(k)
				want := lo + (st.Draw(uint64(j))>>32)*(hi-lo)>>32
				if uint64(p) != want || uint64(p) < lo || uint64(p) >= hi {
					t.Fatalf("n=%d k=%d: index %d is %d, want %d in [%d, %d)", n, k, j, p, want, lo, hi)
				}
			}
			if k == n && !slices.Equal(idx, sparseIota(n)) {
				t.Fatalf("n=k=%d: indices are not 0..n-1", n)
			}
			again, _ := RandomKIndices(nil, n, k, 42, key)
			if !slices.Equal(idx, again) {
				t.Fatalf("n=%d k=%d: indices differ between calls", n, k)
			}
			if k == 0 || n/k < 100 {
				continue // too few choices for different draws to differ surely
			}
			for _, other := range []struct {
				seed uint64
				key  Key
			}{{43, key}, {42, Key{Bucket: 6, Step: 9}}, {42, Key{Bucket: 5, Step: 10}}} {
				o, _ := RandomKIndices(nil, n, k, other.seed, other.key)
				if slices.Equal(idx, o) {
					t.Fatalf("n=%d k=%d: seed %d key %+v draws the same indices", n, k, other.seed, other.key)
				}
			}
		}
	}
}

func sparseIota(n int) []uint32 {
	s := make([]uint32, n)
	for i := range s {
		s[i] = uint32(i)
	}
	return s
}

func TestRandomKIndicesBadSizes(t *testing.T) {
	cases := []struct{ n, k int }{{-1, 0}, {10, 11}, {10, -1}}
	if big := int64(MaxElements) + 1; big <= math.MaxInt {
		cases = append(cases, struct{ n, k int }{int(big), 1}) // 64-bit int only
	}
	for _, c := range cases {
		dst := []uint32{1, 2}
		got, err := RandomKIndices(dst, c.n, c.k, 0, Key{})
		var se *SizeError
		if !errors.As(err, &se) || !slices.Equal(got, dst) {
			t.Errorf("RandomKIndices(n=%d, k=%d) = %v, %v; want dst unchanged and a *SizeError", c.n, c.k, got, err)
		}
	}
}

// TestRandomKUniform checks that the position within a stratum is uniform
// over steps: the mean relative offset is 1/2 within five standard errors.
func TestRandomKUniform(t *testing.T) {
	const n, k, steps = 10000, 10, 4000
	sum := 0.0
	var idx []uint32
	for step := range uint64(steps) {
		idx, _ = RandomKIndices(idx[:0], n, k, 1, Key{Step: step})
		for j, p := range idx {
			sum += (float64(p) - float64(j*n/k) + 0.5) / (n / k)
		}
	}
	mean, se := sum/(steps*k), math.Sqrt(1.0/12/(steps*k))
	if math.Abs(mean-0.5) > 5*se {
		t.Errorf("mean offset within a stratum %v, want 0.5 ± %v", mean, 5*se)
	}
}

// TestRandomKPayload checks that the body holds src at RandomKIndices, that
// decoding uses the header's key, and the seed and corruption checks.
func TestRandomKPayload(t *testing.T) {
	n := 5000
	src := sparseData("laplace", n, 6)
	c := mustParse(t, "randomk:0.01:seed=123")
	key := Key{Bucket: 2, Step: 77}
	p, err := c.Compress(nil, src, key)
	if err != nil {
		t.Fatal(err)
	}
	idx, _ := RandomKIndices(nil, n, 50, 123, key)
	body := payloadBody(p)
	for j, i := range idx {
		if got := binary.LittleEndian.Uint32(body[4*j:]); got != math.Float32bits(src[i]) {
			t.Fatalf("value %d is %#08x, want src[%d] = %#08x", j, got, i, math.Float32bits(src[i]))
		}
	}

	var me *PayloadMismatchError
	if err := mustParse(t, "randomk:0.01:seed=124").Decompress(make([]float32, n), p); !errors.As(err, &me) {
		t.Errorf("decoding under another seed: %v, want a *PayloadMismatchError", err)
	}

	bad := slices.Clone(p)
	binary.LittleEndian.PutUint32(bad[HeaderLen+4*7:], 0x7f800000)
	reseal(bad)
	dst := make([]float32, n)
	var ce *CorruptInputError
	if err := c.Decompress(dst, bad); !errors.As(err, &ce) || ce.Offset != HeaderLen+4*7 {
		t.Errorf("Inf value: %v, want a *CorruptInputError at %d", err, HeaderLen+4*7)
	}
	if slices.ContainsFunc(dst, func(v float32) bool { return v != 0 }) {
		t.Error("dst changed on error")
	}
}

// TestRandomKUnselectedNaN puts a NaN where no stratum picks: it is still
// reported.
func TestRandomKUnselectedNaN(t *testing.T) {
	n := 1000
	src := sparseData("laplace", n, 8)
	idx, _ := RandomKIndices(nil, n, 10, 0, Key{})
	hole := int(idx[3]) + 1
	if slices.Contains(idx, uint32(hole)) {
		t.Fatal("test setup: the hole is selected")
	}
	src[hole] = float32(math.NaN())
	_, err := mustParse(t, "randomk:0.01").Compress(nil, src, Key{})
	var nf *NonFiniteError
	if !errors.As(err, &nf) || nf.Index != hole {
		t.Fatalf("unselected NaN at %d: %v, want a *NonFiniteError there", hole, err)
	}
}
