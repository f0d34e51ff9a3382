package fakegpu

import (
	"testing"

	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/kernels"
)

// flushArgs returns Flush's arguments for 4 elements on d: grad 1 2 3 4,
// residual 10 20 30 40.
func flushArgs(t *testing.T, d *Device) kernels.FlushArgs {
	t.Helper()
	a := kernels.FlushArgs{Grad: alloc(t, d, 16), Resid: alloc(t, d, 16), ResidOut: alloc(t, d, 16), N: 4}
	d.CopyIn(0, a.Grad, f32.Bytes([]float32{1, 2, 3, 4}))
	d.CopyIn(0, a.Resid, f32.Bytes([]float32{10, 20, 30, 40}))
	return a
}

// TestKernelOnDeviceMemory: a kernel reads and writes the device's memory
// in stream order (Flush: grad += resid, resid out zeroed).
func TestKernelOnDeviceMemory(t *testing.T) {
	d := platform(t, 1).Device(0)
	a := flushArgs(t, d)
	d.CopyIn(0, a.ResidOut, f32.Bytes([]float32{9, 9, 9, 9}))
	if err := d.Flush(0, a); err != nil {
		t.Fatal(err)
	}
	grad, out := make([]float32, 4), make([]float32, 4)
	if err := d.CopyOut(0, f32.Bytes(grad), a.Grad); err != nil {
		t.Fatal(err)
	}
	d.CopyOut(0, f32.Bytes(out), a.ResidOut)
	if grad[0] != 11 || grad[3] != 44 || out[0] != 0 || out[3] != 0 {
		t.Errorf("after Flush grad %v, resid out %v; want 11 22 33 44 and zeros", grad, out)
	}
}

// TestScale: Scale multiplies in place, in stream order, by ScaleStep's
// rule.
func TestScale(t *testing.T) {
	d := platform(t, 1).Device(0)
	x := alloc(t, d, 16)
	d.CopyIn(0, x, f32.Bytes([]float32{1, -2, 3, 0.1}))
	if err := d.Scale(0, kernels.ScaleArgs{X: x, N: 3, C: 0.5}); err != nil {
		t.Fatal(err)
	}
	got := make([]float32, 4)
	if err := d.CopyOut(0, f32.Bytes(got), x); err != nil {
		t.Fatal(err)
	}
	if want := []float32{0.5, -1, 1.5, 0.1}; got[0] != want[0] || got[1] != want[1] || got[2] != want[2] || got[3] != want[3] {
		t.Errorf("after Scale %v, want %v (the fourth element untouched)", got, want)
	}
}
