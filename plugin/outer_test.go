package main

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/outer"
	"github.com/gradcomp/gradcomp/overlap"
)

// TestOuterMirrorLayouts: the Go mirrors of gc_outer_config and
// gc_outer_report have the C layouts (tests/capi asserts the same).
func TestOuterMirrorLayouts(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(gc_outer_config)", unsafe.Sizeof(cOuterConfig{}), outerConfigSize211},
		{"offsetof(gc_outer_config, alpha)", unsafe.Offsetof(cOuterConfig{}.Alpha), 16},
		{"offsetof(gc_outer_config, lr)", unsafe.Offsetof(cOuterConfig{}.LR), 32},
		{"offsetof(gc_outer_config, fragment_of)", unsafe.Offsetof(cOuterConfig{}.FragmentOf), 56},
		{"sizeof(gc_outer_report)", unsafe.Sizeof(cOuterReport{}), outerReportSize211},
		{"offsetof(gc_outer_report, step)", unsafe.Offsetof(cOuterReport{}.Step), 32},
		{"offsetof(gc_outer_report, first_skipped)", unsafe.Offsetof(cOuterReport{}.FirstSkipped), 60},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// TestOuterConfigSizes: a gc_outer_config is read as far as its size
// says and no further: one of ABI 2.11's size placed against an
// unreadable page is read whole; any other size is refused naming it and
// the library's, with nothing past the size field readable.
func TestOuterConfigSizes(t *testing.T) {
	page := syscall.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, 2*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_ANON|syscall.MAP_PRIVATE)
	if err != nil {
		t.Skipf("mmap: %v", err)
	}
	defer syscall.Munmap(mem)
	if err := syscall.Mprotect(mem[page:], syscall.PROT_NONE); err != nil {
		t.Skipf("mprotect: %v", err)
	}
	of := []int32{1, 0}
	full := cOuterConfig{Size: outerConfigSize211, SyncEvery: 8, Fragments: 2, Delay: 1, Alpha: 0.5, Optimizer: int32(outer.SGD), LR: 0.3, BucketElements: 64, FragmentOf: &of[0]}
	at := page - outerConfigSize211
	copy(mem[at:page], unsafe.Slice((*byte)(unsafe.Pointer(&full)), outerConfigSize211))
	cfg, invalid := readOuterConfig(unsafe.Pointer(&mem[at]), 2)
	want := outer.Config{SyncEvery: 8, Fragments: 2, Delay: 1, Alpha: 0.5, Optimizer: outer.Optimizer{Kind: outer.SGD, LR: 0.3}, BucketElements: 64, FragmentOf: []int{1, 0}}
	if invalid != nil || fmt.Sprint(cfg) != fmt.Sprint(want) {
		t.Errorf("read %+v, %v; want %+v", cfg, invalid, want)
	}
	for _, size := range []uint32{0, 4, 64, outerConfigSize211 + 8, 1<<32 - 1} {
		*(*uint32)(unsafe.Pointer(&mem[page-4])) = size // only the size field is readable
		_, invalid := readOuterConfig(unsafe.Pointer(&mem[page-4]), 2)
		if invalid == nil || invalid.Field != "ocfg" || !strings.Contains(invalid.Reason, fmt.Sprintf("ocfg->size %d:", size)) ||
			!strings.Contains(invalid.Reason, fmt.Sprintf("a gc_outer_config of %d bytes;", outerConfigSize211)) {
			t.Errorf("size %d: %v; want ocfg refused naming it and %d", size, invalid, outerConfigSize211)
		}
	}
}

