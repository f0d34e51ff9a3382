package nccl

import (
	"fmt"
	"sync"
)

// CUDADriverName is the CUDA driver library WithDevice loads.
const CUDADriverName = "libcuda.so.1"

// cudaFuncs are the driver API functions WithDevice calls, in gc_cuda_bind's
// order.
var cudaFuncs = [4]string{"cuInit", "cuDeviceGet", "cuDevicePrimaryCtxRetain", "cuCtxSetCurrent"}

// cudaDriver is libcuda.so.1, loaded once, on the first WithDevice use.
var cudaDriver = sync.OnceValues(func() (*cudaLib, error) {
	h, err := dlopen(CUDADriverName, false)
	if err != nil {
		return nil, fmt.Errorf("nccl: WithDevice needs the CUDA driver: %w", err)
	}
	l := &cudaLib{errorName: dlsym(h, "cuGetErrorName")}
	for i, name := range cudaFuncs {
		if l.fns[i] = dlsym(h, name); l.fns[i] == 0 {
			return nil, fmt.Errorf("nccl: %s (loaded as %s) has no function %s, which WithDevice calls", dlhandlePath(h), CUDADriverName, name)
		}
	}
	return l, nil
})

type cudaLib struct {
	fns       [4]uintptr
	errorName uintptr
}

// CUDAError reports a CUDA driver call that failed (for WithDevice).
type CUDAError struct {
	Func   string // e.g. "cuInit"
	Device int    // the device ordinal asked for
	Code   int    // the CUresult
	Name   string // cuGetErrorName(Code), e.g. "CUDA_ERROR_NO_DEVICE"; "" when unknown
}

func (e *CUDAError) Error() string {
	name := e.Name
	if name == "" {
		name = "CUresult"
	}
	return fmt.Sprintf("nccl: binding CUDA device %d: %s failed: %s (%d)", e.Device, e.Func, name, e.Code)
}

// bindDevice makes device ordinal's primary context current on the calling
// OS thread (which must be locked), so that NCCL, through the CUDA runtime,
// sees ordinal as the current device. The primary context is retained for
// the life of the process (it is the one PyTorch uses too).
func bindDevice(ordinal int) error {
	l, err := cudaDriver()
	if err != nil {
		return err
	}
	code, step := cudaBind(&l.fns, ordinal)
	if code == 0 {
		return nil
	}
	e := &CUDAError{Func: cudaFuncs[step], Device: ordinal, Code: code}
	if l.errorName != 0 {
		e.Name = cudaErrorName(l.errorName, code)
	}
	return e
}
