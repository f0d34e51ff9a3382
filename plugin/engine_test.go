package main

import (
	"bytes"
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/hosted"
	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/overlap"
)

// TestMirrorLayouts: the Go mirrors of gradcomp.h's structs have the C
// layouts (tests/capi asserts the same sizes and offsets on the C side).
func TestMirrorLayouts(t *testing.T) {
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(gc_op)", unsafe.Sizeof(cOp{}), 72},
		{"offsetof(gc_op, count)", unsafe.Offsetof(cOp{}.Count), 24},
		{"offsetof(gc_op, stream)", unsafe.Offsetof(cOp{}.Stream), 64},
		{"sizeof(gc_engine_config)", unsafe.Sizeof(cEngineConfig{}), engineConfigSize211},
		{"offsetof(gc_engine_config, feedback_decay) (ABI 2.7 size)", unsafe.Offsetof(cEngineConfig{}.FeedbackDecay), engineConfigSize27},
		{"offsetof(gc_engine_config, shapes)", unsafe.Offsetof(cEngineConfig{}.Shapes), 120},
		{"offsetof(gc_engine_config, tensor_counts) (ABI 2.5 size)", unsafe.Offsetof(cEngineConfig{}.TensorCounts), engineConfigSize25},
		{"offsetof(gc_engine_config, node_spec) (ABI 2.4 size)", unsafe.Offsetof(cEngineConfig{}.NodeSpec), engineConfigSize24},
		{"offsetof(gc_engine_config, node)", unsafe.Offsetof(cEngineConfig{}.Node), 84},
		{"offsetof(gc_engine_config, local_size)", unsafe.Offsetof(cEngineConfig{}.LocalSize), 96},
		{"offsetof(gc_op, group)", unsafe.Offsetof(cOp{}.Group), 20},
		{"offsetof(gc_engine_config, momentum_masking)", unsafe.Offsetof(cEngineConfig{}.MomentumMasking), 80},
		{"offsetof(gc_engine_config, momentum) (ABI 2.0 size)", unsafe.Offsetof(cEngineConfig{}.Momentum), engineConfigSize20},
		{"offsetof(gc_engine_config, guard) (ABI 2.1 size)", unsafe.Offsetof(cEngineConfig{}.Guard), engineConfigSize21},
		{"offsetof(gc_engine_config, timeout_seconds)", unsafe.Offsetof(cEngineConfig{}.Timeout), 40},
		{"offsetof(gc_engine_config, device)", unsafe.Offsetof(cEngineConfig{}.Device), 52},
		{"sizeof(gc_bucket_stats)", unsafe.Sizeof(cBucketStats{}), 640},
		{"offsetof(gc_bucket_stats, compress_seconds)", unsafe.Offsetof(cBucketStats{}.Compress), 40},
		{"offsetof(gc_bucket_stats, reason)", unsafe.Offsetof(cBucketStats{}.Reason), 128},
		{"sizeof(gc_bucket_verdict)", unsafe.Sizeof(cBucketVerdict{}), verdictSize210},
		{"offsetof(gc_bucket_verdict, guard)", unsafe.Offsetof(cBucketVerdict{}.Guard), 12},
		{"offsetof(gc_bucket_verdict, held_back)", unsafe.Offsetof(cBucketVerdict{}.HeldBack), 16},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, want %d", c.name, c.got, c.want)
		}
	}
}

// serve carries out tr's posts on c, completing them through the export
// cores (pins included), until tr is closed.
func serve(tr *transport, c comm.Comm) {
	for {
		op, err := tr.take(-1, time.Second)
		if errors.Is(err, comm.ErrClosed) {
			return
		}
		if err != nil {
			continue
		}
		n, runErr := hosted.Run(context.Background(), op, c)
		tr.complete(op.ID, n, runErr)
	}
}

