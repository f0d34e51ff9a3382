package kernels

import (
	"errors"
	"math"
	"math/rand/v2"
	"regexp"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
	"github.com/gradcomp/gradcomp/gpu"
)

// ptxEntries parses the embedded PTX: every kernel entry and the widths in
// bytes of its parameters.
func ptxEntries(t *testing.T) map[string][]int {
	t.Helper()
	entry := regexp.MustCompile(`\.visible \.entry (\w+)\(([^)]*)\)`)
	param := regexp.MustCompile(`\.param \.(u64|u32|f32|s32|b64|b32)`)
	out := map[string][]int{}
	names, texts := ptxModules()
	if len(texts) != 6 {
		t.Fatalf("embedded PTX modules %v, want dense, engine, gemm, lowrank, quant and topk", names)
	}
	for _, text := range texts {
		for _, m := range entry.FindAllStringSubmatch(string(text), -1) {
			var widths []int
			for _, p := range param.FindAllStringSubmatch(m[2], -1) {
				widths = append(widths, map[bool]int{true: 8, false: 4}[strings.HasSuffix(p[1], "64")])
			}
			if _, dup := out[m[1]]; dup {
				t.Fatalf("kernel %s is defined in two modules", m[1])
			}
			out[m[1]] = widths
		}
	}
	return out
}

// fakeArgs returns distinct, aligned, non-overlapping device addresses.
func fakeArgs(c *Codec, n int, ef bool) EncodeArgs {
	a := EncodeArgs{N: n, Key: compress.Key{Bucket: 3, Step: 5}, Grad: 1 << 40, Body: 2 << 40, Status: 3 << 40, Work: 4 << 40}
	if ef {
		a.Resid, a.ResidOut = 5<<40, 6<<40
	}
	if c.WorkspaceLen(n) == 0 {
		a.Work = 0
	}
	return a
}

// allSpecs is every spec of the conformance suite the kernels implement
// plus the sampled path: chunked top-k, which NewCodec refuses
// (TestNewCodecRefusesChunkedTopK), is left out.
var allSpecs = append([]string{"topk:0.001:sampled", "int8:bucket=3", "sign:bucket=7"}, deviceSpecs(compresstest.DefaultSpecs)...)

// deviceSpecs returns specs less those of chunked top-k.
func deviceSpecs(specs []string) []string {
	var out []string
	for _, spec := range specs {
		if s, err := compress.ParseSpec(spec); err != nil || s.Chunk == 0 {
			out = append(out, spec)
		}
	}
	return out
}

// TestNewCodecRefusesChunkedTopK checks that top-k's chunk= and bits=,
// which have no kernels, are an *ArgumentError naming them, never a codec
// that would write another layout.
func TestNewCodecRefusesChunkedTopK(t *testing.T) {
	for spec, want := range map[string]string{
		"topk:0.02:chunk=4096":                   "option chunk=4096 of topk: not supported on the device",
		"topk:0.02:chunk=4096:bits=2":            "options chunk=4096 and bits=2 of topk: not supported on the device",
		"topk:0.1:chunk=64:bits=8:round=nearest": "options chunk=64 and bits=8 of topk",
	} {
		c, err := codecOf(spec)
		var ae *ArgumentError
		if c != nil || !errors.As(err, &ae) || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), spec) {
			t.Errorf("codecOf(%q) = %v, %v; want an *ArgumentError saying %q", spec, c, err, want)
		}
	}
}

