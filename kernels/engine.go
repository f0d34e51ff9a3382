package kernels

import (
	"fmt"
	"math"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
)

// AverageArgs are the device buffers of one Average call.
type AverageArgs struct {
	Dst   gpu.Ptr // N float32: the sum over Ranks ranks, averaged in place
	N     int
	Ranks int // the divisor, 1 to 65535
	// Slots, optional: Count status blocks (StatusLen bytes each, 8-byte
	// aligned), Stride bytes apart, the first at Slots: every rank's Encode
	// status as its gathered payload slot carries it. 0 (with Count 0) for
	// an exchange without statuses (a dense all-reduce).
	Slots  gpu.Ptr
	Stride int
	Count  int
	Out    gpu.Ptr // StatusLen bytes, 8-byte aligned: the result's status (see Average)
}

// averagePlan returns the operations of Average.
func averagePlan(a AverageArgs) ([]step, error) {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: "Average", Reason: fmt.Sprintf(format, v...)}
	}
	switch {
	case a.N < 0 || int64(a.N) > compress.MaxElements:
		return nil, bad("element count %d outside [0, %d]", a.N, uint64(compress.MaxElements))
	case a.Ranks < 1 || a.Ranks > math.MaxUint16:
		return nil, bad("%d ranks, want 1 to %d", a.Ranks, math.MaxUint16)
	case a.N > 0 && (a.Dst == 0 || a.Dst%4 != 0):
		return nil, bad("destination %#x is null or not 4-byte aligned", a.Dst)
	case a.Out == 0 || a.Out%8 != 0:
		return nil, bad("out status %#x is null or not 8-byte aligned", a.Out)
	case a.Count < 0 || a.Count > math.MaxUint16:
		return nil, bad("%d status slots, want 0 to %d", a.Count, math.MaxUint16)
	case a.Count > 0 && (a.Slots == 0 || a.Slots%8 != 0 || a.Stride < StatusLen || a.Stride%8 != 0):
		return nil, bad("status slots at %#x, stride %d: want a non-null 8-byte aligned address and stride ≥ %d, a multiple of 8", a.Slots, a.Stride, StatusLen)
	}
	plan := []step{memset32(a.Out, 0xffffffff, StatusLen/4)}
	if a.N == 0 {
		return plan, nil
	}
	n := uint64(a.N)
	return append(plan, elementwise("gc_average", n, ptrArg(a.Dst), n, uint64(a.Ranks), ptrArg(a.Slots),
		uint64(a.Stride), uint64(a.Count), ptrArg(a.Out))), nil
}

// Average enqueues on s the last step of an exchange (see AverageArgs) and
// returns without waiting: it resets a.Out, then, if a status slot reports
// a failure (a NaN or ±Inf, or a value a codec cannot represent, on some
// rank), sets every element of Dst to a quiet NaN and records the lowest
// such slot's index in the second word of Out (binary little-endian
// uint64; ^0 when none); otherwise it divides Dst by Ranks (each element
// x becomes x / float32(Ranks), rounded once: overlap's average) and
// records the first non-finite result in the first word (read it with
// StatusError).
func Average(ctx *Context, s gpu.Stream, a AverageArgs) error {
	plan, err := averagePlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// MomentumArgs are the device buffers of one Momentum call.
type MomentumArgs struct {
	Grad gpu.Ptr // N float32: the gradient g, replaced by m·u + g
	U    gpu.Ptr // N float32: the velocity u, only read
	Next gpu.Ptr // N float32, not overlapping U or Grad: receives m·u + g
	N    int
	M    float32 // the momentum, in [0, 1)
	// Status: StatusLen bytes, 8-byte aligned, reset by Momentum; its
	// first word records the first non-finite m·u + g (read it with
	// StatusError).
	Status gpu.Ptr
}

// momentumPlan returns the operations of Momentum.
func momentumPlan(a MomentumArgs) ([]step, error) {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: "Momentum", Reason: fmt.Sprintf(format, v...)}
	}
	n := uint64(a.N)
	switch {
	case a.N < 0 || int64(a.N) > compress.MaxElements:
		return nil, bad("element count %d outside [0, %d]", a.N, uint64(compress.MaxElements))
	case !(a.M >= 0 && a.M < 1):
		return nil, bad("momentum %v is not in [0, 1)", a.M)
	case a.Status == 0 || a.Status%8 != 0:
		return nil, bad("status %#x is null or not 8-byte aligned", a.Status)
	case a.N > 0 && (a.Grad == 0 || a.U == 0 || a.Next == 0):
		return nil, bad("null gradient, velocity or next pointer for %d elements", a.N)
	case a.Grad%4 != 0 || a.U%4 != 0 || a.Next%4 != 0:
		return nil, bad("gradient %#x, velocity %#x and next %#x must be 4-byte aligned", a.Grad, a.U, a.Next)
	case a.N > 0 && (overlap(a.Next, a.U, 4*n) || overlap(a.Next, a.Grad, 4*n)):
		return nil, bad("next %#x overlaps the velocity %#x or the gradient %#x (%d bytes each)", a.Next, a.U, a.Grad, 4*n)
	}
	plan := []step{memset32(a.Status, 0xffffffff, StatusLen/4)}
	if a.N == 0 {
		return plan, nil
	}
	return append(plan, elementwise("gc_momentum", n, ptrArg(a.Grad), ptrArg(a.U), ptrArg(a.Next), n,
		f32Arg(a.M), ptrArg(a.Status))), nil
}

