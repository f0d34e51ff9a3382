package kernels

import (
	"cmp"
	"fmt"
	"math"
	"slices"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/lowrank"
	"github.com/gradcomp/gradcomp/gpu"
)

// LowRankArgs are the device buffers of one bucket's PowerSGD round
// (lowrank.Layout's doc defines the round and its buffers):
// LowRankEncode, the first all-reduce (Vals1), LowRankReduce, the second
// (Vals2), LowRankDecode, all on the buffers of one LowRankArgs. Every
// pointer is 4-byte aligned (Work and Out 8-byte); float32 counts follow
// the Layout.
type LowRankArgs struct {
	Layout *lowrank.Layout
	Ranks  int // the world size, 1 to 65535
	Rank   int // this rank, in [0, Ranks)
	// Grad holds N float32: the gradient g, only read by LowRankEncode;
	// LowRankDecode writes the average there.
	Grad gpu.Ptr
	// Resid holds N float32: the error-feedback memory e, only read; 0
	// without error feedback.
	Resid gpu.Ptr
	// M holds N float32: LowRankEncode writes M = e + g (rounded once, as
	// the codecs' error feedback; g itself without Resid), and
	// LowRankDecode replaces it by the residual: M − P̂·Q_ownᵀ on every
	// compressed tensor, zero on the uncompressed ranges.
	M gpu.Ptr
	// Vals1 holds Ranks + PLen + FlatLen float32, the first all-reduce's
	// buffer: the ranks' statuses (1 at a rank whose M is not finite, else
	// 0), the P's, the uncompressed elements.
	Vals1 gpu.Ptr
	// Vals2 holds QLen float32, the second all-reduce's buffer: the Q's.
	Vals2 gpu.Ptr
	QOwn  gpu.Ptr // QLen float32: this rank's Q's, Mᵀ·P̂
	Q     gpu.Ptr // QLen float32: the Q's P is computed with
	// Warm holds QLen float32, the warm start's memory (the previous
	// step's Q̄), only read; 0 for a cold start (every column drawn).
	Warm gpu.Ptr
	// QNext holds QLen float32: LowRankDecode writes Q̄ = Σ Q · (1/Ranks)
	// there, the next step's Warm. 0 for a cold start.
	QNext gpu.Ptr
	// Work holds LowRankWorkspaceLen(Layout) bytes, the calls' scratch:
	// calls that share it must be ordered (one stream, or events).
	Work gpu.Ptr
	Seed uint64 // the Q draws' seed
	Key  compress.Key
	// Out holds StatusLen bytes: LowRankDecode's result status, as
	// Average's Out.
	Out gpu.Ptr
}

