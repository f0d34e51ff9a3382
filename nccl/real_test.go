package nccl_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// The tests in this file load a REAL libnccl.so.2 (ncclmock.RealLibrary:
// $GRADCOMP_NCCL, else the nvidia-nccl-cu12 wheel in the gradcomp venv),
// or a library that is not a usable NCCL, each in a process of its own
// (ncclmock.Isolate). On a machine without a GPU they check what such a
// machine can: the library loads, reports its version and has every
// function the package calls, and every call that needs a device fails
// with an *nccl.Error that carries NCCL's own text, promptly.

// isolatedTimeout bounds each isolated test: a hung NCCL call fails the
// test (the child's -test.timeout prints every goroutine) instead of
// hanging the run.
const isolatedTimeout = 2 * time.Minute

// callTimeout is the communicator timeout of the InitRank calls below: on
// a machine without a GPU they fail in milliseconds, so reaching it means
// NCCL blocked.
const callTimeout = 30 * time.Second

// openReal loads the real library, skipping when there is none.
func openReal(t *testing.T) *nccl.Library {
	t.Helper()
	path, err := ncclmock.RealLibrary()
	if err != nil {
		t.Skip(err)
	}
	start := time.Now()
	l, err := nccl.Open(nccl.WithPath(path))
	if errors.Is(err, nccl.ErrNoCgo) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatalf("Open(WithPath(%s)): %v", path, err)
	}
	t.Logf("loaded NCCL %v (code %d) from %s in %v", l.Version(), l.Version().Code, l.Path(), time.Since(start).Round(time.Millisecond))
	return l
}

// sameFile reports whether a and b name the same file.
func sameFile(a, b string) bool {
	sa, errA := os.Stat(a)
	sb, errB := os.Stat(b)
	return errA == nil && errB == nil && os.SameFile(sa, sb)
}

// TestRealLibrary: the real library loads, its version is a sane 2.x, and
// every function of the package's table resolves inside it.
func TestRealLibrary(t *testing.T) {
	path, err := ncclmock.RealLibrary()
	if err != nil {
		t.Skip(err)
	}
	if !ncclmock.Isolate(t, isolatedTimeout) {
		return
	}
	l := openReal(t)
	v := l.Version()
	if v.Major != 2 || v.Minor < 7 || v.Code != v.Major*10000+v.Minor*100+v.Patch {
		t.Errorf("version %v (code %d): want 2.7 or newer, coded major·10000 + minor·100 + patch", v, v.Code)
	}
	if !sameFile(l.Path(), path) {
		t.Errorf("Path() = %s, want %s", l.Path(), path)
	}
	if want := "WithPath(" + path + ")"; l.Source() != want {
		t.Errorf("Source() = %q, want %q", l.Source(), want)
	}
	names, required, since := nccl.FunctionTable()
	for i, name := range names {
		file := l.SymbolFile(name)
		switch {
		case file == "" && (required[i] || v.Minor >= since[i].Minor):
			t.Errorf("%s: not resolved in NCCL %v", name, v)
		case file == "":
			t.Logf("%s: absent (optional, added in NCCL %d.%d; this is %v)", name, since[i].Major, since[i].Minor, v)
		case !sameFile(file, path):
			t.Errorf("%s resolved in %s, not in %s", name, file, path)
		}
	}
	t.Logf("all %d functions of the package's table resolve in %s", len(names), path)

	// The loaded copy is the process's NCCL from now on.
	again, err := nccl.Open(nccl.WithPath("/nonexistent/libnccl.so.2"))
	if err != nil || !strings.HasPrefix(again.Source(), "already loaded") || !sameFile(again.Path(), path) {
		t.Errorf("second Open: %v, source %q", err, again.Source())
	}
	for r := nccl.ResultSuccess; r <= nccl.ResultTimeout; r++ {
		if s := l.ErrorString(r); s == "" {
			t.Errorf("ncclGetErrorString(%v) is empty", r)
		}
	}
	t.Logf("ncclGetErrorString(%v) = %q", nccl.ResultUnhandledCudaError, l.ErrorString(nccl.ResultUnhandledCudaError))
}

