//go:build cuda

package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
)

// TestAverage checks gc_average against the CPU rule (x / float32(N),
// first non-finite reported) and its poisoning when a status slot reports
// a failure.
func TestAverage(t *testing.T) {
	ctx := device(t)
	const n, ranks = 10007, 3
	x := make([]float32, n)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range x {
		x[i] = float32(rng.NormFloat64() * 1e3)
	}
	x[4321] = float32(math.Inf(1))
	slots := make([]byte, 2*32) // two slots of 32 bytes, status first
	for i := range slots {
		slots[i] = 0xff
	}
	for _, poisoned := range []bool{false, true} {
		if poisoned {
			binary.LittleEndian.PutUint64(slots[32:], 7<<32) // rank 1: a NaN at element 7
		}
		dst, sp, out := upload(t, ctx, x), devBuf(t, ctx, len(slots)), devBuf(t, ctx, StatusLen)
		if err := ctx.CopyIn(0, sp, slots); err != nil {
			t.Fatal(err)
		}
		if err := Average(ctx, 0, AverageArgs{Dst: dst, N: n, Ranks: ranks, Slots: sp, Stride: 32, Count: 2, Out: out}); err != nil {
			t.Fatal(err)
		}
		got := download(t, ctx, dst, n)
		st := make([]byte, StatusLen)
		if err := ctx.CopyOut(0, st, out); err != nil {
			t.Fatal(err)
		}
		if poisoned {
			if r := binary.LittleEndian.Uint64(st[8:]); r != 1 {
				t.Errorf("bad slot recorded as %d, want 1", r)
			}
			for i, v := range got {
				if !math.IsNaN(float64(v)) {
					t.Fatalf("poisoned: element %d is %v, want NaN", i, v)
				}
			}
			continue
		}
		for i := range x {
			if want := x[i] / float32(ranks); math.Float32bits(got[i]) != math.Float32bits(want) {
				t.Fatalf("element %d: %v, want %v", i, got[i], want)
			}
		}
		if err := StatusError(st); err == nil || binary.LittleEndian.Uint64(st)>>32 != 4321 {
			t.Errorf("status %x (%v), want the Inf at 4321", st, err)
		}
	}
}

// TestSGEMM checks the synthetic-compute kernel against the reference
// loop of its doc, bit for bit (same order, one rounding per operation).
func TestSGEMM(t *testing.T) {
	ctx := device(t)
	const m, n, k = 37, 45, 29
	rng := rand.New(rand.NewPCG(3, 4))
	a, b := make([]float32, m*k), make([]float32, k*n)
	for i := range a {
		a[i] = float32(rng.NormFloat64())
	}
	for i := range b {
		b[i] = float32(rng.NormFloat64())
	}
	c := devBuf(t, ctx, 4*m*n)
	if err := SGEMM(ctx, 0, c, upload(t, ctx, a), upload(t, ctx, b), m, n, k); err != nil {
		t.Fatal(err)
	}
	got := download(t, ctx, c, m*n)
	for i := range m {
		for j := range n {
			var acc float32
			for l := range k {
				acc = acc + float32(a[i*k+l]*b[l*n+j])
			}
			if got[i*n+j] != acc {
				t.Fatalf("c[%d][%d] = %v, want %v", i, j, got[i*n+j], acc)
			}
		}
	}
}

// TestMomentum checks gc_momentum against the CPU rule (float32(m·u) + g,
// two roundings), bit for bit, and its report of the first non-finite
// result.
func TestMomentum(t *testing.T) {
	ctx := device(t)
	const n, m = 10007, float32(0.9)
	rng := rand.New(rand.NewPCG(5, 6))
	u, g := make([]float32, n), make([]float32, n)
	for i := range u {
		u[i], g[i] = float32(rng.NormFloat64()*1e3), float32(rng.NormFloat64())
	}
	g[777] = float32(math.NaN())
	gp, up, next, status := upload(t, ctx, g), upload(t, ctx, u), devBuf(t, ctx, 4*n), devBuf(t, ctx, StatusLen)
	if err := Momentum(ctx, 0, MomentumArgs{Grad: gp, U: up, Next: next, N: n, M: m, Status: status}); err != nil {
		t.Fatal(err)
	}
	gotG, gotNext := download(t, ctx, gp, n), download(t, ctx, next, n)
	for i := range u {
		want := float32(m*u[i]) + g[i]
		if math.Float32bits(gotG[i]) != math.Float32bits(want) || math.Float32bits(gotNext[i]) != math.Float32bits(want) {
			t.Fatalf("element %d: gradient %v, next %v, want %v", i, gotG[i], gotNext[i], want)
		}
	}
	st := make([]byte, StatusLen)
	if err := ctx.CopyOut(0, st, status); err != nil {
		t.Fatal(err)
	}
	if binary.LittleEndian.Uint64(st)>>32 != 777 {
		t.Errorf("status %x, want the NaN at 777", st)
	}
}

