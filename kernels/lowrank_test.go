package kernels

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
	"github.com/gradcomp/gradcomp/gpu"
)

// lowRankCase is a bucket of the low-rank tests: its tensors' shapes, laid
// out by lowrank.NewLayout at a rank.
type lowRankCase struct {
	name   string
	shapes [][2]int
	rank   int
	minC   float64 // NewLayout's minCompression
}

// layout returns the case's layout.
func (c lowRankCase) layout() *lowrank.Layout { return lowrank.NewLayout(c.shapes, c.rank, c.minC) }

// lowRankCases are the layouts the plan and device tests run: matrices
// of odd sizes (fewer rows than a warp or a MulTP block, rows not a
// multiple of 32, more columns than a gc_lowrank_mulq tile, a 1×1 one),
// uncompressed ranges before, between and after them, ranks up to 12 (two
// passes of the products), and the layouts without matrices.
var lowRankCases = []lowRankCase{
	{"mixed", [][2]int{{1, 10}, {40, 50}, {3, 3}, {17, 100}, {1, 7}, {70, 33}, {5, 40}}, 4, 1},
	{"rank8", [][2]int{{31, 45}, {1, 5}, {64, 64}, {100, 9}, {5, 40}, {2, 3}}, 8, 1},
	{"small", [][2]int{{3, 101}, {1, 1}, {33, 17}, {0, 5}, {48, 2}}, 2, 0.5},
	{"wide", [][2]int{{20, 600}, {1, 3}, {300, 40}}, 12, 1},
	{"flat", [][2]int{{1, 100}, {2, 2}}, 2, 1},
	{"empty", nil, 1, 1},
}

// fakeLowRankArgs returns arguments for layout l with distinct, aligned,
// non-overlapping device addresses; warm adds Warm and QNext, ef Resid.
func fakeLowRankArgs(l *lowrank.Layout, ranks, rank int, warm, ef bool) LowRankArgs {
	a := LowRankArgs{Layout: l, Ranks: ranks, Rank: rank, Grad: 1 << 40, M: 2 << 40, Vals1: 3 << 40,
		Vals2: 4 << 40, QOwn: 5 << 40, Q: 6 << 40, Work: 7 << 40, Out: 8 << 40, Seed: 11, Key: compress.Key{Bucket: 2, Step: 9}}
	if warm {
		a.Warm, a.QNext = 9<<40, 10<<40
	}
	if ef {
		a.Resid = 11 << 40
	}
	return a
}

// lowRankPlans returns the plans of the three calls for every case, world
// and start, by name, for TestPlansMatchPTX; and a layout whose grids hit
// maxGrid.
func lowRankPlans(t *testing.T) map[string][]step {
	t.Helper()
	cases := append(slices.Clone(lowRankCases), lowRankCase{"tall", [][2]int{{1 << 24, 255}}, 1, 1})
	plans := map[string][]step{}
	for _, c := range cases {
		l := c.layout()
		for _, ranks := range []int{1, 3, 65535} {
			for _, warm := range []bool{false, true} {
				a := fakeLowRankArgs(l, ranks, ranks-1, warm, warm)
				for call, build := range map[string]func(LowRankArgs) ([]step, error){
					"encode": lowRankEncodePlan, "reduce": lowRankReducePlan, "decode": lowRankDecodePlan,
				} {
					plan, err := build(a)
					if err != nil {
						t.Fatalf("%s ranks=%d warm=%v %s: %v", c.name, ranks, warm, call, err)
					}
					plans[fmt.Sprintf("low-rank %s ranks=%d warm=%v %s", c.name, ranks, warm, call)] = plan
				}
			}
		}
	}
	return plans
}

