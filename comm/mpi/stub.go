//go:build !mpi || !cgo

package mpi

import (
	"context"
	"fmt"
	"os"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/internal/check"
)

// handle is empty: without MPI no Comm is ever made.
type handle struct{}

func initWorld(config) (*Comm, error)                       { return nil, ErrNotBuilt }
func (c *Comm) dup(context.Context, config) (*Comm, error)  { return nil, ErrNotBuilt }
func (c *Comm) run(context.Context, check.Call, args) error { return ErrNotBuilt }
func (c *Comm) split(context.Context) (*Comm, *Comm, error) { return nil, nil, ErrNotBuilt }
func (c *Comm) close() error                                { return ErrNotBuilt }
func threadLevel() string                                   { return "none (built without MPI)" }

func (c *Comm) start(context.Context, check.Call, args) (comm.Request, error) {
	return nil, ErrNotBuilt
}

func (c *Comm) abort(code int) {
	fmt.Fprintf(os.Stderr, "comm/mpi: rank %d aborting with code %d (built without MPI)\n", c.rank, code)
	os.Exit(code)
}
