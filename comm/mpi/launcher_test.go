//go:build mpi && cgo

package mpi

// The test binary runs in two roles (see internal/mpilaunch). Started by
// `go test`, it is the launcher: each test reports what the ranks of one
// shared mpirun job (started on first use) said about it. Started by
// mpirun, it is a rank: TestMain initializes MPI and the tests run their
// bodies.

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/internal/mpilaunch"
)

// np is the number of ranks of every test job.
const np = 4

// world is this rank's world communicator; nil in the launcher.
var world *Comm

func TestMain(m *testing.M) {
	os.Exit(mpilaunch.Main(m, func() (*Comm, error) { return Init() }, func(c *Comm) { world = c }))
}

// onRanks runs body on every rank with a fresh Dup of the world made with
// opts (closed afterwards) and a 20-second context. In the launcher it
// reports the ranks' results for this test from the shared job instead.
func onRanks(t *testing.T, body func(ctx context.Context, t *testing.T, c *Comm), opts ...Option) {
	t.Helper()
	if world == nil {
		mpilaunch.Shared(t, np).Report(t)
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
