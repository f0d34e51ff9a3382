package nccl_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// The tests run against the MOCK libnccl.so.2 that ncclmock compiles (a
// test fixture; see its package doc). Scenarios that need a process where
// no NCCL is loaded yet run in a child process: the test binary itself,
// re-executed with childEnv set.

const childEnv = "GRADCOMP_NCCL_TEST_CHILD"

var (
	mockPath   string // the mock library, "" when it could not be built
	noSendPath string // the mock built without ncclSend
	buildErr   error
)

func TestMain(m *testing.M) {
	flag.Parse()
	if scenario := os.Getenv(childEnv); scenario != "" {
		os.Exit(child(scenario))
	}
	dir, err := os.MkdirTemp("", "gradcomp-ncclmock-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	mockPath, buildErr = ncclmock.Build(dir)
	if buildErr == nil {
		sub := dir + "/nosend"
		if err := os.Mkdir(sub, 0o755); err != nil {
			buildErr = err
		} else {
			noSendPath, buildErr = ncclmock.Build(sub, "MOCK_NO_SEND")
		}
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// child runs one scenario in a fresh process and prints its result; the
// exit status is 0 when the scenario could run at all.
func child(scenario string) int {
	switch scenario {
	case "default":
		l, err := nccl.Open()
		report(l, err)
	case "path":
		l, err := nccl.Open(nccl.WithPath(os.Getenv("MOCK_PATH")))
		report(l, err)
	default:
		fmt.Println("unknown scenario", scenario)
		return 2
	}
	return 0
}

func report(l *nccl.Library, err error) {
	if err != nil {
		var le *nccl.LoadError
		fmt.Printf("error notfound=%v loaderror=%v: %v\n", errors.Is(err, nccl.ErrNotFound), errors.As(err, &le), err)
		if le != nil {
			fmt.Printf("symbol=%q\n", le.Symbol)
		}
		return
	}
	fmt.Printf("loaded %s from %s via %s\n", l.Version(), l.Path(), l.Source())
}

// runChild re-executes the test binary for scenario with extra environment.
func runChild(t *testing.T, scenario string, env ...string) string {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), append([]string{childEnv + "=" + scenario}, env...)...)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("child %s: %v\n%s", scenario, err, out)
	}
	return string(out)
}

// open returns the mock library, skipping when it could not be built.
func open(t *testing.T) *nccl.Library {
	t.Helper()
	if buildErr != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	l, err := nccl.Open(nccl.WithPath(mockPath))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func TestOpenMissingLibrary(t *testing.T) {
	out := runChild(t, "default", nccl.EnvPath+"=", "LD_LIBRARY_PATH=")
	if strings.HasPrefix(out, "loaded") {
		t.Skipf("this machine has a real %s on the search path: %s", nccl.LibraryName, out)
	}
	for _, want := range []string{"error notfound=true loaderror=true", "nccl: cannot load libnccl.so.2",
		"already loaded (RTLD_NOLOAD libnccl.so.2)", "search path (libnccl.so.2)", "GRADCOMP_NCCL"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in the error:\n%s", want, out)
		}
	}

	// An explicit path that does not load is final: no fallback.
	out = runChild(t, "default", nccl.EnvPath+"=/nonexistent/libnccl.so.2")
	for _, want := range []string{"error notfound=true", "$GRADCOMP_NCCL=/nonexistent/libnccl.so.2: /nonexistent/libnccl.so.2: cannot open shared object file"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in the error:\n%s", want, out)
		}
	}
	if strings.Contains(out, "search path") {
		t.Errorf("fell back to the search path after an explicit path failed:\n%s", out)
	}
}

