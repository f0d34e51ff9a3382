package lowrank

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
)

// The tolerances: a float32 result of d roundings in a row (a product,
// then sums) is within γ_d·Σ|terms| of the exact sum, γ_d = d·u/(1−d·u)
// (Higham, Accuracy and Stability of Numerical Algorithms, §3.1), here
// 1.01·d·u. d is, for MulQ, 1 (the product) + ⌈cols/32⌉ (a lane's running
// sum) + 5 (the fold of 32 lanes); for MulTP, 1 + min(rows, 32) (a block's
// running sum) + ⌈rows/32⌉ (the blocks' total); for Decompose, r (the
// product and r−1 sums) + 1 (the subtraction from m; the scaling of qAvg
// is in the reference).
func tolMulQ(cols int) float64   { return 1.01 * float64(1+(cols+31)/32+5) * u }
func tolMulTP(rows int) float64  { return 1.01 * float64(1+min(rows, 32)+(rows+31)/32) * u }
func tolDecompose(r int) float64 { return 1.01 * float64(r+1) * u }

// TestMulQ checks MulQ against the float64 reference on every shape, the
// generic kernel against it bit for bit, and that it writes nothing
// outside p.
func TestMulQ(t *testing.T) {
	t.Logf("kernels in use: %s", kernelSet)
	rng := rand.New(rand.NewPCG(1, 2))
	for _, s := range shapes() {
		name := fmt.Sprintf("%dx%d r=%d", s.rows, s.cols, s.r)
		m, q := normal(rng, s.rows*s.cols), normal(rng, s.cols*s.r)
		p, intact := guarded(s.rows * s.r)
		MulQ(p, m, s.rows, s.cols, q, s.r)
		if !intact() {
			t.Fatalf("%s: MulQ wrote outside p", name)
		}
		want, mag := refMulQ(m, s.rows, s.cols, q, s.r)
		within(t, name, p, want, mag, tolMulQ(s.cols))
		g := make([]float32, len(p))
		mulQGeneric(g, m, s.rows, s.cols, q, s.r)
		sameBits(t, name+": kernel and generic", p, g)
	}
}

// TestMulTP is TestMulQ for MulTP.
func TestMulTP(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, s := range append(shapes(), shape{200, 33, 5}, shape{97, 64, 4}) {
		name := fmt.Sprintf("%dx%d r=%d", s.rows, s.cols, s.r)
		m, p := normal(rng, s.rows*s.cols), normal(rng, s.rows*s.r)
		q, intact := guarded(s.cols * s.r)
		MulTP(q, m, s.rows, s.cols, p, s.r)
		if !intact() {
			t.Fatalf("%s: MulTP wrote outside q", name)
		}
		want, mag := refMulTP(m, s.rows, s.cols, p, s.r)
		within(t, name, q, want, mag, tolMulTP(s.rows))
		g := make([]float32, len(q))
		mulTPGeneric(g, m, s.rows, s.cols, p, s.r)
		sameBits(t, name+": kernel and generic", q, g)
		again := make([]float32, len(q))
		MulTP(again, m, s.rows, s.cols, p, s.r)
		sameBits(t, name+": two runs", q, again)
	}
}

// TestDecompose is TestMulQ for Decompose, with scales 1, 0.25 and −3,
// and res as m itself.
func TestDecompose(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	scales := []float32{1, 0.25, -3}
	for n, s := range shapes() {
		scale := scales[n%len(scales)]
		name := fmt.Sprintf("%dx%d r=%d scale=%v", s.rows, s.cols, s.r, scale)
		m, p := normal(rng, s.rows*s.cols), normal(rng, s.rows*s.r)
		qa, qo := normal(rng, s.cols*s.r), normal(rng, s.cols*s.r)
		out, outOK := guarded(s.rows * s.cols)
		res, resOK := guarded(s.rows * s.cols)
		Decompose(out, res, m, s.rows, s.cols, p, qa, qo, s.r, scale)
		if !outOK() || !resOK() {
			t.Fatalf("%s: Decompose wrote outside out or res", name)
		}
		wantOut, outMag, wantRes, resMag := refDecompose(m, s.rows, s.cols, p, qa, qo, s.r, scale)
		within(t, name+": out", out, wantOut, outMag, tolDecompose(s.r))
		within(t, name+": res", res, wantRes, resMag, tolDecompose(s.r))
		gOut, gRes := make([]float32, len(out)), make([]float32, len(res))
		decomposeGeneric(gOut, gRes, m, s.rows, s.cols, p, qa, qo, s.r, scale)
		sameBits(t, name+": out, kernel and generic", out, gOut)
		sameBits(t, name+": res, kernel and generic", res, gRes)
		// In place: res is m.
		inPlace := slices.Clone(m)
		out2 := make([]float32, len(out))
		Decompose(out2, inPlace, inPlace, s.rows, s.cols, p, qa, qo, s.r, scale)
		sameBits(t, name+": out, res = m", out2, out)
		sameBits(t, name+": res = m", inPlace, res)
	}
}