// TestLowRankWorkspaceLen checks the workspace's length: the larger of
// the largest matrix's float64 P and MulTP block sums, rounded up to 8,
// then the gate.
func TestLowRankWorkspaceLen(t *testing.T) {
	for _, tc := range []struct {
		shapes [][2]int
		rank   int
		want   int
	}{
		{nil, 1, 8},                       // the gate alone
		{[][2]int{{40, 50}}, 4, 1600 + 8}, // block sums: 2 blocks · 50 · 4 floats > 40 · 4 doubles
		{[][2]int{{100, 9}}, 8, 6400 + 8}, // P: 100 · 8 doubles > 4 blocks · 9 · 8 floats
		{[][2]int{{3, 101}}, 1, 408 + 8},  // 404 bytes of block sums, rounded up to 8
		{[][2]int{{100, 9}, {3, 101}, {40, 50}}, 8, 6400 + 8},
	} {
		l := lowrank.NewLayout(tc.shapes, tc.rank, 0.5)
		if got := LowRankWorkspaceLen(l); got != tc.want {
			t.Errorf("%v rank %d: %d bytes, want %d", tc.shapes, tc.rank, got, tc.want)
		}
	}
	if got := LowRankWorkspaceLen(lowRankCases[4].layout()); got != 8 {
		t.Errorf("no matrix: %d bytes, want 8 (the gate)", got)
	}
	for _, c := range lowRankCases {
		l := c.layout()
		gate := lowRankGateOffset(l)
		for _, m := range l.Mats {
			if need := max(8*m.Rows*m.R, 4*tpBlocks(m.Rows)*m.Cols*m.R); need > gate {
				t.Errorf("%s: matrix %+v needs %d bytes of scratch, the gate is at %d", c.name, m, need, gate)
			}
		}
		if n := LowRankWorkspaceLen(l); gate%8 != 0 || n != gate+8 {
			t.Errorf("%s: gate at %d of %d bytes", c.name, gate, n)
		}
	}
}

