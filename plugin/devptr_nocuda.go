//go:build !cuda

package main

import "github.com/gradcomp/gradcomp/kernels"

// queryPointer returns kernels.ErrNoCUDA: this build (libgradcomp.so) has
// no CUDA support.
func queryPointer(kernels.DevicePtr) (pointerInfo, error) {
	return pointerInfo{}, kernels.ErrNoCUDA
}