// checkInitError checks that err is the *nccl.Error of a failed
// ncclCommInitRank on rank with NCCL's text in it, returned well before
// the timeout. It skips when InitRank succeeded: the machine has a GPU.
func checkInitError(t *testing.T, l *nccl.Library, c *nccl.Comm, err error, took time.Duration, rank int) *nccl.Error {
	t.Helper()
	if err == nil {
		c.Destroy(context.Background())
		t.Skip("ncclCommInitRank succeeded: this machine has a usable GPU, so the failure path is not reachable here")
	}
	var ae *nccl.AbortError
	if errors.As(err, &ae) {
		t.Fatalf("ncclCommInitRank blocked until the binding aborted it: %v", err)
	}
	var ne *nccl.Error
	if !errors.As(err, &ne) {
		t.Fatalf("got %T %v, want an *nccl.Error", err, err)
	}
	if ne.Func != "ncclCommInitRank" || ne.Rank != rank || ne.Result == nccl.ResultSuccess || ne.Message != l.ErrorString(ne.Result) {
		t.Errorf("got %+v", ne)
	}
	if l.Version().Minor >= 13 && ne.Detail == "" {
		t.Errorf("no ncclGetLastError detail in %v", err)
	}
	for _, part := range []string{ne.Message, ne.Detail, ne.Result.String()} {
		if !strings.Contains(err.Error(), part) {
			t.Errorf("message %q lacks %q", err, part)
		}
	}
	if took > callTimeout/2 {
		t.Errorf("ncclCommInitRank took %v to fail", took)
	}
	t.Logf("ncclCommInitRank (rank %d) failed in %v: %v", rank, took.Round(time.Millisecond), err)
	return ne
}

// TestRealDeviceCalls: without a GPU, ncclGetUniqueId works (it only opens
// the bootstrap socket) and ncclCommInitRank fails at once with NCCL's CUDA
// error, for a world of one rank and for a world whose other rank never
// comes; WithDevice fails in the CUDA driver before NCCL is called.
func TestRealDeviceCalls(t *testing.T) {
	if _, err := ncclmock.RealLibrary(); err != nil {
		t.Skip(err)
	}
	if !ncclmock.Isolate(t, isolatedTimeout) {
		return
	}
	l := openReal(t)
	id, err := l.GetUniqueID()
	if err != nil {
		var ne *nccl.Error
		if !errors.As(err, &ne) || ne.Func != "ncclGetUniqueId" {
			t.Fatalf("GetUniqueID: got %T %v, want an *nccl.Error", err, err)
		}
		t.Logf("GetUniqueID failed (no bootstrap interface?): %v", err)
		copy(id[:], "gradcomp test id") // InitRank needs a non-zero id; it fails before reading it
	} else if id.IsZero() {
		t.Fatal("GetUniqueID returned the zero id")
	}
	opts := []nccl.Option{nccl.WithTimeout(callTimeout), nccl.WithAbortGrace(5 * time.Second)}

	start := time.Now()
	c, err := l.InitRank(t.Context(), 1, id, 0, opts...)
	ne := checkInitError(t, l, c, err, time.Since(start), 0)
	if ne.Result != nccl.ResultUnhandledCudaError {
		t.Errorf("Result = %v, want %v (NCCL reports a missing device as a CUDA error)", ne.Result, nccl.ResultUnhandledCudaError)
	}

	// Rank 1 of 2 never joins: NCCL fails on the device before it waits.
	start = time.Now()
	c, err = l.InitRank(t.Context(), 2, id, 0, opts...)
	checkInitError(t, l, c, err, time.Since(start), 0)

	// WithDevice binds the device in the CUDA driver first.
	_, err = l.InitRank(t.Context(), 1, id, 0, append(opts, nccl.WithDevice(0))...)
	var ce *nccl.CUDAError
	switch {
	case errors.As(err, &ce):
		if ce.Func != "cuInit" && ce.Func != "cuDeviceGet" || ce.Device != 0 || ce.Code == 0 {
			t.Errorf("got %+v", ce)
		}
	case err != nil && strings.Contains(err.Error(), nccl.CUDADriverName):
	default:
		t.Errorf("WithDevice(0): got %v, want a *CUDAError or a missing %s", err, nccl.CUDADriverName)
	}
	t.Logf("InitRank with WithDevice(0): %v", err)
}