// TestPlansMatchPTX checks every launch the encoders and decoders build,
// for every spec and a range of lengths (including the sampled top-k path
// and the two-kernel quantization), against the kernels in the embedded
// PTX: the entry exists, the argument count matches, 4-byte parameters get
// values that fit, and the launch shape is legal.
func TestPlansMatchPTX(t *testing.T) {
	entries := ptxEntries(t)
	used := map[string]bool{}
	checkPlan := func(what string, plan []step) {
		for _, s := range plan {
			if s.fn == "" {
				if s.ptr == 0 && s.count > 0 {
					t.Errorf("%s: memset of %d words at address 0", what, s.count)
				}
				continue
			}
			used[s.fn] = true
			widths, ok := entries[s.fn]
			switch {
			case !ok:
				t.Errorf("%s: launches %s, which the PTX does not define", what, s.fn)
				continue
			case len(widths) != len(s.args):
				t.Errorf("%s: %s gets %d arguments, the kernel has %d parameters", what, s.fn, len(s.args), len(widths))
				continue
			case s.grid < 1 || s.grid > math.MaxInt32 || s.block < 32 || s.block > 1024 || s.block%32 != 0:
				t.Errorf("%s: %s launches %d blocks of %d threads", what, s.fn, s.grid, s.block)
			}
			for i, w := range widths {
				if w == 4 && s.args[i] > math.MaxUint32 {
					t.Errorf("%s: %s parameter %d is 4 bytes, gets %#x", what, s.fn, i, s.args[i])
				}
			}
		}
	}
	for _, spec := range allSpecs {
		c, err := codecOf(spec)
		if err != nil {
			t.Fatal(err)
		}
		for _, n := range []int{0, 1, 7, 33, 513, 4097, 300_001, 1<<20 + 3} {
			for _, ef := range []bool{false, true} {
				plan, err := c.encodePlan(fakeArgs(c, n, ef))
				if err != nil {
					t.Fatalf("%s n=%d ef=%v: %v", spec, n, ef, err)
				}
				checkPlan(spec+" encode", plan)
			}
			bodies := make([]gpu.Ptr, 11) // more than one dequantize-accumulate launch
			for i := range bodies {
				bodies[i] = gpu.Ptr(i+8) << 40
			}
			plan, err := c.decodePlan(DecodeArgs{Dst: 7 << 40, N: n, Bodies: bodies})
			if err != nil {
				t.Fatalf("%s n=%d decode: %v", spec, n, err)
			}
			checkPlan(spec+" decode", plan)
		}
	}
	checkPlan("laplace", []step{elementwise("gc_fill_laplace", 10, 1<<40, 10, 0)})
	for _, a := range []AverageArgs{
		{Dst: 1 << 40, N: 1<<20 + 3, Ranks: 3, Out: 2 << 40},
		{Dst: 1 << 40, N: 1, Ranks: 65535, Slots: 3 << 40, Stride: 1 << 20, Count: 65535, Out: 2 << 40},
	} {
		plan, err := averagePlan(a)
		if err != nil {
			t.Fatalf("average %+v: %v", a, err)
		}
		checkPlan("average", plan)
	}
	plan, err := momentumPlan(MomentumArgs{Grad: 1 << 40, U: 2 << 40, Next: 3 << 40, N: 1<<20 + 3, M: 0.9, Status: 4 << 40})
	if err != nil {
		t.Fatalf("momentum: %v", err)
	}
	checkPlan("momentum", plan)
	for _, n := range []int{0, 1, 1<<20 + 3} {
		plan, err := guardPlan(GuardArgs{Resid: 1 << 40, Grad: 2 << 40, N: n, Dst: 3 << 40, Stride: 1 << 20, Count: 65535})
		if err != nil {
			t.Fatalf("guard n=%d: %v", n, err)
		}
		checkPlan("guard", plan)
		if plan, err = flushPlan(FlushArgs{Grad: 1 << 40, Resid: 2 << 40, ResidOut: 3 << 40, N: n}); err != nil {
			t.Fatalf("flush n=%d: %v", n, err)
		}
		checkPlan("flush", plan)
		if plan, err = scalePlan(ScaleArgs{X: 1 << 40, N: n, C: 0.9}); err != nil {
			t.Fatalf("scale n=%d: %v", n, err)
		}
		checkPlan("scale", plan)
	}
	plan, err = guardMaxPlan(GuardMaxArgs{Src: 1 << 40, Stride: 1 << 20, Count: 65535, Dst: 2 << 40})
	if err != nil {
		t.Fatalf("guard max: %v", err)
	}
	checkPlan("guard max", plan)
	for _, spec := range []string{"topk:0.01", "randomk:0.1"} {
		c, _ := codecOf(spec)
		for _, n := range []int{1, 4097, 1<<20 + 3} {
			plan, err := c.maskPlan(MaskArgs{U: 1 << 40, N: n, Body: 2 << 40, Gate: 3 << 40})
			if err != nil {
				t.Fatalf("%s mask n=%d: %v", spec, n, err)
			}
			checkPlan(spec+" mask", plan)
		}
	}
	for _, d := range [][3]int{{1, 1, 1}, {1000, 17, 4097}, {1 << 15, 1 << 15, 3}} {
		plan, err := sgemmPlan(1<<40, 2<<40, 3<<40, d[0], d[1], d[2])
		if err != nil {
			t.Fatalf("sgemm %v: %v", d, err)
		}
		checkPlan("sgemm", plan)
	}
	for what, plan := range lowRankPlans(t) {
		checkPlan(what, plan)
	}
	for name := range entries {
		if !used[name] && !strings.Contains(name, "from") { // the plain conversions have no plan yet
			t.Errorf("kernel %s is never launched by a plan", name)
		}
	}
}

