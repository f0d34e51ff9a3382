package kernels

import (
	"errors"
	"fmt"
)

// ErrNoCUDA is returned by every call that needs a GPU in a build without
// the cuda tag.
var ErrNoCUDA = errors.New("kernels: this build has no CUDA support (rebuild with -tags cuda and a CUDA toolkit)")

// ErrNoDevice is returned by Open when the CUDA driver is present but sees
// no usable GPU (or the driver library cannot initialize).
var ErrNoDevice = errors.New("kernels: no CUDA device")

// DriverError is a failed CUDA driver call.
type DriverError struct {
	Call string // the driver function, e.g. "cuLaunchKernel(gc_quant_encode)"
	Code int    // the CUresult
	Name string // the CUresult's name, e.g. "CUDA_ERROR_INVALID_VALUE"
}

func (e *DriverError) Error() string {
	return fmt.Sprintf("kernels: %s failed: %s (%d)", e.Call, e.Name, e.Code)
}

// ArgumentError reports an argument a call refuses before the device sees it.
type ArgumentError struct {
	Op     string // the call, e.g. "Encode"
	Reason string
}

func (e *ArgumentError) Error() string { return "kernels: " + e.Op + ": " + e.Reason }

// DeviceInfo describes the device of a Context.
type DeviceInfo struct {
	Ordinal      int
	Name         string
	Major, Minor int   // compute capability
	Memory       int64 // bytes
}