// Momentum enqueues on s momentum correction's step (see MomentumArgs) and
// returns without waiting: it resets a.Status, then sets, for every i,
// v = float32(M·U[i]) + Grad[i] (two roundings, no multiply-add
// contraction: overlap's host engine), Grad[i] = v and Next[i] = v, and
// records the first non-finite v in the status's first word.
func Momentum(ctx *Context, s gpu.Stream, a MomentumArgs) error {
	plan, err := momentumPlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// MomentumStep is Momentum's arithmetic on the host (its definition, and
// overlap's host engine's momentum correction): v = float32(m·u[i]) +
// grad[i], two roundings (no fused multiply-add, on any architecture),
// into grad[i] and next[i]. It returns the index of the first non-finite
// v, or -1.
func MomentumStep(grad, u, next []float32, m float32) int {
	bad := -1
	for i, g := range grad {
		v := float32(m*u[i]) + g
		if bad < 0 && v-v != 0 {
			bad = i
		}
		next[i], grad[i] = v, v
	}
	return bad
}

// GuardLen is the size of an accuracy-guard block: ρ as a little-endian
// IEEE float64, then a zero word. The device engine carries one after each
// payload slot's Encode status (overlap.Config.Guard).
const GuardLen = 16

// guardThreads is GUARD_THREADS in engine.cu: the block of gc_guard.
const guardThreads = 256

// GuardArgs are the device buffers of one Guard call.
type GuardArgs struct {
	Resid gpu.Ptr // N float32: e', the residual an Encode wrote (its ResidOut)
	Grad  gpu.Ptr // N float32: g, the gradient that Encode compressed
	N     int
	// Dst: Count guard blocks (GuardLen bytes each, 8-byte aligned),
	// Stride bytes apart (a multiple of 8, at least GuardLen): each
	// receives ρ.
	Dst    gpu.Ptr
	Stride int
	Count  int
}

// guardPlan returns the operations of Guard.
func guardPlan(a GuardArgs) ([]step, error) {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: "Guard", Reason: fmt.Sprintf(format, v...)}
	}
	switch {
	case a.N < 0 || int64(a.N) > compress.MaxElements:
		return nil, bad("element count %d outside [0, %d]", a.N, uint64(compress.MaxElements))
	case a.N > 0 && (a.Resid == 0 || a.Grad == 0):
		return nil, bad("null residual or gradient pointer for %d elements", a.N)
	case a.Resid%4 != 0 || a.Grad%4 != 0:
		return nil, bad("residual %#x and gradient %#x must be 4-byte aligned", a.Resid, a.Grad)
	}
	if err := checkBlocks(a.Dst, a.Stride, a.Count); err != nil {
		return nil, bad("%v", err)
	}
	return []step{launch("gc_guard", 1, guardThreads, ptrArg(a.Resid), ptrArg(a.Grad), uint64(a.N),
		ptrArg(a.Dst), uint64(a.Stride), uint64(a.Count))}, nil
}

// checkBlocks checks count guard blocks stride bytes apart from p.
func checkBlocks(p gpu.Ptr, stride, count int) error {
	switch {
	case count < 1 || count > math.MaxUint16:
		return fmt.Errorf("%d guard blocks, want 1 to %d", count, math.MaxUint16)
	case p == 0 || p%8 != 0:
		return fmt.Errorf("guard blocks at %#x: want a non-null 8-byte aligned address", p)
	case count > 1 && (stride < GuardLen || stride%8 != 0):
		return fmt.Errorf("guard block stride %d: want a multiple of 8, at least %d", stride, GuardLen)
	}
	return nil
}