// TestSampledPlan checks that the sampled top-k path is taken exactly
// where its preconditions hold, and that its launches are guarded.
func TestSampledPlan(t *testing.T) {
	c, _ := codecOf("topk:0.01:sampled")
	has := func(plan []step, fn string) bool {
		for _, s := range plan {
			if s.fn == fn {
				return true
			}
		}
		return false
	}
	for _, tc := range []struct {
		n    int
		want bool
	}{{sampledMinLen - 1, false}, {sampledMinLen, true}, {1 << 24, true}} {
		plan, err := c.encodePlan(fakeArgs(c, tc.n, false))
		if err != nil {
			t.Fatal(err)
		}
		if got := has(plan, "gc_topk_sample"); got != tc.want {
			t.Errorf("n=%d: sampled path %v, want %v", tc.n, got, tc.want)
		}
	}
	exact, _ := codecOf("topk:0.01")
	plan, _ := exact.encodePlan(fakeArgs(exact, 1<<24, false))
	if has(plan, "gc_topk_sample") || has(plan, "gc_topk_cand_hist") && !has(plan, "gc_topk_collect") {
		t.Error("exact top-k plan runs the sampled kernels")
	}
	if r, limit := sampleParams(1<<24, 1<<14); r < 64 || r > sampleSize || limit < uint64(1<<14) {
		t.Errorf("sampleParams(2^24, 2^14) = %d, %d: the bound must leave at least k candidates", r, limit)
	}
}

// TestCodecParams checks that NewCodec reads the spec's parameters and that
// body lengths are the CPU reference's.
func TestCodecParams(t *testing.T) {
	c, err := codecOf("int2:bucket=33:round=nearest:seed=3")
	if err != nil {
		t.Fatal(err)
	}
	if c.bits != 2 || c.bucket != 33 || !c.nearest || c.seed != 3 || c.aligned() {
		t.Errorf("int2:bucket=33:round=nearest:seed=3 read as %+v", *c)
	}
	if _, err := codecOf("int3"); err == nil {
		t.Error("NewCodec accepted an unknown codec")
	}
	for _, spec := range allSpecs {
		c, _ := codecOf(spec)
		ref, _ := compress.Parse(spec)
		for _, n := range []int{1, 100, 4097} {
			p, err := ref.Compress(nil, make([]float32, n), compress.Key{})
			if err != nil {
				t.Fatal(err)
			}
			_, body, err := compress.DecodePayload(ref, p, n)
			if err != nil {
				t.Fatal(err)
			}
			if c.BodyLen(n) != len(body) {
				t.Errorf("%s n=%d: BodyLen %d, the CPU body has %d bytes", spec, n, c.BodyLen(n), len(body))
			}
		}
	}
}

// TestTopkWorkspace checks the top-k workspace layout: 256-byte aligned
// regions inside WorkspaceLen, in order, without overlap.
func TestTopkWorkspace(t *testing.T) {
	c, _ := codecOf("topk:0.01")
	for _, n := range []int{1, 4096, 4097, 1 << 20} {
		tiles := (n + tile - 1) / tile
		l := newTopkLayout(1<<20, tiles)
		regions := []struct {
			p     gpu.Ptr
			bytes int
		}{{l.state, topkStateLen}, {l.cand, 4 * tile * tiles}, {l.count, 4 * tiles}, {l.above, 4 * tiles}, {l.equal, 4 * tiles}, {l.offset, 4 * tiles}}
		end := gpu.Ptr(1 << 20)
		for i, r := range regions {
			if r.p%256 != 0 || r.p < end {
				t.Errorf("n=%d: region %d at %#x (previous ends at %#x)", n, i, r.p, end)
			}
			end = r.p + gpu.Ptr(r.bytes)
		}
		if got := int(end - 1<<20); got > c.WorkspaceLen(n) {
			t.Errorf("n=%d: regions need %d bytes, WorkspaceLen says %d", n, got, c.WorkspaceLen(n))
		}
	}
}

