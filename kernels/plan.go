package kernels

import (
	"math"

	"github.com/gradcomp/gradcomp/gpu"
)

// A plan is the list of operations one call enqueues on a stream, built in
// plain Go (and tested without a device); the driver backend runs it.
type step struct {
	fn          string // kernel entry point; "" for a memset
	grid, block uint32
	args        []uint64 // one 8-byte slot per kernel parameter (see arg)

	// A memset (fn == ""): count 32-bit words from ptr set to val.
	ptr   gpu.Ptr
	val   uint32
	count uint64
}

// Kernel parameters travel as 8-byte little-endian slots: cuLaunchKernel
// reads as many bytes of each as the parameter has (8 for pointers and
// u64, 4 for u32 and f32), which are the low bytes.

func ptrArg(p gpu.Ptr) uint64 { return uint64(p) }

func boolArg(b bool) uint64 {
	if b {
		return 1
	}
	return 0
}

func f32Arg(x float32) uint64 { return uint64(math.Float32bits(x)) }

// launch returns a kernel step.
func launch(fn string, grid, block uint32, args ...uint64) step {
	return step{fn: fn, grid: grid, block: block, args: args}
}

// memset32 returns a step setting count 32-bit words from p to v.
func memset32(p gpu.Ptr, v uint32, count uint64) step {
	return step{ptr: p, val: v, count: count}
}

const (
	elemThreads = 256     // threads of the elementwise kernels
	maxGrid     = 1 << 20 // grid-stride kernels never launch more blocks
	tile        = 4096    // top-k tile (TILE in topk.cu)
	tileThreads = 256     // TILE_THREADS in topk.cu
)

// gridFor returns the blocks an elementwise kernel over n items launches.
func gridFor(n uint64, threads uint32) uint32 {
	return uint32(max(min((n+uint64(threads)-1)/uint64(threads), maxGrid), 1))
}

// elementwise returns the launch of fn over n items with elemThreads.
func elementwise(fn string, n uint64, args ...uint64) step {
	return launch(fn, gridFor(n, elemThreads), elemThreads, args...)
}

// bucketThreads returns the block size of the per-bucket kernels for
// buckets of b elements: b rounded up to warps, 32 to 256.
func bucketThreads(b int) uint32 {
	return uint32(min(max((b+31)/32*32, 32), 256))
}
