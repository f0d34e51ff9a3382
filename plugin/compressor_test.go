package main

import (
	"errors"
	"fmt"
	"math"
	"sync"
	"testing"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/kernels"
)

// TestStatusOf maps each of compress's typed errors, bare and wrapped, and
// the plugin's own, to its status code; anything else is internal.
func TestStatusOf(t *testing.T) {
	cases := []struct {
		err  error
		want status
	}{
		{&compress.SpecError{}, errSpec},
		{&compress.NonFiniteError{}, errNonFinite},
		{&compress.SizeError{}, errSize},
		{&compress.PayloadMismatchError{}, errMismatch},
		{&compress.CorruptInputError{}, errCorrupt},
		{&compress.ChecksumError{}, errCorrupt},
		{&compress.VersionError{}, errCorrupt},
		{errorf(errState, "x"), errState},
		{fmt.Errorf("bucket 3: %w", &compress.NonFiniteError{}), errNonFinite},
		{fmt.Errorf("outer: %w", errorf(errHandle, "inner")), errHandle},
		{kernels.ErrNoCUDA, errNoCUDA},
		{fmt.Errorf("%w: device 0: %w", kernels.ErrNoDevice, &kernels.DriverError{Call: "cuInit"}), errNoDevice},
		{fmt.Errorf("x: %w", &kernels.DriverError{Call: "cuLaunchKernel"}), errCUDA},
		{&kernels.ArgumentError{Op: "Encode"}, errInvalid},
		{errors.New("something else"), errInternal},
	}
	for _, c := range cases {
		if got := statusOf(c.err); got != c.want {
			t.Errorf("statusOf(%T %v) = %d, want %d", c.err, c.err, got, c.want)
		}
	}
}

// TestHandles: a handle is live from newHandle to release, then gone for
// good; values never seen are refused without calling cgo.Handle.Value.
func TestHandles(t *testing.T) {
	c, err := newCompressor("int8", 1)
	if err != nil {
		t.Fatal(err)
	}
	n0 := liveHandles()
	h := newHandle(c)
	if got, err := lookup(h); err != nil || got != c || liveHandles() != n0+1 {
		t.Fatalf("lookup(%d) = %p, %v with %d live; want %p and %d live", h, got, err, liveHandles(), c, n0+1)
	}
	if _, err := release(h); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []uint64{h, 0, h + 1000, math.MaxUint64} {
		if _, err := lookup(bad); err == nil {
			t.Errorf("lookup(%d) succeeded after release or for an unknown value", bad)
		}
		if _, err := release(bad); err == nil {
			t.Errorf("release(%d) succeeded after release or for an unknown value", bad)
		}
	}
	if liveHandles() != n0 {
		t.Errorf("%d live handles, want %d", liveHandles(), n0)
	}
}

// TestDeferredContention has goroutines race deferred and plain
// error-feedback compresses, and settles, on one bucket: each call either
// succeeds or is refused with GC_ERR_STATE, none waits forever, and the
// residual ends as the sum of what the successful calls left.
func TestDeferredContention(t *testing.T) {
	c, err := newCompressor("none", 1)
	if err != nil {
		t.Fatal(err)
	}
	const goroutines, iters, n = 8, 200, 16
	grad := make([]float32, n)
	for i := range grad {
		grad[i] = 1
	}
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		retained int // deferred compresses settled with Retain: each adds grad to e
	)
	for g := range goroutines {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dst := make([]byte, c.c.MaxEncodedLen(n))
			for i := range iters {
				key := compress.Key{Bucket: 1, Step: uint64(i)}
				flags := uint32(flagFeedback)
				if (g+i)%2 == 0 {
					flags |= flagDefer
				}
				_, err := c.compress(key, flags, grad, dst)
				if err != nil {
					if statusOf(err) != errState {
						t.Errorf("goroutine %d: %v (status %d), want success or GC_ERR_STATE", g, err, statusOf(err))
					}
					continue
				}
				if flags&flagDefer == 0 {
					continue
				}
				if err := c.settle(1, settleRetain); err != nil {
					t.Errorf("goroutine %d: settling its own deferred compress: %v", g, err)
					continue
				}
				mu.Lock()
				retained++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	if err := c.idle("check"); err != nil {
		t.Fatal(err)
	}
	// Codec none is exact: plain feedback leaves e = 0 and Retain adds g,
	// so e is grad times the Retains since the last plain compress — at
	// least finite and a whole multiple of 1.
	e := c.ef.Residual(1)
	if len(e) != n || retained == 0 {
		t.Fatalf("residual of %d elements, %d retained; want %d elements and some retained", len(e), retained, n)
	}
	for i, v := range e {
		if v != e[0] || v != float32(math.Trunc(float64(v))) || v < 0 || int(v) > retained {
			t.Fatalf("residual[%d] = %v (residual[0] = %v), want one whole number ≤ %d", i, v, e[0], retained)
		}
	}
}

// TestSettleRefusals: a settle of a bucket with nothing pending, or with an
// unknown mode, fails with its status and changes nothing.
func TestSettleRefusals(t *testing.T) {
	c, err := newCompressor("int8", 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := c.settle(4, settleCommit); statusOf(err) != errState {
		t.Errorf("settle with nothing pending: %v, want GC_ERR_STATE", err)
	}
	if err := c.settle(4, 7); statusOf(err) != errInvalid {
		t.Errorf("settle mode 7: %v, want GC_ERR_INVALID", err)
	}
	grad := []float32{1, 2, 3}
	dst := make([]byte, c.c.MaxEncodedLen(len(grad)))
	if _, err := c.compress(compress.Key{Bucket: 4}, flagFeedback|flagDefer, grad, dst); err != nil {
		t.Fatal(err)
	}
	if err := c.settle(4, 7); statusOf(err) != errInvalid {
		t.Errorf("settle mode 7 with a compress pending: %v, want GC_ERR_INVALID", err)
	}
	if err := c.settle(4, settleDiscard); err != nil {
		t.Errorf("settle after a refused one: %v", err)
	}
}

// TestGuard: a panic under guard becomes GC_ERR_INTERNAL instead of
// unwinding further.
func TestGuard(t *testing.T) {
	st := func() (st status) {
		defer guard("gc_test", &st)
		var m map[string]int
		m["x"] = 1 // a nil-map write panics
		return statusOK
	}()
	if st != errInternal {
		t.Errorf("status after a panic = %d, want GC_ERR_INTERNAL (%d)", st, errInternal)
	}
}

// TestChunkedTopKHost: a spec the device kernels lack (chunked top-k)
// makes a compressor whose host calls work, with error feedback; only its
// device calls are refused (TestDeviceArgs).
func TestChunkedTopKHost(t *testing.T) {
	c, err := newCompressor("topk:0.02:chunk=4096:bits=2", 1)
	if err != nil {
		t.Fatal(err)
	}
	grad := make([]float32, 10000)
	for i := range grad {
		grad[i] = float32(math.Sin(float64(i)))
	}
	dst := make([]byte, c.c.MaxEncodedLen(len(grad)))
	m, err := c.compress(compress.Key{Bucket: 1}, flagFeedback, grad, dst)
	if err != nil || m != len(dst) {
		t.Fatalf("compress = %d, %v; want %d bytes", m, err, len(dst))
	}
	out := make([]float32, len(grad))
	if err := c.decompress(dst[:m], out, false); err != nil {
		t.Fatal(err)
	}
	if c.deviceErr == nil {
		t.Error("no device refusal recorded for chunked top-k")
	}
}
