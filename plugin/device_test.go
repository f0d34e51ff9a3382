package main

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"testing"
	"unsafe"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/devresid"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/internal/fakegpu"
	"github.com/gradcomp/gradcomp/internal/gputest"
	"github.com/gradcomp/gradcomp/internal/synth"
	"github.com/gradcomp/gradcomp/kernels"
)

// The device calls' argument checks run before the device is looked up, so
// they are tested in both builds and without a GPU; the GPU tests (TestGPU*)
// skip with the reason when kernels.Open(0) fails (libgradcomp.so's build,
// or no device).

// fakePtr is a plausible, aligned device address for checks that fail
// before any device sees it.
const fakePtr = gpu.Ptr(0x7f0000000000)

func mustCompressor(t testing.TB, spec string) *compressor {
	t.Helper()
	c, err := newCompressor(spec, 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.dev.close() })
	return c
}

// TestDeviceArgs checks the refusals every build makes before touching a
// device: status code and a message naming the argument.
func TestDeviceArgs(t *testing.T) {
	c := mustCompressor(t, "int8")
	lossless := mustCompressor(t, "topk:0.01:lossless=zstd")
	chunked := mustCompressor(t, "topk:0.02:chunk=4096:bits=2") // host calls only
	key := compress.Key{Bucket: 1, Step: 2}
	need := uint64(c.c.MaxEncodedLen(1000))
	compressCases := []struct {
		name      string
		c         *compressor
		flags     uint32
		grad, dst gpu.Ptr
		n, cap    uint64
		want      status
		msg       string
	}{
		{"null grad", c, 0, 0, fakePtr, 1000, need, errInvalid, "null grad"},
		{"null dst", c, 0, fakePtr, 0, 1000, need, errInvalid, "null dst"},
		{"misaligned grad", c, 0, fakePtr + 2, fakePtr, 1000, need, errInvalid, "grad 0x7f0000000002 is not 4-byte aligned"},
		{"misaligned dst", c, 0, fakePtr, fakePtr + 1, 1000, need, errInvalid, "dst 0x7f0000000001 is not 4-byte aligned"},
		{"short dst", c, 0, fakePtr, fakePtr, 1000, need - 1, errSize, fmt.Sprintf("needs %d", need)},
		{"too many elements", c, 0, fakePtr, fakePtr, compress.MaxElements + 1, need, errInvalid, "exceeds the payload limit"},
		{"unknown flag", c, 4, fakePtr, fakePtr, 1000, need, errInvalid, "unknown flag bits 0x4"},
		{"defer without feedback", c, flagDefer, fakePtr, fakePtr, 1000, need, errInvalid, "GC_DEFER needs GC_FEEDBACK"},
		{"lossless spec", lossless, 0, fakePtr, fakePtr, 1000, 1 << 20, errInvalid, "lossless stage"},
		{"chunked top-k", chunked, flagFeedback, fakePtr, fakePtr, 1000, 1 << 20, errInvalid, "options chunk=4096 and bits=2 of topk: not supported on the device"},
	}
	for _, tc := range compressCases {
		m, err := tc.c.compressDevice(key, tc.flags, tc.grad, tc.n, tc.dst, tc.cap, 0)
		if st := statusOf(err); st != tc.want || m != 0 || err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.msg)) {
			t.Errorf("%s: compressDevice = %d, %v (status %d); want status %d with %q", tc.name, m, err, st, tc.want, tc.msg)
		}
	}
	decompressCases := []struct {
		name           string
		c              *compressor
		p, dst         gpu.Ptr
		slotLen, count uint64
		exact          bool
		n              uint64
		want           status
		msg            string
	}{
		{"null payload", c, 0, fakePtr, need, 1, true, 1000, errInvalid, "null payload"},
		{"null dst", c, fakePtr, 0, need, 1, true, 1000, errInvalid, "null dst with 1000 elements"},
		{"no slots", c, fakePtr, fakePtr, need, 0, false, 1000, errInvalid, "count = 0"},
		{"too many slots", c, fakePtr, fakePtr, need, maxSlots + 1, false, 1000, errInvalid, "count = 65537"},
		{"odd slot length", c, fakePtr, fakePtr, 62, 2, false, 1000, errInvalid, "not a multiple of 4"},
		{"absurd slot length", c, fakePtr, fakePtr, 1 << 46, 2, false, 1000, errInvalid, "not a plausible payload length"},
		{"misaligned payload", c, fakePtr + 2, fakePtr, need, 1, true, 1000, errInvalid, "payload 0x7f0000000002 is not 4-byte aligned"},
		{"misaligned dst", c, fakePtr, fakePtr + 2, need, 1, true, 1000, errInvalid, "dst 0x7f0000000002 is not 4-byte aligned"},
		{"lossless spec", lossless, fakePtr, fakePtr, need, 1, true, 1000, errInvalid, "lossless stage"},
		{"chunked top-k", chunked, fakePtr, fakePtr, need, 1, true, 1000, errInvalid, "not supported on the device"},
	}
	for _, tc := range decompressCases {
		err := tc.c.decompressDevice(tc.p, tc.slotLen, tc.count, tc.exact, tc.dst, tc.n, false, 0)
		if st := statusOf(err); st != tc.want || err == nil || !bytes.Contains([]byte(err.Error()), []byte(tc.msg)) {
			t.Errorf("%s: decompressDevice = %v (status %d); want status %d with %q", tc.name, err, st, tc.want, tc.msg)
		}
	}
	if _, err := deviceInfo(-1); statusOf(err) != errInvalid {
		t.Errorf("deviceInfo(-1) = %v, want GC_ERR_INVALID", err)
	}
}

