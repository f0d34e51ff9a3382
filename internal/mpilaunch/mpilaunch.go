// Package mpilaunch runs a Go test binary's tests on the ranks of an
// mpirun job, from inside `go test`, so that `go test -tags mpi` runs
// multi-process MPI tests like any others.
//
// The test binary runs in two roles. Started by `go test`, it is the
// launcher: IsRank is false, and a test starts a job (Run, or Shared for
// one job shared by every test) and reports what the ranks said about it
// (Job.Report). Started by mpirun, it is a rank: IsRank is true, TestMain
// initializes MPI and the tests run their bodies. Ranks' output is tagged
// by mpirun (--tag-output) and split by rank and by test.
package mpilaunch

import (
	"bytes"
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

// IsRank reports whether this process was started by mpirun (Open MPI sets
// OMPI_COMM_WORLD_RANK).
func IsRank() bool { return os.Getenv("OMPI_COMM_WORLD_RANK") != "" }

// Job is one finished mpirun run of the test binary.
type Job struct {
	Cmd   string        // the command line, for messages
	Out   []byte        // mpirun's combined output
	Err   error         // mpirun's exit status
	Took  time.Duration // wall time
	ranks []rankLog     // the output of each rank, by test
}

// rankLog maps a test name to its result line ("PASS", "FAIL", "SKIP")
// and the lines it printed.
type rankLog map[string]*testLog

type testLog struct {
	name   string
	result string
	lines  []string
	done   bool // a sibling started: later lines are not this test's
}

var shared struct {
	once sync.Once
	job  *Job
	skip string // why no job could run
}

// Shared runs every test selected by this process's -test.run and
// -test.skip on np ranks, once per process, and returns that job; it skips
// t when mpirun is missing.
func Shared(t *testing.T, np int) *Job {
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
		shared.job = Run(t, np, nil, args...)
		t.Logf("ran %s: %v after %v", shared.job.Cmd, shared.job.Err, shared.job.Took.Round(time.Millisecond))
	})
	if shared.skip != "" {
		t.Skip(shared.skip)
	}
	return shared.job
}

// SharedJob returns the job Shared ran, or nil: TestMain checks its exit
// status once every test has passed.
func SharedJob() *Job { return shared.job }

// Run runs this test binary under mpirun on np ranks with the given test
// flags and extra environment (NAME=VALUE, exported to every rank), and
// parses the tagged output. It skips t when mpirun is missing.
func Run(t testing.TB, np int, env []string, testArgs ...string) *Job {
	t.Helper()
	if _, err := exec.LookPath("mpirun"); err != nil {
		t.Skip("mpirun not found (install openmpi-bin): " + err.Error())
	}
	bin, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	// A session directory of the job's own: mpiruns of test packages that
	// run at once otherwise race to create /tmp/ompi.<host>.<uid> ("File
	// exists", orte_init failed).
	args := []string{"--allow-run-as-root", "--oversubscribe", "--tag-output", "-np", fmt.Sprint(np),
		"--mca", "orte_tmpdir_base", t.TempDir()}
	for _, kv := range env {
		args = append(args, "-x", kv)
	}
	args = append(append(args, bin), testArgs...)
	cmd := exec.Command("mpirun", args...)
	cmd.Env = append(os.Environ(), env...)
	j := &Job{Cmd: "mpirun " + strings.Join(args, " "), ranks: make([]rankLog, np)}
	start := time.Now()
	j.Out, j.Err = cmd.CombinedOutput()
	j.Took = time.Since(start)
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
func (j *Job) parse() {
	np := len(j.ranks)
	running := make([][]*testLog, np)
	for i := range j.ranks {
		j.ranks[i] = rankLog{}
	}
	for _, line := range strings.Split(string(j.Out), "\n") {
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

// Report passes, fails or skips t as the ranks did.
func (j *Job) Report(t *testing.T) {
	t.Helper()
	skipped := 0
	for r, log := range j.ranks {
		tl := log[t.Name()]
		switch {
		case tl == nil || tl.result == "":
			t.Errorf("rank %d did not finish %s (%s: %v, after %v); mpirun's output:\n%s",
				r, t.Name(), j.Cmd, j.Err, j.Took.Round(time.Millisecond), Tail(j.Out, 60))
			return
		case tl.result == "FAIL":
			t.Errorf("rank %d failed:\n%s", r, strings.Join(tl.lines, "\n"))
		case tl.result == "SKIP":
			skipped++
		}
	}
	if skipped == len(j.ranks) {
		t.Skipf("skipped on every rank:\n%s", strings.Join(j.ranks[0][t.Name()].lines, "\n"))
	}
	if !t.Failed() {
		t.Logf("passed on %d ranks", len(j.ranks))
	}
}

// Tail returns the last n lines of out.
func Tail(out []byte, n int) []byte {
	lines := bytes.Split(out, []byte("\n"))
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return bytes.Join(lines, []byte("\n"))
}

// Main is the TestMain body of a package whose tests run on MPI ranks; it
// returns the exit code for os.Exit. In the launcher it runs the tests and
// fails if the shared job (Shared) failed after every test passed. On a
// rank it opens the world communicator with open, hands it to keep, runs the
// tests and closes it.
func Main[C interface{ Close() error }](m *testing.M, open func() (C, error), keep func(C)) int {
	if !IsRank() {
		code := m.Run()
		if j := SharedJob(); j != nil && j.Err != nil && code == 0 {
			fmt.Fprintf(os.Stderr, "mpirun failed after every test passed: %v\n%s", j.Err, j.Out)
			code = 1
		}
		return code
	}
	c, err := open()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	keep(c)
	code := m.Run()
	if err := c.Close(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		code = 1
	}
	return code
}