func TestOpenMissingSymbol(t *testing.T) {
	if buildErr != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	out := runChild(t, "path", "MOCK_PATH="+noSendPath)
	for _, want := range []string{"error notfound=false loaderror=true", `symbol="ncclSend"`, noSendPath + " has no function ncclSend"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

func TestOpenMock(t *testing.T) {
	if buildErr != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	out := runChild(t, "path", "MOCK_PATH="+mockPath)
	if want := "loaded 2.19.3 from " + mockPath + " via WithPath(" + mockPath + ")"; !strings.Contains(out, want) {
		t.Errorf("got %q, want %q", out, want)
	}
	out = runChild(t, "default", nccl.EnvPath+"="+mockPath)
	if want := "via $GRADCOMP_NCCL=" + mockPath; !strings.Contains(out, want) {
		t.Errorf("got %q, want %q", out, want)
	}
	// Once loaded, the process's copy wins over any path.
	open(t)
	l, err := nccl.Open(nccl.WithPath("/nonexistent/libnccl.so.2"))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(l.Source(), "already loaded") || l.Path() != mockPath {
		t.Errorf("second Open: source %q path %q, want the loaded copy %s", l.Source(), l.Path(), mockPath)
	}
	if _, err := nccl.Open(nccl.WithPath("")); err == nil {
		t.Error("WithPath(\"\") accepted")
	}
}

func TestVersionFromCode(t *testing.T) {
	for _, c := range []struct {
		code int
		want string
	}{{22703, "2.27.3"}, {21903, "2.19.3"}, {20900, "2.9.0"}, {2708, "2.7.8"}, {2406, "2.4.6"}} {
		if got := nccl.VersionFromCode(c.code).String(); got != c.want {
			t.Errorf("VersionFromCode(%d) = %s, want %s", c.code, got, c.want)
		}
	}
}

func TestUniqueIDEncoding(t *testing.T) {
	id := ncclmock.ID(ncclmock.ModeOK)
	id[127] = 0xfe
	parsed, err := nccl.ParseUniqueID(id.String())
	if err != nil || parsed != id {
		t.Fatalf("text round trip: %v, equal %v", err, parsed == id)
	}
	b, _ := id.MarshalBinary()
	var back nccl.UniqueID
	if err := back.UnmarshalBinary(b); err != nil || back != id {
		t.Fatalf("binary round trip: %v", err)
	}
	var fromText nccl.UniqueID
	text, _ := id.MarshalText()
	if err := fromText.UnmarshalText([]byte(strings.ToUpper(string(text)))); err != nil || fromText != id {
		t.Fatalf("upper-case text: %v", err)
	}
	for _, bad := range []string{"", "00", strings.Repeat("0", 255), strings.Repeat("zz", 128)} {
		if _, err := nccl.ParseUniqueID(bad); err == nil {
			t.Errorf("ParseUniqueID(%d chars) accepted", len(bad))
		}
	}
	if err := back.UnmarshalBinary(b[:127]); err == nil {
		t.Error("127 bytes accepted")
	}
	if !(nccl.UniqueID{}).IsZero() || id.IsZero() {
		t.Error("IsZero wrong")
	}
}

func TestGetUniqueIDAndErrorString(t *testing.T) {
	l := open(t)
	a, err := l.GetUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	b, _ := l.GetUniqueID()
	if a.IsZero() || a == b {
		t.Errorf("ids %q and %q: want distinct, non-zero", a[:24], b[:24])
	}
	if got, want := l.ErrorString(nccl.ResultInvalidUsage), "invalid usage (run with NCCL_DEBUG=WARN for details)"; got != want {
		t.Errorf("ErrorString = %q, want %q", got, want)
	}
	if got := nccl.ResultRemoteError.String(); got != "ncclRemoteError" {
		t.Errorf("String = %q", got)
	}
	if got := nccl.Result(42).String(); got != "ncclResult(42)" {
		t.Errorf("String = %q", got)
	}
}

// world makes n communicators of one mock world selected by mode.
func world(t *testing.T, l *nccl.Library, n int, mode string, opts ...nccl.Option) []*nccl.Comm {
	t.Helper()
	id := ncclmock.ID(mode)
	comms := make([]*nccl.Comm, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { comms[r], errs[r] = l.InitRank(t.Context(), n, id, r, opts...) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("InitRank %d: %v", r, err)
		}
	}
	t.Cleanup(func() {
		for _, c := range comms {
			c.Destroy(context.Background())
		}
	})
	return comms
}

// onRanks runs f on every rank at once and returns the errors.
func onRanks(comms []*nccl.Comm, f func(r int, c *nccl.Comm) error) []error {
	errs := make([]error, len(comms))
	var wg sync.WaitGroup
	for r, c := range comms {
		wg.Go(func() { errs[r] = f(r, c) })
	}
	wg.Wait()
	return errs
}

func noErrors(t *testing.T, what string, errs []error) {
	t.Helper()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("%s on rank %d: %v", what, r, err)
		}
	}
}