// TestMask checks gc_sparse_mask against the indices the CPU payloads of
// top-k and random-k send, and that a failed gate stops it.
func TestMask(t *testing.T) {
	ctx := device(t)
	const n = 5003
	rng := rand.New(rand.NewPCG(7, 8))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64()) + 10 // no zero: decoded nonzero ⇔ sent
	}
	for _, spec := range []string{"topk:0.05", "randomk:0.1:seed=3"} {
		c, _ := codecOf(spec)
		key := compress.Key{Bucket: 2, Step: 9}
		payload, err := c.Reference().Compress(nil, x, key)
		if err != nil {
			t.Fatal(err)
		}
		_, body, err := compress.DecodePayload(c.Reference(), payload, n)
		if err != nil {
			t.Fatal(err)
		}
		sent := make([]float32, n)
		if err := c.Reference().Decompress(sent, payload); err != nil {
			t.Fatal(err)
		}
		bp := devBuf(t, ctx, len(body))
		if err := ctx.CopyIn(0, bp, body); err != nil {
			t.Fatal(err)
		}
		gate := devBuf(t, ctx, StatusLen)
		for _, failed := range []bool{false, true} {
			g := make([]byte, StatusLen)
			for i := range g {
				g[i] = 0xff
			}
			if failed {
				binary.LittleEndian.PutUint64(g[8:], 1)
			}
			if err := ctx.CopyIn(0, gate, g); err != nil {
				t.Fatal(err)
			}
			u := upload(t, ctx, x)
			if err := c.Mask(ctx, 0, MaskArgs{U: u, N: n, Body: bp, Key: key, Gate: gate}); err != nil {
				t.Fatal(err)
			}
			got := download(t, ctx, u, n)
			for i := range x {
				want := x[i]
				if sent[i] != 0 && !failed {
					want = 0
				}
				if got[i] != want {
					t.Fatalf("%s, gate failed %v, element %d: %v, want %v", spec, failed, i, got[i], want)
				}
			}
		}
	}
}

// TestGuard checks gc_guard against GuardRatio bit for bit (written to
// every block), gc_guard_max (NaN ignored), and gc_flush against the CPU
// rule (e + g rounded once, the residual out zeroed, e untouched).
func TestGuard(t *testing.T) {
	ctx := device(t)
	const n, blocks, stride = 10007, 3, 48
	rng := rand.New(rand.NewPCG(9, 10))
	e, g := make([]float32, n), make([]float32, n)
	for i := range e {
		e[i], g[i] = float32(rng.NormFloat64()*1e-2), float32(rng.NormFloat64())
	}
	ep, gp, dst := upload(t, ctx, e), upload(t, ctx, g), devBuf(t, ctx, blocks*stride)
	if err := Guard(ctx, 0, GuardArgs{Resid: ep, Grad: gp, N: n, Dst: dst, Stride: stride, Count: blocks}); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, blocks*stride)
	if err := ctx.CopyOut(0, got, dst); err != nil {
		t.Fatal(err)
	}
	want := GuardRatio(e, g)
	for b := range blocks {
		rho := math.Float64frombits(binary.LittleEndian.Uint64(got[b*stride:]))
		if math.Float64bits(rho) != math.Float64bits(want) || binary.LittleEndian.Uint64(got[b*stride+8:]) != 0 {
			t.Fatalf("block %d: ρ %v (second word %x), want %v", b, rho, got[b*stride+8:b*stride+16], want)
		}
	}
	binary.LittleEndian.PutUint64(got[stride:], math.Float64bits(math.NaN()))
	binary.LittleEndian.PutUint64(got[2*stride:], math.Float64bits(2.5))
	if err := ctx.CopyIn(0, dst, got); err != nil {
		t.Fatal(err)
	}
	out := devBuf(t, ctx, GuardLen)
	if err := GuardMax(ctx, 0, GuardMaxArgs{Src: dst, Stride: stride, Count: blocks, Dst: out}); err != nil {
		t.Fatal(err)
	}
	m := make([]byte, GuardLen)
	if err := ctx.CopyOut(0, m, out); err != nil {
		t.Fatal(err)
	}
	if rho := math.Float64frombits(binary.LittleEndian.Uint64(m)); rho != max(want, 2.5) {
		t.Errorf("GuardMax: %v, want %v", rho, max(want, 2.5))
	}
	zero := upload(t, ctx, e)
	if err := Flush(ctx, 0, FlushArgs{Grad: gp, Resid: ep, ResidOut: zero, N: n}); err != nil {
		t.Fatal(err)
	}
	gotG, gotE, gotZ := download(t, ctx, gp, n), download(t, ctx, ep, n), download(t, ctx, zero, n)
	for i := range g {
		if math.Float32bits(gotG[i]) != math.Float32bits(e[i]+g[i]) || gotE[i] != e[i] || math.Float32bits(gotZ[i]) != 0 {
			t.Fatalf("Flush element %d: gradient %v (want %v), residual %v (want %v), out %v (want +0)", i, gotG[i], e[i]+g[i], gotE[i], e[i], gotZ[i])
		}
	}
}

// TestScale checks gc_scale against the host definition ScaleStep bit
// for bit, subnormal results included.
func TestScale(t *testing.T) {
	ctx := device(t)
	const n = 10007
	rng := rand.New(rand.NewPCG(11, 12))
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(260)-130)))
	}
	for _, c := range []float32{0.9, float32(1) / 3, 1} {
		p := upload(t, ctx, x)
		if err := Scale(ctx, 0, ScaleArgs{X: p, N: n, C: c}); err != nil {
			t.Fatal(err)
		}
		got, want := download(t, ctx, p, n), append([]float32(nil), x...)
		ScaleStep(want, c)
		for i := range want {
			if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
				t.Fatalf("c=%v element %d: %v, want %v", c, i, got[i], want[i])
			}
		}
	}
}