// TestLowRankArgsRejected checks that the three calls refuse, on the host
// and with an *ArgumentError naming the call, arguments they cannot run,
// and accept the buffers that may be shared.
func TestLowRankArgsRejected(t *testing.T) {
	base := lowRankCases[0].layout()
	good := fakeLowRankArgs(base, 3, 1, true, true)
	calls := []struct {
		op   string
		plan func(LowRankArgs) ([]step, error)
		run  func(*Context, gpu.Stream, LowRankArgs) error
	}{
		{"LowRankEncode", lowRankEncodePlan, LowRankEncode},
		{"LowRankReduce", lowRankReducePlan, LowRankReduce},
		{"LowRankDecode", lowRankDecodePlan, LowRankDecode},
	}
	edit := func(f func(l *lowrank.Layout)) func(a *LowRankArgs) {
		return func(a *LowRankArgs) {
			l := *base
			l.Mats, l.Flat = slices.Clone(l.Mats), slices.Clone(l.Flat)
			f(&l)
			a.Layout = &l
		}
	}
	for name, mod := range map[string]func(a *LowRankArgs){
		"nil layout":          func(a *LowRankArgs) { a.Layout = nil },
		"zero ranks":          func(a *LowRankArgs) { a.Ranks, a.Rank = 0, 0 },
		"too many ranks":      func(a *LowRankArgs) { a.Ranks = 1 << 16 },
		"negative rank":       func(a *LowRankArgs) { a.Rank = -1 },
		"rank = ranks":        func(a *LowRankArgs) { a.Rank = 3 },
		"null gradient":       func(a *LowRankArgs) { a.Grad = 0 },
		"null M":              func(a *LowRankArgs) { a.M = 0 },
		"null vals1":          func(a *LowRankArgs) { a.Vals1 = 0 },
		"null vals2":          func(a *LowRankArgs) { a.Vals2 = 0 },
		"null own Q":          func(a *LowRankArgs) { a.QOwn = 0 },
		"null Q":              func(a *LowRankArgs) { a.Q = 0 },
		"null workspace":      func(a *LowRankArgs) { a.Work = 0 },
		"null out":            func(a *LowRankArgs) { a.Out = 0 },
		"misaligned gradient": func(a *LowRankArgs) { a.Grad += 2 },
		"misaligned warm":     func(a *LowRankArgs) { a.Warm++ },
		"misaligned work":     func(a *LowRankArgs) { a.Work += 4 },
		"misaligned out":      func(a *LowRankArgs) { a.Out += 4 },
		"M on the gradient":   func(a *LowRankArgs) { a.M = a.Grad },
		"own Q on vals2":      func(a *LowRankArgs) { a.QOwn = a.Vals2 + 4 },
		"resid shifted on M":  func(a *LowRankArgs) { a.Resid = a.M + 4 },
		"warm shifted on Q":   func(a *LowRankArgs) { a.Warm = a.Q + 8 },
		"next Q on vals2":     func(a *LowRankArgs) { a.QNext = a.Vals2 },
		"work on out":         func(a *LowRankArgs) { a.Out = a.Work + 8 },
		"negative N":          edit(func(l *lowrank.Layout) { l.N = -1 }),
		"N past the matrices": edit(func(l *lowrank.Layout) { l.N++ }),
		"rank 0 matrix":       edit(func(l *lowrank.Layout) { l.Mats[1].R = 0 }),
		"rank above rows":     edit(func(l *lowrank.Layout) { l.Mats[3].R = 6 }),
		"P out of place":      edit(func(l *lowrank.Layout) { l.Mats[2].P++ }),
		"Q out of place":      edit(func(l *lowrank.Layout) { l.Mats[2].Q-- }),
		"wrong PLen":          edit(func(l *lowrank.Layout) { l.PLen++ }),
		"wrong QLen":          edit(func(l *lowrank.Layout) { l.QLen-- }),
		"wrong FlatLen":       edit(func(l *lowrank.Layout) { l.FlatLen++ }),
		"matrix past N":       edit(func(l *lowrank.Layout) { l.Mats[3].Off = l.N - 1 }),
		"empty range":         edit(func(l *lowrank.Layout) { l.Flat[1][1] = l.Flat[1][0] }),
		"range on a matrix":   edit(func(l *lowrank.Layout) { l.Flat[0][1], l.FlatLen = l.Flat[0][1]+1, l.FlatLen+1 }),
		"ranges descending":   edit(func(l *lowrank.Layout) { l.Flat[0], l.Flat[1] = l.Flat[1], l.Flat[0] }),
		"a gap":               edit(func(l *lowrank.Layout) { l.Flat, l.FlatLen = l.Flat[1:], l.FlatLen-10 }),
		"matrices out of order": edit(func(l *lowrank.Layout) {
			l.Mats[0], l.Mats[1] = l.Mats[1], l.Mats[0]
			l.Mats[0].P, l.Mats[0].Q, l.Mats[1].P, l.Mats[1].Q = 0, 0, l.Mats[0].Rows*4, l.Mats[0].Cols*4
		}),
	} {
		a := good
		mod(&a)
		for _, c := range calls {
			var ae *ArgumentError
			if _, err := c.plan(a); !errors.As(err, &ae) || ae.Op != c.op {
				t.Errorf("%s %s: got %v, want an *ArgumentError of %s", c.op, name, err, c.op)
			}
			if err := c.run(nil, 0, a); !errors.As(err, &ae) {
				t.Errorf("%s %s on a nil context: got %v, want the *ArgumentError first", c.op, name, err)
			}
		}
	}
	empty := lowrank.NewLayout(nil, 1, 1)
	for name, a := range map[string]LowRankArgs{
		"resid is M":       func() LowRankArgs { a := good; a.Resid = a.M; return a }(),
		"warm is Q":        func() LowRankArgs { a := good; a.Warm = a.Q; return a }(),
		"next Q is warm":   func() LowRankArgs { a := good; a.QNext = a.Warm; return a }(),
		"cold, no memory":  fakeLowRankArgs(base, 1, 0, false, false),
		"empty bucket":     {Layout: empty, Ranks: 2, Rank: 1, Vals1: 1 << 40, Work: 2 << 40, Out: 3 << 40},
		"flat only, no Qs": {Layout: lowRankCases[4].layout(), Ranks: 1, Grad: 1 << 40, M: 2 << 40, Vals1: 3 << 40, Work: 4 << 40, Out: 5 << 40},
	} {
		for _, c := range calls {
			if _, err := c.plan(a); err != nil {
				t.Errorf("%s %s: refused: %v", c.op, name, err)
			}
		}
	}
}