// alloc returns per-rank float32 buffers of n elements.
func alloc(t *testing.T, ranks, n int) []*ncclmock.Buffer {
	t.Helper()
	bufs := make([]*ncclmock.Buffer, ranks)
	for r := range bufs {
		b, err := ncclmock.Alloc(4 * n)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { b.Free() })
		bufs[r] = b
	}
	return bufs
}

// val is rank r's input element i: small integers, so every sum is exact.
func val(r, i int) float32 { return float32((r+1)*1000 + i%997) }

func TestCollectives(t *testing.T) {
	l := open(t)
	const ranks, n = 4, 1031
	comms := world(t, l, ranks, ncclmock.ModeOK)
	for r, c := range comms {
		if c.Rank() != r || c.Size() != ranks || c.Library() != l {
			t.Fatalf("comm %d: Rank %d Size %d", r, c.Rank(), c.Size())
		}
	}
	send, recv := alloc(t, ranks, ranks*n), alloc(t, ranks, ranks*n)
	fill := func() {
		for r := range ranks {
			s := send[r].Float32s()
			for i := range s {
				s[i] = val(r, i)
			}
			clear(recv[r].Float32s())
		}
	}
	sum := func(i int) float32 {
		var s float32
		for r := range ranks {
			s += val(r, i)
		}
		return s
	}
	check := func(what string, want func(r, i int) float32, count int) {
		t.Helper()
		for r := range ranks {
			got := recv[r].Float32s()[:count]
			for i, g := range got {
				if w := want(r, i); g != w {
					t.Fatalf("%s: rank %d element %d = %v, want %v", what, r, i, g, w)
				}
			}
		}
	}
	ctx := t.Context()

	fill()
	noErrors(t, "AllReduce", onRanks(comms, func(r int, c *nccl.Comm) error {
		return c.Run(ctx, nccl.AllReduce(send[r].Ptr(), recv[r].Ptr(), n, nccl.Float32, nccl.Sum, 0))
	}))
	check("AllReduce", func(_, i int) float32 { return sum(i) }, n)

	fill()
	noErrors(t, "AllReduce in place", onRanks(comms, func(r int, c *nccl.Comm) error {
		return c.Run(ctx, nccl.AllReduce(send[r].Ptr(), send[r].Ptr(), n, nccl.Float32, nccl.Max, 0))
	}))
	for r := range ranks {
		copy(recv[r].Float32s(), send[r].Float32s()[:n])
	}
	check("AllReduce max in place", func(_, i int) float32 { return val(ranks-1, i) }, n)

	fill()
	noErrors(t, "AllGather", onRanks(comms, func(r int, c *nccl.Comm) error {
		return c.Run(ctx, nccl.AllGather(send[r].Ptr(), recv[r].Ptr(), n, nccl.Float32, 0))
	}))
	check("AllGather", func(_, i int) float32 { return val(i/n, i%n) }, ranks*n)

	fill()
	noErrors(t, "ReduceScatter", onRanks(comms, func(r int, c *nccl.Comm) error {
		return c.Run(ctx, nccl.ReduceScatter(send[r].Ptr(), recv[r].Ptr(), n, nccl.Float32, nccl.Sum, 0))
	}))
	check("ReduceScatter", func(r, i int) float32 { return sum(r*n + i) }, n)

	fill()
	noErrors(t, "Broadcast", onRanks(comms, func(r int, c *nccl.Comm) error {
		s := send[r].Ptr()
		if r != 2 {
			s = 0 // only the root's send is read
		}
		return c.Run(ctx, nccl.Broadcast(s, recv[r].Ptr(), n, nccl.Float32, 2, 0))
	}))
	check("Broadcast", func(_, i int) float32 { return val(2, i) }, n)

	// A ring exchange: each rank sends to the next and receives from the
	// previous, in one group (separately they would deadlock).
	fill()
	noErrors(t, "Send/Recv", onRanks(comms, func(r int, c *nccl.Comm) error {
		return c.Run(ctx,
			nccl.Send(send[r].Ptr(), n, nccl.Float32, (r+1)%ranks, 0),
			nccl.Recv(recv[r].Ptr(), n, nccl.Float32, (r+ranks-1)%ranks, 0))
	}))
	check("Send/Recv", func(r, i int) float32 { return val((r+ranks-1)%ranks, i) }, n)

	noErrors(t, "Wait", onRanks(comms, func(_ int, c *nccl.Comm) error {
		return c.Wait(ctx, func() (bool, error) { return true, nil })
	}))
	noErrors(t, "AsyncError", onRanks(comms, func(_ int, c *nccl.Comm) error { return c.AsyncError() }))
}

