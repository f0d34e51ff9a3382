//go:build (amd64 || arm64) && !purego

package compress

import (
	"bytes"
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
)

// quantFunc is the signature of quantKernel and its versions.
type quantFunc = func(out []byte, x []float32, lo, inv float32, levels int32, bits uint, ctr, k1 uint32, nearest bool)

// kernelVersion is one version of the quantizer's kernels (see
// quantKernelVersions), which the CPU runs if has() is true.
type kernelVersion struct {
	name, lacks string
	has         func() bool
	minMax      func(x []float32) (lo, hi float32, finite bool)
	quant       quantFunc
}

// TestKernelsQuant compares each version of the quantizer's kernels the
// CPU can run (quantKernelVersions: AVX2 and AVX-512 on amd64, NEON on
// arm64), whichever is in use, with the generic one (TestKernels compares
// only those in use, on random inputs): minMaxKernel with a NaN, an ±Inf or
// a signed zero at every position, and quantKernel on every width and
// rounding mode, lengths that leave a version's widest loop a group of 8
// to hand on and that cross quantGeneric's blocks, counters that wrap, and
// the inputs of quantize's edge cases (see quantCases). A version the CPU
// lacks is skipped, saying so.
func TestKernelsQuant(t *testing.T) {
	t.Logf("kernels in use: %s", kernelSet) // shown with -v
	for _, k := range quantKernelVersions {
		t.Run(k.name, func(t *testing.T) {
			if !k.has() {
				t.Skip(k.lacks)
			}
			testMinMaxFunc(t, k.minMax)
			testQuantFunc(t, k.quant)
		})
	}
}

// testMinMaxFunc compares minMax with minMaxGeneric on lengths around the
// vector widths and loop steps, each with one special value at every
// position in turn over random ones.
func testMinMaxFunc(t *testing.T, minMax func(x []float32) (lo, hi float32, finite bool)) {
	r := rand.New(rand.NewPCG(13, 14))
	special := []float32{float32(math.NaN()), float32(math.Inf(1)), float32(math.Inf(-1)),
		0, float32(math.Copysign(0, -1)), math.MaxFloat32, -math.MaxFloat32, 1e-45}
	for _, n := range []int{1, 8, 15, 16, 17, 24, 31, 32, 64, 79, 80, 88, 100, 512, 520} {
		x := make([]float32, n)
		for _, v := range special {
			for at := range n {
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
				x[at] = v
				lo1, hi1, f1 := minMax(x)
				lo2, hi2, f2 := minMaxGeneric(x)
				if f1 != f2 || f1 && (lo1 != lo2 || hi1 != hi2) {
					t.Fatalf("minMax n=%d, %v at %d: (%v %v %v), generic (%v %v %v)", n, v, at, lo1, hi1, f1, lo2, hi2, f2)
				}
			}
		}
	}
}

// testQuantFunc compares quant with quantGeneric on quantCases, and checks
// that it writes nothing past its codes.
func testQuantFunc(t *testing.T, quant quantFunc) {
	r := rand.New(rand.NewPCG(11, 12))
	lengths := []int{8, 16, 24, 32, 40, 48, 56, 64, 72, 504, 512, 520, 1016, 1024, 1032, 2056}
	for range 6 {
		lengths = append(lengths, 8*(1+r.IntN(400)))
	}
	cases, clamped := 0, 0
	for _, bits := range []uint{8, 4, 2} {
		for _, nearest := range []bool{false, true} {
			for _, n := range lengths {
				for _, c := range quantCases(r, n, bits) {
					size := n * int(bits) / 8
					// Equal garbage in both, and 8 sentinel bytes past the codes.
					o1 := make([]byte, size+8)
					for i := range o1 {
						o1[i] = byte(r.Uint32())
					}
					o2 := bytes.Clone(o1)
					quant(o1[:size], c.x, c.lo, c.inv, c.levels, bits, c.ctr, c.k1, nearest)
					quantGeneric(o2[:size], c.x, c.lo, c.inv, c.levels, bits, c.ctr, c.k1, nearest)
					name := fmt.Sprintf("bits=%d nearest=%v n=%d %s", bits, nearest, n, c.name)
					if !bytes.Equal(o1[:size], o2[:size]) {
						t.Fatalf("%s: codes differ at byte %d", name, firstDiff(o1, o2))
					}
					if !bytes.Equal(o1[size:], o2[size:]) {
						t.Fatalf("%s: wrote past the end of out", name)
					}
					cases++
					if c.clamps && !nearest {
						clamped++
					}
				}
			}
		}
	}
	t.Logf("%d cases, %d with a code clamped from L+1 to L", cases, clamped)
}

