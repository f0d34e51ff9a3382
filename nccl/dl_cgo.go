//go:build cgo

package nccl

/*
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

// The NCCL types and prototypes as the binding declares them (no NCCL
// header is needed to build): gc_enum, gc_handle, gc_unique_id and one
// gc_<symbol>_fn per function.
#include "gcnccl.h"

// The function ids; the Go constants fn* mirror them one for one.
enum {
	GC_GET_VERSION, GC_GET_UNIQUE_ID, GC_COMM_INIT_RANK, GC_COMM_DESTROY,
	GC_COMM_ABORT, GC_COMM_GET_ASYNC_ERROR, GC_ALL_REDUCE, GC_ALL_GATHER, GC_REDUCE_SCATTER, GC_BROADCAST, GC_SEND,
	GC_RECV, GC_GROUP_START, GC_GROUP_END, GC_GET_ERROR_STRING,
	GC_GET_LAST_ERROR, GC_COMM_USER_RANK, GC_COMM_COUNT, GC_COMM_SPLIT,
};

// gc_dlopen opens name (RTLD_NOW | RTLD_LOCAL, plus RTLD_NOLOAD when noload
// is set) and returns the handle, or NULL with a malloc'ed copy of
// dlerror() in *err (dlerror's buffer is per thread, so it is read here,
// on the thread that failed).
static uintptr_t gc_dlopen(const char* name, int noload, char** err) {
	dlerror();
	void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL | (noload ? RTLD_NOLOAD : 0));
	if (h == NULL) {
		const char* e = dlerror();
		*err = strdup(e != NULL ? e : "dlopen failed without a message");
	}
	return (uintptr_t)h;
}

// gc_dlsym returns the address of name in the object h, 0 when it has none.
static uintptr_t gc_dlsym(uintptr_t h, const char* name) { return (uintptr_t)dlsym((void*)h, name); }

// gc_dlhandle_path returns the file name of the object h was opened for,
// NULL when unknown.
static const char* gc_dlhandle_path(uintptr_t h) {
	struct link_map* m = NULL;
	if (dlinfo((void*)h, RTLD_DI_LINKMAP, &m) != 0 || m == NULL || m->l_name == NULL || m->l_name[0] == 0) return NULL;
	return m->l_name;
}

// gc_dlclose drops the reference dlopen took on h.
static void gc_dlclose(uintptr_t h) { dlclose((void*)h); }

// gc_dlpath returns the file name of the loaded object that holds addr.
static const char* gc_dlpath(uintptr_t addr) {
	Dl_info info;
	if (dladdr((void*)addr, &info) == 0 || info.dli_fname == NULL) return NULL;
	return info.dli_fname;
}

// gc_call calls the NCCL function fn (of kind id) with the integer and
// pointer arguments a[], the out-parameter out and the unique id in. It is
// the whole C boundary of the package's calls: every argument was checked
// in Go before. ncclCommSplit gets a NULL config: the new communicator's
// configuration is NCCL's default for a child of a[0].
static int gc_call(uintptr_t fn, int id, const uintptr_t* a, void* out, const void* in) {
	void* f = (void*)fn;
	switch (id) {
	case GC_GET_VERSION:
		return ((gc_ncclGetVersion_fn)f)((int*)out);
	case GC_GET_UNIQUE_ID:
		return ((gc_ncclGetUniqueId_fn)f)((gc_unique_id*)out);
	case GC_COMM_INIT_RANK:
		return ((gc_ncclCommInitRank_fn)f)((gc_handle*)out, (int)a[0], *(const gc_unique_id*)in, (int)a[1]);
	case GC_COMM_DESTROY:
		return ((gc_ncclCommDestroy_fn)f)((gc_handle)a[0]);
	case GC_COMM_ABORT:
		return ((gc_ncclCommAbort_fn)f)((gc_handle)a[0]);
	case GC_COMM_GET_ASYNC_ERROR:
		return ((gc_ncclCommGetAsyncError_fn)f)((gc_handle)a[0], (gc_enum*)out);
	case GC_ALL_REDUCE:
		return ((gc_ncclAllReduce_fn)f)((const void*)a[0], (void*)a[1], (size_t)a[2], (gc_enum)a[3], (gc_enum)a[4],
						(gc_handle)a[5], (gc_handle)a[6]);
	case GC_ALL_GATHER:
		return ((gc_ncclAllGather_fn)f)((const void*)a[0], (void*)a[1], (size_t)a[2], (gc_enum)a[3], (gc_handle)a[5],
						(gc_handle)a[6]);
	case GC_REDUCE_SCATTER:
		return ((gc_ncclReduceScatter_fn)f)((const void*)a[0], (void*)a[1], (size_t)a[2], (gc_enum)a[3],
						    (gc_enum)a[4], (gc_handle)a[5], (gc_handle)a[6]);
	case GC_BROADCAST:
		return ((gc_ncclBroadcast_fn)f)((const void*)a[0], (void*)a[1], (size_t)a[2], (gc_enum)a[3], (int)a[4],
						(gc_handle)a[5], (gc_handle)a[6]);
	case GC_SEND:
		return ((gc_ncclSend_fn)f)((const void*)a[0], (size_t)a[2], (gc_enum)a[3], (int)a[4], (gc_handle)a[5],
					   (gc_handle)a[6]);
	case GC_RECV:
		return ((gc_ncclRecv_fn)f)((void*)a[1], (size_t)a[2], (gc_enum)a[3], (int)a[4], (gc_handle)a[5],
					   (gc_handle)a[6]);
	case GC_GROUP_START:
		return ((gc_ncclGroupStart_fn)f)();
	case GC_GROUP_END:
		return ((gc_ncclGroupEnd_fn)f)();
	case GC_COMM_USER_RANK:
		return ((gc_ncclCommUserRank_fn)f)((gc_handle)a[0], (int*)out);
	case GC_COMM_COUNT:
		return ((gc_ncclCommCount_fn)f)((gc_handle)a[0], (int*)out);
	case GC_COMM_SPLIT:
		return ((gc_ncclCommSplit_fn)f)((gc_handle)a[0], (int)(intptr_t)a[1], (int)(intptr_t)a[2], (gc_handle*)out,
						NULL);
	}
	return -1;
}

// gc_string calls ncclGetErrorString(a) or ncclGetLastError((comm)a).
static const char* gc_string(uintptr_t fn, int id, uintptr_t a) {
	switch (id) {
	case GC_GET_ERROR_STRING:
		return ((gc_ncclGetErrorString_fn)fn)((gc_enum)a);
	case GC_GET_LAST_ERROR:
		return ((gc_ncclGetLastError_fn)fn)((gc_handle)a);
	}
	return NULL;
}

static void* gc_load_ptr(void** p) { return __atomic_load_n(p, __ATOMIC_ACQUIRE); }

// gc_cuda_bind makes device ordinal's primary context current on the
// calling thread with the driver API functions fns (cuInit,
// cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent; CUresult is an
// int enum, CUdevice an int, CUcontext a pointer). It returns the CUresult
// and, in *step, the index of the function that failed.
static int gc_cuda_bind(const uintptr_t* fns, int ordinal, int* step) {
	int dev = 0;
	void* ctx = NULL;
	int r;
	*step = 0;
	if ((r = ((int (*)(unsigned))fns[0])(0)) != 0) return r;
	*step = 1;
	if ((r = ((int (*)(int*, int))fns[1])(&dev, ordinal)) != 0) return r;
	*step = 2;
	if ((r = ((int (*)(void**, int))fns[2])(&ctx, dev)) != 0) return r;
	*step = 3;
	return ((int (*)(void*))fns[3])(ctx);
}

// gc_cuda_name calls cuGetErrorName(code); NULL when it fails.
static const char* gc_cuda_name(uintptr_t fn, int code) {
	const char* s = NULL;
	if (((int (*)(int, const char**))fn)(code, &s) != 0) return NULL;
	return s;
}
*/
import "C"

