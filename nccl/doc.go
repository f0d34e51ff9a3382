// Package nccl is a binding of NVIDIA's NCCL (libnccl.so.2) loaded at run
// time with dlopen, so it builds, and its tests run, on machines without
// NCCL, CUDA or a GPU; a missing library is an ordinary error from Open.
// No NCCL header is needed: the few types of nccl.h 2.x it uses, and the
// prototypes of the functions it calls, are declared in gcnccl.h
// (ncclResult_t, ncclDataType_t and ncclRedOp_t are int enums, ncclComm_t
// and cudaStream_t pointers, ncclUniqueId 128 bytes). Open accepts NCCL 2.7
// or newer and refuses a library that is not NCCL 2.x (ErrIncompatible).
// Functions of later releases are optional: Open loads a library without
// them, and the call that needs one fails with an *UnsupportedError
// naming it and the library's version (Comm.Split: ncclCommSplit, 2.18).
//
//	lib, err := nccl.Open()                  // the process's copy if one is loaded (PyTorch's), else $GRADCOMP_NCCL, else libnccl.so.2
//	id, err := lib.GetUniqueID()             // on one rank; send id to the others (UniqueID.String / ParseUniqueID, or a comm.Comm broadcast)
//	c, err := lib.InitRank(ctx, n, id, rank, nccl.WithTimeout(time.Minute))
//	err = c.Run(ctx, nccl.AllReduce(buf, buf, count, nccl.Float32, nccl.Sum, stream))
//	err = c.Wait(ctx, eventDone)             // optional: host waits for the stream's work, polling async errors
//	sub, err := c.Split(ctx, color, key)     // collective: the ranks of one color, ordered by key (NCCL ≥ 2.18)
//	err = c.Destroy(ctx)
//
// Device memory and streams cross the API as gpu.Ptr and gpu.Stream, plain
// uintptr wrappers (a CUdeviceptr or tensor.data_ptr(), a cudaStream_t);
// the package never touches device memory itself and never synchronizes a
// stream. It needs cgo (for dlopen); built with CGO_ENABLED=0, Open returns
// ErrNoCgo.
//
// # Failure
//
// Every NCCL status is checked where it is returned: a failure is an *Error
// with ncclGetErrorString's text and, from NCCL 2.13 on, ncclGetLastError's
// detail. No call hangs: each runs on its own OS thread while the caller
// polls ncclCommGetAsyncError and watches the communicator's timeout and
// ctx, and aborts the communicator (ncclCommAbort) when either ends first
// or an asynchronous error appears (see Comm). Arguments are checked in Go
// before NCCL sees them (*ArgumentError): null device pointers with a
// non-zero count, negative counts, unknown types or reductions, ranks out
// of range, a zero UniqueID.
//
// # Without a GPU
//
// A real libnccl.so.2 loads and answers ncclGetVersion, ncclGetErrorString
// and ncclGetUniqueId (which opens only the bootstrap socket) on a machine
// without a GPU or CUDA driver. InitRank is the first call that needs a
// device: it fails within milliseconds with an *Error (NCCL 2.32:
// ncclUnhandledCudaError, with ncclGetLastError's "Cuda failure 'no CUDA-capable device is
// detected'" (a driver without a GPU) or "'CUDA driver version is
// insufficient for CUDA runtime version'" (no usable libcuda.so.1)), and
// WithDevice fails earlier with a *CUDAError (CUDA_ERROR_NO_DEVICE) or an
// error naming libcuda.so.1. No communicator can be made there, so Run,
// Wait and Destroy are out of reach.
//
// # Testing
//
// The tests build a mock libnccl.so.2 from C (internal/ncclmock, a test
// fixture, never shipped) that implements the ABI on host memory, and run
// the real dlopen, dlsym and call paths against it: collectives on a world
// of goroutine ranks, groups, NCCL errors, hangs that the timeout aborts,
// asynchronous errors, splits by color and key, libraries that lack a
// function (ncclSend: refused; ncclCommSplit: Split refused) or report
// NCCL 3.
//
// Where a real libnccl.so.2 is at hand ($GRADCOMP_NCCL, else the
// nvidia-nccl-cu12 wheel in the venv ${GRADCOMP_VENV:-$HOME/.cache/gradcomp/torch-venv}),
// tests also load it, each in a process of its own, and check its version,
// that every function of the package's table resolves in it, and the
// failures above; with the wheel's nccl.h and a C compiler, TestHeaderABI
// compiles the package's constants, its stand-in types and the prototypes
// it calls (gcnccl.h) against the header. They skip, saying what is
// missing, where there is no real library.
package nccl
