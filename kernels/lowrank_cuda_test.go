//go:build cuda

package kernels

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/internal/synth"
)

// TestLowRankRound runs PowerSGD rounds on the device, every case of
// lowRankCases on 1 and 3 ranks (the all-reduces are sums on the host), with
// and without error feedback, warm (Warm zero at first, then the previous
// QNext) and cold, and compares every buffer with compress/lowrank's CPU
// round after every call, bit for bit (a NaN matching any NaN: the device's
// arithmetic makes the canonical one). The steps: 0 has a rank-1 first
// matrix (a rank-deficient P: its columns after the first are zeroed, and
// warm, redrawn at step 1) and an all-zero last one; 1 (3 ranks) uncompressed
// sums that overflow and an Inf in the last matrix's summed Q (Decode's
// report; warm, a non-finite P at step 2); 3 an Inf in the last rank's
// gradient (a failed round).
func TestLowRankRound(t *testing.T) {
	ctx := device(t)
	for _, c := range lowRankCases {
		for _, ranks := range []int{1, 3} {
			for _, ef := range []bool{false, true} {
				for _, warm := range []bool{false, true} {
					t.Run(fmt.Sprintf("%s/ranks=%d/ef=%v/warm=%v", c.name, ranks, ef, warm), func(t *testing.T) {
						runLowRankRounds(t, ctx, c.layout(), ranks, ef, warm)
					})
				}
			}
		}
	}
}

// lowRankRank is one rank of the device test: its arguments and what the
// CPU round says each float32 buffer holds.
type lowRankRank struct {
	a    LowRankArgs
	want map[string][]float32
}

// bufs returns the rank's float32 device buffers by name.
func (rk *lowRankRank) bufs() map[string]*gpu.Ptr {
	a := &rk.a
	return map[string]*gpu.Ptr{"Grad": &a.Grad, "Resid": &a.Resid, "M": &a.M, "Vals1": &a.Vals1, "Vals2": &a.Vals2,
		"QOwn": &a.QOwn, "Q": &a.Q, "Warm": &a.Warm, "QNext": &a.QNext}
}

// check compares every buffer of the rank with the CPU's.
func (rk *lowRankRank) check(t *testing.T, ctx *Context, what string) {
	t.Helper()
	for name, p := range rk.bufs() {
		if *p == 0 {
			continue
		}
		want := rk.want[name]
		got := download(t, ctx, *p, len(want))
		if i := firstFloatDiff(got, want); i >= 0 {
			t.Errorf("%s: %s[%d] = %v (%#08x), CPU %v (%#08x)", what, name, i, got[i], math.Float32bits(got[i]), want[i], math.Float32bits(want[i]))
		}
	}
}

// set uploads x to the buffer name and records it as the CPU's.
func (rk *lowRankRank) set(t *testing.T, ctx *Context, name string, x []float32) {
	t.Helper()
	if err := ctx.CopyIn(0, *rk.bufs()[name], f32.Bytes(x)); err != nil {
		t.Fatal(err)
	}
	rk.want[name] = slices.Clone(x)
}

// firstFloatDiff returns the first index where got and want differ in
// their bits, unless both are NaN, or −1.
func firstFloatDiff(got, want []float32) int {
	for i := range want {
		g, w := got[i], want[i]
		if math.Float32bits(g) != math.Float32bits(w) && !(g != g && w != w) {
			return i
		}
	}
	return -1
}

// sumRanks returns the sum over the ranks of buffer name, in rank order:
// the all-reduce.
func sumRanks(rks []*lowRankRank, name string) []float32 {
	s := slices.Clone(rks[0].want[name])
	for _, rk := range rks[1:] {
		for i, v := range rk.want[name] {
			s[i] += v
		}
	}
	return s
}

