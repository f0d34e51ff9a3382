package fakegpu

import (
	"fmt"
	"syscall"
	"testing"
	"unsafe"

	"github.com/gradcomp/gradcomp/gpu"
)

// TestMemoryIsHost: an allocation is host memory at its address, and
// CopyIn, Copy and CopyOut move bytes through it in stream order.
func TestMemoryIsHost(t *testing.T) {
	d := platform(t, 1).Device(0)
	a, b := alloc(t, d, 8), alloc(t, d, 8)
	if err := d.CopyIn(0, a, []byte("gradcomp")); err != nil {
		t.Fatal(err)
	}
	if err := d.Copy(0, b, a, 8); err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 8)
	if err := d.CopyOut(0, out, b); err != nil {
		t.Fatal(err)
	}
	host := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(nil), uintptr(b))), 8)
	if string(out) != "gradcomp" || string(host) != "gradcomp" {
		t.Errorf("CopyOut %q, host memory %q, want %q", out, host, "gradcomp")
	}
}

// TestForeignPointer: a pointer of another device is refused, naming both
// devices, by the host view and, as a sticky fault, by stream work.
func TestForeignPointer(t *testing.T) {
	p := platform(t, 2)
	d0, d1 := p.Device(0), p.Device(1)
	theirs := alloc(t, d1, 64)
	_, err := d0.View(theirs+8, 4)
	wantErr(t, "View", err, fmt.Sprintf("pointer %#x belongs to fake device 1, used on fake device 0", theirs+8))
	if err := d0.Copy(0, alloc(t, d0, 4), theirs, 4); err != nil {
		t.Fatalf("Copy was refused at the call: %v", err)
	}
	wantErr(t, "Synchronize after the foreign Copy", d0.Synchronize(0), "Copy on stream 0x0 faulted", "belongs to fake device 1")
	wantErr(t, "Free on the other device", d0.Free(theirs), "Free", "belongs to fake device 1, used on fake device 0")
	other := platform(t, 1).Device(0)
	_, err = other.View(theirs, 4)
	wantErr(t, "View from another platform", err, "fake device 1 of another platform, used on fake device 0")
}

// TestOverrun: an access past the end of an allocation is refused, as is
// external memory that runs into an allocation.
func TestOverrun(t *testing.T) {
	d := platform(t, 1).Device(0)
	p := alloc(t, d, 100)
	if _, err := d.View(p, 100); err != nil {
		t.Fatalf("the whole allocation: %v", err)
	}
	_, err := d.View(p+96, 8)
	wantErr(t, "View past the end", err, "8 bytes at", "run 4 bytes past the end of the 100-byte allocation")
	_, err = d.View(p-16, 32)
	wantErr(t, "external memory into an allocation", err, fmt.Sprintf("run into the allocation at %#x of fake device 0", p))
}

// TestExternalMemory: memory no fake device allocated is host memory the
// caller vouches for (a CPU tensor): accepted by views and kernels.
func TestExternalMemory(t *testing.T) {
	d := platform(t, 1).Device(0)
	mem, err := syscall.Mmap(-1, 0, 4096, syscall.PROT_READ|syscall.PROT_WRITE, syscall.MAP_PRIVATE|syscall.MAP_ANON)
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Munmap(mem)
	ext := gpu.Ptr(unsafe.Pointer(&mem[0]))
	if err := d.CopyIn(0, ext, []byte{1, 2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := d.Synchronize(0); err != nil {
		t.Fatal(err)
	}
	if mem[0] != 1 || mem[2] != 3 {
		t.Errorf("external memory %v after CopyIn, want 1 2 3", mem[:3])
	}
	wantErr(t, "Free of external memory", d.Free(ext), "no fake device allocated it")
}

// TestFree: Free takes only an allocation's start, once; the device's
// resources count it.
func TestFree(t *testing.T) {
	d := platform(t, 1).Device(0)
	p := alloc(t, d, 64)
	wantErr(t, "Free inside", d.Free(p+4), "not its start")
	if got := d.Resources().Allocations; got != 1 {
		t.Errorf("%d allocations, want 1", got)
	}
	if err := d.Free(p); err != nil {
		t.Fatal(err)
	}
	wantErr(t, "second Free", d.Free(p), "no fake device allocated it")
	if got := d.Resources().Allocations; got != 0 {
		t.Errorf("%d allocations after Free, want 0", got)
	}
}