// TestDecomposeLarge runs Decompose where out is large enough for the
// non-temporal stores of the assembly kernel (ntMin), with out aligned and
// not, an odd number of rows and columns a multiple of 16 but not of 32,
// against the generic kernel, res apart and in place; at r = 9 the
// assembly kernel goes through strips of columns (decomposeWhole).
func TestDecomposeLarge(t *testing.T) {
	rng := rand.New(rand.NewPCG(19, 20))
	for _, s := range []shape{{523, 528, 3}, {365, 720, 9}} {
		rows, cols, r := s.rows, s.cols, s.r
		m, p := normal(rng, rows*cols), normal(rng, rows*r)
		qa, qo := normal(rng, cols*r), normal(rng, cols*r)
		want, wantRes := make([]float32, rows*cols), make([]float32, rows*cols)
		decomposeGeneric(want, wantRes, m, rows, cols, p, qa, qo, r, 0.5)
		for _, shift := range []int{0, 1, 16} {
			name := fmt.Sprintf("%dx%d r=%d, out shifted by %d", rows, cols, r, shift)
			buf := make([]float32, rows*cols+16)
			out := buf[shift : shift+rows*cols]
			res := make([]float32, rows*cols)
			Decompose(out, res, m, rows, cols, p, qa, qo, r, 0.5)
			sameBits(t, name+": out", out, want)
			sameBits(t, name+": res", res, wantRes)
			inPlace := slices.Clone(m)
			Decompose(out, inPlace, inPlace, rows, cols, p, qa, qo, r, 0.5)
			sameBits(t, name+": out, res = m", out, want)
			sameBits(t, name+": res = m", inPlace, wantRes)
		}
	}
}

// TestRowRanges checks that MulQ and Decompose on row ranges, run by
// goroutines at once as a caller would run them, give the bits of one
// call.
func TestRowRanges(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 8))
	for _, s := range []shape{{70, 33, 3}, {100, 64, 4}, {37, 257, 9}, {64, 1000, 1}} {
		name := fmt.Sprintf("%dx%d r=%d", s.rows, s.cols, s.r)
		rows, cols, r := s.rows, s.cols, s.r
		m, q := normal(rng, rows*cols), normal(rng, cols*r)
		qo := normal(rng, cols*r)
		whole := make([]float32, rows*r)
		MulQ(whole, m, rows, cols, q, r)
		out, res := make([]float32, rows*cols), make([]float32, rows*cols)
		Decompose(out, res, m, rows, cols, whole, q, qo, r, 0.5)
		for range 5 {
			cuts := []int{0, rows}
			for range 3 {
				cuts = append(cuts, rng.IntN(rows+1))
			}
			slices.Sort(cuts)
			parts := make([]float32, rows*r)
			pOut, pRes := make([]float32, rows*cols), make([]float32, rows*cols)
			var wg sync.WaitGroup
			for c := range len(cuts) - 1 {
				i0, i1 := cuts[c], cuts[c+1]
				wg.Go(func() {
					MulQ(parts[i0*r:i1*r], m[i0*cols:i1*cols], i1-i0, cols, q, r)
					Decompose(pOut[i0*cols:i1*cols], pRes[i0*cols:i1*cols], m[i0*cols:i1*cols], i1-i0, cols,
						whole[i0*r:i1*r], q, qo, r, 0.5)
				})
			}
			wg.Wait()
			sameBits(t, fmt.Sprintf("%s: MulQ cut at %v", name, cuts), parts, whole)
			sameBits(t, fmt.Sprintf("%s: Decompose out cut at %v", name, cuts), pOut, out)
			sameBits(t, fmt.Sprintf("%s: Decompose res cut at %v", name, cuts), pRes, res)
		}
	}
}

