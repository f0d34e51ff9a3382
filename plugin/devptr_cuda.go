//go:build cuda

package main

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdint.h>

// gc_pointer_info asks the driver about address p. cuPointerGetAttributes
// (unlike cuPointerGetAttribute) succeeds for an address CUDA does not know,
// with every attribute zero; none of these attributes needs a current
// context.
static CUresult gc_pointer_info(uintptr_t p, unsigned *memtype, int *ordinal, uintptr_t *start, size_t *size,
                                int *init_failed) {
	CUresult r = cuInit(0);
	*init_failed = r != CUDA_SUCCESS;
	if (r) return r;
	CUpointer_attribute attrs[4] = {CU_POINTER_ATTRIBUTE_MEMORY_TYPE, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
	                                CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, CU_POINTER_ATTRIBUTE_RANGE_SIZE};
	CUdeviceptr st = 0;
	void *data[4] = {memtype, ordinal, &st, size};
	*memtype = 0;
	*ordinal = -1;
	*size = 0;
	r = cuPointerGetAttributes(4, attrs, data, (CUdeviceptr)p);
	*start = (uintptr_t)st;
	return r;
}
static const char *gc_cu_error_name(CUresult r) {
	const char *s = NULL;
	if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == NULL) return "unknown CUresult";
	return s;
}
*/
import "C"

import (
	"fmt"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// features is gc_features' value in this build.
const features = featureCUDA

// queryPointer asks the driver what p is. A driver that cannot initialize
// (no GPU) is an error wrapping kernels.ErrNoDevice.
func queryPointer(p gpu.Ptr) (pointerInfo, error) {
	var (
		memtype    C.unsigned
		ordinal    C.int
		start      C.uintptr_t
		size       C.size_t
		initFailed C.int
	)
	if r := C.gc_pointer_info(C.uintptr_t(p), &memtype, &ordinal, &start, &size, &initFailed); r != C.CUDA_SUCCESS {
		if initFailed != 0 {
			return pointerInfo{}, fmt.Errorf("%w: %w", kernels.ErrNoDevice, &kernels.DriverError{Call: "cuInit", Code: int(r), Name: C.GoString(C.gc_cu_error_name(r))})
		}
		return pointerInfo{}, &kernels.DriverError{Call: "cuPointerGetAttributes", Code: int(r), Name: C.GoString(C.gc_cu_error_name(r))}
	}
	return pointerInfo{
		device:     memtype == C.CU_MEMORYTYPE_DEVICE || memtype == C.CU_MEMORYTYPE_UNIFIED,
		memoryType: int(memtype),
		ordinal:    int(ordinal),
		start:      uint64(start),
		size:       uint64(size),
	}, nil
}