// TestOuterStatus: the Loop's typed errors map to the header's statuses.
func TestOuterStatus(t *testing.T) {
	for _, c := range []struct {
		err  error
		want status
	}{
		{&outer.ConfigError{Field: "Delay"}, errConfig},
		{&outer.ConfigMismatchError{Field: "SyncEvery"}, errConfig},
		{&outer.StateError{Reason: "x", Err: &overlap.StateError{}}, errCorrupt},
		{&outer.NonFiniteSyncError{Err: &overlap.NonFiniteStepError{}}, errNonFinite},
		{&outer.BrokenError{Cause: &overlap.StepError{}}, errBroken},
		{fmt.Errorf("outer: step 3: fragment 0's exchange: %w", &overlap.StepError{}), errComm},
		{fmt.Errorf("outer: Step: %w", outer.ErrClosed), errClosed},
	} {
		if got := statusOf(c.err); got != c.want {
			t.Errorf("statusOf(%T %v) = %d, want %d", c.err, c.err, got, c.want)
		}
	}
}

// TestOuterOverHosted: the plugin's outer loop on hosted transports
// served by Go hosts gives bit for bit package outer's results on
// in-process ranks (streaming, int4 with error feedback), reports and
// Due included; its state loads into a new loop; a second engine or loop
// on its transport is refused.
func TestOuterOverHosted(t *testing.T) {
	const ranks, steps = 2, 12
	sizes := []int{100, 37, 64}
	ec, err := parseEngineConfig(rawEngineConfig{spec: "int4", decision: "compressed", ef: true, timeout: 10, workers: 1, device: -1})
	if err != nil {
		t.Fatal(err)
	}
	cfg := outer.Config{SyncEvery: 4, Fragments: 2, Delay: 1, Alpha: 0.5}
	goCfg := cfg
	goCfg.Engine = ec.Config
	hostGroup, _ := inproc.NewGroup(ranks)
	goGroup, _ := inproc.NewGroup(ranks)
	init := func(r int) [][]float32 { return grads(ranks, 100+r, sizes)[r] }
	viaPlugin, viaGo := make([]*outerLoop, ranks), make([]*outer.Loop, ranks)
	pParams, gParams := make([][][]float32, ranks), make([][][]float32, ranks)
	trs := make([]*transport, ranks)
	errs := make([]error, 2*ranks)
	var wg sync.WaitGroup
	for r := range ranks {
		trs[r], _ = newTransport(r, ranks)
		go serve(trs[r], hostGroup[r])
		pParams[r], gParams[r] = init(r), init(r)
		wg.Go(func() { viaPlugin[r], errs[r] = newOuter(trs[r], cfg, ec, pParams[r], nil) })
		wg.Go(func() { viaGo[r], errs[ranks+r] = outer.New(t.Context(), goGroup[r], gParams[r], goCfg) })
	}
	wg.Wait()
	t.Cleanup(func() {
		for r := range ranks {
			viaGo[r].Close()
			trs[r].close()
		}
	})
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	if _, err := newEngine(trs[0], ec, sizes, nil); err == nil || statusOf(err) != errState || !strings.Contains(err.Error(), "already has an outer loop") {
		t.Errorf("an engine on the loop's transport: %v, want GC_ERR_STATE", err)
	}
	synced := 0 // syncs rank 0 finished
	for s := range steps {
		for r := range ranks {
			g := grads(ranks, s, sizes)[r]
			for i := range sizes {
				for j := range g[i] {
					pParams[r][i][j] -= 0.1 * g[i][j]
					gParams[r][i][j] -= 0.1 * g[i][j]
				}
			}
		}
		dueStarts, dueFinishes := viaPlugin[0].due()
		reps := make([]outer.Report, 2*ranks)
		for r := range ranks {
			wg.Go(func() { reps[r], errs[r] = viaPlugin[r].step() })
			wg.Go(func() { reps[ranks+r], errs[ranks+r] = viaGo[r].Step(t.Context()) })
		}
		wg.Wait()
		for _, err := range errs {
			if err != nil {
				t.Fatalf("step %d: %v", s+1, err)
			}
		}
		var finished []int
		for _, f := range reps[0].Finished {
			finished = append(finished, f.Fragment)
		}
		synced += len(finished)
		if !slices.Equal(dueStarts, reps[0].Started) || !slices.Equal(dueFinishes, finished) {
			t.Errorf("step %d: due %v, %v; did %v, %v", s+1, dueStarts, dueFinishes, reps[0].Started, finished)
		}
		for r := range ranks {
			if p, g := reps[r], reps[ranks+r]; p.Step != g.Step || !slices.Equal(p.Started, g.Started) || p.BytesSent != g.BytesSent {
				t.Errorf("step %d rank %d: plugin reported %+v, Go %+v", s+1, r, p, g)
			}
			if !identical(pParams[r], gParams[r]) || !identical(viaPlugin[r].loop.Global(), viaGo[r].Global()) {
				t.Fatalf("step %d rank %d: the plugin's weights differ from package outer's", s+1, r)
			}
		}
	}
	if synced != 5 { // fragment 0 finishes at 3, 7, 11; fragment 1 at 5, 9
		t.Errorf("%d syncs finished in %d steps, want 5", synced, steps)
	}
	states := make([][]byte, ranks)
	for r := range ranks {
		if states[r], err = viaPlugin[r].save(); err != nil {
			t.Fatal(err)
		}
		var b bytes.Buffer
		if err := viaGo[r].Save(&b); err != nil || !bytes.Equal(b.Bytes(), states[r]) {
			t.Fatalf("rank %d: states differ (%d vs %d bytes; %v)", r, len(states[r]), b.Len(), err)
		}
		if err := viaPlugin[r].close(); err != nil {
			t.Fatal(err)
		}
	}
	// A new loop on the same transports loads the states.
	for r := range ranks {
		wg.Go(func() {
			if viaPlugin[r], errs[r] = newOuter(trs[r], cfg, ec, init(r), nil); errs[r] == nil {
				errs[r] = viaPlugin[r].load(states[r])
			}
		})
	}
	wg.Wait()
	for r := range ranks {
		if errs[r] != nil {
			t.Fatalf("rank %d: %v", r, errs[r])
		}
		if !identical(viaPlugin[r].loop.Global(), viaGo[r].Global()) || viaPlugin[r].loop.InnerSteps() != steps {
			t.Errorf("rank %d: the loaded loop's global weights or step differ", r)
		}
		viaPlugin[r].close()
	}
}