// TestGroupAcrossComms drives two ranks from one goroutine, as a process
// with several GPUs would: the calls must be one group.
func TestGroupAcrossComms(t *testing.T) {
	l := open(t)
	comms := world(t, l, 2, ncclmock.ModeOK)
	bufs := alloc(t, 2, 8)
	for r, b := range bufs {
		for i := range b.Float32s() {
			b.Float32s()[i] = val(r, i)
		}
	}
	err := l.Group(t.Context(),
		nccl.Call{Comm: comms[0], Op: nccl.AllReduce(bufs[0].Ptr(), bufs[0].Ptr(), 8, nccl.Float32, nccl.Sum, 0)},
		nccl.Call{Comm: comms[1], Op: nccl.AllReduce(bufs[1].Ptr(), bufs[1].Ptr(), 8, nccl.Float32, nccl.Sum, 0)})
	if err != nil {
		t.Fatal(err)
	}
	for r, b := range bufs {
		for i, g := range b.Float32s() {
			if w := val(0, i) + val(1, i); g != w {
				t.Fatalf("rank %d element %d = %v, want %v", r, i, g, w)
			}
		}
	}
	if err := l.Group(t.Context()); err == nil {
		t.Error("empty Group accepted")
	}
	if err := l.Group(t.Context(), nccl.Call{Op: nccl.AllReduce(1, 1, 1, nccl.Float32, nccl.Sum, 0)}); err == nil {
		t.Error("nil Comm accepted")
	}
}

func TestArgumentErrors(t *testing.T) {
	l := open(t)
	comms := world(t, l, 1, ncclmock.ModeOK)
	c := comms[0]
	buf := alloc(t, 1, 4)[0].Ptr()
	for _, o := range []struct {
		op   nccl.Op
		want string
	}{
		{nccl.Op{}, "the zero Op"},
		{nccl.AllReduce(buf, 0, 4, nccl.Float32, nccl.Sum, 0), "null recv buffer with count 4"},
		{nccl.AllReduce(0, buf, 4, nccl.Float32, nccl.Sum, 0), "null send buffer with count 4"},
		{nccl.AllReduce(buf, buf, -1, nccl.Float32, nccl.Sum, 0), "negative count -1"},
		{nccl.AllReduce(buf, buf, 4, nccl.DataType(10), nccl.Sum, 0), "unknown data type ncclDataType(10)"},
		{nccl.ReduceScatter(buf, buf, 1, nccl.Float32, nccl.RedOp(5), 0), "unknown reduction ncclRedOp(5)"},
		{nccl.Broadcast(0, buf, 4, nccl.Float32, 0, 0), "null send buffer"},
		{nccl.Broadcast(buf, buf, 4, nccl.Float32, 1, 0), "root 1 out of range [0, 1)"},
		{nccl.Send(buf, 4, nccl.Float32, -1, 0), "peer -1 out of range"},
		{nccl.Recv(0, 4, nccl.Float32, 0, 0), "null recv buffer"},
	} {
		err := c.Run(t.Context(), o.op)
		var ae *nccl.ArgumentError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), o.want) {
			t.Errorf("%v: got %v, want an *ArgumentError with %q", o.op, err, o.want)
		}
	}
	// Nothing was enqueued, and the communicator still works.
	if err := c.Run(t.Context(), nccl.AllReduce(buf, buf, 4, nccl.Float32, nccl.Sum, 0), nccl.AllGather(buf, buf, 0, nccl.Int8, 0)); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []struct {
		n, rank int
		id      nccl.UniqueID
		want    string
	}{
		{0, 0, ncclmock.ID(ncclmock.ModeOK), "nranks = 0"},
		{2, 2, ncclmock.ID(ncclmock.ModeOK), "rank 2 out of range [0, 2)"},
		{1, 0, nccl.UniqueID{}, "zero UniqueID"},
	} {
		_, err := l.InitRank(t.Context(), bad.n, bad.id, bad.rank)
		var ae *nccl.ArgumentError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("InitRank(%d, %d): got %v, want %q", bad.n, bad.rank, err, bad.want)
		}
	}
	if _, err := l.InitRank(t.Context(), 1, ncclmock.ID(ncclmock.ModeOK), 0, nccl.WithTimeout(0)); err == nil {
		t.Error("WithTimeout(0) accepted")
	}
}

