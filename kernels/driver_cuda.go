//go:build cuda

package kernels

/*
#cgo LDFLAGS: -lcuda
#include <cuda.h>
#include <stdint.h>
#include <stdlib.h>

// Every shim makes the context current on the calling OS thread first: a
// cgo call runs on one thread from start to end, and the primary context
// is the one the CUDA runtime (PyTorch) uses, so this changes nothing for
// other users of the thread.
#define CUR(ctx) do { CUresult r_ = cuCtxSetCurrent((CUcontext)(ctx)); if (r_) return r_; } while (0)

static CUresult gc_open(int ordinal, uintptr_t *dev, uintptr_t *ctx) {
	CUdevice d;
	CUcontext c;
	CUresult r = cuInit(0);
	if (r) return r;
	if ((r = cuDeviceGet(&d, ordinal))) return r;
	if ((r = cuDevicePrimaryCtxRetain(&c, d))) return r;
	*dev = (uintptr_t)d;
	*ctx = (uintptr_t)c;
	return cuCtxSetCurrent(c);
}
static CUresult gc_close(uintptr_t dev) { return cuDevicePrimaryCtxRelease((CUdevice)dev); }
static CUresult gc_info(uintptr_t dev, char *name, int len, int *major, int *minor, size_t *mem) {
	CUresult r = cuDeviceGetName(name, len, (CUdevice)dev);
	if (r) return r;
	if ((r = cuDeviceGetAttribute(major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, (CUdevice)dev))) return r;
	if ((r = cuDeviceGetAttribute(minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, (CUdevice)dev))) return r;
	return cuDeviceTotalMem(mem, (CUdevice)dev);
}
static CUresult gc_module(uintptr_t ctx, const char *ptx, uintptr_t *mod) {
	CUmodule m;
	CUR(ctx);
	CUresult r = cuModuleLoadData(&m, ptx);
	*mod = (uintptr_t)m;
	return r;
}
static CUresult gc_unload(uintptr_t ctx, uintptr_t mod) { CUR(ctx); return cuModuleUnload((CUmodule)mod); }
static CUresult gc_function(uintptr_t ctx, uintptr_t mod, const char *name, uintptr_t *fn) {
	CUfunction f;
	CUR(ctx);
	CUresult r = cuModuleGetFunction(&f, (CUmodule)mod, name);
	*fn = (uintptr_t)f;
	return r;
}
static CUresult gc_launch(uintptr_t ctx, uintptr_t fn, unsigned grid, unsigned block, uintptr_t stream,
                          unsigned long long *args, int nargs) {
	void *ptrs[32];
	if (nargs > 32) return CUDA_ERROR_INVALID_VALUE;
	for (int i = 0; i < nargs; i++) ptrs[i] = &args[i];
	CUR(ctx);
	return cuLaunchKernel((CUfunction)fn, grid, 1, 1, block, 1, 1, 0, (CUstream)stream, ptrs, NULL);
}
static CUresult gc_memset32(uintptr_t ctx, uintptr_t p, unsigned v, size_t n, uintptr_t s) {
	CUR(ctx);
	return cuMemsetD32Async((CUdeviceptr)p, v, n, (CUstream)s);
}
static CUresult gc_alloc(uintptr_t ctx, size_t n, uintptr_t *p) {
	CUdeviceptr d;
	CUR(ctx);
	CUresult r = cuMemAlloc(&d, n);
	*p = (uintptr_t)d;
	return r;
}
static CUresult gc_free(uintptr_t ctx, uintptr_t p) { CUR(ctx); return cuMemFree((CUdeviceptr)p); }
static CUresult gc_htod(uintptr_t ctx, uintptr_t dst, const void *src, size_t n, uintptr_t s) {
	CUR(ctx);
	return cuMemcpyHtoDAsync((CUdeviceptr)dst, src, n, (CUstream)s);
}
static CUresult gc_dtoh(uintptr_t ctx, void *dst, uintptr_t src, size_t n, uintptr_t s) {
	CUR(ctx);
	CUresult r = cuMemcpyDtoHAsync(dst, (CUdeviceptr)src, n, (CUstream)s);
	if (r) return r;
	return cuStreamSynchronize((CUstream)s); // dst is Go memory: done before returning
}
static CUresult gc_dtod(uintptr_t ctx, uintptr_t dst, uintptr_t src, size_t n, uintptr_t s) {
	CUR(ctx);
	return cuMemcpyDtoDAsync((CUdeviceptr)dst, (CUdeviceptr)src, n, (CUstream)s);
}
static CUresult gc_stream(uintptr_t ctx, uintptr_t *s) {
	CUstream st;
	CUR(ctx);
	CUresult r = cuStreamCreate(&st, CU_STREAM_NON_BLOCKING);
	*s = (uintptr_t)st;
	return r;
}
static CUresult gc_stream_destroy(uintptr_t ctx, uintptr_t s) { CUR(ctx); return cuStreamDestroy((CUstream)s); }
static CUresult gc_stream_sync(uintptr_t ctx, uintptr_t s) { CUR(ctx); return cuStreamSynchronize((CUstream)s); }
static CUresult gc_event(uintptr_t ctx, int timing, uintptr_t *e) {
	CUevent ev;
	CUR(ctx);
	CUresult r = cuEventCreate(&ev, timing ? CU_EVENT_DEFAULT : CU_EVENT_DISABLE_TIMING);
	*e = (uintptr_t)ev;
	return r;
}
static CUresult gc_event_destroy(uintptr_t ctx, uintptr_t e) { CUR(ctx); return cuEventDestroy((CUevent)e); }
static CUresult gc_record(uintptr_t ctx, uintptr_t e, uintptr_t s) { CUR(ctx); return cuEventRecord((CUevent)e, (CUstream)s); }
static CUresult gc_wait(uintptr_t ctx, uintptr_t s, uintptr_t e) { CUR(ctx); return cuStreamWaitEvent((CUstream)s, (CUevent)e, 0); }
static CUresult gc_event_query(uintptr_t ctx, uintptr_t e) { CUR(ctx); return cuEventQuery((CUevent)e); }
static CUresult gc_event_sync(uintptr_t ctx, uintptr_t e) { CUR(ctx); return cuEventSynchronize((CUevent)e); }
static CUresult gc_elapsed(uintptr_t ctx, uintptr_t a, uintptr_t b, float *ms) {
	CUR(ctx);
	return cuEventElapsedTime(ms, (CUevent)a, (CUevent)b);
}
static const char *gc_error_name(CUresult r) {
	const char *s = NULL;
	if (cuGetErrorName(r, &s) != CUDA_SUCCESS || s == NULL) return "unknown CUresult";
	return s;
}
*/
import "C"

