//go:build mpi && cgo

package mpi

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/commtest"
	"github.com/gradcomp/gradcomp/internal/mpilaunch"
)

func TestConformance(t *testing.T) {
	body := func(ctx context.Context, t *testing.T, c *Comm) {
		if c.Size() != np {
			t.Fatalf("Size() = %d, want %d", c.Size(), np)
		}
		if err := commtest.Run(ctx, c, commtest.Options{}); err != nil {
			t.Fatal(err)
		}
		if err := commtest.RunStarted(ctx, c, commtest.Options{}); err != nil {
			t.Fatal(err)
		}
	}
	t.Run("checked", func(t *testing.T) { onRanks(t, body) })
	t.Run("unchecked", func(t *testing.T) { onRanks(t, body, WithArgCheck(false)) })
}

// TestUnchecked: the view without argument checks passes the conformance
// suites (Run, and RunStarted: it is a comm.Starter too) on the checked
// communicator's handle, and shares its state: once the view is closed,
// the checked Comm is closed too.
func TestUnchecked(t *testing.T) {
	onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
		u := c.Unchecked()
		if err := commtest.Run(ctx, u, commtest.Options{}); err != nil {
			t.Fatal(err)
		}
		s, ok := u.(comm.Starter)
		if !ok {
			t.Fatalf("Unchecked() is a %T, not a comm.Starter", u)
		}
		if err := commtest.RunStarted(ctx, s, commtest.Options{}); err != nil {
			t.Fatal(err)
		}
		if err := c.Barrier(ctx); err != nil { // the checked one still works
			t.Fatal(err)
		}
		if err := u.Close(); err != nil {
			t.Fatal(err)
		}
		if err := c.Barrier(ctx); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("checked Comm after the view's Close: got %v, want ErrClosed", err)
		}
	})
}

func TestThreadLevel(t *testing.T) {
	onRanks(t, func(_ context.Context, t *testing.T, c *Comm) {
		if got := c.ThreadLevel(); got != "MPI_THREAD_MULTIPLE" {
			t.Errorf("ThreadLevel() = %q, want MPI_THREAD_MULTIPLE (Debian's Open MPI provides it)", got)
		}
	})
}

// TestConcurrentComms drives two communicators from two goroutines at once.
func TestConcurrentComms(t *testing.T) {
	onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
		d, err := c.Dup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		errs := make(chan error, 2)
		for i, x := range []*Comm{c, d} {
			go func() {
				for k := range 50 {
					buf := []float32{float32(x.Rank() + i + k)}
					if err := x.AllReduce(ctx, buf); err != nil {
						errs <- err
						return
					}
					if want := float32(np*(np-1)/2 + np*(i+k)); buf[0] != want {
						errs <- fmt.Errorf("comm %d, round %d: sum %v, want %v", i, k, buf[0], want)
						return
					}
				}
				errs <- nil
			}()
		}
		for range 2 {
			if err := <-errs; err != nil {
				t.Error(err)
			}
		}
	})
}

// TestMismatch: disagreements and invalid arguments give every rank the same
// error, and the communicator stays usable.
func TestMismatch(t *testing.T) {
	onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
		l := 12
		if c.Rank() == 2 {
			l = 10
		}
		err := c.AllReduce(ctx, make([]float32, l))
		const want = "comm: AllReduce: ranks disagree on len(buf): rank 0 passed 12, rank 2 passed 10"
		if _, ok := err.(*comm.MismatchError); !ok || err.Error() != want {
			t.Errorf("length: got %v, want *MismatchError %q", err, want)
		}

		dst := make([]byte, 12)
		if c.Rank() == 1 {
			dst = dst[:11]
		}
		err = c.AllGather(ctx, dst, make([]byte, 3))
		const wantArg = "comm: AllGather: invalid argument on rank 1: len(dst) = 11, want Size() × len(src) = 4 × 3 = 12"
		if a, ok := err.(*comm.ArgumentError); !ok || a.Rank != 1 || err.Error() != wantArg {
			t.Errorf("argument: got %v, want *ArgumentError %q", err, wantArg)
		}

		if c.Rank() == 3 {
			err = c.Barrier(ctx)
		} else {
			err = c.Broadcast(ctx, make([]byte, 4), 0)
		}
		const wantOp = "comm: Broadcast: ranks disagree on operation: rank 0 passed Broadcast, rank 3 passed Barrier"
		if err == nil || err.Error() != wantOp {
			t.Errorf("operation: got %v, want %q", err, wantOp)
		}

		buf := []float32{1}
		if err := c.AllReduce(ctx, buf); err != nil || buf[0] != np {
			t.Errorf("after the errors: %v, sum %v, want %d", err, buf[0], np)
		}
	})
}

