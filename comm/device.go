package comm

import (
	"context"

	"github.com/gradcomp/gradcomp/gpu"
)

// DeviceComm is one rank's end of a group that exchanges GPU memory on
// CUDA streams: the collectives of Comm, with each buffer given as a device
// address and a length, enqueued on a stream. Implementation: comm/ncclcomm.
//
// # How the engine uses it
//
// On the GPU the engine keeps its own stream. Per bucket: that stream waits
// for the event the caller recorded when the gradient was ready, the
// compression kernels run on it, then the exchange of the bucket's strategy
// is enqueued on it through a DeviceComm (dense: AllReduce; sparse-gather:
// AllGather; SRA: AllToAll, sum, AllGather), then the decompression
// kernels, then a done event the caller's stream waits on before the
// optimizer. Nothing blocks the host: a DeviceComm call returns once the
// work is enqueued. Wait is for the host to wait for completion, when asked
// to, with a timeout. Configuration agreement, the link probe and the
// bootstrap of the device group travel over a host Comm of the same ranks.
//
// # Rules
//
// The rules of Comm apply (every method but Rank, Size, Wait and Close is
// collective; matched calls name the same operation with the same lengths),
// with these differences:
//   - Lengths are element counts (float32) or byte counts, as each method
//     says; buffers must be valid device memory of that size until the
//     stream has passed the operation, and a non-empty buffer must not be a
//     null pointer.
//   - Calls are asynchronous: they return when the work is enqueued on s,
//     before it runs, and they do not synchronize s or the host. An error
//     means the work was not (entirely) enqueued.
//   - Disagreeing calls are not detected on the device (checking would need
//     a host exchange per call): they are undefined behaviour of the
//     implementation, typically a hang that Wait's timeout ends. The engine
//     agrees on the bucket layout in its handshake instead.
//   - Sum order is the implementation's (NCCL's is neither rank order nor
//     fixed across algorithm choices); sums of small integers are exact.
type DeviceComm interface {
	// Rank returns this rank's index in [0, Size()). It never blocks.
	Rank() int

	// Size returns the number of ranks in the group. It never blocks.
	Size() int

	// AllReduce replaces buf (n float32 elements) on every rank with the
	// element-wise sum over ranks.
	AllReduce(ctx context.Context, buf gpu.Ptr, n int, s gpu.Stream) error

	// AllGather concatenates every rank's src (n bytes) into dst
	// (Size()·n bytes) in rank order; dst must not overlap src.
	AllGather(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error

	// ReduceScatter sums src (Size()·n float32 elements) over ranks and
	// leaves chunk Rank() of the sum in dst (n elements); dst must not
	// overlap src.
	ReduceScatter(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error

	// AllToAll exchanges equal chunks: with m = n/Size(), bytes
	// [j·m, (j+1)·m) of src go to rank j, and chunk i of dst comes from
	// rank i. n (the byte length of src and of dst) must be a multiple of
	// Size(); dst must not overlap src.
	AllToAll(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error

	// Broadcast copies root's buf (n bytes) into buf on every other rank.
	Broadcast(ctx context.Context, buf gpu.Ptr, n int, root int, s gpu.Stream) error

	// Wait blocks the host until done reports true (done typically queries
	// an event recorded on the stream after the work), or until the
	// implementation's timeout or ctx ends it with an error, after which
	// the DeviceComm is unusable. It is not collective.
	Wait(ctx context.Context, done func() (bool, error)) error

	// Close releases this rank's end after the work already enqueued has
	// finished (bounded by the implementation's timeout). Later calls fail;
	// closing twice returns nil.
	Close() error
}

// DeviceSplitter is implemented by a DeviceComm that can make
// communicators of subgroups of its ranks, as the hierarchical exchange
// needs (a node's ranks, the ranks of one local rank across nodes). Split
// is collective over every rank of the DeviceComm, called by all of them
// in the same order: the ranks that pass the same color form a new
// DeviceComm, ranked by key (ties by their rank here), as ncclCommSplit
// does. The new DeviceComm has the parent's timeout and device; closing
// it leaves the parent open, and closing the parent leaves it open.
type DeviceSplitter interface {
	Split(ctx context.Context, color, key int) (DeviceComm, error)
}

// DeviceHost is implemented by a host Comm whose host also carries device
// collectives for the same ranks (comm/hosted: the program hosting the
// engine runs both): Device returns them as a DeviceComm. The comms of
// such a Comm's Split are DeviceHosts too, so that a DeviceComm that does
// not split itself still has device comms for a Split's groups.
type DeviceHost interface {
	Device() DeviceComm
}
