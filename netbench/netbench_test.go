package netbench

import (
	"context"
	"math"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
)

// onRanks runs f on every rank of an in-process group of n and returns the
// ranks' results and errors, in rank order.
func onRanks[T any](t *testing.T, n int, f func(c comm.Comm) (T, error)) ([]T, []error) {
	t.Helper()
	ranks, err := inproc.NewGroup(n)
	if err != nil {
		t.Fatal(err)
	}
	out, errs := make([]T, n), make([]error, n)
	var wg sync.WaitGroup
	for _, c := range ranks {
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer c.Close()
			out[c.Rank()], errs[c.Rank()] = f(c)
		}()
	}
	wg.Wait()
	return out, errs
}

func testConfig() Config {
	return Config{
		Link: "test", Size: 10_000, Reps: 3, Seed: 7,
		BucketElems: 4096, ErrorFeedback: true, Workers: 1,
		ProbeBytes: 4096, Timeout: 10 * time.Second,
	}
}

func TestRunMeasuresEveryCase(t *testing.T) {
	cfg := testConfig()
	cfg.Cases = []Case{{"none", Pinned, ""}, {"topk:0.01", Pinned, ""}, {"int8", Pinned, ""}}
	var progress []string
	cfg.Progress = func(msg string) { progress = append(progress, msg) }
	all, errs := onRanks(t, 4, func(c comm.Comm) ([]Result, error) { return Run(context.Background(), c, cfg) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	results := all[0]
	if len(results) != 4 {
		t.Fatalf("%d results, want the baseline and 3 cases: %+v", len(results), results)
	}
	for r := 1; r < len(all); r++ {
		for i := range results {
			a, b := results[i], all[r][i]
			if a.Seconds != b.Seconds || a.RelErr != b.RelErr || a.BytesSent != b.BytesSent || a.LinkGbps != b.LinkGbps {
				t.Errorf("rank %d result %d differs from rank 0's: %+v vs %+v", r, i, b, a)
			}
		}
	}
	base := results[0]
	if base.Decision != Baseline || base.Codec != "none" || base.Strategy != "dense" || base.Speedup != 1 || base.DenseSeconds != base.Seconds || base.RelErr != 0 {
		t.Errorf("baseline: %+v", base)
	}
	if want := int64(2 * 3 * 4 * cfg.Size / 4); base.BytesSent != want {
		t.Errorf("baseline sent %d bytes, want the ring volume %d", base.BytesSent, want)
	}
	if base.ExchangeSeconds <= 0 || base.ExchangeSeconds > base.Seconds*1.5 || base.CompressSeconds != 0 {
		t.Errorf("baseline stages: %+v", base)
	}
	if base.LinkGbps <= 0 {
		t.Errorf("probed rate %v, want > 0", base.LinkGbps)
	}
	for i, r := range results {
		if r.Link != "test" || r.Ranks != 4 || r.Size != cfg.Size || r.Bytes != 4*int64(cfg.Size) || len(r.Runs) != cfg.Reps {
			t.Errorf("result %d: %+v", i, r)
		}
		if r.Seconds <= 0 || r.Seconds != median(r.Runs) || r.DenseSeconds <= 0 || math.Abs(r.Speedup-r.DenseSeconds/r.Seconds) > 1e-12 {
			t.Errorf("result %d: seconds %v of runs %v, speedup %v against %v", i, r.Seconds, r.Runs, r.Speedup, r.DenseSeconds)
		}
	}
	// The engine's dense path adds in the same order as the baseline's
	// all-reduce; lossy codecs must differ, and send less.
	if none := results[1]; none.RelErr > 1e-6 || none.Strategy != "dense" || none.Buckets != 3 || none.Compressed != 0 || none.BytesSent != base.BytesSent {
		t.Errorf("uncompressed exchange through the engine: %+v", none)
	}
	for i, strategy := range []string{"sparse-gather", "sra"} {
		r := results[2+i]
		if r.Strategy != strategy || r.Buckets != 3 || r.Compressed != 3 || !strings.Contains(r.Reason, "pinned") {
			t.Errorf("%s: %+v, want strategy %s with 3 buckets compressed", r.Codec, r, strategy)
		}
		if r.CompressSeconds <= 0 || r.ExchangeSeconds <= 0 || r.DecompressSeconds <= 0 {
			t.Errorf("%s: stage times %v, %v, %v; want all positive", r.Codec, r.CompressSeconds, r.ExchangeSeconds, r.DecompressSeconds)
		}
		if r.RelErr <= 1e-6 || r.RelErr > 1 {
			t.Errorf("%s: relative error %v, want in (1e-6, 1]", r.Codec, r.RelErr)
		}
		if r.BytesSent >= base.BytesSent {
			t.Errorf("%s sent %d bytes, dense %d", r.Codec, r.BytesSent, base.BytesSent)
		}
	}
	if len(progress) != 5 || !strings.Contains(progress[0], "probing") || !strings.Contains(progress[4], "int8") {
		t.Errorf("progress on rank 0: %q", progress)
	}
}

func TestRunWithCostModel(t *testing.T) {
	cfg := testConfig()
	cfg.Reps = 1
	cfg.Cases = []Case{{"int4", CostModel, ""}}
	all, errs := onRanks(t, 2, func(c comm.Comm) ([]Result, error) { return Run(context.Background(), c, cfg) })
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	r := all[0][1]
	if r.Decision != CostModel || r.Buckets != 3 || r.Reason == "" || strings.Contains(r.Reason, "pinned") {
		t.Errorf("cost-model case: %+v, want the model's reason", r)
	}
	if all[1][1].Compressed != r.Compressed {
		t.Errorf("ranks disagree on the compressed buckets: %d vs %d", r.Compressed, all[1][1].Compressed)
	}
}

func TestBucketSizes(t *testing.T) {
	for _, c := range []struct {
		n, max int
		want   []int
	}{{10, 4, []int{4, 4, 2}}, {8, 4, []int{4, 4}}, {3, 4, []int{3}}, {1, 1, []int{1}}} {
		if got := bucketSizes(c.n, c.max); !slices.Equal(got, c.want) {
			t.Errorf("bucketSizes(%d, %d) = %v, want %v", c.n, c.max, got, c.want)
		}
	}
}

func TestRunRejectsBadConfig(t *testing.T) {
	for name, edit := range map[string]func(*Config){
		"size":     func(c *Config) { c.Size = 0 },
		"reps":     func(c *Config) { c.Reps = 0 },
		"bucket":   func(c *Config) { c.BucketElems = 0 },
		"workers":  func(c *Config) { c.Workers = 0 },
		"probe":    func(c *Config) { c.ProbeBytes = -1 },
		"timeout":  func(c *Config) { c.Timeout = 0 },
		"decision": func(c *Config) { c.Cases = []Case{{"int8", "sometimes", ""}} },
		"baseline": func(c *Config) { c.Cases = []Case{{"none", Baseline, ""}} },
	} {
		cfg := testConfig()
		edit(&cfg)
		_, errs := onRanks(t, 2, func(c comm.Comm) ([]Result, error) { return Run(context.Background(), c, cfg) })
		for r, err := range errs {
			if err == nil || !strings.Contains(err.Error(), "netbench:") {
				t.Errorf("%s: rank %d: error %v", name, r, err)
			}
		}
	}
}

func TestRunReportsBadSpecOnEveryRank(t *testing.T) {
	cfg := testConfig()
	cfg.Timeout = 2 * time.Second
	cfg.Cases = []Case{{"topk:2", Pinned, ""}}
	_, errs := onRanks(t, 3, func(c comm.Comm) ([]Result, error) { return Run(context.Background(), c, cfg) })
	for r, err := range errs {
		if err == nil || !strings.Contains(err.Error(), "topk:2") {
			t.Errorf("rank %d: error %v, want one naming the spec", r, err)
		}
	}
}

func TestProbe(t *testing.T) {
	rates, errs := onRanks(t, 4, func(c comm.Comm) (float64, error) {
		return Probe(context.Background(), c, 1<<16, 2, 5*time.Second)
	})
	for r, err := range errs {
		if err != nil || rates[r] <= 0 {
			t.Errorf("rank %d: rate %v, error %v", r, rates[r], err)
		}
	}
	_, errs = onRanks(t, 4, func(c comm.Comm) (float64, error) { return Probe(context.Background(), c, 1001, 2, time.Second) })
	for r, err := range errs {
		if err == nil {
			t.Errorf("rank %d: no error for 1001 bytes on 4 ranks", r)
		}
	}
	rates, errs = onRanks(t, 1, func(c comm.Comm) (float64, error) { return Probe(context.Background(), c, 64, 1, time.Second) })
	if errs[0] != nil || rates[0] != 0 {
		t.Errorf("one rank: rate %v, error %v; want 0, nil", rates[0], errs[0])
	}
}

func TestMedian(t *testing.T) {
	for _, c := range []struct {
		in   []float64
		want float64
	}{{[]float64{3}, 3}, {[]float64{5, 1, 3}, 3}, {[]float64{4, 1, 3, 2}, 2.5}} {
		in := append([]float64(nil), c.in...)
		if got := median(c.in); got != c.want {
			t.Errorf("median(%v) = %v, want %v", in, got, c.want)
		}
		for i := range in {
			if in[i] != c.in[i] {
				t.Errorf("median modified its input: %v", c.in)
			}
		}
	}
}

func TestRelL2(t *testing.T) {
	if got := relL2([]float32{3, 4}, []float32{0, 0}); got != 5 {
		t.Errorf("against zero: %v, want the absolute norm 5", got)
	}
	if got := relL2([]float32{1, 2}, []float32{1, 2}); got != 0 {
		t.Errorf("equal: %v", got)
	}
	if got := relL2([]float32{0, 0}, []float32{3, 4}); got != 1 {
		t.Errorf("zero against x: %v, want 1", got)
	}
}

// TestRunHier: on 2 nodes × 2 in-process ranks, the hierarchical cases run
// through the engine's hier strategy, report the layout and agree with
// the dense baseline.
func TestRunHier(t *testing.T) {
	cfg := testConfig()
	cfg.Cases = []Case{{"none", Pinned, "hier"}, {"int8", Pinned, "hier"}}
	var progress []string // rank 0's only
	cfg.Progress = func(msg string) { progress = append(progress, msg) }
	ranks, err := inproc.NewNodeGroup([]int{0, 0, 1, 1})
	if err != nil {
		t.Fatal(err)
	}
	all := make([][]Result, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for r, c := range ranks {
		wg.Go(func() { all[r], errs[r] = Run(context.Background(), c, cfg) })
	}
	wg.Wait()
	for r, err := range errs {
		if err != nil {
			t.Fatalf("rank %d: %v", r, err)
		}
	}
	for i, limit := range []float64{1e-6, 0.1} { // dense: rounding; int8: its quantization
		res := all[0][1+i]
		if res.Strategy != "hier" || res.Nodes != 2 || res.RelErr > limit {
			t.Errorf("%s: strategy %s on %d nodes, rel err %g; want hier on 2 nodes, within %g of dense", res.Codec, res.Strategy, res.Nodes, res.RelErr, limit)
		}
	}
	if n := len(progress); n < 2 || progress[n-1] != "int8 pinned, strategy hier" {
		t.Errorf("progress on rank 0: %q, want the last to name strategy hier", progress)
	}
}

// TestTxBytes: the transmitted bytes of /proc/net/dev, loopback left out.
func TestTxBytes(t *testing.T) {
	dev := `Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo: 900 9 0 0 0 0 0 0 900 9 0 0 0 0 0 0
gcnb-v0: 1000 10 0 0 0 0 0 0 2500 20 0 0 0 0 0 0
  eth1: 1 1 0 0 0 0 0 0 500 3 0 0 0 0 0 0
`
	if got, err := txBytes(dev); err != nil || got != 3000 {
		t.Errorf("txBytes = %d, %v; want 3000", got, err)
	}
	if _, err := txBytes("eth0: 1 2 3\n"); err == nil {
		t.Error("txBytes of a short line: no error")
	}
}