// TestEncodeArgsRejected checks that bad device arguments are refused on
// the host with an *ArgumentError before anything is enqueued.
func TestEncodeArgsRejected(t *testing.T) {
	q, _ := codecOf("int2:bucket=33")
	good := fakeArgs(q, 100, true)
	if _, err := q.encodePlan(good); err != nil {
		t.Fatalf("good arguments refused: %v", err)
	}
	for name, mod := range map[string]func(a *EncodeArgs){
		"null status":        func(a *EncodeArgs) { a.Status = 0 },
		"null gradient":      func(a *EncodeArgs) { a.Grad = 0 },
		"null body":          func(a *EncodeArgs) { a.Body = 0 },
		"negative length":    func(a *EncodeArgs) { a.N = -1 },
		"too long":           func(a *EncodeArgs) { a.N = compress.MaxElements + 1 },
		"resid without out":  func(a *EncodeArgs) { a.ResidOut = 0 },
		"out without resid":  func(a *EncodeArgs) { a.Resid = 0 },
		"aliased residual":   func(a *EncodeArgs) { a.ResidOut = a.Resid + 4 },
		"misaligned body":    func(a *EncodeArgs) { a.Body += 2 },
		"misaligned status":  func(a *EncodeArgs) { a.Status += 4 },
		"missing workspace":  func(a *EncodeArgs) { a.Work = 0 },
		"misaligned gradent": func(a *EncodeArgs) { a.Grad++ },
	} {
		a := good
		mod(&a)
		var ae *ArgumentError
		if _, err := q.encodePlan(a); !errors.As(err, &ae) {
			t.Errorf("%s: got %v, want an *ArgumentError", name, err)
		}
	}
	for name, a := range map[string]DecodeArgs{
		"no bodies":       {Dst: 1 << 40, N: 10},
		"null dst":        {N: 10, Bodies: []gpu.Ptr{1 << 40}},
		"null body":       {Dst: 1 << 40, N: 10, Bodies: []gpu.Ptr{0}},
		"misaligned body": {Dst: 1 << 40, N: 10, Bodies: []gpu.Ptr{1<<40 + 1}},
		"negative":        {Dst: 1 << 40, N: -1, Bodies: []gpu.Ptr{1 << 40}},
	} {
		var ae *ArgumentError
		if _, err := q.decodePlan(a); !errors.As(err, &ae) {
			t.Errorf("decode %s: got %v, want an *ArgumentError", name, err)
		}
	}
}

// TestStatusError checks the decoding of status blocks.
func TestStatusError(t *testing.T) {
	clean := []byte{0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}
	if err := StatusError(clean); err != nil {
		t.Errorf("clean status: %v", err)
	}
	if err := StatusError(clean[:8]); err == nil {
		t.Error("short status block accepted")
	}
	for w, want := range []compress.NonFiniteError{{Index: 7, Value: float32(math.Inf(-1))}, {Index: 1 << 31, Value: 70000}} {
		s := append([]byte(nil), clean...)
		v := uint64(want.Index)<<32 | uint64(math.Float32bits(want.Value))
		for i := range 8 {
			s[8*w+i] = byte(v >> (8 * i))
		}
		var nf *compress.NonFiniteError
		if err := StatusError(s); !errors.As(err, &nf) || *nf != want {
			t.Errorf("status word %d: got %v, want %v", w, err, &want)
		}
	}
}

