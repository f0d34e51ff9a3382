// Package kernels runs gradcomp's compressors on an NVIDIA GPU: CUDA kernels
// (cuda/*.cu, compiled to PTX by `go generate` and embedded) with the same
// semantics as package compress, launched through the CUDA driver API on a
// caller's stream.
//
// Build tags:
//
//	(none)      the API is present and every call that needs a GPU returns
//	            ErrNoCUDA; no cgo, no CUDA library needed
//	cuda        the driver-API backend: cgo, cuda.h, links libcuda
//
// Semantics. Every payload the Compressor of this package writes is
// byte-identical to compress.Parse(spec)'s for the same input and key: the
// same bucket parameters, the same stochastic-rounding draws (the
// counter-based stream of compress/rng.go), the same top-k set and tie
// rule, the same random-k indices, the same framing (package compress
// frames the bodies the kernels write, see compress.EncodePayload). The
// kernels are compiled with --fmad=false and without fast math, and the
// bit-exact spots use explicit IEEE intrinsics; sign's float64 scale sum
// follows the CPU's documented order, so even it matches bit for bit.
//
// Streams and synchronization. A gpu.Stream is a raw CUstream (PyTorch's
// torch.cuda.current_stream().cuda_stream, say) and a gpu.Ptr a raw device
// address; both are plain integers so they cross package and language
// boundaries without cgo types. Codec.Encode and Codec.Decode only enqueue
// work on the given stream and return: nothing waits for the device. The
// host copies (Context.CopyIn, CopyOut) follow the driver's rules for
// pageable memory and return once the host buffer may be reused.
//
// Device memory is the current device's primary context, the one the CUDA
// runtime (and so PyTorch) uses, so pointers and streams are shared.
package kernels
