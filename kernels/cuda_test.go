//go:build cuda

package kernels

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/internal/gputest"
	"github.com/gradcomp/gradcomp/internal/synth"
)

// device returns the context of device 0, or skips the test with the
// reason when there is no usable GPU.
var device = gputest.Opener(func() (*Context, error) { return Open(0) }, ErrNoDevice)

// TestDevice logs what the tests run on.
func TestDevice(t *testing.T) {
	ctx := device(t)
	t.Logf("device %+v", ctx.Info())
}

// TestConformance runs the shared conformance suite on the device backend:
// among its checks, byte-identical payloads against the CPU reference.
func TestConformance(t *testing.T) {
	ctx := device(t)
	compresstest.Run(t, func(spec string) (compress.Compressor, error) { return newTestCompressor(ctx, spec) })
}

// devBuf is a device buffer freed at the end of the test.
func devBuf(tb testing.TB, ctx *Context, bytes int) gpu.Ptr {
	tb.Helper()
	p, err := ctx.Alloc(bytes)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { ctx.Free(p) })
	return p
}

func upload(tb testing.TB, ctx *Context, x []float32) gpu.Ptr {
	tb.Helper()
	p := devBuf(tb, ctx, max(4*len(x), 4))
	if err := ctx.CopyIn(0, p, f32.Bytes(x)); err != nil {
		tb.Fatal(err)
	}
	return p
}

func download(tb testing.TB, ctx *Context, p gpu.Ptr, n int) []float32 {
	tb.Helper()
	x := make([]float32, n)
	if err := ctx.CopyOut(0, f32.Bytes(x), p); err != nil {
		tb.Fatal(err)
	}
	return x
}

// TestErrorFeedbackFused runs the device's fused error feedback (Resid and
// ResidOut) for a few steps next to compress.ErrorFeedback and checks that
// bodies and residuals agree bit for bit.
func TestErrorFeedbackFused(t *testing.T) {
	ctx := device(t)
	for _, spec := range allSpecs {
		c, _ := codecOf(spec)
		for _, n := range []int{1, 1000, 4097, 300_001} {
			f := compress.NewErrorFeedback(c.ref)
			e := upload(t, ctx, make([]float32, n))
			eo := devBuf(t, ctx, 4*n)
			a := EncodeArgs{N: n, Resid: e, ResidOut: eo, Body: devBuf(t, ctx, max(c.BodyLen(n), 4)), Status: devBuf(t, ctx, StatusLen)}
			if w := c.WorkspaceLen(n); w > 0 {
				a.Work = devBuf(t, ctx, w)
			}
			for step := range uint64(3) {
				g := synth.UnitLaplace(n, step)
				a.Grad, a.Key = upload(t, ctx, g), compress.Key{Bucket: 1, Step: step}
				p, err := f.Compress(nil, g, a.Key)
				if err != nil {
					t.Fatal(err)
				}
				_, want, _ := compress.DecodePayload(c.ref, p, n)
				if err := c.Encode(ctx, 0, a); err != nil {
					t.Fatal(err)
				}
				status := make([]byte, StatusLen)
				got := make([]byte, c.BodyLen(n))
				if err := ctx.CopyOut(0, status, a.Status); err != nil {
					t.Fatal(err)
				}
				if err := StatusError(status); err != nil {
					t.Fatalf("%s n=%d step %d: %v", spec, n, step, err)
				}
				if err := ctx.CopyOut(0, got, a.Body); err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(got, want) {
					t.Errorf("%s n=%d step %d: device body differs from the CPU's at byte %d", spec, n, step, firstDiff(got, want))
				}
				a.Resid, a.ResidOut = a.ResidOut, a.Resid // Commit
				res, cpu := download(t, ctx, a.Resid, n), f.Residual(1)
				for i := range res {
					if math.Float32bits(res[i]) != math.Float32bits(cpu[i]) {
						t.Errorf("%s n=%d step %d: residual[%d] = %v, CPU %v", spec, n, step, i, res[i], cpu[i])
						break
					}
				}
			}
		}
	}
}

