//go:build fakegpu

package main

import (
	"fmt"
	"math"
	"os"
	"sync"
	"testing"

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
	} {
		n := len(tc.nodeOf)
		t.Run(fmt.Sprintf("%s/%d/hier=%v", tc.spec, n, tc.hier), func(t *testing.T) {
			cfg := overlap.Config{Spec: tc.spec, ErrorFeedback: true, Decision: overlap.DecideCompressed}
			if tc.hier {
				cfg.Strategy = overlap.StrategyHier
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