// TestEngineOverHosted: the plugin's engine on hosted transports served
// by Go hosts gives bit for bit the Go engine's results on the same
// in-process ranks, for every strategy.
func TestEngineOverHosted(t *testing.T) {
	const ranks, steps = 3, 3
	sizes := []int{1000, 37}
	for _, tc := range []struct{ spec, strategy string }{
		{"int8", "sra"}, {"topk:0.05", "sparse-gather"}, {"randomk:0.1", "shared-index"}, {"sign", "allgather"}, {"none", "auto"},
	} {
		t.Run(tc.spec, func(t *testing.T) {
			conf, err := parseEngineConfig(rawEngineConfig{spec: tc.spec, strategy: tc.strategy, decision: "compressed", ef: true, timeout: 10, workers: 1, device: -1})
			if err != nil {
				t.Fatal(err)
			}
			viaPlugin := make([]*engine, ranks)
			viaGo := make([]*overlap.Engine, ranks)
			hostGroup, _ := inproc.NewGroup(ranks)
			goGroup, _ := inproc.NewGroup(ranks)
			var wg sync.WaitGroup
			errs := make([]error, 2*ranks)
			trs := make([]*transport, ranks)
			for r := range ranks {
				trs[r], _ = newTransport(r, ranks)
				go serve(trs[r], hostGroup[r])
				wg.Go(func() { viaPlugin[r], errs[r] = newEngine(trs[r], conf, sizes, nil) })
				wg.Go(func() { viaGo[r], errs[ranks+r] = overlap.New(context.Background(), goGroup[r], sizes, conf.Config) })
			}
			wg.Wait()
			t.Cleanup(func() {
				for r := range ranks {
					viaPlugin[r].close()
					viaGo[r].Close()
					trs[r].close()
				}
			})
			for _, err := range errs {
				if err != nil {
					t.Fatal(err)
				}
			}
			for s := range steps {
				got, want := grads(ranks, s, sizes), grads(ranks, s, sizes)
				for r := range ranks {
					wg.Go(func() {
						e := viaPlugin[r]
						errs[r] = e.stepper().Step()
						for i := range sizes {
							if errs[r] == nil {
								errs[r] = e.ready(len(sizes)-1-i, got[r][len(sizes)-1-i])
							}
						}
						if errs[r] == nil {
							errs[r] = e.wait(0)
						}
					})
					wg.Go(func() {
						e := viaGo[r]
						errs[ranks+r] = e.Step()
						for i := range sizes {
							if errs[ranks+r] == nil {
								errs[ranks+r] = e.Ready(i, want[r][i])
							}
						}
						if errs[ranks+r] == nil {
							_, errs[ranks+r] = e.Wait(context.Background())
						}
					})
				}
				wg.Wait()
				for _, err := range errs {
					if err != nil {
						t.Fatalf("step %d: %v", s, err)
					}
				}
				for r := range ranks {
					for i := range sizes {
						for j := range got[r][i] {
							if got[r][i][j] != want[r][i][j] {
								t.Fatalf("step %d rank %d bucket %d element %d: plugin %v, Go engine %v", s, r, i, j, got[r][i][j], want[r][i][j])
							}
						}
					}
					st, _, err := viaPlugin[r].stats()
					if err != nil || st.Step != uint64(s) || st.BytesSent == 0 {
						t.Fatalf("stats: %+v, %v", st, err)
					}
				}
			}
			for r := range ranks {
				a, err1 := viaPlugin[r].saveState()
				var b bytes.Buffer
				err2 := viaGo[r].Save(&b)
				if err1 != nil || err2 != nil || !bytes.Equal(a, b.Bytes()) {
					t.Fatalf("rank %d: states differ (%d vs %d bytes; %v, %v)", r, len(a), b.Len(), err1, err2)
				}
			}
		})
	}
}

// grads returns the gradients of one step.
func grads(ranks, step int, sizes []int) [][][]float32 {
	g := make([][][]float32, ranks)
	for r := range g {
		rng := rand.New(rand.NewPCG(uint64(r), uint64(step)))
		g[r] = make([][]float32, len(sizes))
		for i, n := range sizes {
			g[r][i] = make([]float32, n)
			for j := range g[r][i] {
				g[r][i][j] = float32(rng.NormFloat64())
			}
		}
	}
	return g
}
