package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"math"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/overlap"
)

// cEngineConfig mirrors gc_engine_config (engineConfigSize211 bytes; an
// older ABI's struct ends at its engineConfigSizes entry).
type cEngineConfig struct {
	Size                     uint32
	ErrorFeedback            int32
	Spec, Strategy, Decision *C.char
	FailOnNonFinite, Warmup  int32
	Timeout                  float64
	Workers, Device          int32
	Momentum                 float64 // since ABI 2.1
	Schedule                 *C.char // since ABI 2.1
	Guard                    float64 // since ABI 2.2
	MomentumMasking          int32   // since ABI 2.2
	Node, Nodes              int32   // since ABI 2.4
	LocalRank, LocalSize     int32   // since ABI 2.4
	_                        int32
	NodeSpec                 *C.char // since ABI 2.5
	TensorCounts, Shapes     *uint64 // since ABI 2.7
	FeedbackDecay            float64 // since ABI 2.11
}

// The sizes of gc_engine_config in the ABIs that changed it, which a
// caller built against that header passes.
const (
	engineConfigSize20  = 56  // ABI 2.0: without Momentum and Schedule
	engineConfigSize21  = 72  // ABI 2.1: without Guard and MomentumMasking
	engineConfigSize22  = 88  // ABI 2.2 and 2.3: without the topology
	engineConfigSize24  = 104 // ABI 2.4: without NodeSpec
	engineConfigSize25  = 112 // ABI 2.5 and 2.6: without TensorCounts and Shapes
	engineConfigSize27  = 128 // ABI 2.7 to 2.10: without FeedbackDecay
	engineConfigSize211 = 136 // ABI 2.11 on: sizeof(cEngineConfig)
)

// engineConfigSizes are the sizes copyEngineConfig accepts, each with the
// ABI that introduced it, this library's last.
var engineConfigSizes = []knownSize{
	{engineConfigSize20, "2.0"}, {engineConfigSize21, "2.1"}, {engineConfigSize22, "2.2"},
	{engineConfigSize24, "2.4"}, {engineConfigSize25, "2.5"}, {engineConfigSize27, "2.7"},
	{engineConfigSize211, "2.11"},
}

// copyEngineConfig returns the gc_engine_config at p, read as far as its
// size says (copySized: the fields an older ABI's struct lacks zero, an
// unknown size refused before a byte past it is read).
func copyEngineConfig(p unsafe.Pointer) (cEngineConfig, error) {
	return copySized[cEngineConfig](p, "cfg", "gc_engine_config", engineConfigSizes)
}

// readEngineConfig reads gc_engine_config and the bucket sizes. On error
// the configuration holds what could be read: its timeout at least, or 0
// (the default) where that could not be read.
func readEngineConfig(cfg unsafe.Pointer, sizes *C.uint64_t, nbuckets C.size_t) (engineConfig, []int, error) {
	switch {
	case cfg == nil:
		return engineConfig{}, nil, errorf(errInvalid, "null cfg")
	case sizes == nil && nbuckets > 0:
		return engineConfig{}, nil, errorf(errInvalid, "null sizes with %d buckets", uint64(nbuckets))
	case uint64(nbuckets) > math.MaxUint32:
		return engineConfig{}, nil, errorf(errInvalid, "%d buckets: at most %d", uint64(nbuckets), uint64(math.MaxUint32))
	}
	c, err := copyEngineConfig(cfg)
	if err != nil {
		return engineConfig{}, nil, err
	}
	str := func(p *C.char) string {
		if p == nil {
			return ""
		}
		return C.GoString(p)
	}
	raw := rawEngineConfig{spec: str(c.Spec), strategy: str(c.Strategy), decision: str(c.Decision),
		ef: c.ErrorFeedback != 0, failNonFinite: c.FailOnNonFinite != 0, warmup: int(c.Warmup),
		timeout: float64(c.Timeout), workers: int(c.Workers), device: int(c.Device),
		momentum: c.Momentum, schedule: str(c.Schedule), guard: c.Guard, momentumMasking: c.MomentumMasking != 0,
		topo:     comm.Topology{Node: int(c.Node), Nodes: int(c.Nodes), LocalRank: int(c.LocalRank), LocalSize: int(c.LocalSize)},
		nodeSpec: str(c.NodeSpec), feedbackDecay: c.FeedbackDecay}
	var shapesErr error
	raw.shapes, shapesErr = readShapes(c.TensorCounts, c.Shapes, int(nbuckets))
	conf, err := parseEngineConfig(raw)
	if err == nil {
		err = shapesErr
	}
	if err == nil && c.Spec == nil { // after parsing, so that conf holds the timeout
		err = errorf(errInvalid, "null cfg->spec")
	}
	if err != nil {
		return conf, nil, err
	}
	sz := make([]int, int(nbuckets))
	for i, n := range unsafe.Slice((*uint64)(unsafe.Pointer(sizes)), int(nbuckets)) {
		if n > math.MaxInt32 {
			return conf, nil, errorf(errInvalid, "sizes[%d] = %d is not a plausible bucket size", i, n)
		}
		sz[i] = int(n)
	}
	return conf, sz, nil
}

// readShapes reads gc_engine_config's tensor_counts and shapes for
// nbuckets buckets (nil, nil: none).
func readShapes(counts, shapes *uint64, nbuckets int) ([][]overlap.Shape, error) {
	switch {
	case counts == nil && shapes == nil:
		return nil, nil
	case counts == nil || shapes == nil:
		return nil, errorf(errConfig, "cfg->tensor_counts and cfg->shapes: give both or neither")
	}
	total := uint64(0)
	cs := unsafe.Slice(counts, nbuckets)
	for i, n := range cs {
		if total += n; n > maxTensors || total > maxTensors {
			return nil, errorf(errConfig, "cfg->tensor_counts[%d] = %d: more than %d tensors in all", i, n, maxTensors)
		}
	}
	pairs := unsafe.Slice(shapes, 2*total)
	out := make([][]overlap.Shape, nbuckets)
	for i, n := range cs {
		out[i] = make([]overlap.Shape, n)
		for j := range out[i] {
			rows, cols := pairs[0], pairs[1]
			pairs = pairs[2:]
			if rows > math.MaxInt32 || cols > math.MaxInt32 {
				return nil, errorf(errConfig, "bucket %d, tensor %d: shape %d×%d is not plausible", i, j, rows, cols)
			}
			out[i][j] = overlap.Shape{Rows: int(rows), Cols: int(cols)}
		}
	}
	return out, nil
}

// maxTensors bounds gc_engine_config's tensors, over every bucket.
const maxTensors = 1 << 24