// TestDeviceUnavailable: well-formed calls reach the device lookup, which
// says why there is none (GC_ERR_NOCUDA in libgradcomp.so's build,
// GC_ERR_NODEVICE without a GPU); on a GPU, a host address is refused as
// not device memory.
func TestDeviceUnavailable(t *testing.T) {
	c := mustCompressor(t, "int8")
	host := make([]float32, 1024)
	p := gpu.Ptr(uintptr(unsafe.Pointer(&host[0])))
	_, qerr := queryPointer(p)
	want, what := errInvalid, "not CUDA device memory"
	switch {
	case errors.Is(qerr, kernels.ErrNoCUDA):
		want, what = errNoCUDA, "device calls need libgradcomp_cuda.so"
	case errors.Is(qerr, kernels.ErrNoDevice):
		want, what = errNoDevice, "no CUDA device"
	case qerr != nil:
		t.Fatalf("queryPointer: %v", qerr)
	}
	_, err := c.compressDevice(compress.Key{}, 0, p, 256, p, 4096, 0)
	if statusOf(err) != want || !bytes.Contains([]byte(err.Error()), []byte(what)) {
		t.Errorf("compressDevice on host memory = %v (status %d), want status %d with %q", err, statusOf(err), want, what)
	}
	err = c.decompressDevice(p, 4096, 1, true, p, 256, true, 0)
	if statusOf(err) != want || !bytes.Contains([]byte(err.Error()), []byte(what)) {
		t.Errorf("decompressDevice on host memory = %v (status %d), want status %d with %q", err, statusOf(err), want, what)
	}
	if want != errInvalid {
		if _, err := deviceInfo(0); statusOf(err) != want {
			t.Errorf("deviceInfo(0) = %v (status %d), want status %d", err, statusOf(err), want)
		}
	}
	if c.dev.owns(0) || liveBuckets(c) != 0 {
		t.Error("a refused call left device memory behind")
	}
}

func liveBuckets(c *compressor) int {
	c.dev.mu.Lock()
	defer c.dev.mu.Unlock()
	return len(c.dev.buckets)
}

