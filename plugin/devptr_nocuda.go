//go:build !cuda

package main

import (
	"github.com/gradcomp/gradcomp/gpu"
)

// queryPointer fails with errNoCUDABuild (wrapping kernels.ErrNoCUDA):
// this build (libgradcomp.so, or the fake-device test build) has no CUDA.
func queryPointer(gpu.Ptr) (pointerInfo, error) {
	return pointerInfo{}, errNoCUDABuild
}