import (
	"unsafe"
)

// The C function ids must equal the Go ones (fnID): each pair of array
// types below has a negative length, and fails to compile, otherwise.
var (
	_ [C.GC_COMM_INIT_RANK - int(fnCommInitRank)]struct{}
	_ [int(fnCommInitRank) - C.GC_COMM_INIT_RANK]struct{}
	_ [C.GC_ALL_REDUCE - int(fnAllReduce)]struct{}
	_ [int(fnAllReduce) - C.GC_ALL_REDUCE]struct{}
	_ [C.GC_RECV - int(fnRecv)]struct{}
	_ [int(fnRecv) - C.GC_RECV]struct{}
	_ [C.GC_GET_LAST_ERROR - int(fnGetLastError)]struct{}
	_ [int(fnGetLastError) - C.GC_GET_LAST_ERROR]struct{}
	_ [C.GC_COMM_SPLIT - int(fnCommSplit)]struct{}
	_ [int(fnCommSplit) - C.GC_COMM_SPLIT]struct{}
)

// cgoEnabled says whether the package can load a library at all.
const cgoEnabled = true

// dlopen opens a shared object (see gc_dlopen) and returns its handle.
func dlopen(name string, noload bool) (uintptr, error) {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	var cerr *C.char
	h := C.gc_dlopen(cname, boolInt(noload), &cerr)
	if h == 0 {
		msg := C.GoString(cerr)
		C.free(unsafe.Pointer(cerr))
		return 0, dlError(msg)
	}
	return uintptr(h), nil
}

