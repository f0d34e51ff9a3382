// Package golden holds the engine's reference results that every front
// end is checked against: the Go engine on in-process ranks writes them
// (go test ./tests/golden -update), this test checks that it still
// produces them, and the C ABI's test (tests/capi/capi_engine_test.c) and
// the Python package's (tests/python/test_frontends.py) check that the
// engine driven through their front end produces them bit for bit.
//
// testdata/cases.txt lists one case per line: name, spec, strategy. Per
// case, testdata/NAME.avg holds the averaged buckets after every step
// (steps, then ranks, then buckets, little-endian float32) and
// testdata/NAME.state<R> rank R's engine state after the last step.
// The gradients are Gradient's, the ranks call Ready in reverse bucket
// order, decisions are pinned to compressed, error feedback is on.
package golden

import (
	"bytes"
	"context"
	"encoding/binary"
	"flag"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/overlap"
)

var update = flag.Bool("update", false, "rewrite testdata from the Go engine")

// The shape every front end runs.
const (
	Ranks = 4
	Steps = 3
)

// Sizes are the buckets' element counts.
var Sizes = []int{1000, 37}

// Cases are the configurations, one per strategy.
var Cases = []struct{ Name, Spec, Strategy string }{
	{"int8-sra", "int8", "sra"},
	{"int4-allgather", "int4", "allgather"},
	{"topk-sparse-gather", "topk:0.05", "sparse-gather"},
	{"randomk-shared-index", "randomk:0.1", "shared-index"},
	{"sign-sra", "sign", "sra"},
	{"fp16-dense", "fp16", "dense"},
	{"none", "none", "auto"},
}

// Gradient is element i of bucket b of rank r at step s: a multiple of
// 1/64 below 16 in magnitude, so that sums of a few are exact in any order
// (gloo's and NCCL's all-reduce orders differ from rank order):
//
//	float32(((r·1000003 + s·10007 + b·101 + i·7919) mod 2003) − 1001) / 64
func Gradient(r, s, b, i int) float32 {
	h := (r*1000003 + s*10007 + b*101 + i*7919) % 2003
	return float32(h-1001) / 64
}

func TestEngineGolden(t *testing.T) {
	var list strings.Builder
	for _, c := range Cases {
		fmt.Fprintf(&list, "%s %s %s\n", c.Name, c.Spec, c.Strategy)
		t.Run(c.Name, func(t *testing.T) {
			avg, states := run(t, c.Spec, c.Strategy)
			check(t, c.Name+".avg", avg)
			for r, s := range states {
				check(t, fmt.Sprintf("%s.state%d", c.Name, r), s)
			}
		})
	}
	check(t, "cases.txt", []byte(list.String()))
}

// run drives Ranks Go engines over comm/inproc for Steps steps.
func run(t *testing.T, spec, strategy string) ([]byte, [][]byte) {
	st, err := overlap.ParseStrategy(strategy)
	if err != nil {
		t.Fatal(err)
	}
	cfg := overlap.Config{Spec: spec, Strategy: st, ErrorFeedback: true, Decision: overlap.DecideCompressed, Workers: 1}
	group, err := inproc.NewGroup(Ranks)
	if err != nil {
		t.Fatal(err)
	}
	engines := make([]*overlap.Engine, Ranks)
	errs := make([]error, Ranks)
	var wg sync.WaitGroup
	for r := range Ranks {
		wg.Go(func() { engines[r], errs[r] = overlap.New(context.Background(), group[r], Sizes, cfg) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			t.Fatal(err)
		}
	}
	var avg bytes.Buffer
	for s := range Steps {
		grads := make([][][]float32, Ranks)
		for r := range Ranks {
			grads[r] = make([][]float32, len(Sizes))
			for b, n := range Sizes {
				grads[r][b] = make([]float32, n)
				for i := range n {
					grads[r][b][i] = Gradient(r, s, b, i)
				}
			}
			wg.Go(func() {
				e := engines[r]
				errs[r] = e.Step()
				for b := len(Sizes) - 1; b >= 0 && errs[r] == nil; b-- {
					errs[r] = e.Ready(b, grads[r][b])
				}
				if errs[r] == nil {
					_, errs[r] = e.Wait(context.Background())
				}
			})
		}
		wg.Wait()
		for r, err := range errs {
			if err != nil {
				t.Fatalf("step %d rank %d: %v", s, r, err)
			}
			for _, g := range grads[r] {
				for _, v := range g {
					binary.Write(&avg, binary.LittleEndian, math.Float32bits(v))
				}
			}
		}
	}
	states := make([][]byte, Ranks)
	for r, e := range engines {
		var b bytes.Buffer
		if err := e.Save(&b); err != nil {
			t.Fatal(err)
		}
		states[r] = b.Bytes()
		e.Close()
	}
	return avg.Bytes(), states
}

// check compares got with testdata/name, or writes it with -update.
func check(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./tests/golden -update)", err)
	}
	if !bytes.Equal(got, want) {
		at := 0
		for at < min(len(got), len(want)) && got[at] == want[at] {
			at++
		}
		t.Fatalf("%s: the Go engine's output differs from the golden file at byte %d (%d bytes, want %d); if the change is intended, run go test ./tests/golden -update", name, at, len(got), len(want))
	}
}