// TestRealWithoutDriver: on a machine whose libcuda.so.1 is not a CUDA
// driver (a stand-in without its functions comes first on
// LD_LIBRARY_PATH), ncclCommInitRank fails with NCCL's CUDA error and
// WithDevice names the function the driver lacks.
func TestRealWithoutDriver(t *testing.T) {
	if _, err := ncclmock.RealLibrary(); err != nil {
		t.Skip(err)
	}
	var env []string // the child inherits the stand-in driver's directory
	if !ncclmock.IsolatedChild() {
		dir, err := buildNoDriver(t)
		if err != nil {
			t.Fatal(err)
		}
		env = []string{"LD_LIBRARY_PATH=" + dir}
	}
	if !ncclmock.Isolate(t, isolatedTimeout, env...) {
		return
	}
	lib := filepath.Join(os.Getenv("LD_LIBRARY_PATH"), nccl.CUDADriverName)
	l := openReal(t)
	id, err := l.GetUniqueID()
	if err != nil {
		t.Logf("GetUniqueID: %v", err)
		copy(id[:], "gradcomp test id")
	}
	start := time.Now()
	c, err := l.InitRank(t.Context(), 1, id, 0, nccl.WithTimeout(callTimeout), nccl.WithAbortGrace(5*time.Second))
	ne := checkInitError(t, l, c, err, time.Since(start), 0)
	if ne.Result != nccl.ResultUnhandledCudaError {
		t.Errorf("Result = %v, want %v", ne.Result, nccl.ResultUnhandledCudaError)
	}
	_, err = l.InitRank(t.Context(), 1, id, 0, nccl.WithDevice(0))
	if want := "has no function cuInit, which WithDevice calls"; err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), lib) {
		t.Errorf("WithDevice(0): got %v, want %q naming %s", err, want, lib)
	}
}

// buildNoDriver builds a libcuda.so.1 that is not a CUDA driver (it has
// none of its functions) in a temporary directory and returns the
// directory; it skips the test when there is no C compiler.
func buildNoDriver(t *testing.T) (string, error) {
	cc, err := ncclmock.CC()
	if err != nil {
		t.Skip(err)
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "nodriver.c")
	if err := os.WriteFile(src, []byte("int gradcomp_not_a_cuda_driver(void) { return 0; }\n"), 0o644); err != nil {
		return "", err
	}
	lib := filepath.Join(dir, nccl.CUDADriverName)
	if out, err := exec.Command(cc, "-shared", "-fPIC", "-Wl,-soname,"+nccl.CUDADriverName, "-o", lib, src).CombinedOutput(); err != nil {
		return "", fmt.Errorf("building the stand-in %s: %v\n%s", nccl.CUDADriverName, err, out)
	}
	return dir, nil
}

// TestOpenIncompatible: a library that is not NCCL, one that lacks a
// function and one of another major version are refused with a
// *LoadError that says why, and closed again: a good library still loads
// afterwards.
func TestOpenIncompatible(t *testing.T) {
	if buildErr != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	var env []string // the child inherits the NCCL 3 mock's path
	if !ncclmock.IsolatedChild() {
		v3, err := ncclmock.Build(t.TempDir(), "MOCK_VERSION=30000")
		if err != nil {
			t.Fatal(err)
		}
		env = []string{"MOCK_V3=" + v3}
	}
	if !ncclmock.Isolate(t, isolatedTimeout, env...) {
		return
	}
	v3 := os.Getenv("MOCK_V3")
	refused := func(path string) *nccl.LoadError {
		t.Helper()
		l, err := nccl.Open(nccl.WithPath(path))
		if errors.Is(err, nccl.ErrNoCgo) {
			t.Skip(err)
		}
		var le *nccl.LoadError
		if err == nil || !errors.As(err, &le) || !errors.Is(err, nccl.ErrIncompatible) || errors.Is(err, nccl.ErrNotFound) {
			t.Fatalf("Open(%s): got %v (library %v), want a *LoadError matching ErrIncompatible", path, err, l)
		}
		t.Logf("Open(%s): %v", path, err)
		return le
	}
	_, required, _ := nccl.FunctionTable()
	nreq := 0
	for _, r := range required {
		if r {
			nreq++
		}
	}

	le := refused("libm.so.6")
	if le.Symbol != "ncclGetVersion" || len(le.Missing) != nreq || !strings.HasSuffix(le.Path, "libm.so.6") {
		t.Errorf("libm: got %+v, want all %d required functions missing", le, nreq)
	}
	if want := le.Path + " is not an NCCL library: it has no function ncclGetVersion, nor"; !strings.Contains(le.Error(), want) {
		t.Errorf("libm: message %q lacks %q", le, want)
	}

	le = refused(noSendPath)
	if le.Symbol != "ncclSend" || len(le.Missing) != 1 || le.Version.String() != "2.19.3" {
		t.Errorf("no ncclSend: got %+v", le)
	}
	if want := noSendPath + " has no function ncclSend, which the package calls (it is NCCL 2.19.3"; !strings.Contains(le.Error(), want) {
		t.Errorf("no ncclSend: message %q lacks %q", le, want)
	}

	le = refused(v3)
	if le.Version.Major != 3 || le.Symbol != "" || le.Path != v3 {
		t.Errorf("NCCL 3: got %+v", le)
	}
	if want := v3 + " is NCCL 3.0.0 (ncclGetVersion code 30000), but the package calls the C ABI of NCCL 2.x"; !strings.Contains(le.Error(), want) {
		t.Errorf("NCCL 3: message %q lacks %q", le, want)
	}

	// None of them stayed loaded as the process's libnccl.so.2.
	l, err := nccl.Open(nccl.WithPath(mockPath))
	if err != nil || l.Path() != mockPath || !strings.HasPrefix(l.Source(), "WithPath") {
		t.Fatalf("Open(mock) after the refusals: %v", err)
	}
}

