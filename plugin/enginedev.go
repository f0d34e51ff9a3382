//go:build !fakegpu

package main

import (
	"github.com/gradcomp/gradcomp/nccl"
	"github.com/gradcomp/gradcomp/overlap"
)

// ncclLoadOptions are openNCCL's: the process's own NCCL first.
var ncclLoadOptions []nccl.LoadOption

// openEngineDevice returns CUDA device ordinal as the device engine's
// Device (its primary context, PyTorch's) and the option that makes it
// current on NCCL's init thread. In libgradcomp.so (no cuda tag) it fails
// with errNoCUDABuild.
func openEngineDevice(ordinal int) (overlap.Device, nccl.Option, error) {
	d, err := openDevice(ordinal)
	if err != nil {
		return nil, nil, err
	}
	return overlap.CUDA(d.ctx), nccl.WithDevice(ordinal), nil
}
