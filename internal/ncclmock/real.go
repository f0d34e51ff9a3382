package ncclmock

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/nccl"
)

// EnvVenv names the Python virtual environment that scripts/setup creates
// (default DefaultVenv under $HOME); RealLibrary looks for the
// nvidia-nccl-cu12 wheel's libnccl.so.2 in it.
const EnvVenv = "GRADCOMP_VENV"

// DefaultVenv is the venv's path relative to $HOME when $GRADCOMP_VENV is
// unset.
const DefaultVenv = ".cache/gradcomp/torch-venv"

// wheelLib is where the nvidia-nccl-cu12 (and -cu13) wheel puts the library
// inside a venv; its header is ../include/nccl.h from there.
const wheelLib = "lib/python3*/site-packages/nvidia/nccl/lib/" + nccl.LibraryName

// RealLibrary returns the path of a real libnccl.so.2 for tests: the file
// $GRADCOMP_NCCL names when it is set, else the nvidia-nccl wheel's copy in
// the venv ${GRADCOMP_VENV:-$HOME/.cache/gradcomp/torch-venv}. The error
// says where it looked; tests skip with it as the reason.
func RealLibrary() (string, error) {
	if p := os.Getenv(nccl.EnvPath); p != "" {
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("ncclmock: no real %s: $%s=%s: %w", nccl.LibraryName, nccl.EnvPath, p, err)
		}
		return p, nil
	}
	venv := os.Getenv(EnvVenv)
	if venv == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("ncclmock: no real %s: $%s and $%s are unset and $HOME is unknown: %w", nccl.LibraryName, nccl.EnvPath, EnvVenv, err)
		}
		venv = filepath.Join(home, DefaultVenv)
	}
	pattern := filepath.Join(venv, wheelLib)
	matches, _ := filepath.Glob(pattern)
	if len(matches) == 0 {
		return "", fmt.Errorf("ncclmock: no real %s: $%s is unset and nothing matches %s (scripts/setup installs the nvidia-nccl-cu12 wheel into that venv)", nccl.LibraryName, nccl.EnvPath, pattern)
	}
	return matches[len(matches)-1], nil
}

// RealHeader returns the nccl.h that ships with the library at lib: the
// wheel's include/nccl.h beside its lib directory. The error names the file
// it looked for.
func RealHeader(lib string) (string, error) {
	h := filepath.Join(filepath.Dir(filepath.Dir(lib)), "include", "nccl.h")
	if _, err := os.Stat(h); err != nil {
		return "", fmt.Errorf("ncclmock: no nccl.h beside %s: %w", lib, err)
	}
	return h, nil
}

// envIsolated carries the name of the test a child process of Isolate runs.
const envIsolated = "GRADCOMP_NCCL_ISOLATED_TEST"

// IsolatedChild reports whether this process is a child that Isolate
// started. A TestMain must then load no NCCL library before the test runs:
// the test loads the one it is about.
func IsolatedChild() bool { return os.Getenv(envIsolated) != "" }

// Isolate runs the calling top-level test in a fresh process: the test
// binary, re-executed with -test.run selecting the test alone, env added
// to its environment and -test.timeout set to timeout. In that child it
// returns true and the test goes on; in the parent it waits for the child,
// reports its outcome as the test's own (its log on success, its skip
// reason on a skip, its whole output on a failure, a hang past timeout as
// a failure that names it) and returns false: the test must return.
//
// A process holds one libnccl.so.2 (package nccl uses the copy already
// loaded), so a test that loads another library than the mock, or none,
// runs isolated.
func Isolate(t *testing.T, timeout time.Duration, env ...string) bool {
	t.Helper()
	if name := os.Getenv(envIsolated); name != "" {
		if name != t.Name() {
			t.Fatalf("ncclmock: Isolate in %s, but this child process was started for %s", t.Name(), name)
		}
		return true
	}
	ctx, cancel := context.WithTimeout(t.Context(), timeout+30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^"+regexp.QuoteMeta(t.Name())+"$",
		"-test.v", "-test.count=1", "-test.timeout="+timeout.String())
	cmd.Env = append(os.Environ(), append(env, envIsolated+"="+t.Name())...)
	cmd.WaitDelay = 5 * time.Second
	start := time.Now()
	out, err := cmd.CombinedOutput()
	text := string(out)
	var exit *exec.ExitError
	switch {
	case ctx.Err() != nil:
		t.Fatalf("the child process running %s did not finish within %v (killed after %v): an NCCL call hung\n%s", t.Name(), timeout, time.Since(start).Round(time.Millisecond), text)
	case err != nil && !errors.As(err, &exit):
		t.Fatalf("running %s in a child process: %v", t.Name(), err)
	case err != nil:
		t.Fatalf("%s failed in its child process (%v):\n%s", t.Name(), err, text)
	case strings.Contains(text, "--- SKIP: "+t.Name()+" "):
		t.Skipf("in its child process:\n%s", childLog(text))
	case strings.Contains(text, "--- PASS: "+t.Name()+" "):
		if l := childLog(text); l != "" {
			t.Logf("in its child process:\n%s", l)
		}
	default:
		t.Fatalf("the child process running %s reported no result:\n%s", t.Name(), text)
	}
	return false
}

// childLog returns the indented log lines of a child's -test.v output.
func childLog(out string) string {
	var lines []string
	for l := range strings.SplitSeq(out, "\n") {
		if strings.HasPrefix(l, "    ") {
			lines = append(lines, l)
		}
	}
	return strings.Join(lines, "\n")
}
