//go:build mpi && cgo

package mpi

// The test binary runs in two roles. Started by `go test`, it is the
// launcher: TestMain finds no OMPI_COMM_WORLD_RANK, and each test reports
// what the ranks of one shared mpirun job (started on first use) said about
// it. Started by mpirun, it is a rank: TestMain initializes MPI and the tests
// run their bodies.

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// np is the number of ranks of every test job.
const np = 4

// world is this rank's world communicator; nil in the launcher.
var world *Comm

func TestMain(m *testing.M) {
	flag.Parse()
	if os.Getenv("OMPI_COMM_WORLD_RANK") == "" {
		code := m.Run()
		if j := shared.job; j != nil && j.err != nil && code == 0 {
			fmt.Fprintf(os.Stderr, "mpirun failed after every test passed: %v\n%s", j.err, j.out)
			code = 1
		}
		os.Exit(code)
	}
	c, err := Init()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	world = c
	code := m.Run()
	if err := c.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	os.Exit(code)
}

// onRanks runs body on every rank with a fresh Dup of the world made with
// opts (closed afterwards) and a 20-second context. In the launcher it
// reports the ranks' results for this test from the shared job instead.
func onRanks(t *testing.T, body func(ctx context.Context, t *testing.T, c *Comm), opts ...Option) {
	t.Helper()
	if world == nil {
		sharedJob(t).report(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := world.Dup(ctx, opts...)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := c.Close(); err != nil {
			t.Error(err)
		}
	}()
	body(ctx, t, c)
}

// job is one finished mpirun run of the test binary.
type job struct {
	cmd   string        // the command line, for messages
	out   []byte        // mpirun's combined output
	err   error         // mpirun's exit status
	took  time.Duration // wall time
	ranks [np]rankLog   // the output of each rank, by test
}

// rankLog maps a top-level test name to its result line ("PASS", "FAIL",
// "SKIP") and the lines it printed.
type rankLog map[string]*testLog

type testLog struct {
	name   string
	result string
	lines  []string
	done   bool // a sibling started: later lines are not this test's
}

var shared struct {
	once sync.Once
	job  *job
	skip string // why no job could run
}

// sharedJob runs every test selected by this process's -test.run and
// -test.skip on np ranks, once, or skips t when mpirun is missing.
func sharedJob(t *testing.T) *job {
	t.Helper()
	shared.once.Do(func() {
		if _, err := exec.LookPath("mpirun"); err != nil {
			shared.skip = "mpirun not found (install openmpi-bin): " + err.Error()
			return
		}
		args := []string{"-test.v=true", "-test.short=" + flag.Lookup("test.short").Value.String()}
		for _, name := range []string{"test.run", "test.skip", "test.timeout"} {
			if v := flag.Lookup(name).Value.String(); v != "" {
				args = append(args, "-"+name+"="+v)
			}
		}
		shared.job = runJob(t, nil, args...)
		t.Logf("ran %s: %v after %v", shared.job.cmd, shared.job.err, shared.job.took.Round(time.Millisecond))
	})
	if shared.skip != "" {
		t.Skip(shared.skip)
	}
	return shared.job
}

// runJob runs this test binary under mpirun on np ranks with the given test
// flags and extra environment (NAME=VALUE, exported to every rank), and
// parses the tagged output.
func runJob(t *testing.T, env []string, testArgs ...string) *job {
	t.Helper()
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	args := []string{"--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", fmt.Sprint(np)}
	for _, kv := range env {
		args = append(args, "-x", kv)
	}
	args = append(append(args, bin), testArgs...)
	cmd := exec.Command("mpirun", args...)
	cmd.Env = append(os.Environ(), env...)
	j := &job{cmd: "mpirun " + strings.Join(args, " ")}
	start := time.Now()
	j.out, j.err = cmd.CombinedOutput()
	j.took = time.Since(start)
	j.parse()
	return j
}

var (
	tagged   = regexp.MustCompile(`^\[\d+,(\d+)\]<std(?:out|err)>:(.*)$`)
	started  = regexp.MustCompile(`^=== RUN   (\S+)$`)
	finished = regexp.MustCompile(`^\s*--- (PASS|FAIL|SKIP): (\S+) \(`)
)

// parse splits the tagged output by rank and by test. A line belongs to
// every test running when it was printed, up to the start of a test that is
// not its subtest (go test -v prints subtests' results with their parent's).
func (j *job) parse() {
	var running [np][]*testLog
	for i := range j.ranks {
		j.ranks[i] = rankLog{}
	}
	for _, line := range strings.Split(string(j.out), "\n") {
		m := tagged.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		var r int
		if _, err := fmt.Sscan(m[1], &r); err != nil || r >= np {
			continue
		}
		text := m[2]
		if s := started.FindStringSubmatch(text); s != nil {
			for _, tl := range running[r] {
				tl.done = tl.done || !strings.HasPrefix(s[1], tl.name+"/")
			}
			tl := &testLog{name: s[1]}
			j.ranks[r][s[1]] = tl
			running[r] = append(running[r], tl)
		}
		for _, tl := range running[r] {
			if !tl.done {
				tl.lines = append(tl.lines, text)
			}
		}
		if f := finished.FindStringSubmatch(text); f != nil {
			if tl := j.ranks[r][f[2]]; tl != nil {
				tl.result = f[1]
				running[r] = slices.DeleteFunc(running[r], func(x *testLog) bool { return x == tl })
			}
		}
	}
}

// report passes, fails or skips t as the ranks did.
func (j *job) report(t *testing.T) {
	t.Helper()
	skipped := 0
	for r, log := range j.ranks {
		tl := log[t.Name()]
		switch {
		case tl == nil || tl.result == "":
			t.Errorf("rank %d did not finish %s (%s: %v, after %v); mpirun's output:\n%s",
				r, t.Name(), j.cmd, j.err, j.took.Round(time.Millisecond), tail(j.out, 60))
			return
		case tl.result == "FAIL":
			t.Errorf("rank %d failed:\n%s", r, strings.Join(tl.lines, "\n"))
		case tl.result == "SKIP":
			skipped++
		}
	}
	if skipped == np {
		t.Skipf("skipped on every rank:\n%s", strings.Join(j.ranks[0][t.Name()].lines, "\n"))
	}
	if !t.Failed() {
		t.Logf("passed on %d ranks", np)
	}
}

// tail returns the last n lines of out.
func tail(out []byte, n int) []byte {
	lines := bytes.Split(out, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return bytes.Join(lines, []byte("\n"))
}