// LowRankEncode enqueues on s a PowerSGD round's first step on this rank
// (lowrank.Layout.Encode) and returns without waiting: it sets the
// statuses Vals1[0, Ranks) to zero and M = Resid + Grad (rounded once;
// Grad itself without Resid). If M holds a NaN or ±Inf it sets Vals1[Rank]
// to 1 and the rest of Vals1 to zero, and nothing else; otherwise it sets
// Q to Warm and draws Warm's all-zero columns (every column without Warm:
// lowrank.DrawQ with Seed and Key), writes each matrix's P = M·Q to Vals1
// after the statuses (lowrank.MulQ) and copies the uncompressed elements
// of M after the P's. The results are the CPU's bit for bit (but for a
// NaN's payload). The first all-reduce (a sum of Vals1 over the ranks)
// follows on s.
func LowRankEncode(ctx *Context, s gpu.Stream, a LowRankArgs) error {
	plan, err := lowRankEncodePlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// LowRankReduce enqueues on s the step between a round's all-reduces, on
// the summed Vals1, and returns without waiting. If a status in Vals1 is
// not zero (the round failed on some rank) it sets Vals2 to zero, and
// nothing else, so that the second all-reduce still runs on every rank;
// otherwise it does lowrank.Layout.Reduce: it orthogonalizes each matrix's
// P in Vals1 in place (lowrank.Orthogonalize), writes QOwn = Mᵀ·P̂
// (lowrank.MulTP) and copies QOwn to Vals2, the CPU's results bit for bit.
// The second all-reduce (a sum of Vals2 over the ranks) follows on s.
func LowRankReduce(ctx *Context, s gpu.Stream, a LowRankArgs) error {
	plan, err := lowRankReducePlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// LowRankDecode enqueues on s a round's last step, on the summed Vals1 and
// Vals2, and returns without waiting. It resets Out, as Average does. If
// a status in Vals1 is not zero it sets every element of Grad to a quiet
// NaN and records the lowest failing rank in Out's second word (binary
// little-endian uint64), and changes nothing else. Otherwise it does
// lowrank.Layout.Decode, the CPU's results bit for bit (but for a NaN's
// payload): Grad gets the average, P̂·(Q̄/Ranks)ᵀ on each matrix and the
// uncompressed elements' average (compress.Average, also written over
// their sums in Vals1) on the rest, M the residual (M − P̂·QOwnᵀ, zero on
// the uncompressed elements), and QNext, when set, Vals2·(1/Ranks), the
// next step's warm start. Out's first word records the lowest of the
// first element of a matrix whose summed Q holds a NaN or ±Inf (with such
// a value) and the index of a non-finite average: StatusError reads it as
// a *compress.NonFiniteError, whose Index is Decode's result.
func LowRankDecode(ctx *Context, s gpu.Stream, a LowRankArgs) error {
	plan, err := lowRankDecodePlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// The launch shapes of the round's kernels (lowrank.cu).
const (
	lowRankGateOpen    = 0xffffffff // GATE_OPEN: the round goes on
	lowRankGateLen     = 8          // the gate's bytes in the workspace (a u32, padded)
	lowRankGateThreads = 256        // gc_lowrank_gate: one block
	drawQThreads       = 1024       // gc_lowrank_q: one block per matrix
	mulQThreads        = 256        // gc_lowrank_mulq: a warp per row, 8 rows per block
	orthThreads        = 256        // gc_lowrank_orth: one block per matrix
	tpBlockRows        = 32         // TP_BLOCK: MulTP's block of rows (lowrank.MulTP)
)

// LowRankWorkspaceLen returns the bytes LowRankArgs.Work needs for layout
// l, a multiple of 8: a scratch region, then the gate (the flag by which
// a call's later kernels learn that the round failed). The region holds,
// in turn (the kernels of one matrix run after the previous matrix's, on
// one stream), a matrix's P as float64 columns for the orthogonalization
// (Rows·R doubles) and its MulTP block sums (⌈Rows/32⌉·Cols·R floats),
// so it is the largest of these over the matrices: for ranks up to 32 at
// most 8 bytes per element of the bucket.
func LowRankWorkspaceLen(l *lowrank.Layout) int {
	return lowRankGateOffset(l) + lowRankGateLen
}

// lowRankGateOffset returns the gate's byte offset in the workspace: the
// scratch region's length rounded up to 8.
func lowRankGateOffset(l *lowrank.Layout) int {
	n := 0
	for _, m := range l.Mats {
		n = max(n, 8*m.Rows*m.R, 4*tpBlocks(m.Rows)*m.Cols*m.R)
	}
	return (n + 7) &^ 7
}

// tpBlocks returns the number of MulTP's row blocks in rows rows.
func tpBlocks(rows int) int { return (rows + tpBlockRows - 1) / tpBlockRows }

// checkLayout returns why l is not a layout the device's round can run,
// or nil: it must have the form lowrank.NewLayout gives, its matrices and
// ranges in bucket order tiling the N elements, the matrices' P's and Q's at the
// running sums of Rows·R and Cols·R, 1 ≤ R ≤ min(Rows, Cols, MaxLowRank),
// and its lengths the sums of its parts.
func checkLayout(l *lowrank.Layout) error {
	if l.N < 0 || int64(l.N) > compress.MaxElements {
		return fmt.Errorf("N = %d outside [0, %d]", l.N, uint64(compress.MaxElements))
	}
	// The descriptions are made only for an error: the checks run on
	// every call.
	mat := func(x int) string {
		m := l.Mats[x]
		return fmt.Sprintf("matrix %d (%d×%d at %d, rank %d)", x, m.Rows, m.Cols, m.Off, m.R)
	}
	flat := func(x int) string {
		return fmt.Sprintf("uncompressed range %d [%d, %d)", x, l.Flat[x][0], l.Flat[x][1])
	}
	type span struct {
		lo, hi int
		x      int // the matrix's or range's index
		isMat  bool
	}
	what := func(s span) string {
		if s.isMat {
			return mat(s.x)
		}
		return flat(s.x)
	}
	spans := make([]span, 0, len(l.Mats)+len(l.Flat))
	plen, qlen, flen := 0, 0, 0
	for x, m := range l.Mats {
		switch {
		case m.Rows < 1 || m.Cols < 1 || m.Rows > l.N || m.Cols > l.N/m.Rows:
			return fmt.Errorf("%s: not a matrix of at most N = %d elements", mat(x), l.N)
		case m.R < 1 || m.R > min(m.Rows, m.Cols, compress.MaxLowRank):
			return fmt.Errorf("%s: rank outside [1, min(rows, cols, %d)]", mat(x), compress.MaxLowRank)
		case m.Off < 0 || m.Off > l.N-m.Rows*m.Cols:
			return fmt.Errorf("%s: outside the bucket of %d elements", mat(x), l.N)
		case m.P != plen || m.Q != qlen:
			return fmt.Errorf("%s: P at %d and Q at %d, want %d and %d (after the matrices before it)", mat(x), m.P, m.Q, plen, qlen)
		case x > 0 && m.Off < l.Mats[x-1].Off:
			return fmt.Errorf("%s: before matrix %d (at %d): not in bucket order", mat(x), x-1, l.Mats[x-1].Off)
		}
		spans = append(spans, span{m.Off, m.Off + m.Rows*m.Cols, x, true})
		plen += m.Rows * m.R
		qlen += m.Cols * m.R
	}
	for x, f := range l.Flat {
		switch {
		case f[0] < 0 || f[0] >= f[1] || f[1] > l.N:
			return fmt.Errorf("%s: empty or outside the bucket of %d elements", flat(x), l.N)
		case x > 0 && f[0] < l.Flat[x-1][1]:
			return fmt.Errorf("%s: not after range %d: not ascending and apart", flat(x), x-1)
		}
		spans = append(spans, span{f[0], f[1], x, false})
		flen += f[1] - f[0]
	}
	if plen != l.PLen || qlen != l.QLen || flen != l.FlatLen {
		return fmt.Errorf("PLen, QLen, FlatLen = %d, %d, %d; the matrices and ranges make %d, %d, %d", l.PLen, l.QLen, l.FlatLen, plen, qlen, flen)
	}
	slices.SortStableFunc(spans, func(a, b span) int { return cmp.Compare(a.lo, b.lo) })
	at := 0
	for x, s := range spans {
		switch {
		case s.lo < at:
			return fmt.Errorf("%s overlaps %s", what(s), what(spans[x-1]))
		case s.lo > at:
			return fmt.Errorf("elements [%d, %d) are in no matrix or range", at, s.lo)
		}
		at = s.hi
	}
	if at != l.N {
		return fmt.Errorf("elements [%d, %d) are in no matrix or range", at, l.N)
	}
	return nil
}

// lowRankBuffer is one of LowRankArgs' device buffers, for the checks.
type lowRankBuffer struct {
	name  string
	p     gpu.Ptr
	bytes uint64
	need  bool // the layout needs it: it must not be null
	align gpu.Ptr
	input bool // only read by the round (Resid, Warm)
}

// check validates a for op (the calling function's name): the world, the
// layout (checkLayout), and every buffer the layout needs present and
// aligned; buffers that the round writes may not overlap another buffer,
// except that Resid may be M itself (in-place error feedback) and Q,
// QNext and Warm may be one buffer with each other.
func (a *LowRankArgs) check(op string) error {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: op, Reason: fmt.Sprintf(format, v...)}
	}
	l := a.Layout
	switch {
	case l == nil:
		return bad("nil layout")
	case a.Ranks < 1 || a.Ranks > math.MaxUint16:
		return bad("%d ranks, want 1 to %d", a.Ranks, math.MaxUint16)
	case a.Rank < 0 || a.Rank >= a.Ranks:
		return bad("rank %d outside [0, %d)", a.Rank, a.Ranks)
	}
	if err := checkLayout(l); err != nil {
		return bad("layout: %v", err)
	}
	n, q := 4*uint64(l.N), 4*uint64(l.QLen)
	bufs := []lowRankBuffer{
		{"Grad", a.Grad, n, l.N > 0, 4, false},
		{"Resid", a.Resid, n, false, 4, true},
		{"M", a.M, n, l.N > 0, 4, false},
		{"Vals1", a.Vals1, 4 * uint64(a.Ranks+l.PLen+l.FlatLen), true, 4, false},
		{"Vals2", a.Vals2, q, l.QLen > 0, 4, false},
		{"QOwn", a.QOwn, q, l.QLen > 0, 4, false},
		{"Q", a.Q, q, l.QLen > 0, 4, false},
		{"Warm", a.Warm, q, false, 4, true},
		{"QNext", a.QNext, q, false, 4, false},
		{"Work", a.Work, uint64(LowRankWorkspaceLen(l)), true, 8, false},
		{"Out", a.Out, StatusLen, true, 8, false},
	}
	for _, b := range bufs {
		switch {
		case b.need && b.p == 0:
			return bad("null %s (%d bytes)", b.name, b.bytes)
		case b.p%b.align != 0:
			return bad("%s %#x is not %d-byte aligned", b.name, b.p, b.align)
		}
	}
	for x, b := range bufs {
		for _, c := range bufs[:x] {
			if b.p == 0 || c.p == 0 || b.input && c.input || !overlapSpans(b.p, b.bytes, c.p, c.bytes) ||
				b.p == c.p && lowRankMayShare(b.name, c.name) {
				continue
			}
			return bad("%s %#x (%d bytes) overlaps %s %#x (%d bytes)", b.name, b.p, b.bytes, c.name, c.p, c.bytes)
		}
	}
	return nil
}

// lowRankMayShare reports whether buffers x and y (LowRankArgs' names) may
// be one buffer: M and Resid (the residual replaces e in place), and any
// two of Q, Warm and QNext (no kernel reads one of them while another is
// written: Encode copies Warm to Q element by element, Decode writes
// QNext from Vals2).
func lowRankMayShare(x, y string) bool {
	pair := func(a, b string) bool { return x == a && y == b || x == b && y == a }
	return pair("M", "Resid") || pair("Q", "Warm") || pair("QNext", "Warm") || pair("QNext", "Q")
}

// gate returns the device address of a's gate.
func (a *LowRankArgs) gate() uint64 { return ptrArg(a.Work) + uint64(lowRankGateOffset(a.Layout)) }

// elemAddr returns the address of float32 element i of buffer p.
func elemAddr(p gpu.Ptr, i int) uint64 { return ptrArg(p) + 4*uint64(i) }

// lowRankEncodePlan returns the operations of LowRankEncode.
func lowRankEncodePlan(a LowRankArgs) ([]step, error) {
	if err := a.check("LowRankEncode"); err != nil {
		return nil, err
	}
	l := a.Layout
	plan := []step{memset32(a.Vals1, 0, uint64(a.Ranks))}
	if l.N == 0 {
		return plan, nil
	}
	gate, n, rest := a.gate(), uint64(l.N), uint64(l.PLen+l.FlatLen)
	plan = append(plan, memset32(gpu.Ptr(gate), lowRankGateOpen, 1),
		elementwise("gc_lowrank_sum", n, ptrArg(a.M), ptrArg(a.Grad), ptrArg(a.Resid), n, gate),
		elementwise("gc_lowrank_fail", rest, ptrArg(a.Vals1), uint64(a.Ranks), uint64(a.Rank), rest, gate))
	for _, m := range l.Mats {
		warm := uint64(0)
		if a.Warm != 0 {
			warm = elemAddr(a.Warm, m.Q)
		}
		base := compress.StreamBase(a.Seed, a.Key, compress.DomainLowRank+uint64(m.Tensor))
		rows, cols, r, q := uint64(m.Rows), uint64(m.Cols), uint64(m.R), elemAddr(a.Q, m.Q)
		plan = append(plan,
			launch("gc_lowrank_q", 1, drawQThreads, q, warm, cols, r, base, gate),
			launch("gc_lowrank_mulq", gridFor(rows, mulQThreads/32), mulQThreads,
				elemAddr(a.Vals1, a.Ranks+m.P), elemAddr(a.M, m.Off), rows, cols, q, r, gate))
	}
	pos := a.Ranks + l.PLen
	for _, f := range l.Flat {
		k := uint64(f[1] - f[0])
		plan = append(plan, elementwise("gc_lowrank_scale", k, elemAddr(a.Vals1, pos), elemAddr(a.M, f[0]), k, f32Arg(1), gate))
		pos += f[1] - f[0]
	}
	return plan, nil
}

// lowRankReducePlan returns the operations of LowRankReduce.
func lowRankReducePlan(a LowRankArgs) ([]step, error) {
	if err := a.check("LowRankReduce"); err != nil {
		return nil, err
	}
	l := a.Layout
	if len(l.Mats) == 0 {
		return nil, nil // no Q's: Vals2 is empty
	}
	gate := a.gate()
	plan := []step{launch("gc_lowrank_gate", 1, lowRankGateThreads, ptrArg(a.Vals1), uint64(a.Ranks), gate, 0)}
	for _, m := range l.Mats {
		rows, cols, r, p := uint64(m.Rows), uint64(m.Cols), uint64(m.R), elemAddr(a.Vals1, a.Ranks+m.P)
		nb := uint64(tpBlocks(m.Rows))
		plan = append(plan,
			launch("gc_lowrank_orth", 1, orthThreads, p, rows, r, ptrArg(a.Work), gate),
			elementwise("gc_lowrank_tp_blocks", nb*cols, ptrArg(a.Work), elemAddr(a.M, m.Off), rows, cols, p, r, gate),
			elementwise("gc_lowrank_tp_sum", cols*r, elemAddr(a.QOwn, m.Q), elemAddr(a.Vals2, m.Q), ptrArg(a.Work), nb, cols*r, gate))
	}
	return plan, nil
}

// lowRankDecodePlan returns the operations of LowRankDecode.
func lowRankDecodePlan(a LowRankArgs) ([]step, error) {
	if err := a.check("LowRankDecode"); err != nil {
		return nil, err
	}
	l := a.Layout
	gate, out, inv := a.gate(), ptrArg(a.Out), 1/float32(a.Ranks)
	plan := []step{memset32(a.Out, 0xffffffff, StatusLen/4),
		launch("gc_lowrank_gate", 1, lowRankGateThreads, ptrArg(a.Vals1), uint64(a.Ranks), gate, out)}
	for _, m := range l.Mats {
		n := uint64(m.Rows * m.Cols)
		plan = append(plan, elementwise("gc_lowrank_decompose", n, elemAddr(a.Grad, m.Off), elemAddr(a.M, m.Off),
			elemAddr(a.Vals1, a.Ranks+m.P), elemAddr(a.Vals2, m.Q), elemAddr(a.QOwn, m.Q), uint64(m.Rows), uint64(m.Cols), uint64(m.R),
			f32Arg(inv), uint64(m.Off), out, gate))
	}
	pos := a.Ranks + l.PLen
	for _, f := range l.Flat {
		k := uint64(f[1] - f[0])
		plan = append(plan, elementwise("gc_lowrank_flat", k, elemAddr(a.Grad, f[0]), elemAddr(a.M, f[0]), elemAddr(a.Vals1, pos), k,
			uint64(a.Ranks), uint64(f[0]), out, gate))
		pos += f[1] - f[0]
	}
	if a.QNext != 0 && l.QLen > 0 {
		q := uint64(l.QLen)
		plan = append(plan, elementwise("gc_lowrank_scale", q, ptrArg(a.QNext), ptrArg(a.Vals2), q, f32Arg(inv), gate))
	}
	return plan, nil
}