// TestNCCLError: an NCCL error comes back with ncclGetErrorString and
// ncclGetLastError in it, and leaves the communicator usable.
func TestNCCLError(t *testing.T) {
	l := open(t)
	c := world(t, l, 1, ncclmock.ModeFail)[0]
	buf := alloc(t, 1, 4)[0].Ptr()
	err := c.Run(t.Context(), nccl.AllReduce(buf, buf, 4, nccl.Float32, nccl.Sum, 0))
	var ne *nccl.Error
	if !errors.As(err, &ne) {
		t.Fatalf("got %v, want an *nccl.Error", err)
	}
	if ne.Func != "ncclAllReduce" || ne.Rank != 0 || ne.Result != nccl.ResultInvalidUsage ||
		ne.Message != "invalid usage (run with NCCL_DEBUG=WARN for details)" ||
		ne.Detail != "mock: AllReduce: told to fail by the unique id" {
		t.Errorf("got %+v", ne)
	}
	want := "nccl: ncclAllReduce on rank 0 failed: ncclInvalidUsage: invalid usage (run with NCCL_DEBUG=WARN for details) (last error: mock: AllReduce: told to fail by the unique id)"
	if err.Error() != want {
		t.Errorf("message\n%s\nwant\n%s", err, want)
	}
	if err := c.AsyncError(); err != nil {
		t.Errorf("AsyncError after a plain failure: %v", err)
	}
	// In a group, the failing function is named too.
	err = c.Run(t.Context(), nccl.Send(buf, 1, nccl.Float32, 0, 0), nccl.Recv(buf, 1, nccl.Float32, 0, 0))
	if !errors.As(err, &ne) || ne.Func != "ncclSend" {
		t.Errorf("group: got %v, want ncclSend's error", err)
	}
}

func TestMismatchedCalls(t *testing.T) {
	l := open(t)
	comms := world(t, l, 2, ncclmock.ModeOK)
	bufs := alloc(t, 2, 8)
	errs := onRanks(comms, func(r int, c *nccl.Comm) error {
		return c.Run(t.Context(), nccl.AllReduce(bufs[r].Ptr(), bufs[r].Ptr(), 4+r, nccl.Float32, nccl.Sum, 0))
	})
	for r, err := range errs {
		var ne *nccl.Error
		if !errors.As(err, &ne) || !strings.Contains(ne.Detail, "ranks disagree") {
			t.Errorf("rank %d: got %v", r, err)
		}
	}
}

// hangs runs a collective on a world of mode with the options and returns
// the Comm, how long Run took and its error.
func hangs(t *testing.T, ctx context.Context, mode string, opts ...nccl.Option) (*nccl.Comm, time.Duration, error) {
	t.Helper()
	l := open(t)
	c := world(t, l, 1, mode, opts...)[0]
	buf := alloc(t, 1, 4)[0].Ptr()
	start := time.Now()
	err := c.Run(ctx, nccl.AllReduce(buf, buf, 4, nccl.Float32, nccl.Sum, 0))
	return c, time.Since(start), err
}

func TestTimeoutAborts(t *testing.T) {
	c, took, err := hangs(t, t.Context(), ncclmock.ModeHang, nccl.WithTimeout(100*time.Millisecond), nccl.WithAbortGrace(5*time.Second))
	var ae *nccl.AbortError
	if !errors.As(err, &ae) || !ae.Aborted || !ae.Returned || ae.AbortErr != nil || ae.Func != "ncclAllReduce" {
		t.Fatalf("got %#v (%v)", err, err)
	}
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, nccl.ErrClosed) {
		t.Errorf("%v: want errors.Is DeadlineExceeded and ErrClosed", err)
	}
	if took < 100*time.Millisecond || took > 3*time.Second {
		t.Errorf("Run took %v with a 100ms timeout", took)
	}
	if !strings.Contains(err.Error(), "the communicator was aborted") {
		t.Errorf("message: %v", err)
	}
	// The Comm has ended: every later call says so at once.
	buf := alloc(t, 1, 4)[0].Ptr()
	err = c.Run(t.Context(), nccl.AllReduce(buf, buf, 4, nccl.Float32, nccl.Sum, 0))
	var ce *nccl.DestroyedError
	if !errors.As(err, &ce) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("after the abort: %v", err)
	}
	if err := c.Wait(t.Context(), func() (bool, error) { return true, nil }); !errors.Is(err, nccl.ErrClosed) {
		t.Errorf("Wait after the abort: %v", err)
	}
	if err := c.Destroy(t.Context()); err != nil {
		t.Errorf("Destroy after the abort: %v", err)
	}
}

