package ncclmock_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
)

// The tests run ranks as processes: the test binary re-executed with
// roleEnv naming a scenario of children.go, the mock's path in pathEnv
// and the world in idEnv, rankEnv and sizeEnv.
const (
	roleEnv = "GCMOCK_TEST_ROLE"
	pathEnv = "GCMOCK_TEST_LIB"
	idEnv   = "GCMOCK_TEST_ID"
	rankEnv = "GCMOCK_TEST_RANK"
	sizeEnv = "GCMOCK_TEST_SIZE"
)

var (
	mockPath string // the mock, with 4 KiB staging areas so that tests cross in many chunks
	buildErr error
)

func TestMain(m *testing.M) {
	if role := os.Getenv(roleEnv); role != "" {
		os.Exit(child(role))
	}
	dir, err := os.MkdirTemp("", "gradcomp-ncclmock-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	mockPath, buildErr = ncclmock.Build(dir, "MOCK_STAGE_BYTES=4096")
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}
