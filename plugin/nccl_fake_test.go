//go:build fakegpu

package main

import (
	"fmt"
	"math"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/internal/ncclmock"
	"github.com/gradcomp/gradcomp/nccl"
	"github.com/gradcomp/gradcomp/overlap"
)

// mockOnce builds the mock libnccl.so.2 once per test binary and points
// $GRADCOMP_NCCL at it (the process then loads it on first use).
var mockOnce = sync.OnceValue(func() error {
	dir, err := os.MkdirTemp("", "gradcomp-plugin-mock-")
	if err != nil {
		return err
	}
	path, err := ncclmock.Build(dir)
	if err != nil {
		return err
	}
	return os.Setenv(nccl.EnvPath, path)
})

func needMock(t *testing.T) {
	t.Helper()
	if err := mockOnce(); err != nil {
		t.Skipf("mock libnccl.so.2: %v", err)
	}
}

// onEach runs f for ranks 0 to n-1 at once and returns their errors.
func onEach(n int, f func(r int) error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for r := range n {
		wg.Go(func() { errs[r] = f(r) })
	}
	wg.Wait()
	return errs
}

// grad is rank r's gradient of bucket b at step s: varied, finite values.
func grad(r, b, s, n int) []float32 {
	g := make([]float32, n)
	for i := range g {
		g[i] = float32(math.Sin(float64(1+r*7919+b*104729+s*1299709+i) * 0.37))
	}
	return g
}

// TestNCCLEngineFake runs engines on their own (mock) NCCL communicators
// and fake devices, created through newNCCLEngine from one unique id as
// gc_engine_create_nccl creates them, and checks every step's averages
// bit for bit against host engines over an in-process group with the same
// configuration: the device path of the C ABI gives the host path's
// results.
func TestNCCLEngineFake(t *testing.T) {
	needMock(t)
	sizes := []int{300, 1000, 77}
	for _, tc := range []struct {
		spec   string
		nodeOf []int // nil: one node
		hier   bool
	}{
		{spec: "int8", nodeOf: []int{0, 0}},
		{spec: "topk:0.05", nodeOf: []int{0, 0, 0}},
		{spec: "int4", nodeOf: []int{0, 0, 0, 0}},
		{spec: "randomk:0.1", nodeOf: []int{0, 0}},
		{spec: "int8", nodeOf: []int{0, 0, 1, 1}, hier: true},
		{spec: "powersgd:2", nodeOf: []int{0, 0}},
	} {
		n := len(tc.nodeOf)
		t.Run(fmt.Sprintf("%s/%d/hier=%v", tc.spec, n, tc.hier), func(t *testing.T) {
			cfg := overlap.Config{Spec: tc.spec, ErrorFeedback: true, Decision: overlap.DecideCompressed}
			if tc.hier {
				cfg.Strategy = overlap.StrategyHier
			}
			if strings.HasPrefix(tc.spec, "powersgd") {
				cfg.Shapes = [][]overlap.Shape{{{Rows: 15, Cols: 20}}, {{Rows: 40, Cols: 25}}, {{Rows: 7, Cols: 11}}}
			}
			host, err := inproc.NewNodeGroup(tc.nodeOf)
			if err != nil {
				t.Fatal(err)
			}
			topo, err := comm.NodeTopologies(tc.nodeOf)
			if err != nil {
				t.Fatal(err)
			}
			id, err := ncclUniqueID()
			if err != nil {
				t.Fatal(err)
			}
			ref := make([]*overlap.Engine, n)
			dev := make([]*engine, n)
			errs := onEach(2*n, func(k int) error {
				var err error
				if r := k % n; k < n {
					ref[r], err = overlap.New(t.Context(), host[r], sizes, cfg)
				} else {
					c := engineConfig{Config: cfg, device: r}
					if tc.hier {
						c.topo = topo[r]
					}
					dev[r], err = newNCCLEngine(id, r, n, c, sizes, nil)
				}
				return err
			})
			for k, err := range errs {
				if err != nil {
					t.Fatalf("engine %d: %v", k, err)
				}
			}
			t.Cleanup(func() {
				for r := range n {
					ref[r].Close()
					dev[r].close()
				}
			})
			bufs := make([][]*ncclmock.Buffer, n)
			for r := range bufs {
				for _, sz := range sizes {
					b, err := ncclmock.Alloc(4 * sz)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() { b.Free() })
					bufs[r] = append(bufs[r], b)
				}
			}
			for s := range 3 {
				want := make([][][]float32, n)
				errs := onEach(2*n, func(k int) error {
					r := k % n
					if k < n {
						if err := ref[r].Step(); err != nil {
							return err
						}
						want[r] = make([][]float32, len(sizes))
						for b := len(sizes) - 1; b >= 0; b-- { // backward's order
							want[r][b] = grad(r, b, s, sizes[b])
							if err := ref[r].Ready(b, want[r][b]); err != nil {
								return err
							}
						}
						_, err := ref[r].Wait(t.Context())
						return err
					}
					e := dev[r]
					if err := e.stepper().Step(); err != nil {
						return err
					}
					for b := len(sizes) - 1; b >= 0; b-- {
						copy(bufs[r][b].Float32s(), grad(r, b, s, sizes[b]))
						if err := e.readyDevice(b, bufs[r][b].Ptr(), sizes[b], 0); err != nil {
							return err
						}
					}
					if err := e.done(0); err != nil {
						return err
					}
					return e.wait(0)
				})
				for k, err := range errs {
					if err != nil {
						t.Fatalf("step %d, engine %d: %v", s, k, err)
					}
				}
				for r := range n {
					for b := range sizes {
						got := bufs[r][b].Float32s()[:sizes[b]]
						for i, w := range want[r][b] {
							if math.Float32bits(got[i]) != math.Float32bits(w) {
								t.Fatalf("step %d, rank %d, bucket %d, element %d: device engine %v, host engine %v", s, r, b, i, got[i], w)
							}
						}
					}
				}
			}
		})
	}
}

