//go:build !cuda && !fakegpu

package main

import (
	"github.com/gradcomp/gradcomp/gpu"
)

// features is gc_features' value in this build: no CUDA.
const features = 0

// queryPointer fails with errNoCUDABuild (wrapping kernels.ErrNoCUDA):
// this build, libgradcomp.so, has no CUDA support.
func queryPointer(gpu.Ptr) (pointerInfo, error) {
	return pointerInfo{}, errNoCUDABuild
}
