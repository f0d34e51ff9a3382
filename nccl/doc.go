// Package nccl is a binding of NVIDIA's NCCL (libnccl.so.2) loaded at run
// time with dlopen, so it builds, and its tests run, on machines without
// NCCL, CUDA or a GPU; a missing library is an ordinary error from Open.
// No NCCL header is needed: the few types of nccl.h 2.x it uses are
// declared here (ncclResult_t, ncclDataType_t and ncclRedOp_t are int
// enums, ncclComm_t and cudaStream_t pointers, ncclUniqueId 128 bytes).
//
//	lib, err := nccl.Open()                  // the process's copy if one is loaded (PyTorch's), else $GRADCOMP_NCCL, else libnccl.so.2
//	id, err := lib.GetUniqueID()             // on one rank; send id to the others (UniqueID.String / ParseUniqueID, or a comm.Comm broadcast)
//	c, err := lib.InitRank(ctx, n, id, rank, nccl.WithTimeout(time.Minute))
//	err = c.Run(ctx, nccl.AllReduce(buf, buf, count, nccl.Float32, nccl.Sum, stream))
//	err = c.Wait(ctx, eventDone)             // optional: host waits for the stream's work, polling async errors
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
// # Testing without a GPU
//
// The tests build a mock libnccl.so.2 from C (internal/ncclmock, a test
// fixture, never shipped) that implements the ABI on host memory, and run
// the real dlopen, dlsym and call paths against it: collectives on a world
// of goroutine ranks, groups, NCCL errors, hangs that the timeout aborts,
// asynchronous errors.
package nccl
