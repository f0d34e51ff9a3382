//go:build !mpi || !cgo

package mpi

import (
	"errors"
	"testing"
)

func TestStub(t *testing.T) {
	c, err := Init()
	if c != nil || !errors.Is(err, ErrNotBuilt) {
		t.Fatalf("Init() = %v, %v; want nil, ErrNotBuilt", c, err)
	}
	t.Log(err)
}
