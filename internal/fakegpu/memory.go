package fakegpu

import (
	"fmt"
	"os"
	"syscall"
	"unsafe"

	"github.com/gradcomp/gradcomp/gpu"
)

// allocation is one Alloc: size bytes at base, in a private anonymous
// mapping (mem, rounded up to pages).
type allocation struct {
	dev  *Device
	base uintptr
	size int
	mem  []byte
}

// unmap returns the allocation's pages to the system.
func (a *allocation) unmap() {
	if err := syscall.Munmap(a.mem); err != nil {
		panic(fmt.Sprintf("fakegpu: munmap of %d bytes at %#x on %s: %v", len(a.mem), a.base, a.dev, err))
	}
}

// Alloc maps bytes of zeroed host memory, outside the Go heap, for the
// device and returns its address.
func (d *Device) Alloc(bytes int) (gpu.Ptr, error) {
	if err := d.err("Alloc"); err != nil {
		return 0, err
	}
	if bytes <= 0 {
		return 0, fmt.Errorf("fakegpu: Alloc(%d) on %s: the size must be positive", bytes, d)
	}
	page := os.Getpagesize()
	mem, err := syscall.Mmap(-1, 0, (bytes+page-1)/page*page, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		return 0, fmt.Errorf("fakegpu: Alloc(%d) on %s: mmap: %w", bytes, d, err)
	}
	a := &allocation{dev: d, base: uintptr(unsafe.Pointer(&mem[0])), size: bytes, mem: mem}
	reg.add(a)
	return gpu.Ptr(a.base), nil
}

// Free unmaps the allocation at p, once the device's streams have run the
// work enqueued so far (cudaFree synchronizes too). p must be an address
// Alloc returned on this device and not freed since.
func (d *Device) Free(p gpu.Ptr) error {
	if err := d.err("Free"); err != nil {
		return err
	}
	in, _ := reg.locate(uintptr(p))
	switch {
	case in == nil:
		return fmt.Errorf("fakegpu: Free(%#x) on %s: no fake device allocated it", p, d)
	case in.dev != d:
		return fmt.Errorf("fakegpu: Free: %w", d.foreign("pointer", uintptr(p), in.dev))
	case in.base != uintptr(p):
		return fmt.Errorf("fakegpu: Free(%#x) on %s: inside the allocation at %#x, not its start", p, d, in.base)
	}
	d.synchronize()
	reg.remove(in.base).unmap()
	return d.err("Free")
}

// View returns the n bytes at p as a Go slice, after the checks of every
// access (see the package doc): host code's view of device memory, as
// unified memory gives one on a GPU. It does not wait for any stream.
func (d *Device) View(p gpu.Ptr, n int) ([]byte, error) {
	switch {
	case n < 0:
		return nil, fmt.Errorf("negative length %d at %#x on %s", n, p, d)
	case n == 0:
		return nil, nil
	case p == 0:
		return nil, fmt.Errorf("null pointer for %d bytes on %s", n, d)
	}
	if err := reg.check(d, uintptr(p), n); err != nil {
		return nil, err
	}
	return unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), uintptr(p))), n), nil
}

// fault is the panic by which work on a stream reports its failure to the
// stream (see run): the device's sticky error.
type fault struct{ err error }

// throw ends the running stream work with err.
func throw(err error) { panic(fault{err}) }

// bytes is View for stream work: a failure is a fault.
func (d *Device) bytes(p gpu.Ptr, n int) []byte {
	b, err := d.View(p, n)
	if err != nil {
		throw(err)
	}
	return b
}

// floats is bytes for n float32 elements.
func (d *Device) floats(p gpu.Ptr, n int) []float32 {
	b := d.bytes(p, 4*n)
	if n == 0 {
		return nil
	}
	return unsafe.Slice((*float32)(unsafe.Pointer(&b[0])), n)
}

// CopyIn enqueues on s a copy of src (taken now) to dst.
func (d *Device) CopyIn(s gpu.Stream, dst gpu.Ptr, src []byte) error {
	data := append([]byte(nil), src...)
	return d.launch("CopyIn", s, func() { copy(d.bytes(dst, len(data)), data) })
}

// Copy enqueues on s a copy of bytes from src to dst.
func (d *Device) Copy(s gpu.Stream, dst, src gpu.Ptr, bytes int) error {
	return d.launch("Copy", s, func() { copy(d.bytes(dst, bytes), d.bytes(src, bytes)) })
}

// CopyOut waits for the work enqueued on s so far, then copies len(dst)
// bytes at src to dst.
func (d *Device) CopyOut(s gpu.Stream, dst []byte, src gpu.Ptr) error {
	if err := d.Synchronize(s); err != nil {
		return err
	}
	b, err := d.View(src, len(dst))
	if err != nil {
		return fmt.Errorf("fakegpu: CopyOut: %w", err)
	}
	copy(dst, b)
	return nil
}