// TestEngineArgsRejected checks that Average and SGEMM refuse bad
// arguments on the host with an *ArgumentError, and that SGEMM's grid covers
// every tile of c.
func TestEngineArgsRejected(t *testing.T) {
	good := AverageArgs{Dst: 1 << 40, N: 100, Ranks: 4, Slots: 3 << 40, Stride: 64, Count: 4, Out: 2 << 40}
	if _, err := averagePlan(good); err != nil {
		t.Fatalf("good arguments refused: %v", err)
	}
	for name, mod := range map[string]func(a *AverageArgs){
		"zero ranks":        func(a *AverageArgs) { a.Ranks = 0 },
		"too many ranks":    func(a *AverageArgs) { a.Ranks = 1 << 16 },
		"null dst":          func(a *AverageArgs) { a.Dst = 0 },
		"misaligned dst":    func(a *AverageArgs) { a.Dst += 2 },
		"null out":          func(a *AverageArgs) { a.Out = 0 },
		"misaligned out":    func(a *AverageArgs) { a.Out += 4 },
		"negative length":   func(a *AverageArgs) { a.N = -1 },
		"null slots":        func(a *AverageArgs) { a.Slots = 0 },
		"short stride":      func(a *AverageArgs) { a.Stride = 8 },
		"misaligned stride": func(a *AverageArgs) { a.Stride = 20 },
		"negative count":    func(a *AverageArgs) { a.Count = -1 },
		"misaligned slots":  func(a *AverageArgs) { a.Slots += 4 },
		"too many slots":    func(a *AverageArgs) { a.Count = 1 << 16 },
	} {
		a := good
		mod(&a)
		var ae *ArgumentError
		if _, err := averagePlan(a); !errors.As(err, &ae) {
			t.Errorf("average %s: got %v, want an *ArgumentError", name, err)
		}
	}
	for name, d := range map[string][6]int{
		"zero m":         {1 << 40, 2 << 40, 3 << 40, 0, 4, 4},
		"negative k":     {1 << 40, 2 << 40, 3 << 40, 4, 4, -1},
		"null c":         {0, 2 << 40, 3 << 40, 4, 4, 4},
		"misaligned a":   {1 << 40, 2<<40 + 1, 3 << 40, 4, 4, 4},
		"too many tiles": {1 << 40, 2 << 40, 3 << 40, math.MaxInt32, math.MaxInt32, 1},
	} {
		var ae *ArgumentError
		if _, err := sgemmPlan(gpu.Ptr(d[0]), gpu.Ptr(d[1]), gpu.Ptr(d[2]), d[3], d[4], d[5]); !errors.As(err, &ae) {
			t.Errorf("sgemm %s: got %v, want an *ArgumentError", name, err)
		}
	}
	plan, _ := sgemmPlan(1<<40, 2<<40, 3<<40, 33, 17, 5)
	if got, want := plan[0].grid, uint32(3*2); got != want {
		t.Errorf("sgemm 33×17: %d blocks, want %d (one per 16×16 tile)", got, want)
	}
}

// TestMomentumArgsRejected checks that Momentum and Mask refuse bad
// arguments on the host with an *ArgumentError.
func TestMomentumArgsRejected(t *testing.T) {
	good := MomentumArgs{Grad: 1 << 40, U: 2 << 40, Next: 3 << 40, N: 100, M: 0.9, Status: 4 << 40}
	if _, err := momentumPlan(good); err != nil {
		t.Fatalf("good arguments refused: %v", err)
	}
	for name, mod := range map[string]func(a *MomentumArgs){
		"negative length":   func(a *MomentumArgs) { a.N = -1 },
		"too long":          func(a *MomentumArgs) { a.N = compress.MaxElements + 1 },
		"momentum 1":        func(a *MomentumArgs) { a.M = 1 },
		"negative momentum": func(a *MomentumArgs) { a.M = -0.5 },
		"NaN momentum":      func(a *MomentumArgs) { a.M = float32(math.NaN()) },
		"null status":       func(a *MomentumArgs) { a.Status = 0 },
		"misaligned status": func(a *MomentumArgs) { a.Status += 4 },
		"null gradient":     func(a *MomentumArgs) { a.Grad = 0 },
		"null velocity":     func(a *MomentumArgs) { a.U = 0 },
		"null next":         func(a *MomentumArgs) { a.Next = 0 },
		"misaligned next":   func(a *MomentumArgs) { a.Next += 2 },
		"next on velocity":  func(a *MomentumArgs) { a.Next = a.U + 4 },
		"next on gradient":  func(a *MomentumArgs) { a.Next = a.Grad },
	} {
		a := good
		mod(&a)
		var ae *ArgumentError
		if _, err := momentumPlan(a); !errors.As(err, &ae) {
			t.Errorf("momentum %s: got %v, want an *ArgumentError", name, err)
		}
	}
	topk, _ := codecOf("topk:0.1")
	randomk, _ := codecOf("randomk:0.1")
	int8, _ := codecOf("int8")
	if _, err := randomk.maskPlan(MaskArgs{U: 1 << 40, N: 100}); err != nil {
		t.Errorf("random-k mask without a body refused: %v", err)
	}
	for name, tc := range map[string]struct {
		c *Codec
		a MaskArgs
	}{
		"quantizer":       {int8, MaskArgs{U: 1 << 40, N: 100, Body: 2 << 40}},
		"negative length": {topk, MaskArgs{U: 1 << 40, N: -1, Body: 2 << 40}},
		"null velocity":   {topk, MaskArgs{N: 100, Body: 2 << 40}},
		"misaligned u":    {randomk, MaskArgs{U: 1<<40 + 2, N: 100}},
		"top-k null body": {topk, MaskArgs{U: 1 << 40, N: 100}},
		"misaligned gate": {topk, MaskArgs{U: 1 << 40, N: 100, Body: 2 << 40, Gate: 3<<40 + 4}},
		"misaligned body": {topk, MaskArgs{U: 1 << 40, N: 100, Body: 2<<40 + 1}},
	} {
		var ae *ArgumentError
		if _, err := tc.c.maskPlan(tc.a); !errors.As(err, &ae) {
			t.Errorf("mask %s: got %v, want an *ArgumentError", name, err)
		}
	}
}

