package main

import (
	"errors"
	"fmt"
	"sync"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// The devices the device calls run on: one primary context per device
// ordinal (PyTorch's), with the kernels loaded and a stream of gradcomp's
// own, and the checks that locate a call's buffers on one of them.

// deviceContext is one device's primary context with the kernels loaded,
// and a stream of gradcomp's own for copies that must not wait on (or
// delay) a caller's stream.
type deviceContext struct {
	ordinal int
	ctx     *kernels.Context
	own     gpu.Stream
}

// devices holds the contexts opened so far, one per device ordinal, kept
// for the process's life (the primary context is PyTorch's too).
var devices = struct {
	mu   sync.Mutex
	open map[int]*deviceContext
}{open: map[int]*deviceContext{}}

// errNoCUDABuild is what device calls to libgradcomp.so (no cuda tag) fail
// with, saying which library to load instead.
var errNoCUDABuild = fmt.Errorf("this is libgradcomp.so, built without CUDA: device calls need libgradcomp_cuda.so (%w)", kernels.ErrNoCUDA)

// openDevice returns the context of device ordinal, opening it on first use.
// A failure is not cached: a later call tries again.
func openDevice(ordinal int) (*deviceContext, error) {
	devices.mu.Lock()
	defer devices.mu.Unlock()
	if d, ok := devices.open[ordinal]; ok {
		return d, nil
	}
	ctx, err := kernels.Open(ordinal)
	if errors.Is(err, kernels.ErrNoCUDA) {
		return nil, errNoCUDABuild
	}
	if err != nil {
		return nil, err
	}
	s, err := ctx.NewStream()
	if err != nil {
		ctx.Close()
		return nil, err
	}
	d := &deviceContext{ordinal: ordinal, ctx: ctx, own: s}
	devices.open[ordinal] = d
	return d, nil
}

// deviceInfo describes device ordinal (gc_device_info).
func deviceInfo(ordinal int) (kernels.DeviceInfo, error) {
	if ordinal < 0 {
		return kernels.DeviceInfo{}, errorf(errInvalid, "device %d: ordinals start at 0", ordinal)
	}
	d, err := openDevice(ordinal)
	if err != nil {
		return kernels.DeviceInfo{}, err
	}
	return d.ctx.Info(), nil
}

// pointerInfo is what the CUDA driver knows of a device address
// (queryPointer, in devptr_cuda.go; devptr_nocuda.go has none).
type pointerInfo struct {
	device      bool // device (or managed) memory a kernel may read and write
	memoryType  int  // the CUmemorytype, 0 for an address CUDA does not know
	ordinal     int
	start, size uint64 // the allocation holding the address
}

// region is a device buffer an argument names: what (for messages), its
// address and its length in bytes.
type region struct {
	what  string
	p     gpu.Ptr
	bytes uint64
}

// deviceOf returns the context of the device that holds every region of
// non-zero length: each must be CUDA device memory (or managed memory),
// lie within one allocation and sit on the same device as the others.
func deviceOf(regions ...region) (*deviceContext, error) {
	ordinal := -1
	first := ""
	for _, r := range regions {
		if r.bytes == 0 {
			continue
		}
		info, err := queryPointer(r.p)
		if err != nil {
			return nil, fmt.Errorf("%s %#x: %w", r.what, uintptr(r.p), err)
		}
		if !info.device {
			return nil, errorf(errInvalid, "%s %#x is not CUDA device memory (memory type %d: host memory, or an address CUDA did not allocate)", r.what, uintptr(r.p), info.memoryType)
		}
		if end := uint64(r.p) + r.bytes; end > info.start+info.size || end < uint64(r.p) {
			return nil, errorf(errSize, "%s: %d bytes from %#x run past the end of its allocation (%d bytes from %#x)", r.what, r.bytes, uintptr(r.p), info.size, info.start)
		}
		switch {
		case ordinal < 0:
			ordinal, first = info.ordinal, r.what
		case info.ordinal != ordinal:
			return nil, errorf(errInvalid, "%s is on device %d but %s is on device %d", r.what, info.ordinal, first, ordinal)
		}
	}
	if ordinal < 0 {
		return nil, errorf(errInternal, "no device buffer to locate")
	}
	return openDevice(ordinal)
}
