//go:build !cuda

package kernels

import (
	"errors"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
)

// TestNoCUDA checks that a build without the cuda tag offers the whole API
// and answers ErrNoCUDA wherever a device is needed.
func TestNoCUDA(t *testing.T) {
	ctx, err := Open(0)
	if !errors.Is(err, ErrNoCUDA) || ctx != nil {
		t.Fatalf("Open: %v, %v; want nil, ErrNoCUDA", ctx, err)
	}
	if _, err := newTestCompressor(ctx, "int8"); !errors.Is(err, ErrNoCUDA) {
		t.Errorf("newTestCompressor: %v, want ErrNoCUDA", err)
	}
	if _, err := newTestCompressor(ctx, "int9"); errors.Is(err, ErrNoCUDA) || err == nil {
		t.Errorf("newTestCompressor with a bad spec: %v, want the spec error first", err)
	}
	c, err := codecOf("topk:0.01")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Encode(ctx, 0, fakeArgs(c, 1000, true)); !errors.Is(err, ErrNoCUDA) {
		t.Errorf("Encode: %v, want ErrNoCUDA", err)
	}
	if err := c.Decode(ctx, 0, DecodeArgs{Dst: 1 << 40, N: 10, Bodies: []gpu.Ptr{2 << 40}}); !errors.Is(err, ErrNoCUDA) {
		t.Errorf("Decode: %v, want ErrNoCUDA", err)
	}
	if err := FillLaplace(ctx, 0, 1<<40, 10, 1, compress.Key{}); !errors.Is(err, ErrNoCUDA) {
		t.Errorf("FillLaplace: %v, want ErrNoCUDA", err)
	}
	if _, err := ctx.Alloc(16); !errors.Is(err, ErrNoCUDA) {
		t.Errorf("Alloc: %v, want ErrNoCUDA", err)
	}
	if _, err := ctx.NewEvent(true); !errors.Is(err, ErrNoCUDA) {
		t.Errorf("NewEvent: %v, want ErrNoCUDA", err)
	}
}