// Guard enqueues on s the accuracy guard's measure of one bucket (see
// GuardArgs) and returns without waiting: ρ = ‖Resid‖/‖Grad‖ as
// GuardRatio defines it (bit for bit), written to every block of Dst.
// It runs as one block of 256 threads, so its time is that of one
// multiprocessor reading 8·N bytes.
func Guard(ctx *Context, s gpu.Stream, a GuardArgs) error {
	plan, err := guardPlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// GuardRatio is the definition Guard computes, on the host: the squares of
// resid's and grad's elements summed in float64 by 256 lanes (lane t takes
// the indices i ≡ t mod 256 in increasing order), the lanes' sums halved
// pairwise (lane t adds lane t + s, for s = 128, 64, ..., 1), then ρ = 0
// if the residual's sum is 0, else √E / √G (+Inf for G = 0; NaN when an
// input is not finite). Each sum of n squares is within n·2⁻⁵³ of the
// exact one (relative), so ρ is within about n·2⁻⁵³ of ‖e'‖/‖g‖;
// overlap's host engine sums in index order, and for a sparse codec as
// ‖s‖² − ‖s at the kept indices‖², which may cancel.
func GuardRatio(resid, grad []float32) float64 {
	var e, g [guardThreads]float64
	for i := range resid {
		r, x := float64(resid[i]), float64(grad[i])
		e[i%guardThreads] += r * r
		g[i%guardThreads] += x * x
	}
	for s := guardThreads / 2; s > 0; s >>= 1 {
		for t := range s {
			e[t] += e[t+s]
			g[t] += g[t+s]
		}
	}
	if e[0] == 0 {
		return 0
	}
	return math.Sqrt(e[0]) / math.Sqrt(g[0])
}

// GuardMaxArgs are the device buffers of one GuardMax call.
type GuardMaxArgs struct {
	// Src: Count guard blocks (GuardLen bytes each, 8-byte aligned),
	// Stride bytes apart (a multiple of 8, at least GuardLen).
	Src    gpu.Ptr
	Stride int
	Count  int
	Dst    gpu.Ptr // one guard block, 8-byte aligned: receives the largest ρ
}

// guardMaxPlan returns the operations of GuardMax.
func guardMaxPlan(a GuardMaxArgs) ([]step, error) {
	if err := checkBlocks(a.Src, a.Stride, a.Count); err != nil {
		return nil, &ArgumentError{Op: "GuardMax", Reason: err.Error()}
	}
	if err := checkBlocks(a.Dst, 0, 1); err != nil {
		return nil, &ArgumentError{Op: "GuardMax", Reason: "destination: " + err.Error()}
	}
	return []step{launch("gc_guard_max", 1, 32, ptrArg(a.Src), uint64(a.Stride), uint64(a.Count), ptrArg(a.Dst))}, nil
}

// GuardMax enqueues on s the largest ρ of a.Count guard blocks (every
// rank's, as their gathered payload slots carry them) into a.Dst, and
// returns without waiting: a NaN is ignored, and the result is 0 when no
// ρ is larger.
func GuardMax(ctx *Context, s gpu.Stream, a GuardMaxArgs) error {
	plan, err := guardMaxPlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// FlushArgs are the device buffers of one Flush call.
type FlushArgs struct {
	Grad     gpu.Ptr // N float32: the gradient g, replaced by e + g
	Resid    gpu.Ptr // N float32: the residual e, only read
	ResidOut gpu.Ptr // N float32, not overlapping Resid or Grad: set to 0
	N        int
}

// flushPlan returns the operations of Flush.
func flushPlan(a FlushArgs) ([]step, error) {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: "Flush", Reason: fmt.Sprintf(format, v...)}
	}
	n := uint64(a.N)
	switch {
	case a.N < 0 || int64(a.N) > compress.MaxElements:
		return nil, bad("element count %d outside [0, %d]", a.N, uint64(compress.MaxElements))
	case a.N > 0 && (a.Grad == 0 || a.Resid == 0 || a.ResidOut == 0):
		return nil, bad("null gradient, residual or residual-out pointer for %d elements", a.N)
	case a.Grad%4 != 0 || a.Resid%4 != 0 || a.ResidOut%4 != 0:
		return nil, bad("gradient %#x, residual %#x and residual out %#x must be 4-byte aligned", a.Grad, a.Resid, a.ResidOut)
	case overlap(a.ResidOut, a.Resid, 4*n) || overlap(a.ResidOut, a.Grad, 4*n):
		return nil, bad("residual out %#x overlaps the residual %#x or the gradient %#x (%d bytes each): a failed step must keep e", a.ResidOut, a.Resid, a.Grad, 4*n)
	}
	if a.N == 0 {
		return nil, nil
	}
	return []step{elementwise("gc_flush", n, ptrArg(a.Grad), ptrArg(a.Resid), ptrArg(a.ResidOut), n)}, nil
}

