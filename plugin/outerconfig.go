package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"fmt"
	"math"
	"unsafe"

	"github.com/gradcomp/gradcomp/outer"
	"github.com/gradcomp/gradcomp/overlap"
)

// cOuterConfig mirrors gc_outer_config (outerConfigSize211 bytes).
type cOuterConfig struct {
	Size                        uint32
	SyncEvery, Fragments, Delay int32
	Alpha                       float64
	Optimizer, OnNonFinite      int32
	LR, Momentum                float64
	BucketElements              uint64
	FragmentOf                  *int32
	Shapes                      *uint64
}

// outerConfigSize211 is sizeof(gc_outer_config) in ABI 2.11, which added
// it.
const outerConfigSize211 = 72

// outerConfigSizes are the sizes of gc_outer_config this library reads.
var outerConfigSizes = []knownSize{{outerConfigSize211, "2.11"}}

// maxTensorElements bounds one tensor of gc_outer_create (2^40 float32s,
// 4 TiB): a larger size is a caller's error, not a tensor.
const maxTensorElements = 1 << 40

// invalidf is a *outer.ConfigError on field (as the C caller names it).
func invalidf(field, format string, args ...any) *outer.ConfigError {
	return &outer.ConfigError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

// readOuterParams reads gc_outer_create's params and sizes: one slice per
// tensor over the caller's memory (the Loop reads and writes it during
// gc_outer_create and gc_outer_step only).
func readOuterParams(params unsafe.Pointer, sizes *C.uint64_t, n C.size_t) ([][]float32, *outer.ConfigError) {
	switch {
	case uint64(n) > maxTensors:
		return nil, invalidf("ntensors", "%d: at most %d", uint64(n), maxTensors)
	case n > 0 && params == nil:
		return nil, invalidf("params", "null with %d tensors", uint64(n))
	case n > 0 && sizes == nil:
		return nil, invalidf("sizes", "null with %d tensors", uint64(n))
	}
	ptrs := unsafe.Slice((**float32)(params), int(n))
	out := make([][]float32, int(n))
	for i, size := range unsafe.Slice((*uint64)(unsafe.Pointer(sizes)), int(n)) {
		switch {
		case size > maxTensorElements:
			return nil, invalidf(fmt.Sprintf("sizes[%d]", i), "%d is not a plausible tensor size (at most 2^40 elements)", size)
		case size > 0 && ptrs[i] == nil:
			return nil, invalidf(fmt.Sprintf("params[%d]", i), "null for a tensor of %d elements", size)
		case size > 0:
			out[i] = unsafe.Slice(ptrs[i], int(size))
		default:
			out[i] = []float32{}
		}
	}
	return out, nil
}

// readOuterConfig reads gc_outer_config (ntensors entries in its
// fragment_of and shapes) into outer.Config's fields but Engine: the
// values as given, outer.New checks them.
func readOuterConfig(p unsafe.Pointer, ntensors int) (outer.Config, *outer.ConfigError) {
	if p == nil {
		return outer.Config{}, invalidf("ocfg", "null")
	}
	c, err := copySized[cOuterConfig](p, "ocfg", "gc_outer_config", outerConfigSizes)
	if err != nil {
		return outer.Config{}, invalidf("ocfg", "%v", err)
	}
	if c.BucketElements > math.MaxInt64 {
		return outer.Config{}, invalidf("ocfg->bucket_elements", "%d is not plausible", c.BucketElements)
	}
	cfg := outer.Config{SyncEvery: int(c.SyncEvery), Fragments: int(c.Fragments), Delay: int(c.Delay), Alpha: c.Alpha,
		Optimizer:      outer.Optimizer{Kind: outer.OptimizerKind(c.Optimizer), LR: c.LR, Momentum: c.Momentum},
		OnNonFinite:    outer.NonFinitePolicy(c.OnNonFinite),
		BucketElements: int(c.BucketElements)}
	if c.FragmentOf != nil {
		cfg.FragmentOf = make([]int, ntensors)
		for i, f := range unsafe.Slice(c.FragmentOf, ntensors) {
			cfg.FragmentOf[i] = int(f)
		}
	}
	if c.Shapes != nil {
		pairs := unsafe.Slice(c.Shapes, 2*ntensors)
		cfg.Shapes = make([]overlap.Shape, ntensors)
		for i := range cfg.Shapes {
			rows, cols := pairs[2*i], pairs[2*i+1]
			if rows > math.MaxInt32 || cols > math.MaxInt32 {
				return outer.Config{}, invalidf(fmt.Sprintf("ocfg->shapes[%d]", i), "%d×%d is not plausible", rows, cols)
			}
			cfg.Shapes[i] = overlap.Shape{Rows: int(rows), Cols: int(cols)}
		}
	}
	return cfg, nil
}
