package bench

import (
	"context"
	"errors"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/internal/synth"
)

// quick is a Config that keeps suite tests fast: one short round per cell.
func quick(codecs []string, sizes ...int) Config {
	return Config{Codecs: codecs, Sizes: sizes, Seed: 1, MinRounds: 1, MaxRounds: 2, Budget: time.Millisecond}
}

// requireCodecs skips t when a codec it needs is not built into compress yet.
func requireCodecs(t *testing.T, names ...string) {
	t.Helper()
	for _, n := range names {
		if !slices.Contains(compress.CodecNames(), n) {
			t.Skipf("codec %q is not registered in compress on this branch (have %v)", n, compress.CodecNames())
		}
	}
}

func TestRunDense(t *testing.T) {
	// The second size spans two of synth's 65536-element blocks.
	sizes := []int{1000, 1<<16 + 3}
	cfg := quick([]string{"none", "fp16", "bf16", "fp16:lossless=huff0"}, sizes...)
	calls := 0
	cfg.Progress = func(done, total int) {
		calls++
		if done != calls || total != 8 {
			t.Errorf("progress(%d, %d) at call %d, want (%d, 8)", done, total, calls, calls)
		}
	}
	rs, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if len(rs) != 8 || calls != 8 {
		t.Fatalf("%d results, %d progress calls; want 8 of each", len(rs), calls)
	}
	for i, r := range rs {
		if want := sizes[i/4]; r.Size != want {
			t.Errorf("result %d (%s) has size %d, want %d (sizes outer)", i, r.Codec, r.Size, want)
		}
		if r.Error != "" || r.Dist != "mixture" || r.Workers != 1 || r.Rounds < 1 {
			t.Errorf("%s@%d: error %q, dist %q, workers %d, rounds %d", r.Codec, r.Size, r.Error, r.Dist, r.Workers, r.Rounds)
		}
		if r.EncodeGBps <= 0 || r.DecodeGBps <= 0 || r.MemcpyGBps <= 0 || r.EncodeVsMemcpy != r.EncodeGBps/r.MemcpyGBps {
			t.Errorf("%s@%d: throughputs enc %g dec %g copy %g ratio %g", r.Codec, r.Size, r.EncodeGBps, r.DecodeGBps, r.MemcpyGBps, r.EncodeVsMemcpy)
		}
		if r.Recall != nil {
			t.Errorf("%s@%d has a recall", r.Codec, r.Size)
		}
		if want := float64(4*r.Size) / float64(r.PayloadBytes); r.Ratio != want {
			t.Errorf("%s@%d: ratio %g, want 4n/payload = %g", r.Codec, r.Size, r.Ratio, want)
		}
		switch r.Codec {
		case "none":
			if r.Ratio < 0.9 || r.Ratio >= 1 || r.RelL2Error != 0 {
				t.Errorf("none@%d: ratio %g (want just under 1), error %g (want 0)", r.Size, r.Ratio, r.RelL2Error)
			}
		case "fp16":
			if r.Ratio < 1.8 || r.Ratio >= 2 || r.RelL2Error <= 0 || r.RelL2Error >= 1e-3 {
				t.Errorf("fp16@%d: ratio %g, error %g", r.Size, r.Ratio, r.RelL2Error)
			}
		case "bf16":
			if r.Ratio < 1.8 || r.Ratio >= 2 || r.RelL2Error < 1e-4 || r.RelL2Error >= 1e-2 {
				t.Errorf("bf16@%d: ratio %g, error %g", r.Size, r.Ratio, r.RelL2Error)
			}
		case "fp16:lossless=huff0":
			if r.Lossless != "huff0" || r.LosslessRatioGain == nil || r.LosslessEncodeSlowdown == nil {
				t.Fatalf("fp16:lossless=huff0@%d: lossless fields %q %v %v", r.Size, r.Lossless, r.LosslessRatioGain, r.LosslessEncodeSlowdown)
			}
			plain := rs[i-2] // fp16 of the same size
			if gain := float64(plain.PayloadBytes) / float64(r.PayloadBytes); *r.LosslessRatioGain != gain || gain < 1 {
				t.Errorf("fp16:lossless=huff0@%d: gain %g, want fp16 bytes / these bytes = %g ≥ 1", r.Size, *r.LosslessRatioGain, gain)
			}
			if *r.LosslessEncodeSlowdown <= 0 {
				t.Errorf("fp16:lossless=huff0@%d: slowdown %g", r.Size, *r.LosslessEncodeSlowdown)
			}
		default:
			t.Errorf("unexpected codec %q", r.Codec)
		}
		if r.Lossless == "" && (r.LosslessRatioGain != nil || r.LosslessEncodeSlowdown != nil) {
			t.Errorf("%s@%d has lossless figures without a stage", r.Codec, r.Size)
		}
	}
}