import (
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/gradcomp/gradcomp/gpu"
)

// Context is a device's primary context (cuDevicePrimaryCtxRetain: the one
// the CUDA runtime and PyTorch use, so their pointers and streams are valid
// here) with gradcomp's PTX modules loaded. It is safe for concurrent use.
type Context struct {
	info    DeviceInfo
	dev     C.uintptr_t
	ctx     C.uintptr_t
	mu      sync.Mutex
	closed  bool
	modules []C.uintptr_t
	fns     map[string]C.uintptr_t
}

// check turns a CUresult into nil or a *DriverError naming call.
func check(call string, r C.CUresult) error {
	if r == C.CUDA_SUCCESS {
		return nil
	}
	return &DriverError{Call: call, Code: int(r), Name: C.GoString(C.gc_error_name(r))}
}

// Open retains the primary context of device ordinal and loads the
// kernels' modules (the driver JIT-compiles the PTX for the device on first
// use and caches it). With no usable device the error wraps ErrNoDevice.
func Open(ordinal int) (*Context, error) {
	c := &Context{fns: map[string]C.uintptr_t{}}
	if r := C.gc_open(C.int(ordinal), &c.dev, &c.ctx); r != C.CUDA_SUCCESS {
		return nil, fmt.Errorf("%w: device %d: %w", ErrNoDevice, ordinal, check("cuInit/cuDevicePrimaryCtxRetain", r))
	}
	var name [256]C.char
	var major, minor C.int
	var mem C.size_t
	if err := check("cuDeviceGetName/Attribute", C.gc_info(c.dev, &name[0], C.int(len(name)), &major, &minor, &mem)); err != nil {
		C.gc_close(c.dev)
		return nil, err
	}
	c.info = DeviceInfo{Ordinal: ordinal, Name: C.GoString(&name[0]), Major: int(major), Minor: int(minor), Memory: int64(mem)}
	names, texts := ptxModules()
	for i, text := range texts {
		src := C.CString(string(text))
		var m C.uintptr_t
		r := C.gc_module(c.ctx, src, &m)
		C.free(unsafe.Pointer(src))
		if err := check("cuModuleLoadData("+names[i]+")", r); err != nil {
			c.Close()
			return nil, err
		}
		c.modules = append(c.modules, m)
	}
	return c, nil
}

