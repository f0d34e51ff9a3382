package nccl_test

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// cudaShim stands in for the CUDA headers nccl.h includes when the system
// has none (they are searched after the system's own, -idirafter): nccl.h
// needs only cudaStream_t, cudaEvent_t and CUDART_VERSION from them.
var cudaShim = map[string]string{
	"cuda_runtime.h": "#pragma once\n#include <stddef.h>\n#define CUDART_VERSION 12000\ntypedef struct CUstream_st* cudaStream_t;\ntypedef struct CUevent_st* cudaEvent_t;\n",
	"cuda_fp16.h":    "#pragma once\n",
	"cuda_bf16.h":    "#pragma once\n",
	"cuda_fp8.h":     "#pragma once\n",
}

// TestHeaderABI checks the binding against the nccl.h that ships with the
// real library (ncclmock.RealHeader), by compiling a C file with the
// system's C compiler: every constant of the package (results, data types,
// reductions, NCCL_UNIQUE_ID_BYTES) has nccl.h's value; every result code
// nccl.h defines has a name here; the binding's stand-in types (gcnccl.h)
// have the size and alignment of nccl.h's; and each function the package
// calls, as the package's table lists them, has the prototype gcnccl.h
// declares for it (an incompatible pointer type is an error), an optional
// one where nccl.h is of a release that has it.
func TestHeaderABI(t *testing.T) {
	lib, err := ncclmock.RealLibrary()
	if err != nil {
		t.Skip(err)
	}
	header, err := ncclmock.RealHeader(lib)
	if err != nil {
		t.Skip(err)
	}
	cc, err := ncclmock.CC()
	if err != nil {
		t.Skip(err)
	}
	text, err := os.ReadFile(header)
	if err != nil {
		t.Fatal(err)
	}
	if m := regexp.MustCompile(`(?m)^#define NCCL_VERSION_CODE (\d+)`).FindSubmatch(text); m != nil {
		t.Logf("checking against %s (NCCL_VERSION_CODE %s)", header, m[1])
	}
	pkg, err := os.Getwd() // the package directory, which holds gcnccl.h
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	shim := filepath.Join(dir, "cudashim")
	if err := os.Mkdir(shim, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, body := range cudaShim {
		if err := os.WriteFile(filepath.Join(shim, name), []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	src := filepath.Join(dir, "abi.c")
	if err := os.WriteFile(src, []byte(abiProgram()), 0o644); err != nil {
		t.Fatal(err)
	}
	args := []string{"-fsyntax-only", "-Werror=incompatible-pointer-types", "-Werror=int-conversion",
		"-I", filepath.Dir(header), "-I", pkg, "-idirafter", shim, src}
	if out, err := exec.Command(cc, args...).CombinedOutput(); err != nil {
		t.Fatalf("the binding disagrees with %s (%s %s: %v):\n%s\nthe checks:\n%s", header, cc, strings.Join(args, " "), err, out, abiProgram())
	}
}

// constant is one of the package's exported constants: its C name (from
// String) and its value.
type constant struct {
	name  string
	value int
}

// constants returns the package's exported constants.
func constants() []constant {
	var cs []constant
	for _, r := range []nccl.Result{nccl.ResultSuccess, nccl.ResultUnhandledCudaError, nccl.ResultSystemError,
		nccl.ResultInternalError, nccl.ResultInvalidArgument, nccl.ResultInvalidUsage, nccl.ResultRemoteError,
		nccl.ResultInProgress, nccl.ResultTimeout} {
		cs = append(cs, constant{r.String(), int(r)})
	}
	for _, d := range []nccl.DataType{nccl.Int8, nccl.Uint8, nccl.Int32, nccl.Uint32, nccl.Int64, nccl.Uint64,
		nccl.Float16, nccl.Float32, nccl.Float64, nccl.Bfloat16} {
		cs = append(cs, constant{d.String(), int(d)})
	}
	for _, o := range []nccl.RedOp{nccl.Sum, nccl.Prod, nccl.Max, nccl.Min, nccl.Avg} {
		cs = append(cs, constant{o.String(), int(o)})
	}
	return cs
}

// TestConstantNames: every exported constant has a C name (String finds
// it in the package's table), so that TestHeaderABI can look it up.
func TestConstantNames(t *testing.T) {
	for _, c := range constants() {
		if !regexp.MustCompile(`^nccl[A-Za-z0-9]+$`).MatchString(c.name) {
			t.Errorf("the constant of value %d has no C name: String gives %q", c.value, c.name)
		}
	}
}

// abiProgram returns the C file TestHeaderABI compiles: static assertions
// and function pointer initializations generated from the package's
// constants and its table of functions.
func abiProgram() string {
	var b strings.Builder
	w := func(format string, args ...any) { fmt.Fprintf(&b, format+"\n", args...) }
	w("#include <nccl.h>")
	w("#define GC_RESULT ncclResult_t")
	w("#define GC_DATATYPE ncclDataType_t")
	w("#define GC_REDOP ncclRedOp_t")
	w("#define GC_COMM ncclComm_t")
	w("#define GC_STREAM cudaStream_t")
	w("#define GC_UNIQUE_ID ncclUniqueId")
	w("#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 14, 0)") // ncclConfig_t
	w("#define GC_CONFIG ncclConfig_t")
	w("#endif")
	w(`#include "gcnccl.h"`)
	w("")
	same := func(ours, theirs string) {
		w("_Static_assert(sizeof(%s) == sizeof(%s) && _Alignof(%s) == _Alignof(%s), %q);",
			ours, theirs, ours, theirs, ours+" differs from nccl.h's "+theirs+" in size or alignment")
	}
	same("gc_enum", "ncclResult_t")
	same("gc_enum", "ncclDataType_t")
	same("gc_enum", "ncclRedOp_t")
	same("gc_handle", "ncclComm_t")
	same("gc_handle", "cudaStream_t")
	same("gc_unique_id", "ncclUniqueId")
	value := func(name string, v int) {
		w("_Static_assert(%s == %d, %q);", name, v, fmt.Sprintf("the binding has %s = %d; nccl.h does not", name, v))
	}
	value("NCCL_UNIQUE_ID_BYTES", nccl.UniqueIDBytes)
	value("GC_UNIQUE_ID_BYTES", nccl.UniqueIDBytes)
	// The exported constants, by the C names String gives them.
	for _, c := range constants() {
		value(c.name, c.value)
	}
	// Every value String names, which covers the codes NCCL may return.
	nres := 0
	for r := nccl.Result(0); !strings.HasPrefix(r.String(), "ncclResult("); r++ {
		value(r.String(), int(r))
		nres++
	}
	w("_Static_assert(ncclNumResults <= %d, %q);", nres, fmt.Sprintf("nccl.h has result codes the binding does not name (it names %d)", nres))
	for d := nccl.DataType(0); d.Size() != 0; d++ {
		value(d.String(), int(d))
	}
	for o := nccl.RedOp(0); !strings.HasPrefix(o.String(), "ncclRedOp("); o++ {
		value(o.String(), int(o))
	}
	w("")
	// An optional function is checked where the header is of a release
	// that has it.
	names, _, since := nccl.FunctionTable()
	for i, name := range names {
		if since[i].Code != 0 {
			w("#if NCCL_VERSION_CODE >= NCCL_VERSION(%d, %d, 0)", since[i].Major, since[i].Minor)
		}
		w("gc_%s_fn check_%s = %s;", name, name, name)
		if since[i].Code != 0 {
			w("#endif")
		}
	}
	return b.String()
}