func firstDiff(a, b []byte) int {
	for i := range min(len(a), len(b)) {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}

// TestDecodeAccumulate decodes 11 payloads (two dequantize-accumulate
// launches for bucketed codes) with and without Add and compares with
// Decompress followed by DecompressAdd on the CPU.
func TestDecodeAccumulate(t *testing.T) {
	ctx := device(t)
	const n = 5000
	key := compress.Key{Bucket: 2, Step: 7}
	for _, spec := range allSpecs {
		c, _ := codecOf(spec)
		var bodies []gpu.Ptr
		var payloads [][]byte
		for p := range 11 {
			pl, err := c.ref.Compress(nil, synth.UnitLaplace(n, uint64(p)), key)
			if err != nil {
				t.Fatal(err)
			}
			_, body, _ := compress.DecodePayload(c.ref, pl, n)
			b := devBuf(t, ctx, len(body))
			ctx.CopyIn(0, b, body)
			bodies, payloads = append(bodies, b), append(payloads, pl)
		}
		for _, add := range []bool{false, true} {
			start := synth.UnitLaplace(n, 99)
			want := append([]float32(nil), start...)
			for p, pl := range payloads {
				decode := c.ref.DecompressAdd
				if p == 0 && !add {
					decode = c.ref.Decompress
				}
				if err := decode(want, pl); err != nil {
					t.Fatal(err)
				}
			}
			dst := upload(t, ctx, start)
			if err := c.Decode(ctx, 0, DecodeArgs{Dst: dst, N: n, Add: add, Bodies: bodies, Key: key}); err != nil {
				t.Fatal(err)
			}
			got := download(t, ctx, dst, n)
			for i := range got {
				if math.Float32bits(got[i]) != math.Float32bits(want[i]) {
					t.Errorf("%s add=%v: dst[%d] = %v, CPU %v", spec, add, i, got[i], want[i])
					break
				}
			}
		}
	}
}

// TestTopKPaths compares exact and sampled top-k with the CPU on inputs
// that take the sampled path, its fallback (heavy ties at the bound) and
// the exact path, several tiles long.
func TestTopKPaths(t *testing.T) {
	ctx := device(t)
	n := 1<<20 + 77
	if testing.Short() {
		n = sampledMinLen + 5
	}
	ties := synth.UnitLaplace(n, 5)
	for i := range ties {
		ties[i] = float32(math.Round(float64(ties[i]) * 2))
	}
	for _, spec := range []string{"topk:0.01", "topk:0.01:sampled", "topk:0.001:sampled", "topk:0.1:sampled"} {
		dc, err := newTestCompressor(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		ref, _ := compress.Parse(spec)
		for name, x := range map[string][]float32{"laplace": synth.UnitLaplace(n, 4), "ties": ties} {
			got, err := dc.Compress(nil, x, compress.Key{})
			if err != nil {
				t.Fatal(err)
			}
			want, _ := ref.Compress(nil, x, compress.Key{})
			if !bytes.Equal(got, want) {
				t.Errorf("%s %s n=%d: payload differs from the CPU's at byte %d", spec, name, n, firstDiff(got, want))
			}
		}
		dc.Close()
	}
}

// FuzzDifferential compresses fuzzed inputs on the device and the CPU and
// requires the same payload bytes, or the same error, then the same decoded
// bits.
func FuzzDifferential(f *testing.F) {
	f.Add(uint8(0), uint64(1), []byte{1, 2, 3, 4, 0, 0, 0x80, 0x7f, 9, 9, 9, 9})
	f.Add(uint8(13), uint64(7), bytes.Repeat([]byte{0x3f, 0x80, 0, 0}, 700))
	f.Add(uint8(23), uint64(2), bytes.Repeat([]byte{0, 0, 0x80, 0xff, 1, 0, 0, 0}, 90))
	f.Fuzz(func(t *testing.T, which uint8, step uint64, raw []byte) {
		ctx := device(t)
		spec := allSpecs[int(which)%len(allSpecs)]
		x := make([]float32, len(raw)/4)
		for i := range x {
			x[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
		dc, err := newTestCompressor(ctx, spec)
		if err != nil {
			t.Fatal(err)
		}
		defer dc.Close()
		ref, _ := compress.Parse(spec)
		key := compress.Key{Bucket: 9, Step: step}
		got, gerr := dc.Compress(nil, x, key)
		want, werr := ref.Compress(nil, x, key)
		if fmt.Sprint(gerr) != fmt.Sprint(werr) {
			t.Fatalf("%s: device error %v, CPU error %v", spec, gerr, werr)
		}
		if werr != nil {
			return
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("%s n=%d: payload differs from the CPU's at byte %d", spec, len(x), firstDiff(got, want))
		}
		d, r := make([]float32, len(x)), make([]float32, len(x))
		if err := dc.Decompress(d, got); err != nil {
			t.Fatal(err)
		}
		ref.Decompress(r, want)
		for i := range d {
			if math.Float32bits(d[i]) != math.Float32bits(r[i]) {
				t.Fatalf("%s: decoded[%d] = %v, CPU %v", spec, i, d[i], r[i])
			}
		}
	})
}