// TestSpecialValues runs the kernels on inputs with signed zeros,
// subnormals and large values (but finite sums), kernel against generic.
func TestSpecialValues(t *testing.T) {
	rng := rand.New(rand.NewPCG(9, 10))
	special := []float32{0, float32(math.Copysign(0, -1)), 1e-45, -1e-40, 1e30, -1e30, 1, -1}
	pick := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = special[rng.IntN(len(special))]
		}
		return x
	}
	for _, s := range []shape{{3, 5, 2}, {33, 47, 5}, {40, 64, 4}} {
		rows, cols, r := s.rows, s.cols, s.r
		m, q, p := pick(rows*cols), pick(cols*r), pick(rows*r)
		a, b := make([]float32, rows*r), make([]float32, rows*r)
		MulQ(a, m, rows, cols, q, r)
		mulQGeneric(b, m, rows, cols, q, r)
		sameBits(t, "MulQ", a, b)
		a, b = make([]float32, cols*r), make([]float32, cols*r)
		MulTP(a, m, rows, cols, p, r)
		mulTPGeneric(b, m, rows, cols, p, r)
		sameBits(t, "MulTP", a, b)
		o1, r1, o2, r2 := make([]float32, rows*cols), make([]float32, rows*cols), make([]float32, rows*cols), make([]float32, rows*cols)
		Decompose(o1, r1, m, rows, cols, p, q, q, r, -0.5)
		decomposeGeneric(o2, r2, m, rows, cols, p, q, q, r, -0.5)
		sameBits(t, "Decompose out", o1, o2)
		sameBits(t, "Decompose res", r1, r2)
	}
}

// TestEmpty: no rows or no columns are valid sizes.
func TestEmpty(t *testing.T) {
	p := []float32{7, 7}
	MulQ(p, make([]float32, 0), 2, 0, nil, 1)
	if p[0] != 0 || p[1] != 0 {
		t.Errorf("MulQ with cols = 0: p = %v, want zeros", p)
	}
	q := []float32{7, 7, 7}
	MulTP(q, nil, 0, 3, nil, 1)
	if q[0] != 0 || q[1] != 0 || q[2] != 0 {
		t.Errorf("MulTP with rows = 0: q = %v, want zeros", q)
	}
	MulQ(nil, nil, 0, 5, make([]float32, 10), 2)
	Decompose(nil, nil, nil, 0, 4, nil, make([]float32, 4), make([]float32, 4), 1, 1)
	Decompose(nil, nil, nil, 3, 0, make([]float32, 3), nil, nil, 1, 1)
	if Orthogonalize(nil, 0, 2) != 2 {
		t.Errorf("Orthogonalize of 0 rows: want 2 columns zeroed")
	}
}

// TestPanics checks that wrong sizes and overlaps panic with a message
// that names the function and the lengths.
func TestPanics(t *testing.T) {
	buf := make([]float32, 100)
	cases := []struct {
		name string
		f    func()
		want string
	}{
		{"MulQ short p", func() { MulQ(make([]float32, 5), make([]float32, 12), 3, 4, make([]float32, 8), 2) }, "lowrank.MulQ: len(p) = 5, want rows·r = 3·2 = 6"},
		{"MulQ short m", func() { MulQ(make([]float32, 6), make([]float32, 11), 3, 4, make([]float32, 8), 2) }, "lowrank.MulQ: len(m) = 11, want rows·cols = 3·4 = 12"},
		{"MulQ long q", func() { MulQ(make([]float32, 6), make([]float32, 12), 3, 4, make([]float32, 9), 2) }, "lowrank.MulQ: len(q) = 9, want cols·r = 4·2 = 8"},
		{"MulQ r = 0", func() { MulQ(nil, nil, 0, 0, nil, 0) }, "lowrank.MulQ: rows = 0, cols = 0, r = 0"},
		{"MulQ rows < 0", func() { MulQ(nil, nil, -1, 0, nil, 1) }, "lowrank.MulQ: rows = -1"},
		{"MulQ p in m", func() { MulQ(buf[10:16], buf[:12], 3, 4, make([]float32, 8), 2) }, "lowrank.MulQ: p and m overlap"},
		{"MulTP short q", func() { MulTP(make([]float32, 7), make([]float32, 12), 3, 4, make([]float32, 6), 2) }, "lowrank.MulTP: len(q) = 7, want cols·r = 4·2 = 8"},
		{"MulTP short p", func() { MulTP(make([]float32, 8), make([]float32, 12), 3, 4, make([]float32, 5), 2) }, "lowrank.MulTP: len(p) = 5, want rows·r = 3·2 = 6"},
		{"MulTP q in p", func() { MulTP(buf[:8], make([]float32, 12), 3, 4, buf[4:10], 2) }, "lowrank.MulTP: q and p overlap"},
		{"Decompose short res", func() {
			Decompose(make([]float32, 12), make([]float32, 11), make([]float32, 12), 3, 4, make([]float32, 6), make([]float32, 8), make([]float32, 8), 2, 1)
		}, "lowrank.Decompose: len(res) = 11, want rows·cols = 3·4 = 12"},
		{"Decompose short qOwn", func() {
			Decompose(make([]float32, 12), make([]float32, 12), make([]float32, 12), 3, 4, make([]float32, 6), make([]float32, 8), make([]float32, 7), 2, 1)
		}, "lowrank.Decompose: len(qOwn) = 7, want cols·r = 4·2 = 8"},
		{"Decompose out is m", func() {
			Decompose(buf[:12], make([]float32, 12), buf[:12], 3, 4, make([]float32, 6), make([]float32, 8), make([]float32, 8), 2, 1)
		}, "lowrank.Decompose: out and m overlap"},
		{"Decompose res shifted from m", func() {
			Decompose(make([]float32, 12), buf[1:13], buf[:12], 3, 4, make([]float32, 6), make([]float32, 8), make([]float32, 8), 2, 1)
		}, "lowrank.Decompose: res and m overlap"},
		{"Decompose out is res", func() {
			Decompose(buf[:12], buf[:12], make([]float32, 12), 3, 4, make([]float32, 6), make([]float32, 8), make([]float32, 8), 2, 1)
		}, "lowrank.Decompose: out and res overlap"},
		{"Decompose res in qAvg", func() {
			Decompose(make([]float32, 12), buf[:12], make([]float32, 12), 3, 4, make([]float32, 6), buf[8:16], make([]float32, 8), 2, 1)
		}, "lowrank.Decompose: res and qAvg overlap"},
		{"Orthogonalize short p", func() { Orthogonalize(make([]float32, 5), 3, 2) }, "lowrank.Orthogonalize: len(p) = 5, want rows·r = 3·2 = 6"},
		{"Orthogonalize r = 0", func() { Orthogonalize(nil, 3, 0) }, "lowrank.Orthogonalize: rows = 3, r = 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			defer func() {
				msg, _ := recover().(string)
				if !strings.Contains(msg, c.want) {
					t.Errorf("panic %q, want one containing %q", msg, c.want)
				}
			}()
			c.f()
		})
	}
}