// Info describes the context's device.
func (c *Context) Info() DeviceInfo { return c.info }

// Close unloads the modules and releases the primary context. Device
// memory allocated through the context must have been freed; streams and
// events destroyed. Later calls return an error.
func (c *Context) Close() error {
	if c == nil {
		return nil
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var first error
	for _, m := range c.modules {
		if err := check("cuModuleUnload", C.gc_unload(c.ctx, m)); err != nil && first == nil {
			first = err
		}
	}
	if err := check("cuDevicePrimaryCtxRelease", C.gc_close(c.dev)); err != nil && first == nil {
		first = err
	}
	return first
}

// live returns an error for a nil or closed context.
func (c *Context) live(op string) error {
	if c == nil {
		return &ArgumentError{Op: op, Reason: "nil context"}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return &ArgumentError{Op: op, Reason: "context is closed"}
	}
	return nil
}

// function returns the kernel entry point name from the loaded modules.
func (c *Context) function(name string) (C.uintptr_t, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if f, ok := c.fns[name]; ok {
		return f, nil
	}
	cname := C.CString(name)
	defer C.free(unsafe.Pointer(cname))
	for _, m := range c.modules {
		var f C.uintptr_t
		if C.gc_function(c.ctx, m, cname, &f) == C.CUDA_SUCCESS {
			c.fns[name] = f
			return f, nil
		}
	}
	return 0, &ArgumentError{Op: "launch", Reason: "no kernel " + name + " in the embedded PTX"}
}

// run enqueues plan on s.
func (c *Context) run(s gpu.Stream, plan []step) error {
	if err := c.live("run"); err != nil {
		return err
	}
	for _, st := range plan {
		if st.fn == "" {
			if err := check("cuMemsetD32Async", C.gc_memset32(c.ctx, C.uintptr_t(st.ptr), C.uint(st.val), C.size_t(st.count), C.uintptr_t(s))); err != nil {
				return err
			}
			continue
		}
		f, err := c.function(st.fn)
		if err != nil {
			return err
		}
		args := st.args
		if len(args) == 0 {
			args = []uint64{0}
		}
		r := C.gc_launch(c.ctx, f, C.uint(st.grid), C.uint(st.block), C.uintptr_t(s), (*C.ulonglong)(unsafe.Pointer(&args[0])), C.int(len(st.args)))
		if err := check("cuLaunchKernel("+st.fn+")", r); err != nil {
			return err
		}
	}
	return nil
}

// Alloc returns bytes (> 0) of device memory, 256-byte aligned.
func (c *Context) Alloc(bytes int) (gpu.Ptr, error) {
	if err := c.live("Alloc"); err != nil {
		return 0, err
	}
	if bytes <= 0 {
		return 0, &ArgumentError{Op: "Alloc", Reason: fmt.Sprintf("size %d is not positive", bytes)}
	}
	var p C.uintptr_t
	if err := check(fmt.Sprintf("cuMemAlloc(%d)", bytes), C.gc_alloc(c.ctx, C.size_t(bytes), &p)); err != nil {
		return 0, err
	}
	return gpu.Ptr(p), nil
}

// Free releases memory from Alloc; Free(0) does nothing.
func (c *Context) Free(p gpu.Ptr) error {
	if p == 0 {
		return nil
	}
	if err := c.live("Free"); err != nil {
		return err
	}
	return check("cuMemFree", C.gc_free(c.ctx, C.uintptr_t(p)))
}

// CopyIn copies src to device address dst, ordered on stream s. It returns
// once src may be reused (the driver stages pageable memory); the device
// copy itself may still be in flight on s.
func (c *Context) CopyIn(s gpu.Stream, dst gpu.Ptr, src []byte) error {
	if len(src) == 0 {
		return nil
	}
	if err := c.live("CopyIn"); err != nil {
		return err
	}
	return check("cuMemcpyHtoDAsync", C.gc_htod(c.ctx, C.uintptr_t(dst), unsafe.Pointer(&src[0]), C.size_t(len(src)), C.uintptr_t(s)))
}

// CopyOut copies len(dst) bytes from device address src, ordered on stream
// s, and waits for s: it synchronizes the host with s, by its nature.
func (c *Context) CopyOut(s gpu.Stream, dst []byte, src gpu.Ptr) error {
	if len(dst) == 0 {
		return nil
	}
	if err := c.live("CopyOut"); err != nil {
		return err
	}
	return check("cuMemcpyDtoHAsync", C.gc_dtoh(c.ctx, unsafe.Pointer(&dst[0]), C.uintptr_t(src), C.size_t(len(dst)), C.uintptr_t(s)))
}

// Copy enqueues a device-to-device copy of bytes on s.
func (c *Context) Copy(s gpu.Stream, dst, src gpu.Ptr, bytes int) error {
	if err := c.live("Copy"); err != nil {
		return err
	}
	return check("cuMemcpyDtoDAsync", C.gc_dtod(c.ctx, C.uintptr_t(dst), C.uintptr_t(src), C.size_t(bytes), C.uintptr_t(s)))
}

// NewStream creates a non-blocking stream (it does not synchronize with
// the legacy default stream).
func (c *Context) NewStream() (gpu.Stream, error) {
	if err := c.live("NewStream"); err != nil {
		return 0, err
	}
	var s C.uintptr_t
	err := check("cuStreamCreate", C.gc_stream(c.ctx, &s))
	return gpu.Stream(s), err
}

// DestroyStream destroys a stream from NewStream.
func (c *Context) DestroyStream(s gpu.Stream) error {
	if err := c.live("DestroyStream"); err != nil {
		return err
	}
	return check("cuStreamDestroy", C.gc_stream_destroy(c.ctx, C.uintptr_t(s)))
}

// Synchronize waits until the device has finished the work enqueued on s.
func (c *Context) Synchronize(s gpu.Stream) error {
	if err := c.live("Synchronize"); err != nil {
		return err
	}
	return check("cuStreamSynchronize", C.gc_stream_sync(c.ctx, C.uintptr_t(s)))
}

// NewEvent creates an event; timing events can be measured with Elapsed.
func (c *Context) NewEvent(timing bool) (gpu.Event, error) {
	if err := c.live("NewEvent"); err != nil {
		return 0, err
	}
	t := C.int(0)
	if timing {
		t = 1
	}
	var e C.uintptr_t
	err := check("cuEventCreate", C.gc_event(c.ctx, t, &e))
	return gpu.Event(e), err
}

// DestroyEvent destroys an event from NewEvent.
func (c *Context) DestroyEvent(e gpu.Event) error {
	if err := c.live("DestroyEvent"); err != nil {
		return err
	}
	return check("cuEventDestroy", C.gc_event_destroy(c.ctx, C.uintptr_t(e)))
}

// Record enqueues e on s: it completes when the work before it on s has.
func (c *Context) Record(e gpu.Event, s gpu.Stream) error {
	if err := c.live("Record"); err != nil {
		return err
	}
	return check("cuEventRecord", C.gc_record(c.ctx, C.uintptr_t(e), C.uintptr_t(s)))
}

// WaitEvent makes the work enqueued on s after this call wait for e's
// completion, without blocking the host (cuStreamWaitEvent).
func (c *Context) WaitEvent(s gpu.Stream, e gpu.Event) error {
	if err := c.live("WaitEvent"); err != nil {
		return err
	}
	return check("cuStreamWaitEvent", C.gc_wait(c.ctx, C.uintptr_t(s), C.uintptr_t(e)))
}

// EventQuery reports, without blocking, whether e has completed
// (cuEventQuery: CUDA_ERROR_NOT_READY is false, not an error). An event
// never recorded counts as completed.
func (c *Context) EventQuery(e gpu.Event) (bool, error) {
	if err := c.live("EventQuery"); err != nil {
		return false, err
	}
	switch r := C.gc_event_query(c.ctx, C.uintptr_t(e)); r {
	case C.CUDA_SUCCESS:
		return true, nil
	case C.CUDA_ERROR_NOT_READY:
		return false, nil
	default:
		return false, check("cuEventQuery", r)
	}
}

// EventSynchronize blocks the host until e has completed.
func (c *Context) EventSynchronize(e gpu.Event) error {
	if err := c.live("EventSynchronize"); err != nil {
		return err
	}
	return check("cuEventSynchronize", C.gc_event_sync(c.ctx, C.uintptr_t(e)))
}

// Elapsed returns the device time between two completed timing events.
func (c *Context) Elapsed(start, end gpu.Event) (time.Duration, error) {
	if err := c.live("Elapsed"); err != nil {
		return 0, err
	}
	var ms C.float
	if err := check("cuEventElapsedTime", C.gc_elapsed(c.ctx, C.uintptr_t(start), C.uintptr_t(end), &ms)); err != nil {
		return 0, err
	}
	return time.Duration(float64(ms) * float64(time.Millisecond)), nil
}