// dlsym returns the address of name in the object h, 0 when it has none.
func dlsym(h uintptr, name string) uintptr {
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	return uintptr(C.gc_dlsym(C.uintptr_t(h), cname))
}

// dlhandlePath returns the file the object h was opened from, "" when
// unknown.
func dlhandlePath(h uintptr) string {
	p := C.gc_dlhandle_path(C.uintptr_t(h))
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// dlclose drops the reference dlopen took on h; the object is unloaded
// when no other reference holds it.
func dlclose(h uintptr) { C.gc_dlclose(C.uintptr_t(h)) }

// dlpath returns the file that holds the symbol at addr, "" when unknown.
func dlpath(addr uintptr) string {
	p := C.gc_dlpath(C.uintptr_t(addr))
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// ccall calls fn (of kind id) with the arguments a, the out-parameter out
// (nil, C memory, or Go memory holding no Go pointers) and the 128-byte
// unique id in (nil unless id is fnCommInitRank), and returns its result.
// A negative int argument travels as uintptr(int64(v)) and comes back
// intact in C.
func ccall(fn uintptr, id fnID, a *[7]uintptr, out, in unsafe.Pointer) Result {
	return Result(C.gc_call(C.uintptr_t(fn), C.int(id), (*C.uintptr_t)(unsafe.Pointer(a)), out, in))
}

// cstring calls ncclGetErrorString or ncclGetLastError and copies the
// string; "" when it returned NULL.
func cstring(fn uintptr, id fnID, arg uintptr) string {
	p := C.gc_string(C.uintptr_t(fn), C.int(id), C.uintptr_t(arg))
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

// commSlot is C memory holding the ncclComm_t that ncclCommInitRank or
// ncclCommSplit writes, so that a watchdog can read it while the call is
// still running, and a call left blocked can still write it.
type commSlot struct{ p unsafe.Pointer }

func newCommSlot() commSlot {
	return commSlot{C.calloc(1, C.size_t(unsafe.Sizeof(uintptr(0))))}
}

// ptr returns the slot's address, for the call's out-parameter.
func (s commSlot) ptr() unsafe.Pointer { return s.p }

// load reads the communicator the call has written so far (0 when none).
func (s commSlot) load() uintptr { return uintptr(C.gc_load_ptr((*unsafe.Pointer)(s.p))) }

// free releases the slot.
func (s commSlot) free() { C.free(s.p) }

// cudaBind calls gc_cuda_bind: fns are cuInit, cuDeviceGet,
// cuDevicePrimaryCtxRetain and cuCtxSetCurrent. It returns the CUresult and
// the index of the function that failed.
func cudaBind(fns *[4]uintptr, ordinal int) (code, step int) {
	var cstep C.int
	r := C.gc_cuda_bind((*C.uintptr_t)(unsafe.Pointer(fns)), C.int(ordinal), &cstep)
	return int(r), int(cstep)
}

// cudaErrorName calls cuGetErrorName; "" when it fails.
func cudaErrorName(fn uintptr, code int) string {
	p := C.gc_cuda_name(C.uintptr_t(fn), C.int(code))
	if p == nil {
		return ""
	}
	return C.GoString(p)
}

func boolInt(b bool) C.int {
	if b {
		return 1
	}
	return 0
}