// fnNames returns the kernels of a plan in order, "memset" for a memset.
func fnNames(plan []step) []string {
	var names []string
	for _, s := range plan {
		if s.fn == "" {
			names = append(names, "memset")
		} else {
			names = append(names, strings.TrimPrefix(s.fn, "gc_lowrank_"))
		}
	}
	return names
}

// TestLowRankPlans checks the launches of the three calls: per matrix and
// range, their grids and blocks, and the addresses of a matrix's blocks.
func TestLowRankPlans(t *testing.T) {
	l := lowRankCases[0].layout() // 4 matrices at rank 4, ranges before the 1st, 2nd and 3rd
	if len(l.Mats) != 4 || len(l.Flat) != 3 {
		t.Fatalf("layout %+v: want 4 matrices and 3 ranges", l)
	}
	for _, warm := range []bool{false, true} {
		a := fakeLowRankArgs(l, 3, 2, warm, true)
		enc, err := lowRankEncodePlan(a)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"memset", "memset", "sum", "fail", "q", "mulq", "q", "mulq", "q", "mulq", "q", "mulq", "scale", "scale", "scale"}
		if got := fnNames(enc); !slices.Equal(got, want) {
			t.Fatalf("warm=%v encode: %v, want %v", warm, got, want)
		}
		gate := uint64(a.Work) + uint64(lowRankGateOffset(l))
		if s := enc[1]; s.ptr != gpu.Ptr(gate) || s.count != 1 || s.val != 0xffffffff {
			t.Errorf("encode opens the gate with %+v, want one word ~0 at %#x", s, gate)
		}
		if s := enc[0]; s.ptr != a.Vals1 || s.count != 3 || s.val != 0 {
			t.Errorf("encode clears the statuses with %+v, want 3 zero words at Vals1", s)
		}
		for x, m := range l.Mats {
			q, mulq := enc[4+2*x], enc[5+2*x]
			wantWarm := uint64(0)
			if warm {
				wantWarm = uint64(a.Warm) + 4*uint64(m.Q)
			}
			base := compress.StreamBase(a.Seed, a.Key, compress.DomainLowRank+uint64(m.Tensor))
			if q.grid != 1 || q.block != 1024 || q.args[0] != uint64(a.Q)+4*uint64(m.Q) || q.args[1] != wantWarm || q.args[4] != base {
				t.Errorf("warm=%v matrix %d: q launch %+v", warm, x, q)
			}
			if mulq.grid != uint32((m.Rows+7)/8) || mulq.block != 256 || mulq.args[0] != uint64(a.Vals1)+4*uint64(3+m.P) ||
				mulq.args[1] != uint64(a.M)+4*uint64(m.Off) || mulq.args[4] != q.args[0] {
				t.Errorf("warm=%v matrix %d (%d rows): mulq launch %+v", warm, x, m.Rows, mulq)
			}
		}
		pos := 3 + l.PLen
		for x, f := range l.Flat {
			s := enc[12+x]
			if s.args[0] != uint64(a.Vals1)+4*uint64(pos) || s.args[1] != uint64(a.M)+4*uint64(f[0]) || s.args[2] != uint64(f[1]-f[0]) || s.args[3] != f32Arg(1) {
				t.Errorf("range %d: copy %+v", x, s)
			}
			pos += f[1] - f[0]
		}

		red, err := lowRankReducePlan(a)
		if err != nil {
			t.Fatal(err)
		}
		want = []string{"gate", "orth", "tp_blocks", "tp_sum", "orth", "tp_blocks", "tp_sum", "orth", "tp_blocks", "tp_sum", "orth", "tp_blocks", "tp_sum"}
		if got := fnNames(red); !slices.Equal(got, want) {
			t.Fatalf("reduce: %v, want %v", got, want)
		}
		if s := red[0]; s.grid != 1 || s.block != 256 || s.args[3] != 0 {
			t.Errorf("reduce gate %+v: one block, no status words", s)
		}
		for x, m := range l.Mats {
			orth, blocks, sum := red[1+3*x], red[2+3*x], red[3+3*x]
			nb := (m.Rows + 31) / 32
			if orth.grid != 1 || orth.block != 256 || orth.args[0] != uint64(a.Vals1)+4*uint64(3+m.P) {
				t.Errorf("matrix %d: orth launch %+v", x, orth)
			}
			if blocks.grid != gridFor(uint64(nb*m.Cols), 256) || blocks.args[0] != uint64(a.Work) {
				t.Errorf("matrix %d: %d×%d block sums launched as %+v", x, nb, m.Cols, blocks)
			}
			if sum.grid != gridFor(uint64(m.Cols*m.R), 256) || sum.args[0] != uint64(a.QOwn)+4*uint64(m.Q) ||
				sum.args[1] != uint64(a.Vals2)+4*uint64(m.Q) || sum.args[3] != uint64(nb) {
				t.Errorf("matrix %d: total launched as %+v", x, sum)
			}
		}

		dec, err := lowRankDecodePlan(a)
		if err != nil {
			t.Fatal(err)
		}
		want = []string{"memset", "gate", "decompose", "decompose", "decompose", "decompose", "flat", "flat", "flat"}
		if warm {
			want = append(want, "scale")
		}
		if got := fnNames(dec); !slices.Equal(got, want) {
			t.Fatalf("warm=%v decode: %v, want %v", warm, got, want)
		}
		if s := dec[0]; s.ptr != a.Out || s.count != StatusLen/4 || s.val != 0xffffffff {
			t.Errorf("decode resets out with %+v", s)
		}
		if s := dec[1]; s.args[3] != uint64(a.Out) {
			t.Errorf("decode gate %+v: want the status words at %#x", s, a.Out)
		}
		for x, m := range l.Mats {
			s := dec[2+x]
			if s.grid != gridFor(uint64(m.Rows*m.Cols), 256) || s.args[0] != uint64(a.Grad)+4*uint64(m.Off) ||
				s.args[8] != f32Arg(1.0/3) || s.args[9] != uint64(m.Off) {
				t.Errorf("matrix %d: decompose %+v", x, s)
			}
		}
		if warm {
			if s := dec[len(dec)-1]; s.args[0] != uint64(a.QNext) || s.args[2] != uint64(l.QLen) || s.args[3] != f32Arg(1.0/3) {
				t.Errorf("next warm start %+v", s)
			}
		}
	}

	empty := LowRankArgs{Layout: lowrank.NewLayout(nil, 1, 1), Ranks: 2, Vals1: 1 << 40, Work: 2 << 40, Out: 3 << 40}
	for _, tc := range []struct {
		call string
		plan func(LowRankArgs) ([]step, error)
		want []string
	}{
		{"encode", lowRankEncodePlan, []string{"memset"}},
		{"reduce", lowRankReducePlan, nil},
		{"decode", lowRankDecodePlan, []string{"memset", "gate"}},
	} {
		plan, err := tc.plan(empty)
		if got := fnNames(plan); err != nil || !slices.Equal(got, tc.want) {
			t.Errorf("empty bucket %s: %v, %v; want %v", tc.call, got, err, tc.want)
		}
	}

	tall := lowrank.NewLayout([][2]int{{1 << 24, 255}}, 1, 1)
	enc, err := lowRankEncodePlan(fakeLowRankArgs(tall, 1, 0, false, false))
	if err != nil {
		t.Fatal(err)
	}
	if s := enc[5]; s.fn != "gc_lowrank_mulq" || s.grid != maxGrid {
		t.Errorf("%d rows: %s launches %d blocks, want %d (grid-stride beyond)", 1<<24, s.fn, s.grid, maxGrid)
	}
}
