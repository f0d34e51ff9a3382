//go:build !cuda

package main

import "github.com/gradcomp/gradcomp/kernels"

// features is gc_features' value in this build: no CUDA.
const features = 0

// queryPointer fails with errNoCUDABuild (wrapping kernels.ErrNoCUDA):
// this build, libgradcomp.so, has no CUDA support.
func queryPointer(kernels.DevicePtr) (pointerInfo, error) {
	return pointerInfo{}, errNoCUDABuild
}
