package ncclmock_test

import (
	"bytes"
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
)

// worldLimit bounds a whole world of child processes: far above what
// each needs (its calls have their own timeouts), so that only a hang
// reaches it.
const worldLimit = 3 * time.Minute

// processWorld runs scenario on size child processes that form the world
// of id, and fails the test when any of them fails. Afterwards no shared
// memory of the world may remain.
func processWorld(t *testing.T, scenario string, id nccl.UniqueID, size int) {
	t.Helper()
	if buildErr != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	ctx, cancel := context.WithTimeout(t.Context(), worldLimit)
	defer cancel()
	outs := make([]bytes.Buffer, size)
	errs := make([]error, size)
	var wg sync.WaitGroup
	for r := range size {
		cmd := exec.CommandContext(ctx, os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), roleEnv+"="+scenario, pathEnv+"="+mockPath, idEnv+"="+id.String(),
			rankEnv+"="+strconv.Itoa(r), sizeEnv+"="+strconv.Itoa(size))
		cmd.Stdout, cmd.Stderr = &outs[r], &outs[r]
		if err := cmd.Start(); err != nil {
			t.Fatalf("starting rank %d: %v", r, err)
		}
		wg.Go(func() { errs[r] = cmd.Wait() })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Errorf("rank %d of %s: %v\n%s", r, scenario, err, outs[r].String())
		}
	}
	if _, err := os.Stat(filepath.Join("/dev/shm", ncclmock.ShmName(id))); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("the world's shared memory %s remains (stat: %v)", ncclmock.ShmName(id), err)
	}
}

// TestProcessCollectives: three processes make one world and run every
// operation, a split and sends and receives, on buffers many staging
// areas long; each checks its results exactly (rank-order sums).
func TestProcessCollectives(t *testing.T) {
	processWorld(t, "collectives", ncclmock.ID(ncclmock.ModeOK), 3)
}

// TestProcessHang: in a hang world every process's collective blocks
// until its own timeout aborts it, and the abort wakes it at once.
func TestProcessHang(t *testing.T) {
	processWorld(t, "hang", ncclmock.ID(ncclmock.ModeHang), 2)
}

// TestProcessAsync: the collective runs across processes, then the
// asynchronous error aborts each rank.
func TestProcessAsync(t *testing.T) {
	processWorld(t, "async", ncclmock.ID(ncclmock.ModeAsync), 2)
}

// TestProcessFail: each process's collective fails at once.
func TestProcessFail(t *testing.T) {
	processWorld(t, "fail", ncclmock.ID(ncclmock.ModeFail), 2)
}

// TestProcessFailInit: rank 1's init fails; ranks 0 and 2 wait for it
// until their timeouts abort them.
func TestProcessFailInit(t *testing.T) {
	processWorld(t, "failinit", ncclmock.FailInitID(1), 3)
}

// TestProcessExit: a process that exits while its peer waits for it in a
// collective leaves the peer blocked until its deadline aborts it,
// promptly. (With more survivors, the first one aborted breaks the
// world, and the others end with its ncclRemoteError instead.)
func TestProcessExit(t *testing.T) {
	processWorld(t, "exit", ncclmock.ID(ncclmock.ModeOK), 2)
}

// TestShmName: a world that waits for a rank is in shared memory under
// ShmName, and gone once its only rank is aborted.
func TestShmName(t *testing.T) {
	if buildErr != nil {
		t.Skipf("mock libnccl.so.2 not built: %v", buildErr)
	}
	l, err := nccl.Open(nccl.WithPath(mockPath))
	if err != nil {
		t.Fatal(err)
	}
	id := ncclmock.ID(ncclmock.ModeOK)
	file := filepath.Join("/dev/shm", ncclmock.ShmName(id))
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() {
		_, err := l.InitRank(ctx, 2, id, 0, nccl.WithTimeout(worldLimit))
		done <- err
	}()
	for deadline := time.Now().Add(worldLimit); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(file); err == nil {
			break
		} else if time.Now().After(deadline) {
			cancel()
			t.Fatalf("%s did not appear while rank 0 waits for rank 1: %v", file, err)
		}
	}
	cancel()
	var ae *nccl.AbortError
	if err := <-done; !errors.As(err, &ae) || !ae.Aborted {
		t.Errorf("InitRank: got %v, want an abort", err)
	}
	if _, err := os.Stat(file); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("%s remains after the abort: %v", file, err)
	}
}