// lowRankGrad returns the gradient of rank at step (see TestLowRankRound).
func lowRankGrad(l *lowrank.Layout, step, rank, ranks int) []float32 {
	g := synth.UnitLaplace(l.N, uint64(100*step+rank))
	switch {
	case step == 0 && len(l.Mats) > 0:
		m := l.Mats[0] // rows ±2^e, the same on every rank: P's columns exactly proportional
		for i := range m.Rows {
			v := float32(math.Ldexp(1, i*7%11-5))
			if i%2 == 1 {
				v = -v
			}
			for j := range m.Cols {
				g[m.Off+i*m.Cols+j] = v
			}
		}
		if len(l.Mats) > 1 {
			z := l.Mats[len(l.Mats)-1]
			clear(g[z.Off : z.Off+z.Rows*z.Cols])
		}
	case step == 1 && ranks > 1:
		for _, f := range l.Flat {
			g[f[0]] = 3e38 // the sum over the ranks overflows
		}
	case step == 3 && rank == ranks-1 && l.N > 0:
		g[l.N/2] = float32(math.Inf(1))
	}
	return g
}

// runLowRankRounds runs the steps of TestLowRankRound on layout l.
func runLowRankRounds(t *testing.T, ctx *Context, l *lowrank.Layout, ranks int, ef, warm bool) {
	const seed = 7
	lens := map[string]int{"Grad": l.N, "Resid": l.N, "M": l.N, "Vals1": ranks + l.PLen + l.FlatLen,
		"Vals2": l.QLen, "QOwn": l.QLen, "Q": l.QLen, "Warm": l.QLen, "QNext": l.QLen}
	rks := make([]*lowRankRank, ranks)
	for r := range rks {
		rk := &lowRankRank{a: LowRankArgs{Layout: l, Ranks: ranks, Rank: r, Seed: seed,
			Work: devBuf(t, ctx, LowRankWorkspaceLen(l)), Out: devBuf(t, ctx, StatusLen)}, want: map[string][]float32{}}
		for name, p := range rk.bufs() {
			var x []float32
			switch name {
			case "Resid", "Warm": // memories: zero at first
				if name == "Resid" && !ef || name == "Warm" && !warm {
					continue
				}
				x = make([]float32, lens[name])
			case "QNext":
				if !warm {
					continue
				}
				fallthrough
			default: // what a call leaves alone must stay so
				x = synth.UnitLaplace(lens[name], uint64(1000+r))
			}
			*p = upload(t, ctx, x)
			rk.want[name] = x
		}
		rks[r] = rk
	}
	for step := range 4 {
		key := compress.Key{Bucket: 1, Step: uint64(step)}
		for r, rk := range rks {
			what := fmt.Sprintf("step %d rank %d encode", step, r)
			rk.a.Key = key
			rk.set(t, ctx, "Grad", lowRankGrad(l, step, r, ranks))
			m := slices.Clone(rk.want["Grad"])
			if ef {
				for i, e := range rk.want["Resid"] {
					m[i] = e + m[i]
				}
			}
			vals1, q := make([]float32, lens["Vals1"]), make([]float32, l.QLen)
			if warm {
				copy(q, rk.want["Warm"])
			}
			if l.Encode(vals1, m, q, !warm, ranks, r, seed, key) {
				rk.want["Q"] = q
			}
			rk.want["M"], rk.want["Vals1"] = m, vals1
			if err := LowRankEncode(ctx, 0, rk.a); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			rk.check(t, ctx, what)
		}

		sum := sumRanks(rks, "Vals1")
		failed := lowrank.Failed(sum, ranks)
		for _, rk := range rks {
			rk.set(t, ctx, "Vals1", sum)
		}
		for r, rk := range rks {
			what := fmt.Sprintf("step %d rank %d reduce", step, r)
			if failed >= 0 {
				rk.want["Vals2"] = make([]float32, l.QLen)
			} else {
				rk.want["QOwn"], rk.want["Vals2"] = make([]float32, l.QLen), make([]float32, l.QLen)
				l.Reduce(rk.want["Vals1"], rk.want["M"], rk.want["QOwn"], rk.want["Vals2"], ranks)
			}
			if err := LowRankReduce(ctx, 0, rk.a); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			rk.check(t, ctx, what)
		}
		if step == 0 && failed < 0 {
			checkLowRankZeroed(t, l, rks[0].want["Vals1"][ranks:])
		}

		sum = sumRanks(rks, "Vals2")
		if step == 1 && ranks > 1 && len(l.Mats) > 0 {
			sum[l.Mats[len(l.Mats)-1].Q] = float32(math.Inf(1))
		}
		for _, rk := range rks {
			rk.set(t, ctx, "Vals2", sum)
		}
		for r, rk := range rks {
			what := fmt.Sprintf("step %d rank %d decode", step, r)
			bad, rank := -1, uint64(math.MaxUint64)
			if failed >= 0 {
				rank = uint64(failed)
				rk.want["Grad"] = make([]float32, l.N)
				for i := range rk.want["Grad"] {
					rk.want["Grad"][i] = math.Float32frombits(0x7fc00000)
				}
			} else {
				var qNext []float32
				if warm {
					qNext = make([]float32, l.QLen)
					rk.want["QNext"] = qNext
				}
				bad = l.Decode(rk.want["Grad"], rk.want["M"], rk.want["M"], rk.want["Vals1"], rk.want["Vals2"], rk.want["QOwn"], qNext, ranks)
			}
			if err := LowRankDecode(ctx, 0, rk.a); err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			rk.check(t, ctx, what)
			if failed >= 0 {
				for i, v := range download(t, ctx, rk.a.Grad, l.N) {
					if math.Float32bits(v) != 0x7fc00000 {
						t.Fatalf("%s: failed round's Grad[%d] = %#08x, want the quiet NaN 0x7fc00000", what, i, math.Float32bits(v))
					}
				}
			}
			checkLowRankOut(t, ctx, what, rk.a.Out, bad, rank)
		}
		if failed >= 0 {
			if step != 3 {
				t.Fatalf("step %d failed on rank %d", step, failed)
			}
			return
		}
		for _, rk := range rks {
			if ef {
				rk.a.Resid, rk.a.M = rk.a.M, rk.a.Resid
				rk.want["Resid"], rk.want["M"] = rk.want["M"], rk.want["Resid"]
			}
			if warm {
				rk.a.Warm, rk.a.QNext = rk.a.QNext, rk.a.Warm
				rk.want["Warm"], rk.want["QNext"] = rk.want["QNext"], rk.want["Warm"]
			}
		}
	}
	if l.N > 0 {
		t.Error("no step failed: step 3 has an Inf in the last rank's gradient")
	}
}