func TestCancelAborts(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), 80*time.Millisecond)
	defer cancel()
	_, _, err := hangs(t, ctx, ncclmock.ModeHang)
	if !errors.Is(err, context.DeadlineExceeded) || !errors.Is(err, nccl.ErrClosed) {
		t.Fatalf("got %v", err)
	}
}

// TestStuckCallLeftBehind: a call that does not return after the abort is
// left behind after the grace; Run still returns.
func TestStuckCallLeftBehind(t *testing.T) {
	_, took, err := hangs(t, t.Context(), ncclmock.ModeStuck, nccl.WithTimeout(50*time.Millisecond), nccl.WithAbortGrace(50*time.Millisecond))
	var ae *nccl.AbortError
	if !errors.As(err, &ae) || ae.Returned || !ae.Aborted {
		t.Fatalf("got %v", err)
	}
	if took > 450*time.Millisecond { // the mock returns 500ms after the abort
		t.Errorf("Run took %v: it waited for the stuck call", took)
	}
	if !strings.Contains(err.Error(), "had not returned after the abort") {
		t.Errorf("message: %v", err)
	}
}

func TestAsyncErrorAborts(t *testing.T) {
	_, _, err := hangs(t, t.Context(), ncclmock.ModeAsync)
	var ae *nccl.AbortError
	var ne *nccl.Error
	if !errors.As(err, &ae) || !errors.As(ae.Cause, &ne) {
		t.Fatalf("got %v", err)
	}
	if ne.Func != "ncclCommGetAsyncError" || ne.Result != nccl.ResultRemoteError || !strings.Contains(ne.Detail, "peer connection lost") {
		t.Errorf("cause %+v", ne)
	}
}

// TestInitTimeout: a rank that never joins ends InitRank with an abort of
// the half-made communicator.
func TestInitTimeout(t *testing.T) {
	l := open(t)
	start := time.Now()
	_, err := l.InitRank(t.Context(), 2, ncclmock.ID(ncclmock.ModeOK), 0, nccl.WithTimeout(100*time.Millisecond))
	var ae *nccl.AbortError
	if !errors.As(err, &ae) || !ae.Aborted || !ae.Returned || ae.Func != "ncclCommInitRank" {
		t.Fatalf("got %v", err)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("InitRank took %v", took)
	}
}

func TestWait(t *testing.T) {
	l := open(t)
	// 100 polls take about 30 ms, more on a loaded machine: a timeout of
	// 10 s leaves them room; the last check below has 100 ms.
	c := world(t, l, 1, ncclmock.ModeOK, nccl.WithTimeout(10*time.Second))[0]
	polls := 0
	if err := c.Wait(t.Context(), func() (bool, error) { polls++; return polls == 100, nil }); err != nil || polls != 100 {
		t.Fatalf("Wait: %v after %d polls", err, polls)
	}
	probe := errors.New("cuEventQuery: an illegal memory access")
	if err := c.Wait(t.Context(), func() (bool, error) { return false, probe }); !errors.Is(err, probe) {
		t.Fatalf("probe error: got %v", err)
	}
	if err := c.AsyncError(); err != nil {
		t.Fatalf("a probe error ended the Comm: %v", err)
	}
	c = world(t, l, 1, ncclmock.ModeOK, nccl.WithTimeout(100*time.Millisecond))[0]
	start := time.Now()
	err := c.Wait(t.Context(), func() (bool, error) { return false, nil })
	var ae *nccl.AbortError
	if !errors.As(err, &ae) || ae.Func != "Wait" || !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("never done: got %v", err)
	}
	if took := time.Since(start); took < 100*time.Millisecond || took > 3*time.Second {
		t.Errorf("Wait took %v with a 100ms timeout", took)
	}
	if err := c.AsyncError(); !errors.Is(err, nccl.ErrClosed) {
		t.Errorf("AsyncError after the abort: %v", err)
	}
}