// sameOrBothNaN fails t unless a and b are equal bit for bit or both NaN
// (a NaN's payload is unspecified).
func sameOrBothNaN(t *testing.T, what string, a, b []float32) {
	t.Helper()
	for i := range a {
		if math.Float32bits(a[i]) != math.Float32bits(b[i]) && !(a[i] != a[i] && b[i] != b[i]) {
			t.Fatalf("%s: element %d: %v (%#08x) and %v (%#08x)", what, i, a[i], math.Float32bits(a[i]), b[i], math.Float32bits(b[i]))
		}
	}
}

// FuzzKernels compares MulQ, MulTP and Decompose (the kernels in use) with
// the generic kernels on fuzzed sizes and values, any float32 bits.
func FuzzKernels(f *testing.F) {
	f.Add(uint8(3), uint8(5), uint8(2), []byte{1, 2, 3, 4, 5, 6, 7, 8})
	f.Add(uint8(33), uint8(40), uint8(5), []byte{0x80, 0, 0, 0x7f, 0xff, 0xff, 0x7f, 0x7f})
	f.Fuzz(func(t *testing.T, rb, cb, kb uint8, data []byte) {
		rows, cols, r := int(rb%70), int(cb%70), int(kb%9)+1
		if len(data) < 4 {
			return
		}
		// The values cycle through data, 4 bytes each, any bits.
		next := 0
		vals := func(n int) []float32 {
			x := make([]float32, n)
			for i := range x {
				b := data[next%(len(data)-3):]
				x[i] = math.Float32frombits(uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24)
				next += 4
			}
			return x
		}
		m, q, p, q2 := vals(rows*cols), vals(cols*r), vals(rows*r), vals(cols*r)
		a, b := make([]float32, rows*r), make([]float32, rows*r)
		MulQ(a, m, rows, cols, q, r)
		mulQGeneric(b, m, rows, cols, q, r)
		sameOrBothNaN(t, "MulQ", a, b)
		a, b = make([]float32, cols*r), make([]float32, cols*r)
		MulTP(a, m, rows, cols, p, r)
		if rows > 0 {
			mulTPGeneric(b, m, rows, cols, p, r)
		}
		sameOrBothNaN(t, "MulTP", a, b)
		o1, r1, o2, r2 := make([]float32, rows*cols), make([]float32, rows*cols), make([]float32, rows*cols), make([]float32, rows*cols)
		Decompose(o1, r1, m, rows, cols, p, q, q2, r, 0.5)
		if rows > 0 && cols > 0 {
			decomposeGeneric(o2, r2, m, rows, cols, p, q, q2, r, 0.5)
		}
		sameOrBothNaN(t, "Decompose out", o1, o2)
		sameOrBothNaN(t, "Decompose res", r1, r2)
	})
}