func TestRunSampledTopKRecall(t *testing.T) {
	requireCodecs(t, "topk")
	rs, err := Run(context.Background(), quick([]string{"topk:0.01:sampled", "topk:0.01"}, 1<<16))
	if err != nil {
		t.Fatal(err)
	}
	if rs[0].Recall == nil || *rs[0].Recall <= 0.5 || *rs[0].Recall > 1 {
		t.Errorf("sampled top-k recall %v, want in (0.5, 1]", rs[0].Recall)
	}
	if rs[1].Recall != nil {
		t.Errorf("exact top-k has a recall %v", *rs[1].Recall)
	}
	if rs[1].Ratio < 40 || rs[1].RelL2Error <= 0 || rs[1].RelL2Error >= 1 {
		t.Errorf("topk:0.01: ratio %g, error %g", rs[1].Ratio, rs[1].RelL2Error)
	}
}

// TestRunChunkedTopK: SparseLoCo's setting, 4096-element chunks at 2%
// with 2-bit values, is 256 chunks of 8 + 123 + 21 bytes at 1M elements.
func TestRunChunkedTopK(t *testing.T) {
	requireCodecs(t, "topk")
	rs, err := Run(context.Background(), quick([]string{"topk:0.02:chunk=4096:bits=2"}, 1<<20))
	if err != nil {
		t.Fatal(err)
	}
	if want := float64(4<<20) / float64(compress.HeaderLen+256*(8+123+21)+compress.TrailerLen); rs[0].Ratio != want || rs[0].RelL2Error <= 0 || rs[0].RelL2Error >= 1 {
		t.Errorf("ratio %g (want %g), error %g", rs[0].Ratio, want, rs[0].RelL2Error)
	}
}

// TestRunCodecError feeds fp16 a value it cannot hold: the run goes on and
// the failed cell carries the codec's error.
func TestRunCodecError(t *testing.T) {
	huge := synth.New("huge", "one value beyond fp16", func(dst []float32, r *rand.Rand) {
		for i := range dst {
			dst[i] = float32(r.NormFloat64())
		}
		dst[0] = 1e6
	})
	cfg := quick([]string{"fp16", "none"}, 100)
	cfg.Dist = huge
	rs, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(rs[0].Error, "non-finite") || rs[0].Ratio != 0 || rs[0].Codec != "fp16" || rs[0].Size != 100 {
		t.Errorf("fp16 on 1e6: %+v, want the codec's non-finite error and no figures", rs[0])
	}
	if rs[1].Error != "" || rs[1].RelL2Error != 0 {
		t.Errorf("none after a failed codec: %+v", rs[1])
	}
}

func TestRunBadConfig(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name string
		cfg  Config
		want []string // substrings of the error
	}{
		{"unknown codecs", quick([]string{"none", "nosuch", "fp16", "alsonot"}, 10), []string{`"nosuch"`, `"alsonot"`, "fp16", "none"}},
		{"bad option", quick([]string{"fp16:lossless=lz4"}, 10), []string{"lz4"}},
		{"duplicate", quick([]string{"fp16", "fp16:lossless=none"}, 10), []string{"twice"}},
		{"space", quick([]string{" fp16"}, 10), []string{"printable ASCII without spaces"}},
		{"no codec", quick(nil, 10), []string{"no codec"}},
		{"no size", quick([]string{"none"}), []string{"no size"}},
		{"zero size", quick([]string{"none"}, 0), []string{"size 0"}},
		{"workers", Config{Codecs: []string{"none"}, Sizes: []int{1}, Workers: -2}, []string{"-2 workers"}},
		{"rounds", Config{Codecs: []string{"none"}, Sizes: []int{1}, MinRounds: 5, MaxRounds: 2}, []string{"MinRounds"}},
	}
	for _, c := range cases {
		called := false
		c.cfg.Progress = func(int, int) { called = true }
		rs, err := Run(ctx, c.cfg)
		if err == nil || rs != nil || called {
			t.Errorf("%s: Run = %v, %v (progress called %v); want an error before any measurement", c.name, rs, err, called)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not mention %s", c.name, err, w)
			}
		}
	}
}

func TestRunCancelled(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	cfg := quick([]string{"none", "fp16"}, 1000)
	cfg.Progress = func(int, int) { cancel() }
	rs, err := Run(ctx, cfg)
	if !errors.Is(err, context.Canceled) || len(rs) != 1 {
		t.Fatalf("Run after cancel = %d results, %v; want 1 and context.Canceled", len(rs), err)
	}
}

func TestSplitList(t *testing.T) {
	if got := SplitList(" none, fp16 ,topk:0.01"); !slices.Equal(got, []string{"none", "fp16", "topk:0.01"}) {
		t.Errorf("SplitList = %q", got)
	}
}
