package devresid

import (
	"bytes"
	"errors"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/internal/fakegpu"
)

// device returns a fake device, its platform closed at the test's end.
func device(t *testing.T) *fakegpu.Device {
	t.Helper()
	p := fakegpu.New(1)
	t.Cleanup(p.Close)
	return p.Device(0)
}

// newResidual makes a residual of n elements on d, freed at the test's end.
func newResidual(t *testing.T, d Device, n int) *Residual {
	t.Helper()
	r, err := New(d, 0, n)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := r.Free(); err != nil {
			t.Error(err)
		}
	})
	return r
}

// write copies v to p.
func write(t *testing.T, d Device, p gpu.Ptr, v []float32) {
	t.Helper()
	if err := d.CopyIn(0, p, f32.Bytes(v)); err != nil {
		t.Fatal(err)
	}
}

// hostMemory returns empty host error-feedback memory.
func hostMemory(t *testing.T) *compress.ErrorFeedback {
	t.Helper()
	c, err := compress.Parse("int8")
	if err != nil {
		t.Fatal(err)
	}
	return compress.NewErrorFeedback(c)
}

// saved returns r's memory as a host residual.
func saved(t *testing.T, r *Residual) []float32 {
	t.Helper()
	f := hostMemory(t)
	if err := r.SaveTo(0, f, 7); err != nil {
		t.Fatal(err)
	}
	return f.Residual(7)
}

// TestSettle: a new memory is zero; Commit installs Out, Retain the sum,
// and leaving both alone keeps e; the buffers only change places.
func TestSettle(t *testing.T) {
	d := device(t)
	for _, tc := range []struct {
		name   string
		settle func(*Residual)
		want   []float32
	}{
		{"commit", (*Residual).Commit, []float32{2, 2, 2}},
		{"retain", (*Residual).Retain, []float32{3, 3, 3}},
		{"discard", func(*Residual) {}, []float32{0, 0, 0}},
	} {
		r := newResidual(t, d, 3)
		sum, err := r.Sum()
		if err != nil {
			t.Fatal(err)
		}
		if again, _ := r.Sum(); again != sum {
			t.Fatalf("%s: Sum allocated a second buffer", tc.name)
		}
		e, out := r.Ptr(), r.Out()
		write(t, d, out, []float32{2, 2, 2})
		write(t, d, sum, []float32{3, 3, 3})
		tc.settle(r)
		if got := saved(t, r); !bytes.Equal(f32.Bytes(got), f32.Bytes(tc.want)) {
			t.Errorf("%s: memory %v, want %v", tc.name, got, tc.want)
		}
		if got := map[gpu.Ptr]bool{r.Ptr(): true, r.Out(): true, r.sum: true}; len(got) != 3 || !got[e] || !got[out] || !got[sum] {
			t.Errorf("%s: buffers %#x, %#x, %#x; want %#x, %#x, %#x in some order", tc.name, r.Ptr(), r.Out(), r.sum, e, out, sum)
		}
	}
}

// TestRetainWithoutSum keeps e, and a nil Residual is no memory.
func TestRetainWithoutSum(t *testing.T) {
	r := newResidual(t, device(t), 2)
	e := r.Ptr()
	if r.Retain(); r.Ptr() != e {
		t.Error("Retain without a sum buffer replaced e")
	}
	var none *Residual
	if none.Commit(); none.Ptr() != 0 || none.Out() != 0 {
		t.Error("a nil Residual has buffers")
	}
}

// TestLoadSave: LoadFrom and SaveTo move a host residual to the device
// and back; a bucket the host lacks loads as zeros; a length mismatch is a
// SizeError.
func TestLoadSave(t *testing.T) {
	d := device(t)
	r := newResidual(t, d, 3)
	f := hostMemory(t)
	if err := f.SetResidual(7, []float32{1, -2, 3}); err != nil {
		t.Fatal(err)
	}
	if err := r.LoadFrom(0, f, 7); err != nil {
		t.Fatal(err)
	}
	if got := saved(t, r); !bytes.Equal(f32.Bytes(got), f32.Bytes([]float32{1, -2, 3})) {
		t.Errorf("loaded and saved %v, want [1 -2 3]", got)
	}
	if err := r.LoadFrom(0, f, 8); err != nil {
		t.Fatal(err)
	}
	if got := saved(t, r); !bytes.Equal(f32.Bytes(got), make([]byte, 12)) {
		t.Errorf("a bucket the host lacks loaded as %v, want zeros", got)
	}
	var size *compress.SizeError
	if err := newResidual(t, d, 4).LoadFrom(0, f, 7); !errors.As(err, &size) || size.Got != 3 || size.Want != 4 {
		t.Errorf("loading 3 elements into 4: %v, want a SizeError", err)
	}
}

// TestFree releases every buffer, the sum's too, once.
func TestFree(t *testing.T) {
	d := device(t)
	before := d.Resources()
	r, err := New(d, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Sum(); err != nil {
		t.Fatal(err)
	}
	if err := r.Free(); err != nil {
		t.Fatal(err)
	}
	if err := r.Free(); err != nil {
		t.Errorf("a second Free: %v", err)
	}
	if after := d.Resources(); after != before {
		t.Errorf("resources %+v after Free, %+v before New", after, before)
	}
}