// TestDevicePendingSwaps checks the settle modes of a deferred device
// compress on the memory's buffers (a fake device's): Commit installs the
// new residual, Retain the sum, Discard nothing, and a freed bucket is
// left alone.
func TestDevicePendingSwaps(t *testing.T) {
	plat := fakegpu.New(1)
	t.Cleanup(plat.Close)
	for _, tc := range []struct {
		name   string
		settle func(*devicePending)
		freed  bool
		want   string // the buffer that becomes e
	}{
		{"commit", (*devicePending).Commit, false, "out"},
		{"retain", (*devicePending).Retain, false, "sum"},
		{"discard", (*devicePending).Discard, false, "e"},
		{"commit after free", (*devicePending).Commit, true, "e"},
	} {
		r, err := devresid.New(plat.Device(0), 0, 8)
		if err != nil {
			t.Fatal(err)
		}
		sum, err := r.Sum()
		if err != nil {
			t.Fatal(err)
		}
		bufs := map[string]gpu.Ptr{"e": r.Ptr(), "out": r.Out(), "sum": sum}
		tc.settle(&devicePending{b: &deviceBucket{r: r, freed: tc.freed}})
		if r.Ptr() != bufs[tc.want] {
			t.Errorf("%s: e is %#x, want the %s buffer %#x (buffers %#x)", tc.name, r.Ptr(), tc.want, bufs[tc.want], bufs)
		}
		if err := r.Free(); err != nil {
			t.Fatal(err)
		}
	}
}

// TestStateWithoutDevice: with no device buckets the state is exactly the
// host memory's checkpoint.
func TestStateWithoutDevice(t *testing.T) {
	c := mustCompressor(t, "topk:0.1")
	g := []float32{1, -2, 3, -4, 5, -6, 7, -8, 9, -10}
	if _, err := c.compress(compress.Key{Bucket: 3}, flagFeedback, g, make([]byte, c.c.MaxEncodedLen(len(g)))); err != nil {
		t.Fatal(err)
	}
	got, err := c.state()
	if err != nil {
		t.Fatal(err)
	}
	var want bytes.Buffer
	if err := c.ef.Save(&want); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want.Bytes()) {
		t.Error("state() differs from the host memory's Save")
	}
}

// ---- GPU tests: they skip without a usable device. ----

// testDevice returns device 0's context or skips the test, saying why.
var testDevice = gputest.Opener(func() (*deviceContext, error) { return openDevice(0) }, kernels.ErrNoCUDA, kernels.ErrNoDevice)

// devAlloc returns device memory freed when the test ends.
func devAlloc(t testing.TB, d *deviceContext, bytes int) gpu.Ptr {
	t.Helper()
	p, err := d.ctx.Alloc(max(bytes, 4))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { d.ctx.Free(p) })
	return p
}

func upload(t testing.TB, d *deviceContext, p gpu.Ptr, b []byte) {
	t.Helper()
	if err := d.ctx.CopyIn(d.own, p, b); err != nil {
		t.Fatal(err)
	}
	if err := d.ctx.Synchronize(d.own); err != nil {
		t.Fatal(err)
	}
}

func download(t testing.TB, d *deviceContext, p gpu.Ptr, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if err := d.ctx.CopyOut(d.own, b, p); err != nil {
		t.Fatal(err)
	}
	return b
}

// gpuSpecs are the specs the GPU tests run: the four, and the
// other paths (unaligned buckets, sampled top-k, random-k, halves).
var gpuSpecs = []string{"int8", "int4", "sign", "topk:0.01", "topk:0.01:sampled", "int2:bucket=100", "randomk:0.01", "fp16", "none"}

