// Package gpu holds the types that name CUDA objects across gradcomp's
// packages: a device memory address, a stream and an event, each the raw
// handle the CUDA driver (and torch, and NCCL) uses. kernels runs on them,
// nccl and comm's DeviceComm exchange through them, overlap and the C ABI
// pass them along; none of these packages converts between its own
// copies. The package has no code and imports nothing, so any package may
// use it: the handles, and the memory calls every device offers.
package gpu

// Ptr is a device memory address: a CUdeviceptr, or a CUDA tensor's
// data_ptr(). Host code never dereferences it; 0 is no buffer.
type Ptr uintptr

// Stream is a CUDA stream handle (a CUstream / cudaStream_t, as
// torch.cuda.Stream.cuda_stream gives it); 0 is the legacy default stream.
type Stream uintptr

// Event is a CUDA event handle (a CUevent).
type Event uintptr

// Memory is device memory as the layers above the kernels use it: buffers,
// and copies between host and device ordered on a stream. CopyIn returns
// once src may be reused; CopyOut waits for the stream's work before it
// and returns with dst filled. The kernels' context (kernels.Context), the
// device engine's Device and the fake device all have it.
type Memory interface {
	Alloc(bytes int) (Ptr, error)
	Free(p Ptr) error
	CopyIn(s Stream, dst Ptr, src []byte) error
	CopyOut(s Stream, dst []byte, src Ptr) error
}