// TestRealSplit: the real library has ncclCommSplit (NCCL ≥ 2.18), and
// where a GPU makes a communicator, Split of a one-rank communicator gives
// a one-rank one (NoColor gives none), and the parent and the child each
// outlive the other's Destroy. Without a GPU ncclCommInitRank fails, so
// after the symbol check the test skips, saying so.
func TestRealSplit(t *testing.T) {
	path, err := ncclmock.RealLibrary()
	if err != nil {
		t.Skip(err)
	}
	if !ncclmock.Isolate(t, isolatedTimeout) {
		return
	}
	l := openReal(t)
	if v := l.Version(); v.Minor < 18 {
		t.Skipf("NCCL %v predates ncclCommSplit (2.18)", v)
	}
	if file := l.SymbolFile("ncclCommSplit"); !sameFile(file, path) {
		t.Fatalf("ncclCommSplit resolved in %q, not in %s", file, path)
	}
	id, err := l.GetUniqueID()
	if err != nil {
		t.Skipf("GetUniqueID failed (no bootstrap interface?), so no communicator: %v", err)
	}
	ctx := t.Context()
	opts := []nccl.Option{nccl.WithTimeout(callTimeout), nccl.WithAbortGrace(5 * time.Second)}
	c, err := l.InitRank(ctx, 1, id, 0, opts...)
	if err != nil {
		var ne *nccl.Error
		if errors.As(err, &ne) && ne.Func == "ncclCommInitRank" {
			t.Skipf("ncclCommInitRank failed (no usable GPU here), so Split is out of reach: %v", err)
		}
		t.Fatal(err)
	}
	defer c.Destroy(context.Background())
	start := time.Now()
	s, err := c.Split(ctx, 0, 0)
	if err != nil {
		t.Fatalf("Split: %v", err)
	}
	if s.Rank() != 0 || s.Size() != 1 {
		t.Errorf("Split of one rank: Rank %d Size %d", s.Rank(), s.Size())
	}
	t.Logf("ncclCommSplit of one rank took %v", time.Since(start).Round(time.Millisecond))
	if none, err := c.Split(ctx, nccl.NoColor, 0); none != nil || err != nil {
		t.Errorf("Split(NoColor): got %v, %v; want nil, nil", none, err)
	}
	if err := s.Destroy(ctx); err != nil {
		t.Fatalf("Destroy of the child: %v", err)
	}
	if err := c.AsyncError(); err != nil {
		t.Errorf("the parent after its child's Destroy: %v", err)
	}
	s, err = c.Split(ctx, 1, 0)
	if err != nil {
		t.Fatalf("second Split: %v", err)
	}
	if err := c.Destroy(ctx); err != nil {
		t.Fatalf("Destroy of the parent: %v", err)
	}
	if err := s.Wait(ctx, func() (bool, error) { return true, nil }); err != nil {
		t.Errorf("the child after its parent's Destroy: %v", err)
	}
	if err := s.Destroy(ctx); err != nil {
		t.Errorf("Destroy of the child: %v", err)
	}
}