// quantCase is one input of quantKernel.
type quantCase struct {
	name    string
	x       []float32
	lo, inv float32
	levels  int32
	ctr, k1 uint32
	clamps  bool // stochastic rounding takes an element's code from L + 1 to L
}

// quantCases returns inputs of n elements for codes of bits each, with lo
// and inv as quantCodec.scales sets them for the inputs' range:
//
//   - random: normally distributed values, random counters;
//   - ends: only the least and greatest values and their neighbours, where
//     t is 0 or about L, of a range far from 0, near the top of float32 or
//     of subnormals;
//   - zero scale: one value throughout (+0, −0 or another), inv = 0;
//   - clamp: values 0 and 1, t = 0 or L, with the counters set so that an
//     element at 1 draws u = 2^24 − 1: t + r rounds up to L + 1, which must
//     be clamped to L (the stochastic quantizers' rare case);
//   - wrap: random values, with the global index of the elements wrapping
//     from 2^32 − 1 to 0 in the middle of x.
func quantCases(r *rand.Rand, n int, bits uint) []quantCase {
	q := &quantCodec{bits: bits}
	levels := q.levels()
	mk := func(name string, x []float32, ctr uint32) quantCase {
		lo, hi := sliceRange(x)
		_, inv, ok := q.scales(lo+0, hi+0)
		if !ok {
			panic(name + ": a range quantCodec cannot encode")
		}
		return quantCase{name: name, x: x, lo: lo + 0, inv: inv, levels: levels, ctr: ctr, k1: r.Uint32()}
	}
	normal := func() []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	pick := func(v ...float32) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = v[r.IntN(len(v))]
		}
		return x
	}
	ends := func(lo, hi float32) []float32 {
		return pick(lo, hi, math.Nextafter32(lo, hi), math.Nextafter32(hi, lo))
	}
	cs := []quantCase{
		mk("random", normal(), r.Uint32()),
		mk("ends", ends(-1000.5, -999.25), r.Uint32()),
		mk("ends near MaxFloat32", ends(-math.MaxFloat32/2, math.MaxFloat32/2), r.Uint32()),
		mk("ends subnormal", ends(0, 1e-44), r.Uint32()),
		mk("zero scale", pick(0), r.Uint32()),
		mk("zero scale −0", pick(float32(math.Copysign(0, -1))), r.Uint32()),
		mk("zero scale 3.75", pick(3.75), r.Uint32()),
	}
	// Elements 0..n−1 are global indices -n/2 .. n/2−1 of a stream.
	keys := lanes32(r.Uint64())
	w := mk("wrap", normal(), keys.counter(-uint32(n/2)))
	w.k1 = keys.k1
	cs = append(cs, w)

	x, j := pick(0, 1), r.IntN(n)
	x[j], x[(j+1)%n] = 1, 0 // the range is [0, 1]
	c := mk("clamp", x, 0)
	h := uint32(0xffffff00) | r.Uint32()&0xff
	c.ctr = unhash32(h, c.k1) - uint32(j)*lane32Weyl
	if hash32(c.ctr+uint32(j)*lane32Weyl, c.k1) != h || c.inv != float32(levels) || rawCode(1, c.lo, c.inv, float32(h>>8)*0x1p-24) != int64(levels)+1 {
		panic("clamp: the forced draw does not take the code to L + 1")
	}
	c.name = fmt.Sprintf("clamp at %d", j)
	c.clamps = true
	return append(cs, c)
}

// unhash32 returns the x with hash32(x, k1) == h: lowbias32's steps are
// each invertible (an xorshift by 16 undoes itself, one by 15 is undone by
// shifts by 15 and 30, an odd multiplier has an inverse modulo 2^32).
func unhash32(h, k1 uint32) uint32 {
	x := (h ^ h>>16) * inverse32(lane32M2)
	x ^= k1
	x ^= x>>15 ^ x>>30
	x *= inverse32(lane32M1)
	return x ^ x>>16
}

// inverse32 returns the inverse of the odd m modulo 2^32 by Newton's
// iteration, each step doubling the correct low bits (m·m ≡ 1 mod 8).
func inverse32(m uint32) uint32 {
	y := m
	for range 4 {
		y *= 2 - m*y
	}
	return y
}