// TestDeadline: rank 3 skips a collective; the others get a deadline error
// within the deadline and a poisoned communicator. Rank 3 then makes a call
// that matches what the others left outstanding, so Close drains it and the
// job ends cleanly.
func TestDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	cases := []struct {
		name string
		opts []Option
		// late is rank 3's call, matching the others' abandoned request:
		// with the argument check, that request is the header exchange.
		late func(ctx context.Context, t *testing.T, c *Comm)
	}{
		{"checked", nil, func(ctx context.Context, t *testing.T, c *Comm) {
			err := c.Barrier(ctx)
			if _, ok := err.(*comm.MismatchError); !ok || !strings.Contains(err.Error(), "rank 0 passed AllReduce, rank 3 passed Barrier") {
				t.Errorf("rank 3's late Barrier: got %v, want a mismatch with the others' AllReduce", err)
			}
		}},
		{"unchecked", []Option{WithArgCheck(false)}, func(ctx context.Context, t *testing.T, c *Comm) {
			buf := []float32{1}
			if err := c.AllReduce(ctx, buf); err != nil || buf[0] != np {
				t.Errorf("rank 3's late AllReduce: %v, sum %v, want %d", err, buf[0], np)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
				if c.Rank() != 3 {
					start := time.Now() // before the deadline is set, so took ≥ deadline
					short, cancel := context.WithTimeout(ctx, deadline)
					err := c.AllReduce(short, []float32{1})
					took := time.Since(start)
					cancel()
					var inc *comm.IncompleteError
					if !errors.As(err, &inc) || inc.Op != comm.OpAllReduce || inc.Rank != c.Rank() || !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("got %v, want *IncompleteError of AllReduce wrapping DeadlineExceeded", err)
					}
					if took < deadline || took > deadline+time.Second {
						t.Errorf("returned after %v, want just after the %v deadline", took, deadline)
					}
					err = c.Barrier(ctx)
					var p *comm.PoisonedError
					if !errors.As(err, &p) || p.Cause != inc {
						t.Errorf("call after the timeout: got %v, want *PoisonedError wrapping %v", err, inc)
					}
				}
				if err := world.Barrier(ctx); err != nil {
					t.Fatal(err)
				}
				if c.Rank() == 3 {
					tc.late(ctx, t, c)
				}
			}, tc.opts...)
		})
	}
}

