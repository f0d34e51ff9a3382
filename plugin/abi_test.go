package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"testing"

	"github.com/gradcomp/gradcomp/nccl"
)

// TestHeaderConstants checks every constant of include/gradcomp.h against
// abi.go's Go values, so that the two cannot drift.
func TestHeaderConstants(t *testing.T) {
	h, err := os.ReadFile("include/gradcomp.h")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int64{
		"GRADCOMP_ABI_MAJOR": abiMajor, "GRADCOMP_ABI_MINOR": abiMinor,
		"GC_FEEDBACK": flagFeedback, "GC_DEFER": flagDefer,
		"GC_COMMIT": settleCommit, "GC_RETAIN": settleRetain, "GC_DISCARD": settleDiscard,
		"GC_OK": int64(statusOK), "GC_ERR_INVALID": int64(errInvalid), "GC_ERR_SPEC": int64(errSpec),
		"GC_ERR_HANDLE": int64(errHandle), "GC_ERR_SIZE": int64(errSize), "GC_ERR_CORRUPT": int64(errCorrupt),
		"GC_ERR_NONFINITE": int64(errNonFinite), "GC_ERR_MISMATCH": int64(errMismatch),
		"GC_ERR_STATE": int64(errState), "GC_ERR_INTERNAL": int64(errInternal),
		"GC_FEATURE_CUDA": featureCUDA, "GC_FEATURE_FAKE_DEVICE": featureFakeDevice,
		"GC_ERR_NCCL": int64(errNCCL), "GC_NCCL_UNIQUE_ID_BYTES": nccl.UniqueIDBytes,
		"GC_ERR_NOCUDA": int64(errNoCUDA), "GC_ERR_NODEVICE": int64(errNoDevice), "GC_ERR_CUDA": int64(errCUDA),
		"GC_ERR_TIMEOUT": int64(errTimeout), "GC_ERR_CLOSED": int64(errClosed), "GC_ERR_COMM": int64(errComm),
		"GC_ERR_CONFIG": int64(errConfig), "GC_ERR_BROKEN": int64(errBroken), "GC_ERR_NOMEM": int64(errNoMem),
		"GC_OP_ALLREDUCE": opAllReduce, "GC_OP_ALLGATHER": opAllGather, "GC_OP_REDUCESCATTER": opReduceScatter,
		"GC_OP_ALLTOALL": opAllToAll, "GC_OP_BROADCAST": opBroadcast, "GC_OP_BARRIER": opBarrier,
		"GC_GROUP_WORLD": groupWorld, "GC_GROUP_NODE": groupNode, "GC_GROUP_CROSS": groupCross,
		"GC_NAMES_STRATEGY": namesStrategy, "GC_NAMES_DECISION": namesDecision, "GC_NAMES_ORIGIN": namesOrigin,
		"GC_NAMES_CAUTION": namesCaution, "GC_NAMES_GUARD": namesGuard,
		"GC_ORIGIN_CODEC": originCodec, "GC_ORIGIN_PINNED": originPinned, "GC_ORIGIN_COST_MODEL": originCostModel,
		"GC_ORIGIN_VERIFICATION": originVerification, "GC_ORIGIN_WARMUP": originWarmup, "GC_ORIGIN_TRIAL": originTrial,
		"GC_ORIGIN_GUARD": originGuard, "GC_ORIGIN_FALLBACK": originFallback,
		"GC_CAUTION_NONE": cautionNone, "GC_CAUTION_RANDOMK_RATIO": cautionRandomKRatio,
		"GC_NAMES_OUTER_OPTIMIZER": namesOptimizer, "GC_OUTER_NESTEROV": outerNesterov, "GC_OUTER_SGD": outerSGD,
		"GC_OUTER_NONE": outerNone, "GC_OUTER_SKIP": outerSkip, "GC_OUTER_FAIL": outerFail,
		"GC_GUARD_OFF": guardOff, "GC_GUARD_CLEAR": guardClear, "GC_GUARD_TRIPPED": guardTripped, "GC_GUARD_PENDING": guardPending,
	}
	defs := regexp.MustCompile(`(?m)^#define (\w+) (\d+)u?\b|^\s+(GC_\w+) = (\d+),?`).FindAllSubmatch(h, -1)
	got := map[string]int64{}
	for _, d := range defs {
		name, val := string(d[1])+string(d[3]), string(d[2])+string(d[4])
		v, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			t.Fatalf("%s = %q: %v", name, val, err)
		}
		got[name] = v
	}
	for name, w := range want {
		if g, ok := got[name]; !ok || g != w {
			t.Errorf("gradcomp.h: %s = %d (found: %v), abi.go has %d", name, g, ok, w)
		}
	}
	for name := range got {
		if _, ok := want[name]; !ok {
			t.Errorf("gradcomp.h defines %s, which abi.go does not mirror", name)
		}
	}
}

// TestHeaderFunctions checks that the header declares exactly the functions
// the library exports: the //export functions and the public C definitions.
func TestHeaderFunctions(t *testing.T) {
	h, err := os.ReadFile("include/gradcomp.h")
	if err != nil {
		t.Fatal(err)
	}
	declared := names(regexp.MustCompile(`(?m)^(?:const char \*|uint32_t |gc_status )(gc_\w+)\(`), h)

	var exported []string
	goFiles, _ := filepath.Glob("*.go")
	cFiles, _ := filepath.Glob("*.c")
	private, err := os.ReadFile("lasterror.h")
	if err != nil {
		t.Fatal(err)
	}
	hidden := names(regexp.MustCompile(`(?m)^__attribute__\(\(visibility\("hidden"\)\)\) \w+ \*?(\w+)\(`), private)
	for _, f := range append(goFiles, cFiles...) {
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		exported = append(exported, names(regexp.MustCompile(`(?m)^//export (\w+)$`), src)...)
		if filepath.Ext(f) == ".c" {
			for _, fn := range names(regexp.MustCompile(`(?m)^(?:const )?\w+ \*?(\w+)\([^;{]*\) \{`), src) {
				if !slices.Contains(hidden, fn) {
					exported = append(exported, fn)
				}
			}
		}
	}
	slices.Sort(declared)
	slices.Sort(exported)
	if len(declared) < 10 || !slices.Equal(declared, exported) {
		t.Errorf("gradcomp.h declares %v,\nthe library exports %v", declared, exported)
	}
}

// names returns the first submatch of every match of re in src.
func names(re *regexp.Regexp, src []byte) []string {
	var out []string
	for _, m := range re.FindAllSubmatch(src, -1) {
		out = append(out, string(m[1]))
	}
	return out
}