// TestGPUCompressMatchesHost: every device payload equals the host's byte
// for byte, with error feedback through every settle mode (the residuals,
// compared through the saved states, too); decoding on the device equals
// the host's bit for bit, one payload or several slots.
func TestGPUCompressMatchesHost(t *testing.T) {
	d := testDevice(t)
	const n = 300007
	for _, spec := range gpuSpecs {
		t.Run(spec, func(t *testing.T) {
			host, dev := mustCompressor(t, spec), mustCompressor(t, spec)
			need := host.c.MaxEncodedLen(n)
			grad, dst := devAlloc(t, d, 4*n), devAlloc(t, d, need)
			hostPayload := make([]byte, need)
			modes := []int{-1, settleCommit, settleRetain, settleDiscard, -1, -2}
			for step, mode := range modes {
				g := synth.UnitLaplace(n, uint64(step))
				upload(t, d, grad, f32.Bytes(g))
				key := compress.Key{Bucket: 5, Step: uint64(step)}
				flags := uint32(flagFeedback)
				switch mode {
				case -2:
					flags = 0
				case -1:
				default:
					flags |= flagDefer
				}
				mh, err := host.compress(key, flags, g, hostPayload)
				if err != nil {
					t.Fatal(err)
				}
				md, err := dev.compressDevice(key, flags, grad, n, dst, uint64(need), d.own)
				if err != nil {
					t.Fatalf("step %d: %v", step, err)
				}
				if got := download(t, d, dst, md); md != mh || !bytes.Equal(got, hostPayload[:mh]) {
					t.Fatalf("step %d (flags %d): device payload (%d bytes) differs from the host's (%d)", step, flags, md, mh)
				}
				if mode >= 0 {
					if err := host.settle(5, mode); err != nil {
						t.Fatal(err)
					}
					if err := dev.settle(5, mode); err != nil {
						t.Fatal(err)
					}
				}
				hs, err := host.state()
				if err != nil {
					t.Fatal(err)
				}
				ds, err := dev.state()
				if err != nil {
					t.Fatal(err)
				}
				if !bytes.Equal(hs, ds) {
					t.Fatalf("step %d (mode %d): device error-feedback state differs from the host's", step, mode)
				}
			}
			// Decoding: one payload, added; then 3 slots with padding.
			want := synth.UnitLaplace(n, 99)
			if err := host.decompress(hostPayload[:need], want, true); err != nil {
				t.Fatal(err)
			}
			out := devAlloc(t, d, 4*n)
			upload(t, d, out, f32.Bytes(synth.UnitLaplace(n, 99)))
			if err := dev.decompressDevice(dst, uint64(need), 1, true, out, n, true, d.own); err != nil {
				t.Fatal(err)
			}
			if got := download(t, d, out, 4*n); !bytes.Equal(got, f32.Bytes(want)) {
				t.Fatal("gc_decompress_add_device differs from gc_decompress_add")
			}
			slot := (need + 64) &^ 3
			slots := devAlloc(t, d, 3*slot)
			sum := make([]float32, n)
			for i := range 3 {
				g := synth.UnitLaplace(n, uint64(10+i))
				m, err := host.compress(compress.Key{Bucket: 9, Step: 1}, 0, g, hostPayload)
				if err != nil {
					t.Fatal(err)
				}
				upload(t, d, slots+gpu.Ptr(i*slot), append(hostPayload[:m:m], make([]byte, slot-m)...))
				if i == 0 {
					err = host.decompress(hostPayload[:m], sum, false)
				} else {
					err = host.decompress(hostPayload[:m], sum, true)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			if err := dev.decompressDevice(slots, uint64(slot), 3, false, out, n, false, d.own); err != nil {
				t.Fatal(err)
			}
			if got := download(t, d, out, 4*n); !bytes.Equal(got, f32.Bytes(sum)) {
				t.Fatal("gc_decompress_slots_device differs from gc_decompress + gc_decompress_add")
			}
		})
	}
}

// TestGPUBadInput: a NaN leaves the device residual untouched; a length
// past the allocation, a corrupt payload, a padded slot passed as a
// payload and a host bucket used as a device one are refused clearly; a
// loaded state moves to the device and continues bit-exactly.
func TestGPUBadInput(t *testing.T) {
	d := testDevice(t)
	const n = 4096
	c, ref := mustCompressor(t, "int8"), mustCompressor(t, "int8")
	need := c.c.MaxEncodedLen(n)
	grad, dst := devAlloc(t, d, 4*n), devAlloc(t, d, need+64)
	g := synth.UnitLaplace(n, 1)
	upload(t, d, grad, f32.Bytes(g))
	if _, err := c.compressDevice(compress.Key{Bucket: 1}, flagFeedback, grad, n, dst, uint64(need), d.own); err != nil {
		t.Fatal(err)
	}
	before, _ := c.state()
	g[77] = float32(math.NaN())
	upload(t, d, grad, f32.Bytes(g))
	_, err := c.compressDevice(compress.Key{Bucket: 1, Step: 1}, flagFeedback|flagDefer, grad, n, dst, uint64(need), d.own)
	var nf *compress.NonFiniteError
	if !errors.As(err, &nf) || nf.Index != 77 {
		t.Fatalf("NaN at 77: %v, want a NonFiniteError at index 77", err)
	}
	if after, _ := c.state(); !bytes.Equal(before, after) {
		t.Fatal("a NaN changed the device residual")
	}
	if err := c.settle(1, settleCommit); statusOf(err) != errState {
		t.Fatalf("settle after a failed deferred compress: %v, want GC_ERR_STATE", err)
	}
	if _, err := c.compressDevice(compress.Key{}, 0, grad, n+1, dst, uint64(need+64), d.own); statusOf(err) != errSize {
		t.Fatalf("n past the allocation: %v, want GC_ERR_SIZE", err)
	}
	if _, err := c.compress(compress.Key{Bucket: 1}, flagFeedback, make([]float32, n), make([]byte, need)); statusOf(err) != errState {
		t.Fatalf("host compress of a device bucket: %v, want GC_ERR_STATE", err)
	}
	// A corrupt payload: dst untouched.
	upload(t, d, grad, f32.Bytes(synth.UnitLaplace(n, 2)))
	m, err := c.compressDevice(compress.Key{}, 0, grad, n, dst, uint64(need), d.own)
	if err != nil {
		t.Fatal(err)
	}
	upload(t, d, dst+100, []byte{0xff})
	out := devAlloc(t, d, 4*n)
	upload(t, d, out, f32.Bytes(synth.UnitLaplace(n, 3)))
	if err := c.decompressDevice(dst, uint64(m), 1, true, out, n, false, d.own); statusOf(err) != errCorrupt {
		t.Fatalf("corrupt payload: %v, want GC_ERR_CORRUPT", err)
	}
	if err := c.decompressDevice(dst, uint64(m+4), 1, true, out, n, false, d.own); statusOf(err) != errCorrupt {
		t.Fatalf("padded payload: %v, want GC_ERR_CORRUPT", err)
	}
	if got := download(t, d, out, 4*n); !bytes.Equal(got, f32.Bytes(synth.UnitLaplace(n, 3))) {
		t.Fatal("a refused decompress wrote dst")
	}
	// Resume: ref's state loaded into c; both continue on host and device.
	hg := synth.UnitLaplace(n, 4)
	if _, err := ref.compress(compress.Key{Bucket: 2}, flagFeedback, hg, make([]byte, need)); err != nil {
		t.Fatal(err)
	}
	s, _ := ref.state()
	if err := c.loadState(s); err != nil || liveBuckets(c) != 0 {
		t.Fatalf("loadState: %v with %d device buckets left", err, liveBuckets(c))
	}
	hp := make([]byte, need)
	upload(t, d, grad, f32.Bytes(synth.UnitLaplace(n, 5)))
	if _, err := ref.compress(compress.Key{Bucket: 2, Step: 1}, flagFeedback, synth.UnitLaplace(n, 5), hp); err != nil {
		t.Fatal(err)
	}
	if _, err := c.compressDevice(compress.Key{Bucket: 2, Step: 1}, flagFeedback, grad, n, dst, uint64(need), d.own); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(download(t, d, dst, need), hp) {
		t.Fatal("after a state load, the device payload differs from the host's")
	}
	rs, _ := ref.state()
	if cs, _ := c.state(); !bytes.Equal(rs, cs) {
		t.Fatal("after a state load, the device residual differs from the host's")
	}
}