// TestCloseInFlight: Close abandons a call in flight on another goroutine;
// once the other ranks make the matching call, Close completes it.
func TestCloseInFlight(t *testing.T) {
	onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
		d, err := c.Dup(ctx, WithArgCheck(false), WithDrainTimeout(10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		if c.Rank() == 0 {
			pending := make(chan error)
			go func() { pending <- d.Barrier(ctx) }()
			for inFlight := false; !inFlight; {
				select {
				case <-d.h.guard.Idle():
					time.Sleep(time.Millisecond)
				default:
					inFlight = true
				}
			}
			closed := make(chan error)
			go func() { closed <- d.Close() }()
			err := <-pending
			var ce *comm.ClosedError
			if !errors.Is(err, comm.ErrClosed) || !errors.As(err, &ce) || ce.Rank != 0 {
				t.Errorf("Barrier in flight: got %v, want it abandoned by Close", err)
			}
			if err := world.Barrier(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-closed; err != nil {
				t.Errorf("Close: %v", err)
			}
			if err := d.Barrier(ctx); !errors.Is(err, comm.ErrClosed) {
				t.Errorf("after Close: got %v, want ErrClosed", err)
			}
			return
		}
		if err := world.Barrier(ctx); err != nil {
			t.Fatal(err)
		}
		if err := d.Barrier(ctx); err != nil {
			t.Errorf("Barrier matching rank 0's abandoned one: %v", err)
		}
		if err := d.Close(); err != nil {
			t.Error(err)
		}
	})
}

// scenarioEnv names the scenario a rank job runs for a test that starts its
// own job.
const scenarioEnv = "GRADCOMP_MPI_SCENARIO"

// ownJob runs test t in a job of its own: the launcher starts mpirun with
// the scenario named after t and returns the finished job; a rank of that
// job runs body on the world communicator and returns nil. In any other
// job it skips t.
func ownJob(t *testing.T, body func(ctx context.Context, c *Comm)) *mpilaunch.Job {
	t.Helper()
	if world == nil {
		return mpilaunch.Run(t, np, []string{scenarioEnv + "=" + t.Name()}, "-test.v=true", "-test.run=^"+t.Name()+"$")
	}
	if os.Getenv(scenarioEnv) != t.Name() {
		t.Skip("runs in a job of its own, started by the launcher")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	body(ctx, world)
	return nil
}

// TestJobEnds: a rank that exits or aborts while the others wait in a
// collective (with a 60-second deadline) ends the job promptly with the
// rank's exit code, and the output names the rank. For an exit, mpirun names
// it; for Abort, the line Abort writes does (mpirun's own "MPI_ABORT was
// invoked on rank 2" is lost in about one run in five: Open MPI 4.1.4 then
// logs "ORTE_ERROR_LOG: Data unpack would read past end of buffer" instead).
func TestJobEnds(t *testing.T) {
	cases := []struct {
		name  string
		leave func(c *Comm)
		code  int      // mpirun's exit code
		want  []string // regular expressions mpirun's output must match
	}{
		{"exit", func(*Comm) { os.Exit(3) }, 3, []string{`Process name: \[\[\d+,\d+\],2\]\s+Exit code:\s+3`}},
		{"abort", func(c *Comm) { c.Abort(7) }, 7, []string{`\[1,2\]<stderr>:comm/mpi: rank 2 of 4 aborts the job with code 7`}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			j := ownJob(t, func(ctx context.Context, c *Comm) {
				if c.Rank() == 2 {
					time.Sleep(100 * time.Millisecond) // let the others enter the AllReduce
					tc.leave(c)
				}
				err := c.AllReduce(ctx, make([]float32, 1<<10))
				t.Errorf("rank %d: AllReduce returned %v; want the job killed first", c.Rank(), err)
			})
			if j == nil {
				return // a rank: the launcher checks the outcome
			}
			var exit *exec.ExitError
			if !errors.As(j.Err, &exit) || exit.ExitCode() != tc.code {
				t.Errorf("%s: %v, want exit code %d", j.Cmd, j.Err, tc.code)
			}
			if j.Took > 20*time.Second {
				t.Errorf("the job took %v, want it ended well before the 60 s deadline", j.Took)
			}
			for _, re := range tc.want {
				if !regexp.MustCompile(re).Match(j.Out) {
					t.Errorf("mpirun's output does not match %q:\n%s", re, mpilaunch.Tail(j.Out, 40))
				}
			}
			t.Logf("%s: %v after %v", j.Cmd, j.Err, j.Took.Round(time.Millisecond))
		})
	}
}

// BenchmarkAllReduce measures AllReduce with and without the argument check
// (SetBytes: one rank's buffer). It runs only as ranks of a job started by
// hand, with a fixed iteration count so every rank makes the same calls:
//
//	go test -c -tags mpi ./comm/mpi
//	mpirun --allow-run-as-root --oversubscribe -np 4 ./mpi.test -test.run '^$' -test.bench . -test.benchtime 2000x
func BenchmarkAllReduce(b *testing.B) {
	if world == nil {
		b.Skip("run the test binary under mpirun (see the doc comment)")
	}
	if bt := flag.Lookup("test.benchtime").Value.String(); !strings.HasSuffix(bt, "x") {
		b.Skipf("-test.benchtime=%s: use a fixed count (e.g. 2000x) so every rank runs the same iterations", bt)
	}
	for _, l := range []int{1, 1 << 10, 1 << 18} {
		for _, checked := range []bool{true, false} {
			b.Run(fmt.Sprintf("%dB/check=%v", 4*l, checked), func(b *testing.B) {
				ctx := context.Background()
				c, err := world.Dup(ctx, WithArgCheck(checked))
				if err != nil {
					b.Fatal(err)
				}
				defer c.Close()
				buf := make([]float32, l)
				b.SetBytes(int64(4 * l))
				b.ResetTimer()
				for range b.N {
					if err := c.AllReduce(ctx, buf); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}

// TestTopology: in the shared job, on one machine, every rank is on node 0
// of 1, its local rank its rank; a Dup keeps it.
func TestTopology(t *testing.T) {
	onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
		want := comm.Topology{Node: 0, Nodes: 1, LocalRank: c.Rank(), LocalSize: np}
		if got := c.Topology(); got != want {
			t.Errorf("rank %d: Topology %+v, want %+v", c.Rank(), got, want)
		}
	})
}

// topologyEnvRan is the line every rank of TestTopologyEnv's job prints at
// the end of its body, so the launcher knows the bodies ran.
const topologyEnvRan = "topology-env body ran on rank"

// TestTopologyEnv: with RanksPerNodeEnv=2, the 4 ranks are 2 nodes of 2,
// and Split passes commtest.RunSplit (MPI_Comm_split's comms hold the
// right ranks, conform, and are independent of the world).
func TestTopologyEnv(t *testing.T) {
	if world == nil {
		j := mpilaunch.Run(t, np, []string{scenarioEnv + "=" + t.Name(), RanksPerNodeEnv + "=2"}, "-test.v=true", "-test.run=^"+t.Name()+"$")
		if j.Err != nil {
			t.Errorf("%s: %v\n%s", j.Cmd, j.Err, j.Out)
		}
		for r := range np {
			if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[\d+,%d\]<stdout>:%s %d$`, r, topologyEnvRan, r)).Match(j.Out) {
				t.Errorf("rank %d did not report that the test body ran:\n%s", r, mpilaunch.Tail(j.Out, 40))
			}
		}
		return
	}
	if os.Getenv(scenarioEnv) != t.Name() {
		t.Skip("runs in a job of its own, started by the launcher")
	}
	r := world.Rank()
	want := comm.Topology{Node: r / 2, Nodes: 2, LocalRank: r % 2, LocalSize: 2}
	if got := world.Topology(); got != want {
		t.Errorf("rank %d: Topology %+v, want %+v", r, got, want)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := commtest.RunSplit(ctx, world, commtest.Options{}); err != nil {
		t.Errorf("rank %d: %v", r, err)
	}
	fmt.Println(topologyEnvRan, r)
}

// TestSplit: on one machine (the shared job: one node of 4 ranks), Split
// passes commtest.RunSplit, with and without the argument check.
func TestSplit(t *testing.T) {
	body := func(ctx context.Context, t *testing.T, c *Comm) {
		if err := commtest.RunSplit(ctx, c, commtest.Options{}); err != nil {
			t.Errorf("rank %d: %v", c.Rank(), err)
		}
	}
	t.Run("checked", func(t *testing.T) { onRanks(t, body) })
	t.Run("unchecked", func(t *testing.T) { onRanks(t, body, WithArgCheck(false)) })
}

// TestSplitDeadline: rank 3 skips a Split; the others' Split returns within
// the deadline an error naming Split and the rank that wraps the Barrier's
// *comm.IncompleteError, and the parent is poisoned. Rank 3 then makes the
// call matching the request the others left outstanding, so Close drains
// it: with the argument check, that request is the Barrier's header
// exchange, which rank 3's AllReduce meets with a mismatch.
func TestSplitDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	cases := []struct {
		name string
		opts []Option
		late func(ctx context.Context, t *testing.T, c *Comm)
	}{
		{"checked", nil, func(ctx context.Context, t *testing.T, c *Comm) {
			err := c.AllReduce(ctx, []float32{1})
			if _, ok := err.(*comm.MismatchError); !ok || !strings.Contains(err.Error(), "rank 0 passed Barrier, rank 3 passed AllReduce") {
				t.Errorf("rank 3's late AllReduce: got %v, want a mismatch with the others' Barrier", err)
			}
		}},
		{"unchecked", []Option{WithArgCheck(false)}, func(ctx context.Context, t *testing.T, c *Comm) {
			if err := c.Barrier(ctx); err != nil {
				t.Errorf("rank 3's late Barrier: %v", err)
			}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
				if c.Rank() != 3 {
					start := time.Now()
					short, cancel := context.WithTimeout(ctx, deadline)
					node, cross, err := c.Split(short)
					took := time.Since(start)
					cancel()
					var inc *comm.IncompleteError
					if node != nil || cross != nil || !errors.As(err, &inc) || inc.Op != comm.OpBarrier || !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("got %v, %v, %v; want nil comms and an *IncompleteError of the Barrier wrapping DeadlineExceeded", node, cross, err)
					}
					if want := fmt.Sprintf("comm/mpi: Split on rank %d: ", c.Rank()); err == nil || !strings.HasPrefix(err.Error(), want) {
						t.Errorf("got %v, want it prefixed %q", err, want)
					}
					if took < deadline || took > deadline+time.Second {
						t.Errorf("returned after %v, want just after the %v deadline", took, deadline)
					}
					var p *comm.PoisonedError
					if err := c.Barrier(ctx); !errors.As(err, &p) || p.Cause != inc {
						t.Errorf("call after the failed Split: got %v, want *PoisonedError wrapping %v", err, inc)
					}
				}
				if err := world.Barrier(ctx); err != nil {
					t.Fatal(err)
				}
				if c.Rank() == 3 {
					tc.late(ctx, t, c)
				}
			}, tc.opts...)
		})
	}
}

// TestTopologyEnvRefused: with RanksPerNodeEnv=3, which does not divide the
// 4 ranks, Init fails (after freeing the communicator it made) with an
// error naming the variable and the rank, and the job fails. mpirun ends
// the job when the first rank exits, so only that rank's line is sure to
// be printed.
func TestTopologyEnvRefused(t *testing.T) {
	if world != nil {
		t.Skip("the launcher runs this test's job, whose ranks fail in Init")
	}
	j := mpilaunch.Run(t, np, []string{RanksPerNodeEnv + "=3"}, "-test.run=^$")
	if j.Err == nil {
		t.Errorf("%s succeeded, want the ranks to fail in Init", j.Cmd)
	}
	re := regexp.MustCompile(fmt.Sprintf(`(?m)^\[\d+,(\d+)\]<stderr>:comm/mpi: Init on rank (\d+): %s="3": want a positive integer dividing the world size %d$`, RanksPerNodeEnv, np))
	lines := re.FindAllSubmatch(j.Out, -1)
	if len(lines) == 0 {
		t.Errorf("mpirun's output does not match %q:\n%s", re, mpilaunch.Tail(j.Out, 40))
	}
	for _, m := range lines {
		if string(m[1]) != string(m[2]) {
			t.Errorf("rank %s printed the error of rank %s: %s", m[1], m[2], m[0])
		}
	}
}

// outstanding returns how many requests c has issued and not yet settled.
func outstanding(c *Comm) int {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	return len(c.h.outstanding)
}

// waited is the result of a Wait or call made on another goroutine, and
// when it returned.
type waited struct {
	err error
	at  time.Time
}

// TestStartedDeadline: with several collectives outstanding, a rank that
// gives up on one (a Wait, or a checked start, whose ctx ends first) gets
// its *comm.IncompleteError within the deadline, and every other
// collective it had outstanding fails with a *comm.PoisonedError wrapping
// that error: at once for a Wait made afterwards, promptly for a Wait and
// a blocking call already waiting on other goroutines. Nothing hangs. Rank
// 3 then makes the calls matching what the others left outstanding, so
// their Close drains them and the job ends cleanly.
func TestStartedDeadline(t *testing.T) {
	const deadline = 300 * time.Millisecond
	// poisoned checks that err is a *comm.PoisonedError of op wrapping
	// cause and that it came within a second of the failure at failedAt.
	poisoned := func(t *testing.T, what string, w waited, op comm.Op, cause error, failedAt time.Time) {
		t.Helper()
		var p *comm.PoisonedError
		if !errors.As(w.err, &p) || p.Op != op || p.Cause != cause {
			t.Errorf("%s: got %v, want a *PoisonedError of %v wrapping %v", what, w.err, op, cause)
		}
		if late := w.at.Sub(failedAt); late > time.Second {
			t.Errorf("%s returned %v after the failure, want at once", what, late)
		}
	}
	incomplete := func(t *testing.T, what string, err error, op comm.Op, rank int, took time.Duration) *comm.IncompleteError {
		t.Helper()
		var inc *comm.IncompleteError
		if !errors.As(err, &inc) || inc.Op != op || inc.Rank != rank || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: got %v, want *IncompleteError of %v wrapping DeadlineExceeded", what, err, op)
		}
		if took < deadline || took > deadline+time.Second {
			t.Errorf("%s returned after %v, want just after the %v deadline", what, took, deadline)
		}
		return inc
	}

	// Unchecked: every rank starts A; the others start B, C, D and call E
	// (a blocking AllReduce on another goroutine), which rank 3 does not
	// make yet. They wait for A, wait for B on another goroutine, and give
	// up on C after the deadline.
	t.Run("wait", func(t *testing.T) {
		onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
			n, r := c.Size(), c.Rank()
			a := []float32{1}
			qa, err := c.StartAllReduce(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			gsrc, gdst := []byte{byte(r)}, make([]byte, n)
			cbuf := []float32{2}
			asrc, adst := make([]byte, n), make([]byte, n)
			for j := range asrc {
				asrc[j] = byte(r*n + j)
			}
			ebuf := []float32{3}
			startBCD := func() (qb, qc, qd comm.Request) {
				var err error
				if qb, err = c.StartAllGather(ctx, gdst, gsrc); err != nil {
					t.Fatal(err)
				}
				if qc, err = c.StartAllReduce(ctx, cbuf); err != nil {
					t.Fatal(err)
				}
				if qd, err = c.StartAllToAll(ctx, adst, asrc); err != nil {
					t.Fatal(err)
				}
				return qb, qc, qd
			}
			if r == 3 {
				if err := qa.Wait(ctx); err != nil || a[0] != float32(n) {
					t.Errorf("A: %v, sum %v, want %d", err, a[0], n)
				}
				if err := world.Barrier(ctx); err != nil {
					t.Fatal(err)
				}
				// The late calls matching the others' B, C, D and E.
				qb, qc, qd := startBCD()
				if err := c.AllReduce(ctx, ebuf); err != nil || ebuf[0] != float32(3*n) {
					t.Errorf("late E: %v, sum %v, want %d", err, ebuf[0], 3*n)
				}
				for i, q := range []comm.Request{qd, qb, qc} {
					if err := q.Wait(ctx); err != nil {
						t.Errorf("late wait %d: %v", i, err)
					}
				}
				for q := range n {
					if gdst[q] != byte(q) || adst[q] != byte(q*n+r) {
						t.Errorf("late B, D: all-gather %v, all-to-all %v", gdst, adst)
						break
					}
				}
				if cbuf[0] != float32(2*n) {
					t.Errorf("late C: sum %v, want %d", cbuf[0], 2*n)
				}
				return
			}
			qb, qc, qd := startBCD()
			eDone := make(chan waited, 1)
			go func() {
				err := c.AllReduce(ctx, ebuf)
				eDone <- waited{err, time.Now()}
			}()
			for outstanding(c) < 5 { // A, B, C, D and E issued
				time.Sleep(time.Millisecond)
			}
			if err := qa.Wait(ctx); err != nil || a[0] != float32(n) {
				t.Errorf("A: %v, sum %v, want %d", err, a[0], n)
			}
			bDone := make(chan waited, 1)
			go func() {
				err := qb.Wait(ctx)
				bDone <- waited{err, time.Now()}
			}()

			start := time.Now()
			short, cancel := context.WithTimeout(ctx, deadline)
			err = qc.Wait(short)
			failedAt := time.Now()
			cancel()
			inc := incomplete(t, "Wait for C", err, comm.OpAllReduce, r, failedAt.Sub(start))

			b := <-bDone
			poisoned(t, "Wait for B, waiting meanwhile", b, comm.OpAllGather, inc, failedAt)
			poisoned(t, "blocking E, in flight meanwhile", <-eDone, comm.OpAllReduce, inc, failedAt)
			err = qd.Wait(ctx)
			poisoned(t, "Wait for D", waited{err, time.Now()}, comm.OpAllToAll, inc, failedAt)
			if err := qc.Wait(ctx); err != inc {
				t.Errorf("second Wait for C: got %v, want the first's %v", err, inc)
			}
			if err := qb.Wait(ctx); err != b.err {
				t.Errorf("second Wait for B: got %v, want the first's %v", err, b.err)
			}
			err = c.Barrier(ctx)
			poisoned(t, "Barrier after the failure", waited{err, time.Now()}, comm.OpBarrier, inc, failedAt)
			q, err := c.StartAllReduce(ctx, []float32{1})
			if q != nil {
				t.Errorf("start after the failure returned a request")
			}
			poisoned(t, "start after the failure", waited{err, time.Now()}, comm.OpAllReduce, inc, failedAt)
			if err := world.Barrier(ctx); err != nil {
				t.Fatal(err)
			}
			// Close (onRanks) drains B, C, D and E once rank 3 has made them.
		}, WithArgCheck(false))
	})

	// Checked: every rank starts A and B; the others then start C with a
	// short ctx, whose header exchange rank 3 does not join yet.
	t.Run("start", func(t *testing.T) {
		onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
			n, r := c.Size(), c.Rank()
			a := []float32{1}
			qa, err := c.StartAllReduce(ctx, a)
			if err != nil {
				t.Fatal(err)
			}
			gdst := make([]byte, n)
			qb, err := c.StartAllGather(ctx, gdst, []byte{byte(r)})
			if err != nil {
				t.Fatal(err)
			}
			if r == 3 {
				if err := qa.Wait(ctx); err != nil || a[0] != float32(n) {
					t.Errorf("A: %v, sum %v, want %d", err, a[0], n)
				}
				if err := qb.Wait(ctx); err != nil || gdst[n-1] != byte(n-1) {
					t.Errorf("B: %v, all-gather %v", err, gdst)
				}
				if err := world.Barrier(ctx); err != nil {
					t.Fatal(err)
				}
				// The others left C's header exchange outstanding; a
				// Barrier meets it with a mismatch and moves no data.
				err := c.Barrier(ctx)
				if _, ok := err.(*comm.MismatchError); !ok || !strings.Contains(err.Error(), "rank 0 passed AllReduce, rank 3 passed Barrier") {
					t.Errorf("rank 3's late Barrier: got %v, want a mismatch with the others' AllReduce", err)
				}
				return
			}
			start := time.Now()
			short, cancel := context.WithTimeout(ctx, deadline)
			qc, err := c.StartAllReduce(short, []float32{2})
			failedAt := time.Now()
			cancel()
			if qc != nil {
				t.Errorf("the failed start returned a request")
			}
			inc := incomplete(t, "start of C", err, comm.OpAllReduce, r, failedAt.Sub(start))
			err = qb.Wait(ctx)
			poisoned(t, "Wait for B", waited{err, time.Now()}, comm.OpAllGather, inc, failedAt)
			err = qa.Wait(ctx)
			poisoned(t, "Wait for A", waited{err, time.Now()}, comm.OpAllReduce, inc, failedAt)
			err = c.Unchecked().Barrier(ctx)
			poisoned(t, "Barrier of the unchecked view after the failure", waited{err, time.Now()}, comm.OpBarrier, inc, failedAt)
			if err := world.Barrier(ctx); err != nil {
				t.Fatal(err)
			}
		})
	})
}

// TestCloseStarted: Close with started collectives not waited for fails
// them (their Wait returns a *comm.PoisonedError wrapping the
// *comm.ClosedError, at once) and, every rank having started them, drains
// them and frees the communicator.
func TestCloseStarted(t *testing.T) {
	body := func(ctx context.Context, t *testing.T, c *Comm) {
		qa, err := c.StartAllReduce(ctx, []float32{1})
		if err != nil {
			t.Fatal(err)
		}
		qb, err := c.StartAllGather(ctx, make([]byte, c.Size()), []byte{1})
		if err != nil {
			t.Fatal(err)
		}
		if err := c.Close(); err != nil {
			t.Errorf("Close: %v", err)
		}
		for _, q := range []comm.Request{qa, qb} {
			start := time.Now()
			err := q.Wait(ctx)
			var ce *comm.ClosedError
			if !errors.Is(err, comm.ErrClosed) || !errors.As(err, &ce) || ce.Rank != c.Rank() {
				t.Errorf("Wait after Close: got %v, want a *PoisonedError wrapping this rank's *ClosedError", err)
			}
			if took := time.Since(start); took > time.Second {
				t.Errorf("Wait after Close took %v, want at once", took)
			}
		}
		if _, err := c.StartAllReduce(ctx, nil); !errors.Is(err, comm.ErrClosed) {
			t.Errorf("start after Close: got %v, want ErrClosed", err)
		}
	}
	t.Run("checked", func(t *testing.T) { onRanks(t, body) })
	t.Run("unchecked", func(t *testing.T) { onRanks(t, body, WithArgCheck(false)) })
}

// TestStartBusy: a start made while a blocking call is in flight returns a
// *comm.BusyError naming that call and starts nothing.
func TestStartBusy(t *testing.T) {
	onRanks(t, func(ctx context.Context, t *testing.T, c *Comm) {
		if c.Rank() == 0 {
			pending := make(chan error, 1)
			go func() { pending <- c.Barrier(ctx) }()
			for outstanding(c) == 0 { // the Barrier's header exchange is issued
				time.Sleep(time.Millisecond)
			}
			q, err := c.StartAllReduce(ctx, []float32{1})
			var busy *comm.BusyError
			if q != nil || !errors.As(err, &busy) || busy.Op != comm.OpAllReduce || busy.Pending != comm.OpBarrier || busy.Started != 0 {
				t.Errorf("start during a Barrier: got %v, %v; want a *BusyError naming the Barrier", q, err)
			}
			if err := world.Barrier(ctx); err != nil {
				t.Fatal(err)
			}
			if err := <-pending; err != nil {
				t.Errorf("Barrier: %v", err)
			}
		} else {
			if err := world.Barrier(ctx); err != nil {
				t.Fatal(err)
			}
			if err := c.Barrier(ctx); err != nil {
				t.Errorf("Barrier: %v", err)
			}
		}
		buf := []float32{1}
		q, err := c.StartAllReduce(ctx, buf)
		if err != nil {
			t.Fatal(err)
		}
		if err := q.Wait(ctx); err != nil || buf[0] != float32(c.Size()) {
			t.Errorf("start after the Barrier: %v, sum %v", err, buf[0])
		}
	})
}

// serializedRan is the line every rank of TestSerialized's job prints at
// the end of its body.
const serializedRan = "serialized body ran on rank"

// TestSerialized runs the conformance suites with every MPI call
// serialized by the process-wide mutex, as Init does when MPI provides
// only MPI_THREAD_SERIALIZED (Debian's Open MPI provides
// MPI_THREAD_MULTIPLE, so the job turns serialization on by hand): the
// locking of several collectives in flight neither deadlocks nor races.
func TestSerialized(t *testing.T) {
	j := ownJob(t, func(ctx context.Context, w *Comm) {
		serial = true // before any goroutine of this job's collectives starts
		if got, want := w.ThreadLevel(), "MPI_THREAD_SERIALIZED (calls serialized by a process-wide mutex)"; got != want {
			t.Errorf("ThreadLevel() = %q, want %q", got, want)
		}
		c, err := w.Dup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		for _, s := range []comm.Starter{c, c.Unchecked().(comm.Starter)} {
			if err := commtest.Run(ctx, s, commtest.Options{}); err != nil {
				t.Fatal(err)
			}
			if err := commtest.RunStarted(ctx, s, commtest.Options{}); err != nil {
				t.Fatal(err)
			}
		}
		fmt.Println(serializedRan, w.Rank())
	})
	if j == nil {
		return
	}
	if j.Err != nil {
		t.Errorf("%s: %v\n%s", j.Cmd, j.Err, mpilaunch.Tail(j.Out, 60))
	}
	for r := range np {
		if !regexp.MustCompile(fmt.Sprintf(`(?m)^\[\d+,%d\]<stdout>:%s %d$`, r, serializedRan, r)).Match(j.Out) {
			t.Errorf("rank %d did not report that the test body ran:\n%s", r, mpilaunch.Tail(j.Out, 40))
		}
	}
}