// TestOuterRefused: a rank whose gc_engine_config is unusable for the
// loop refuses through the handshake: every rank fails at once with
// GC_ERR_CONFIG naming it and the field.
func TestOuterRefused(t *testing.T) {
	const ranks = 2
	group, _ := inproc.NewGroup(ranks)
	ec, err := parseEngineConfig(rawEngineConfig{spec: "none", timeout: 30, workers: 1, device: -1})
	if err != nil {
		t.Fatal(err)
	}
	bad := ec
	bad.device = 0
	errs := make([]error, ranks)
	var wg sync.WaitGroup
	start := time.Now()
	for r := range ranks {
		tr, _ := newTransport(r, ranks)
		defer tr.close()
		go serve(tr, group[r])
		c := ec
		var invalid *outer.ConfigError
		if r == 1 {
			c, invalid = bad, outerEngineConfig(bad)
		}
		wg.Go(func() {
			var o *outerLoop
			if o, errs[r] = newOuter(tr, outer.Config{SyncEvery: 2}, c, [][]float32{make([]float32, 4)}, invalid); errs[r] == nil {
				o.close()
			}
		})
	}
	wg.Wait()
	for r, err := range errs {
		var ce *outer.ConfigError
		if !errors.As(err, &ce) || ce.Rank != 1 || ce.Field != "ecfg->device" || statusOf(err) != errConfig {
			t.Errorf("rank %d: %v, want GC_ERR_CONFIG naming rank 1's ecfg->device", r, err)
		}
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("took %v with a 30 s timeout", took)
	}
}

// identical reports whether a and b hold the same bits.
func identical(a, b [][]float32) bool {
	for i := range a {
		for j := range a[i] {
			if math.Float32bits(a[i][j]) != math.Float32bits(b[i][j]) {
				return false
			}
		}
	}
	return len(a) == len(b)
}
