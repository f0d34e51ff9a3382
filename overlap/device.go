package overlap

import (
	"time"

	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/kernels"
)

// Device is what the device engine needs of a GPU: memory, streams,
// events, and the kernels of package kernels enqueued on a stream. CUDA
// gives the one over a kernels.Context; tests use a fake. Every method but
// EventQuery, CopyIn and CopyOut only enqueues work (or creates or
// destroys a handle) and never waits for the device; their contracts are
// kernels.Context's of the same names, and Encode, Decode, Average,
// Momentum, Mask, Guard, GuardMax, Flush and Scale are
// kernels.Codec.Encode, kernels.Codec.Decode, kernels.Average,
// kernels.Momentum, kernels.Codec.Mask, kernels.Guard, kernels.GuardMax,
// kernels.Flush and kernels.Scale;
// LowRankEncode, LowRankReduce and LowRankDecode are kernels'.
type Device interface {
	gpu.Memory
	NewStream() (gpu.Stream, error)
	DestroyStream(s gpu.Stream) error
	NewEvent(timing bool) (gpu.Event, error)
	DestroyEvent(e gpu.Event) error
	Record(e gpu.Event, s gpu.Stream) error
	WaitEvent(s gpu.Stream, e gpu.Event) error
	EventQuery(e gpu.Event) (bool, error)
	Elapsed(start, end gpu.Event) (time.Duration, error)
	Copy(s gpu.Stream, dst, src gpu.Ptr, bytes int) error
	Encode(c *kernels.Codec, s gpu.Stream, a kernels.EncodeArgs) error
	Decode(c *kernels.Codec, s gpu.Stream, a kernels.DecodeArgs) error
	Average(s gpu.Stream, a kernels.AverageArgs) error
	Momentum(s gpu.Stream, a kernels.MomentumArgs) error
	Mask(c *kernels.Codec, s gpu.Stream, a kernels.MaskArgs) error
	Guard(s gpu.Stream, a kernels.GuardArgs) error
	GuardMax(s gpu.Stream, a kernels.GuardMaxArgs) error
	Flush(s gpu.Stream, a kernels.FlushArgs) error
	Scale(s gpu.Stream, a kernels.ScaleArgs) error
	LowRankEncode(s gpu.Stream, a kernels.LowRankArgs) error
	LowRankReduce(s gpu.Stream, a kernels.LowRankArgs) error
	LowRankDecode(s gpu.Stream, a kernels.LowRankArgs) error
}

// CUDA returns the Device of a kernels.Context (its primary context, so
// PyTorch's pointers and streams are valid in it). In a build without the
// cuda tag no Context can be opened.
func CUDA(ctx *kernels.Context) Device { return cudaDevice{ctx} }

// cudaDevice is the Device of a kernels.Context: its methods, and the
// kernels of package kernels run in it.
type cudaDevice struct{ *kernels.Context }

func (d cudaDevice) Encode(c *kernels.Codec, s gpu.Stream, a kernels.EncodeArgs) error {
	return c.Encode(d.Context, s, a)
}

func (d cudaDevice) Decode(c *kernels.Codec, s gpu.Stream, a kernels.DecodeArgs) error {
	return c.Decode(d.Context, s, a)
}

func (d cudaDevice) Average(s gpu.Stream, a kernels.AverageArgs) error {
	return kernels.Average(d.Context, s, a)
}

func (d cudaDevice) Momentum(s gpu.Stream, a kernels.MomentumArgs) error {
	return kernels.Momentum(d.Context, s, a)
}

func (d cudaDevice) Mask(c *kernels.Codec, s gpu.Stream, a kernels.MaskArgs) error {
	return c.Mask(d.Context, s, a)
}

func (d cudaDevice) Guard(s gpu.Stream, a kernels.GuardArgs) error {
	return kernels.Guard(d.Context, s, a)
}

func (d cudaDevice) GuardMax(s gpu.Stream, a kernels.GuardMaxArgs) error {
	return kernels.GuardMax(d.Context, s, a)
}

func (d cudaDevice) Flush(s gpu.Stream, a kernels.FlushArgs) error {
	return kernels.Flush(d.Context, s, a)
}

func (d cudaDevice) Scale(s gpu.Stream, a kernels.ScaleArgs) error {
	return kernels.Scale(d.Context, s, a)
}

func (d cudaDevice) LowRankEncode(s gpu.Stream, a kernels.LowRankArgs) error {
	return kernels.LowRankEncode(d.Context, s, a)
}

func (d cudaDevice) LowRankReduce(s gpu.Stream, a kernels.LowRankArgs) error {
	return kernels.LowRankReduce(d.Context, s, a)
}

func (d cudaDevice) LowRankDecode(s gpu.Stream, a kernels.LowRankArgs) error {
	return kernels.LowRankDecode(d.Context, s, a)
}
