//go:build !(mpi && cgo)

package main

import (
	"strings"
	"testing"
)

func TestNetbenchExplainsMissingMPI(t *testing.T) {
	code, stdout, stderr := gradcomp(t, "netbench", "-size", "10")
	if code != 1 || stdout != "" || !strings.Contains(stderr, "go build -tags mpi") || !strings.Contains(stderr, "scripts/netbench") {
		t.Errorf("exit %d, stdout %q, stderr %q; want exit 1 and how to build", code, stdout, stderr)
	}
}

func TestTrainMPIExplainsMissingMPI(t *testing.T) {
	code, _, stderr := gradcomp(t, "train", "-out", t.TempDir(), "-mpi")
	if code != 1 || !strings.Contains(stderr, "-tags mpi") {
		t.Errorf("exit %d, stderr %q; want exit 1 mentioning -tags mpi", code, stderr)
	}
}