// checkLowRankOut checks LowRankDecode's status words: the first the
// index bad (none for −1) of a non-finite value, the second the failed
// rank (^0 for none).
func checkLowRankOut(t *testing.T, ctx *Context, what string, out gpu.Ptr, bad int, rank uint64) {
	t.Helper()
	st := make([]byte, StatusLen)
	if err := ctx.CopyOut(0, st, out); err != nil {
		t.Fatal(err)
	}
	if got := binary.LittleEndian.Uint64(st[8:]); got != rank {
		t.Errorf("%s: failed rank recorded as %#x, want %#x", what, got, rank)
	}
	err := StatusError(append(slices.Clone(st[:8]), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
	var nf *compress.NonFiniteError
	switch {
	case bad < 0 && err != nil:
		t.Errorf("%s: status %v, the CPU found every value finite", what, err)
	case bad >= 0 && (!errors.As(err, &nf) || nf.Index != bad || !math.IsNaN(float64(nf.Value)) && !math.IsInf(float64(nf.Value), 0)):
		t.Errorf("%s: status %v, want a non-finite value at %d", what, err, bad)
	}
}

// checkLowRankZeroed checks the premise of step 0: the first matrix's P̂
// (in the summed ps) has only its first column left, the last one none.
func checkLowRankZeroed(t *testing.T, l *lowrank.Layout, ps []float32) {
	t.Helper()
	for x, m := range l.Mats {
		first := 1
		switch {
		case x == len(l.Mats)-1 && x > 0:
			first = 0
		case x != 0:
			continue
		}
		for i := range m.Rows {
			for k := first; k < m.R; k++ {
				if v := ps[m.P+i*m.R+k]; v != 0 {
					t.Fatalf("matrix %d: P̂[%d][%d] = %v, the test wants the column zeroed", x, i, k, v)
				}
			}
		}
	}
}
