package ncclmock_test

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
)

// TestDeviceHooks builds testdata/hooktest/hooks.c against the mock and
// runs it: a launcher that queues work per stream and runs it later
// checks the hook protocol (see the program's comment).
func TestDeviceHooks(t *testing.T) {
	if buildErr != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	cc, err := ncclmock.CC()
	if err != nil {
		t.Skip(err)
	}
	dir := filepath.Dir(mockPath)
	prog := filepath.Join(t.TempDir(), "hooks")
	build := exec.Command(cc, "-O1", "-Wall", "-Wextra", "-Werror", "-o", prog, "testdata/hooktest/hooks.c",
		"-L"+dir, "-l:libnccl.so.2", "-Wl,-rpath,"+dir, "-lpthread")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("%v: %v\n%s", build.Args, err, out)
	}
	ctx, cancel := context.WithTimeout(t.Context(), worldLimit)
	defer cancel()
	out, err := exec.CommandContext(ctx, prog).CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "PASS" {
		t.Fatalf("%s: %v\n%s", prog, err, out)
	}
}
