//go:build cuda

package kernels

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"testing"
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
