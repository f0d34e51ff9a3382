// Command plugin is libgradcomp.so, gradcomp's C ABI, built with
//
//	go build -buildmode=c-shared -o build/libgradcomp.so ./plugin
//
// (`make plugin`). The contract is the hand-written header
// include/gradcomp.h; this package holds only its //export functions and the
// bookkeeping they need (live handles, the last-error string, the mapping of
// compress's typed errors to status codes). Everything else is compress/ and
// overlap/.
//
// Every export recovers a Go panic into GC_ERR_INTERNAL, validates each
// argument before touching memory and reports a failure as a status code plus
// a message in the calling thread's last-error buffer (C storage, see
// lasterror.c), so C never sees a Go panic or a Go pointer.
//
// With -tags cuda the same package is libgradcomp_cuda.so:
//
//	go build -tags cuda -buildmode=c-shared -o build/libgradcomp_cuda.so ./plugin
//
// It links libcuda.so.1 (kernels/ and devptr_cuda.go) and runs the device
// calls (gc_compress_device and the gc_decompress*_device calls,
// device.go) on the GPU; in libgradcomp.so they return GC_ERR_NOCUDA.
// Loading either library never touches a GPU: the driver is initialized on
// the first device call.
package main

// main is never called: a c-shared library's Go runtime starts when the
// library is loaded.
func main() {}