// TestGuardArgsRejected checks that Guard, GuardMax and Flush refuse bad
// arguments on the host with an *ArgumentError.
func TestGuardArgsRejected(t *testing.T) {
	good := GuardArgs{Resid: 1 << 40, Grad: 2 << 40, N: 100, Dst: 3 << 40, Stride: 48, Count: 4}
	if _, err := guardPlan(good); err != nil {
		t.Fatalf("good guard arguments refused: %v", err)
	}
	for name, mod := range map[string]func(a *GuardArgs){
		"negative length":   func(a *GuardArgs) { a.N = -1 },
		"too long":          func(a *GuardArgs) { a.N = compress.MaxElements + 1 },
		"null residual":     func(a *GuardArgs) { a.Resid = 0 },
		"null gradient":     func(a *GuardArgs) { a.Grad = 0 },
		"misaligned grad":   func(a *GuardArgs) { a.Grad += 2 },
		"null blocks":       func(a *GuardArgs) { a.Dst = 0 },
		"misaligned blocks": func(a *GuardArgs) { a.Dst += 4 },
		"no blocks":         func(a *GuardArgs) { a.Count = 0 },
		"too many blocks":   func(a *GuardArgs) { a.Count = 1 << 16 },
		"short stride":      func(a *GuardArgs) { a.Stride = 8 },
		"misaligned stride": func(a *GuardArgs) { a.Stride = 20 },
	} {
		a := good
		mod(&a)
		var ae *ArgumentError
		if _, err := guardPlan(a); !errors.As(err, &ae) {
			t.Errorf("guard %s: got %v, want an *ArgumentError", name, err)
		}
	}
	if _, err := guardPlan(GuardArgs{Dst: 3 << 40, Count: 1}); err != nil {
		t.Errorf("an empty bucket's guard refused: %v", err)
	}
	goodMax := GuardMaxArgs{Src: 1 << 40, Stride: 64, Count: 3, Dst: 2 << 40}
	if _, err := guardMaxPlan(goodMax); err != nil {
		t.Fatalf("good guard-max arguments refused: %v", err)
	}
	for name, mod := range map[string]func(a *GuardMaxArgs){
		"null source":    func(a *GuardMaxArgs) { a.Src = 0 },
		"no blocks":      func(a *GuardMaxArgs) { a.Count = 0 },
		"short stride":   func(a *GuardMaxArgs) { a.Stride = 0 },
		"null dst":       func(a *GuardMaxArgs) { a.Dst = 0 },
		"misaligned dst": func(a *GuardMaxArgs) { a.Dst += 4 },
		"misaligned src": func(a *GuardMaxArgs) { a.Src += 2 },
	} {
		a := goodMax
		mod(&a)
		var ae *ArgumentError
		if _, err := guardMaxPlan(a); !errors.As(err, &ae) {
			t.Errorf("guard max %s: got %v, want an *ArgumentError", name, err)
		}
	}
	goodFlush := FlushArgs{Grad: 1 << 40, Resid: 2 << 40, ResidOut: 3 << 40, N: 100}
	if _, err := flushPlan(goodFlush); err != nil {
		t.Fatalf("good flush arguments refused: %v", err)
	}
	for name, mod := range map[string]func(a *FlushArgs){
		"negative length": func(a *FlushArgs) { a.N = -1 },
		"null gradient":   func(a *FlushArgs) { a.Grad = 0 },
		"null residual":   func(a *FlushArgs) { a.Resid = 0 },
		"null out":        func(a *FlushArgs) { a.ResidOut = 0 },
		"misaligned out":  func(a *FlushArgs) { a.ResidOut += 2 },
		"out on residual": func(a *FlushArgs) { a.ResidOut = a.Resid + 4 },
		"out on gradient": func(a *FlushArgs) { a.ResidOut = a.Grad },
	} {
		a := goodFlush
		mod(&a)
		var ae *ArgumentError
		if _, err := flushPlan(a); !errors.As(err, &ae) {
			t.Errorf("flush %s: got %v, want an *ArgumentError", name, err)
		}
	}
}