// newEngines creates n engines on one unique id with per-rank
// configurations and returns them with each rank's status and error.
func newEngines(t *testing.T, id nccl.UniqueID, cfgs []engineConfig, sizes []int, invalid []error) ([]*engine, []status, []error) {
	t.Helper()
	n := len(cfgs)
	engs := make([]*engine, n)
	errs := onEach(n, func(r int) error {
		var bad error
		if invalid != nil {
			bad = invalid[r]
		}
		var err error
		engs[r], err = newNCCLEngine(id, r, n, cfgs[r], sizes, bad)
		return err
	})
	sts := make([]status, n)
	for r, err := range errs {
		if err != nil {
			sts[r] = statusOf(err)
		}
	}
	t.Cleanup(func() {
		for _, e := range engs {
			if e != nil {
				e.close()
			}
		}
	})
	return engs, sts, errs
}

// TestNCCLEngineFakeRefusals: what goes wrong while the engines on their
// own communicator are made ends on every rank with a status naming the
// cause, within the timeout, never a hang.
func TestNCCLEngineFakeRefusals(t *testing.T) {
	needMock(t)
	sizes := []int{64, 10}
	const timeout = 2 * time.Second
	base := func(device int, spec string) engineConfig {
		return engineConfig{Config: overlap.Config{Spec: spec, ErrorFeedback: true, Decision: overlap.DecideCompressed, Timeout: timeout}, device: device}
	}
	fresh := func() nccl.UniqueID {
		id, err := ncclUniqueID()
		if err != nil {
			t.Fatal(err)
		}
		return id
	}
	t.Run("mismatch", func(t *testing.T) {
		_, sts, errs := newEngines(t, fresh(), []engineConfig{base(0, "int8"), base(1, "int4")}, sizes, nil)
		for r := range sts {
			if sts[r] != errConfig || !strings.Contains(errs[r].Error(), "int4") {
				t.Errorf("rank %d: status %d, %v; want GC_ERR_CONFIG naming the other spec", r, sts[r], errs[r])
			}
		}
	})
	t.Run("invalid", func(t *testing.T) {
		bad := errorf(errInvalid, "strategy: no such strategy %q", "fastest")
		_, sts, errs := newEngines(t, fresh(), []engineConfig{base(0, "int8"), base(1, "int8")}, sizes, []error{nil, bad})
		for r := range sts {
			if sts[r] != errConfig || !strings.Contains(errs[r].Error(), "fastest") {
				t.Errorf("rank %d: status %d, %v; want GC_ERR_CONFIG naming rank 1's setting", r, sts[r], errs[r])
			}
		}
	})
	t.Run("initfail", func(t *testing.T) {
		start := time.Now()
		_, sts, errs := newEngines(t, ncclmock.FailInitID(1), []engineConfig{base(0, "int8"), base(1, "int8"), base(2, "int8")}, sizes, nil)
		if sts[1] != errNCCL {
			t.Errorf("rank 1 (its init fails): status %d, %v; want GC_ERR_NCCL", sts[1], errs[1])
		}
		for _, r := range []int{0, 2} {
			if sts[r] != errComm {
				t.Errorf("rank %d: status %d, %v; want GC_ERR_COMM (its init aborted)", r, sts[r], errs[r])
			}
		}
		if d := time.Since(start); d > timeout+5*time.Second {
			t.Errorf("took %v with a timeout of %v", d, timeout)
		}
	})
	t.Run("device", func(t *testing.T) {
		for _, tc := range []struct {
			device int
			want   status
		}{{-1, errInvalid}, {1 << 20, errNoDevice}} {
			_, err := newNCCLEngine(fresh(), 0, 1, base(tc.device, "int8"), sizes, nil)
			if statusOf(err) != tc.want {
				t.Errorf("device %d: %v (status %d), want status %d", tc.device, err, statusOf(err), tc.want)
			}
		}
		if _, err := newNCCLEngine(nccl.UniqueID{}, 0, 1, base(0, "int8"), sizes, nil); statusOf(err) != errInvalid {
			t.Errorf("zero id: %v, want GC_ERR_INVALID", err)
		}
	})
}

