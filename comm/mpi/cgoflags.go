//go:build mpi && cgo

package mpi

// The compiler and linker flags of Open MPI's C bindings, from pkg-config
// (Debian: libopenmpi-dev installs ompi-c.pc). They apply to every cgo file
// of the package.

// #cgo pkg-config: ompi-c
import "C"
