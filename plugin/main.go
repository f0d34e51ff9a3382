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
// The CUDA library, libgradcomp_cuda.so (-tags cuda: device pointers and a
// CUDA stream), is not built yet: it needs the kernels/ package's GPU path.
// This package builds only the CPU library, libgradcomp.so.
package main

// main is never called: a c-shared library's Go runtime starts when the
// library is loaded.
func main() {}