// Flush enqueues on s the accuracy guard's flush of one bucket (see
// FlushArgs) and returns without waiting: Grad[i] = Resid[i] + Grad[i]
// (rounded once: compress.ErrorFeedback.Flush) and ResidOut[i] = 0, the
// empty memory to install (swap with Resid) once the dense exchange of
// Grad succeeded; until then Resid is as it was.
func Flush(ctx *Context, s gpu.Stream, a FlushArgs) error {
	plan, err := flushPlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// ScaleArgs are the device buffers of one Scale call.
type ScaleArgs struct {
	X gpu.Ptr // N float32, scaled in place
	N int
	C float32 // the factor, finite
}

// scalePlan returns the operations of Scale.
func scalePlan(a ScaleArgs) ([]step, error) {
	bad := func(format string, v ...any) error {
		return &ArgumentError{Op: "Scale", Reason: fmt.Sprintf(format, v...)}
	}
	switch {
	case a.N < 0 || int64(a.N) > compress.MaxElements:
		return nil, bad("element count %d outside [0, %d]", a.N, uint64(compress.MaxElements))
	case a.C-a.C != 0:
		return nil, bad("factor %v is not finite", a.C)
	case a.N > 0 && (a.X == 0 || a.X%4 != 0):
		return nil, bad("buffer %#x is null or not 4-byte aligned", a.X)
	}
	if a.N == 0 {
		return nil, nil
	}
	n := uint64(a.N)
	return []step{elementwise("gc_scale", n, ptrArg(a.X), n, f32Arg(a.C))}, nil
}

// Scale enqueues on s the product of every element of a.X by a.C (see
// ScaleStep, its definition) and returns without waiting: overlap's decay
// of error-feedback memory (Config.FeedbackDecay) on the residual an
// Encode wrote.
func Scale(ctx *Context, s gpu.Stream, a ScaleArgs) error {
	plan, err := scalePlan(a)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}

// ScaleStep is Scale's arithmetic on the host (its definition, and
// overlap's host engine's decay of error-feedback memory): x[i] = c·x[i],
// one float32 multiplication rounded to nearest even.
func ScaleStep(x []float32, c float32) {
	for i, v := range x {
		x[i] = c * v
	}
}

// gemmTile is GT in gemm.cu.
const gemmTile = 16

// sgemmPlan returns the launch of SGEMM.
func sgemmPlan(c, a, b gpu.Ptr, m, n, k int) ([]step, error) {
	switch {
	case m < 1 || n < 1 || k < 1 || m > math.MaxInt32 || n > math.MaxInt32 || k > math.MaxInt32:
		return nil, &ArgumentError{Op: "SGEMM", Reason: fmt.Sprintf("dimensions m=%d n=%d k=%d, want 1 to %d each", m, n, k, math.MaxInt32)}
	case c == 0 || a == 0 || b == 0 || c%4 != 0 || a%4 != 0 || b%4 != 0:
		return nil, &ArgumentError{Op: "SGEMM", Reason: fmt.Sprintf("matrices at %#x, %#x, %#x: want non-null 4-byte aligned addresses", c, a, b)}
	}
	tiles := uint64((m+gemmTile-1)/gemmTile) * uint64((n+gemmTile-1)/gemmTile)
	if tiles > math.MaxInt32 {
		return nil, &ArgumentError{Op: "SGEMM", Reason: fmt.Sprintf("%d tiles of %d×%d exceed the grid limit", tiles, gemmTile, gemmTile)}
	}
	return []step{launch("gc_sgemm", uint32(tiles), gemmTile*gemmTile, ptrArg(c), ptrArg(a), ptrArg(b),
		uint64(m), uint64(n), uint64(k))}, nil
}

// SGEMM enqueues on s the product c (m×n) = a (m×k) · b (k×n) of row-major
// float32 matrices, summed in k order, and returns without waiting. It is
// the synthetic compute of the overlap benchmark (a plain shared-memory
// tiled kernel, not a fast GEMM); c must not overlap a or b.
func SGEMM(ctx *Context, s gpu.Stream, c, a, b gpu.Ptr, m, n, k int) error {
	plan, err := sgemmPlan(c, a, b, m, n, k)
	if err != nil {
		return err
	}
	return ctx.run(s, plan)
}
