package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
)

// TestInfoRuns: `gradcomp info` reports and exits 0 on this machine,
// whatever it has.
func TestInfoRuns(t *testing.T) {
	code, stdout, stderr := gradcomp(t, "info")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if !strings.HasPrefix(stdout, "GPUs: ") || !strings.Contains(stdout, "\nNCCL: ") {
		t.Errorf("output:\n%s", stdout)
	}
	code, stdout, _ = gradcomp(t, "info", "-json")
	var r infoReport
	if err := json.Unmarshal([]byte(stdout), &r); code != 0 || err != nil {
		t.Fatalf("exit %d, %v:\n%s", code, err, stdout)
	}
	if (r.GPUs.NoGPU == "") == (len(r.GPUs.Devices) == 0) {
		t.Errorf("a report must have devices or say why not: %+v", r.GPUs)
	}
	if (r.NCCL.Error == "") == (r.NCCL.Version == "") {
		t.Errorf("a report must have an NCCL version or say why not: %+v", r.NCCL)
	}
}

// TestInfoNoGPU: without the NVML library (any machine, with this path),
// info says there is no GPU and exits 0.
func TestInfoNoGPU(t *testing.T) {
	code, stdout, stderr := gradcomp(t, "info", "-nvml", "/nonexistent/libnvidia-ml.so.1")
	if code != 0 || stderr != "" {
		t.Fatalf("exit %d, stderr %q", code, stderr)
	}
	if !strings.HasPrefix(stdout, "GPUs: none. ") || !strings.Contains(stdout, "\nLayout: no GPU; the ranks of a node are") {
		t.Errorf("output:\n%s", stdout)
	}
	if code, _, stderr := gradcomp(t, "info", "stray"); code != 2 || !strings.Contains(stderr, "unexpected argument") {
		t.Errorf("stray argument: exit %d, %q", code, stderr)
	}
}

// TestInfoNCCL: the NCCL line reports the library's version and path; run
// against the MOCK libnccl.so.2 (a test fixture).
func TestInfoNCCL(t *testing.T) {
	path, err := ncclmock.Build(t.TempDir())
	if err != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", err)
	}
	code, stdout, _ := gradcomp(t, "info", "-nccl", path)
	if want := "NCCL: 2.19.3 (" + path + ", "; code != 0 || !strings.Contains(stdout, want) {
		t.Errorf("exit %d, want %q in:\n%s", code, want, stdout)
	}
}