// TestNCCLEngineFakeDeadPeer: a rank that never comes to a step's
// collectives ends the others' step with GC_ERR_COMM within the
// timeout, and the engine is broken afterwards.
func TestNCCLEngineFakeDeadPeer(t *testing.T) {
	needMock(t)
	sizes := []int{64}
	id, err := ncclUniqueID()
	if err != nil {
		t.Fatal(err)
	}
	cfg := func(d int) engineConfig {
		return engineConfig{Config: overlap.Config{Spec: "int8", ErrorFeedback: true, Decision: overlap.DecideCompressed, Timeout: time.Second}, device: d}
	}
	// The gradient outlives the engines (cleanups run last-in first-out):
	// after a failed step the engine's streams may still write it until
	// the engine is closed, as on a GPU.
	buf, err := ncclmock.Alloc(4 * sizes[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { buf.Free() })
	engs, _, errs := newEngines(t, id, []engineConfig{cfg(0), cfg(1)}, sizes, nil)
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	e := engs[0]
	if err := e.stepper().Step(); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	if err := e.readyDevice(0, buf.Ptr(), sizes[0], 0); err != nil {
		t.Fatal(err)
	}
	if err := e.done(0); err != nil {
		t.Fatal(err)
	}
	err = e.wait(0)
	if statusOf(err) != errComm {
		t.Fatalf("wait without the peer: %v (status %d), want GC_ERR_COMM", err, statusOf(err))
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("took %v with a timeout of 1s", d)
	}
	if err := e.stepper().Step(); statusOf(err) != errBroken {
		t.Errorf("Step after the failure: %v, want GC_ERR_BROKEN", err)
	}
}