// TestScaleArgsRejected checks that Scale refuses bad arguments on the
// host with an *ArgumentError, and takes an empty buffer.
func TestScaleArgsRejected(t *testing.T) {
	good := ScaleArgs{X: 1 << 40, N: 100, C: 0.5}
	if _, err := scalePlan(good); err != nil {
		t.Fatalf("good scale arguments refused: %v", err)
	}
	if plan, err := scalePlan(ScaleArgs{C: 0.5}); err != nil || plan != nil {
		t.Errorf("an empty scale: plan %v, %v; want nothing to run", plan, err)
	}
	for name, mod := range map[string]func(a *ScaleArgs){
		"negative length":  func(a *ScaleArgs) { a.N = -1 },
		"too long":         func(a *ScaleArgs) { a.N = compress.MaxElements + 1 },
		"null buffer":      func(a *ScaleArgs) { a.X = 0 },
		"misaligned":       func(a *ScaleArgs) { a.X += 2 },
		"NaN factor":       func(a *ScaleArgs) { a.C = float32(math.NaN()) },
		"infinite factor":  func(a *ScaleArgs) { a.C = float32(math.Inf(1)) },
		"-infinite factor": func(a *ScaleArgs) { a.C = float32(math.Inf(-1)) },
	} {
		a := good
		mod(&a)
		var ae *ArgumentError
		if _, err := scalePlan(a); !errors.As(err, &ae) {
			t.Errorf("scale %s: got %v, want an *ArgumentError", name, err)
		}
	}
}

// TestScaleStep checks the definition: one float32 product per element,
// rounded once (float64's product of two float32 is exact, so its
// rounding to float32 is the reference).
func TestScaleStep(t *testing.T) {
	rng := rand.New(rand.NewPCG(5, 6))
	for _, c := range []float32{0.9, 0.5, 1, float32(1) / 3} {
		x := make([]float32, 1000)
		for i := range x {
			x[i] = float32(rng.NormFloat64() * math.Exp2(float64(rng.IntN(200)-100)))
		}
		x[0], x[1] = float32(math.Copysign(0, -1)), math.SmallestNonzeroFloat32
		want := make([]float32, len(x))
		for i, v := range x {
			want[i] = float32(float64(c) * float64(v))
		}
		ScaleStep(x, c)
		for i := range x {
			if math.Float32bits(x[i]) != math.Float32bits(want[i]) {
				t.Fatalf("c=%v element %d: %v, want %v", c, i, x[i], want[i])
			}
		}
	}
}

// TestGuardRatio checks the definition against plain float64 norms, and
// its cases: an empty residual is 0, a zero gradient +Inf.
func TestGuardRatio(t *testing.T) {
	rng := rand.New(rand.NewPCG(3, 4))
	for _, n := range []int{1, 255, 256, 257, 10007} {
		e, g := make([]float32, n), make([]float32, n)
		var e2, g2 float64
		for i := range e {
			e[i], g[i] = float32(rng.NormFloat64()*1e-3), float32(rng.NormFloat64())
			e2 += float64(e[i]) * float64(e[i])
			g2 += float64(g[i]) * float64(g[i])
		}
		want := math.Sqrt(e2) / math.Sqrt(g2)
		if got := GuardRatio(e, g); math.Abs(got-want) > float64(2*n+4)*0x1p-52*want {
			t.Errorf("n=%d: %v, want %v", n, got, want)
		}
		if got := GuardRatio(make([]float32, n), g); got != 0 {
			t.Errorf("n=%d, zero residual: %v, want 0", n, got)
		}
		if got := GuardRatio(e, make([]float32, n)); !math.IsInf(got, 1) {
			t.Errorf("n=%d, zero gradient: %v, want +Inf", n, got)
		}
	}
}
