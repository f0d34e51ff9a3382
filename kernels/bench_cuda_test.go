//go:build cuda

package kernels

import (
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
)

// The kernel benchmarks of issue 4, on 256M float32 (1 GiB) of Laplace
// gradients made on the device. Each reports MB/s of effective bandwidth
// (bytes the operation must read and write ÷ time, via SetBytes), so the
// ratio to BenchmarkCopy's MB/s in the same run is the figure the targets
// name. scripts/gpu-check runs them and compares.

const benchN = 256 << 20

// benchInput returns a device buffer of n Laplace samples.
func benchInput(b *testing.B, ctx *Context, n int, seed uint64) gpu.Ptr {
	p := devBuf(b, ctx, 4*n)
	if err := FillLaplace(ctx, 0, p, n, seed, compress.Key{}); err != nil {
		b.Fatal(err)
	}
	return p
}

// loop runs op b.N times on the default stream and waits for the device.
func loop(b *testing.B, ctx *Context, op func() error) {
	if err := op(); err != nil { // warm up: JIT, caches
		b.Fatal(err)
	}
	ctx.Synchronize(0)
	b.ResetTimer()
	for range b.N {
		if err := op(); err != nil {
			b.Fatal(err)
		}
	}
	if err := ctx.Synchronize(0); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkCopy is the baseline: a device-to-device copy of 1 GiB (bytes
// read + written).
func BenchmarkCopy(b *testing.B) {
	ctx := device(b)
	src, dst := benchInput(b, ctx, benchN, 1), devBuf(b, ctx, 4*benchN)
	b.SetBytes(2 * 4 * benchN)
	loop(b, ctx, func() error { return ctx.Copy(0, dst, src, 4*benchN) })
}

// encodeBench runs Encode of spec over benchN elements, with error
// feedback if ef; bytes is the effective traffic per call.
func encodeBench(b *testing.B, spec string, ef bool) (*Codec, EncodeArgs) {
	ctx := device(b)
	c, err := codecOf(spec)
	if err != nil {
		b.Fatal(err)
	}
	a := EncodeArgs{N: benchN, Grad: benchInput(b, ctx, benchN, 1), Body: devBuf(b, ctx, c.BodyLen(benchN)), Status: devBuf(b, ctx, StatusLen)}
	if w := c.WorkspaceLen(benchN); w > 0 {
		a.Work = devBuf(b, ctx, w)
	}
	if ef {
		a.Resid, a.ResidOut = benchInput(b, ctx, benchN, 2), devBuf(b, ctx, 4*benchN)
	}
	return c, a
}

// BenchmarkQuantizeEF is the fused error feedback + int8 quantization:
// reads g and e, writes the residual and the body.
func BenchmarkQuantizeEF(b *testing.B) {
	c, a := encodeBench(b, "int8", true)
	ctx := device(b)
	b.SetBytes(int64(3*4*benchN + c.BodyLen(benchN)))
	loop(b, ctx, func() error { return c.Encode(ctx, 0, a) })
}

// BenchmarkDequantAccumulate8 adds 8 int8 payloads into dst: reads 8
// bodies and dst, writes dst.
func BenchmarkDequantAccumulate8(b *testing.B) {
	c, a := encodeBench(b, "int8", false)
	ctx := device(b)
	if err := c.Encode(ctx, 0, a); err != nil {
		b.Fatal(err)
	}
	bodies := make([]gpu.Ptr, 8)
	for i := range bodies {
		bodies[i] = devBuf(b, ctx, c.BodyLen(benchN))
		ctx.Copy(0, bodies[i], a.Body, c.BodyLen(benchN))
	}
	dst := devBuf(b, ctx, 4*benchN)
	b.SetBytes(int64(8*c.BodyLen(benchN) + 2*4*benchN))
	loop(b, ctx, func() error {
		return c.Decode(ctx, 0, DecodeArgs{Dst: dst, N: benchN, Add: true, Bodies: bodies})
	})
}

// topkBench times top-k 1% of benchN (no error feedback: torch.topk's
// job). The sampled form also reports its recall against the exact form.
func topkBench(b *testing.B, spec string) {
	c, a := encodeBench(b, spec, false)
	ctx := device(b)
	b.SetBytes(4 * benchN)
	loop(b, ctx, func() error { return c.Encode(ctx, 0, a) })
	b.StopTimer()
	exact, _ := codecOf("topk:0.01")
	ea := a
	ea.Body = devBuf(b, ctx, c.BodyLen(benchN))
	if err := exact.Encode(ctx, 0, ea); err != nil {
		b.Fatal(err)
	}
	k := c.BodyLen(benchN) / 8
	got, want := make([]byte, 4*k), make([]byte, 4*k)
	ctx.CopyOut(0, got, a.Body)
	ctx.CopyOut(0, want, ea.Body)
	same := 0 // both index lists ascend: count the common ones
	for i, j := 0, 0; i < len(got) && j < len(want); {
		x, y := le32(got[i:]), le32(want[j:])
		switch {
		case x == y:
			same++
			i, j = i+4, j+4
		case x < y:
			i += 4
		default:
			j += 4
		}
	}
	b.ReportMetric(float64(same)/float64(k), "recall")
}

func le32(b []byte) uint32 {
	return uint32(b[0]) | uint32(b[1])<<8 | uint32(b[2])<<16 | uint32(b[3])<<24
}

// BenchmarkTopKSampled is the sampled-threshold top-k 1%.
func BenchmarkTopKSampled(b *testing.B) { topkBench(b, "topk:0.01:sampled") }

// BenchmarkTopKExact is the exact radix-select top-k 1%.
func BenchmarkTopKExact(b *testing.B) { topkBench(b, "topk:0.01") }