// TestAbortFromAnotherGoroutine: Abort unblocks a call in flight.
func TestAbortFromAnotherGoroutine(t *testing.T) {
	l := open(t)
	c := world(t, l, 1, ncclmock.ModeHang)[0]
	buf := alloc(t, 1, 4)[0].Ptr()
	done := make(chan error, 1)
	go func() { done <- c.Run(t.Context(), nccl.AllReduce(buf, buf, 4, nccl.Float32, nccl.Sum, 0)) }()
	time.Sleep(20 * time.Millisecond)
	if err := c.Abort(); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		var ne *nccl.Error
		if !errors.As(err, &ne) || ne.Result != nccl.ResultSystemError {
			t.Errorf("the aborted call returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Run still blocked 5s after Abort")
	}
	if err := c.Abort(); err != nil {
		t.Errorf("second Abort: %v", err)
	}
	if err := c.AsyncError(); !errors.Is(err, nccl.ErrClosed) || !strings.Contains(err.Error(), "aborted by Comm.Abort") {
		t.Errorf("after Abort: %v", err)
	}
}

func TestTypesStrings(t *testing.T) {
	if nccl.Float32.Size() != 4 || nccl.Bfloat16.Size() != 2 || nccl.Float64.String() != "ncclFloat64" || nccl.DataType(-1).Size() != 0 {
		t.Error("DataType")
	}
	if nccl.Avg.String() != "ncclAvg" || nccl.RedOp(9).String() != "ncclRedOp(9)" {
		t.Error("RedOp")
	}
	if got := nccl.Send(0x10, 3, nccl.Int32, 1, 0x20).String(); got != "ncclSend(buf=0x10, count=3, ncclInt32, peer=1, stream=0x20)" {
		t.Errorf("Op.String = %q", got)
	}
}

// TestWithDevice: binding a device goes through the real CUDA driver
// library; on a machine without a GPU it fails with a clear error before
// NCCL sees anything.
func TestWithDevice(t *testing.T) {
	l := open(t)
	if _, err := l.InitRank(t.Context(), 1, ncclmock.ID(ncclmock.ModeOK), 0, nccl.WithDevice(-1)); err == nil {
		t.Error("WithDevice(-1) accepted")
	}
	c, err := l.InitRank(t.Context(), 1, ncclmock.ID(ncclmock.ModeOK), 0, nccl.WithDevice(0))
	if err == nil {
		c.Destroy(t.Context())
		t.Skip("this machine has CUDA device 0: the failure path is not reachable here")
	}
	var ce *nccl.CUDAError
	switch {
	case errors.As(err, &ce):
		if ce.Func != "cuInit" && ce.Func != "cuDeviceGet" || ce.Device != 0 || ce.Code == 0 {
			t.Errorf("got %+v", ce)
		}
		t.Logf("as expected without a GPU: %v", err)
	case strings.Contains(err.Error(), nccl.CUDADriverName):
		t.Logf("as expected without a CUDA driver: %v", err)
	default:
		t.Errorf("got %v, want a *CUDAError or a missing %s", err, nccl.CUDADriverName)
	}
}

// BenchmarkRun measures what one Run costs on top of the NCCL call: a
// one-element AllReduce on a one-rank mock world (the mock's own work is a
// few hundred nanoseconds), so ns/op is mostly the binding's supervision
// (a goroutine on a locked thread, a timer, an async-error poll).
func BenchmarkRun(b *testing.B) {
	if buildErr != nil {
		b.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	l, err := nccl.Open(nccl.WithPath(mockPath))
	if err != nil {
		b.Fatal(err)
	}
	c, err := l.InitRank(b.Context(), 1, ncclmock.ID(ncclmock.ModeOK), 0)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Destroy(context.Background())
	buf, err := ncclmock.Alloc(4)
	if err != nil {
		b.Fatal(err)
	}
	defer buf.Free()
	op := nccl.AllReduce(buf.Ptr(), buf.Ptr(), 1, nccl.Float32, nccl.Sum, 0)
	b.Run("Run", func(b *testing.B) {
		for b.Loop() {
			if err := c.Run(b.Context(), op); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("Wait", func(b *testing.B) {
		for b.Loop() {
			if err := c.Wait(b.Context(), func() (bool, error) { return true, nil }); err != nil {
				b.Fatal(err)
			}
		}
	})
}
