// Package netbench times gradient exchanges over a real transport: a dense
// float32 all-reduce against compressed exchanges of the same gradient, on
// every rank of a comm.Comm group, as `gradcomp netbench` runs them over
// emulated links (scripts/netbench).
//
// # What is timed
//
// Each rank draws its own gradient of Config.Size float32s (rank r uses
// bench.Generate(mixture, Size, Seed+r)). For every case, one untimed run
// warms the exchange up, then Config.Reps timed runs follow. A timed run
// starts after a barrier and ends when the rank average is in the rank's
// gradient buffer; the run's time is that of the slowest rank, and a case's
// time is the median of its runs. Setting the exchange up (the engine's
// handshake, its cost-model probe) and refilling the gradient between runs
// are not timed.
//
// The baseline is a dense all-reduce of the whole gradient followed by the
// division by the rank count: what a framework without compression does.
// Every other case is measured against it (Result.Speedup) and checked
// against its output (Result.RelErr).
package netbench

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/gradcomp/gradcomp/bench"
	"github.com/gradcomp/gradcomp/comm"
)

// Decision modes of a case: whether the exchange may fall back to dense.
const (
	// Baseline marks the dense all-reduce every case is compared with.
	Baseline = "baseline"
	// Pinned forces compression on every bucket.
	Pinned = "pinned"
	// CostModel lets the engine's cost model choose compressed or dense
	// per bucket.
	CostModel = "cost-model"
)

// Case is one exchange to time.
type Case struct {
	// Codec is the compressor spec (compress.Parse), e.g. "topk:0.01".
	// The baseline's is "none".
	Codec string
	// Decision is Baseline, Pinned or CostModel.
	Decision string
}

// Config describes one measurement run. Every rank must pass the same
// Config.
type Config struct {
	Link  string // label copied into every Result, e.g. "1gbit"
	Size  int    // gradient length in float32 elements, at least 1
	Reps  int    // timed runs per case, at least 1
	Seed  uint64 // rank r's gradient is drawn with seed Seed+r
	Cases []Case // in order; the baseline runs first whether listed or not

	// BucketElems is the largest bucket the engine is given, in elements
	// (the gradient is cut into buckets of this size, the last one
	// shorter); at least 1.
	BucketElems int
	// ErrorFeedback turns the engine's error-feedback memory on.
	ErrorFeedback bool
	// Workers is the number of compressor goroutines per rank, at least 1.
	Workers int
	// ProbeBytes is the per-rank size of the all-to-all that measures the
	// link's rate before the cases (0: no probe). It is rounded down to a
	// multiple of the rank count.
	ProbeBytes int
	// Timeout bounds each collective and each exchange.
	Timeout time.Duration
	// Progress, when set, is called on rank 0 before each case with a
	// short description.
	Progress func(msg string)
}

// Result is the measurement of one case, the same on every rank. The JSON
// field names are part of the output format of `gradcomp netbench`.
type Result struct {
	Strategy string  `json:"strategy"`         // how the buckets crossed the wire: "dense" (MPI all-reduce), "sparse-gather", "sra", "shared-index", …
	Codec    string  `json:"codec"`            // compressor spec; "none" for the baseline
	Decision string  `json:"decision"`         // Baseline, Pinned or CostModel
	Link     string  `json:"link"`             // Config.Link
	Seconds  float64 `json:"seconds"`          // median over the timed runs of the slowest rank's time
	Speedup  float64 `json:"speedup_vs_dense"` // baseline Seconds / Seconds
	Ranks    int     `json:"ranks"`            // group size
	Size     int     `json:"size"`             // gradient length, float32 elements
	Bytes    int64   `json:"bytes"`            // gradient size in bytes (4·Size)
	// BytesSent is what the busiest rank put on the wire in one exchange:
	// the engine's count for compressed cases, the ring all-reduce volume
	// 2(n−1)/n·Bytes for the baseline.
	BytesSent int64 `json:"bytes_sent"`
	// Buckets and Compressed count the buckets of one exchange and those
	// that crossed compressed (on the slowest rank's last run).
	Buckets    int `json:"buckets"`
	Compressed int `json:"compressed_buckets"`
	// Reason is the engine's explanation of its choice for the first
	// bucket (cost-model inputs) on the reporting rank, when it gives one.
	Reason string `json:"reason,omitempty"`
	// RelErr is ‖avg − dense‖₂ / ‖dense‖₂ on the rank with the largest
	// value, where avg is this case's output and dense the baseline's.
	RelErr float64 `json:"rel_err"`
	// LinkGbps is the probed per-rank link rate in Gbit/s (0 without a
	// probe); see Probe.
	LinkGbps float64 `json:"link_gbit_s"`
	// Runs holds every timed run's time (slowest rank), in order.
	Runs []float64 `json:"runs"`
}

func (cfg Config) validate() error {
	switch {
	case cfg.Size < 1:
		return fmt.Errorf("netbench: size %d, want at least 1 element", cfg.Size)
	case cfg.Reps < 1:
		return fmt.Errorf("netbench: %d repetitions, want at least 1", cfg.Reps)
	case cfg.BucketElems < 1:
		return fmt.Errorf("netbench: bucket of %d elements, want at least 1", cfg.BucketElems)
	case cfg.Workers < 1:
		return fmt.Errorf("netbench: %d workers, want at least 1", cfg.Workers)
	case cfg.ProbeBytes < 0:
		return fmt.Errorf("netbench: probe of %d bytes, want 0 or more", cfg.ProbeBytes)
	case cfg.Timeout <= 0:
		return fmt.Errorf("netbench: timeout %v, want a positive duration", cfg.Timeout)
	}
	for _, cs := range cfg.Cases {
		switch cs.Decision {
		case Baseline, Pinned, CostModel:
		default:
			return fmt.Errorf("netbench: case %q: decision %q, want %q, %q or %q", cs.Codec, cs.Decision, Baseline, Pinned, CostModel)
		}
	}
	return nil
}

// Run measures the link (see Probe) and then every case of cfg on rank
// c.Rank() of c, and returns the results, baseline first, the same on every
// rank. Every rank of c must call Run with the same cfg. An error on one
// rank (a bad spec, a failed collective) usually ends the others' calls
// with an error too, within cfg.Timeout.
func Run(ctx context.Context, c comm.Comm, cfg Config) ([]Result, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	progress := func(format string, a ...any) {
		if cfg.Progress != nil && c.Rank() == 0 {
			cfg.Progress(fmt.Sprintf(format, a...))
		}
	}
	var gbps float64
	if n := cfg.ProbeBytes / c.Size() * c.Size(); n > 0 {
		progress("probing the link (all-to-all of %d bytes per rank)", n)
		var err error
		if gbps, err = Probe(ctx, c, n, cfg.Reps, cfg.Timeout); err != nil {
			return nil, err
		}
	}
	src := bench.Generate(mixture, cfg.Size, cfg.Seed+uint64(c.Rank()))
	grad := make([]float32, cfg.Size)
	m := measurer{c: c, cfg: cfg, src: src, grad: grad}

	cases := append([]Case{{Codec: "none", Decision: Baseline}}, slices.DeleteFunc(slices.Clone(cfg.Cases), func(cs Case) bool { return cs.Decision == Baseline })...)
	var results []Result
	var dense []float32
	for _, cs := range cases {
		progress("%s %s", cs.Codec, cs.Decision)
		r, err := m.measure(ctx, cs, dense)
		if err != nil {
			return results, fmt.Errorf("netbench: %s (%s) on rank %d: %w", cs.Codec, cs.Decision, c.Rank(), err)
		}
		if dense == nil {
			dense = slices.Clone(grad)
		}
		r.Link, r.LinkGbps = cfg.Link, gbps
		base := r.Seconds
		if len(results) > 0 {
			base = results[0].Seconds
		}
		if r.Seconds > 0 {
			r.Speedup = base / r.Seconds
		}
		results = append(results, r)
	}
	return results, nil
}

// mixture is the distribution the gradients are drawn from.
var mixture = func() bench.Distribution {
	d, err := bench.DistributionByName("mixture")
	if err != nil {
		panic(err) // a built-in name: cannot happen
	}
	return d
}()

// measurer runs the cases of one Run on one rank.
type measurer struct {
	c    comm.Comm
	cfg  Config
	src  []float32 // this rank's gradient, never modified
	grad []float32 // the exchange buffer, refilled from src before each run
}

// measure times case cs; dense is the baseline's output (nil while
// measuring the baseline itself).
func (m *measurer) measure(ctx context.Context, cs Case, dense []float32) (Result, error) {
	ex, err := newExchange(ctx, m.c, cs, m.cfg)
	if err != nil {
		return Result{}, err
	}
	r, err := m.time(ctx, ex, cs, dense)
	if cerr := ex.close(); err == nil {
		err = cerr
	}
	return r, err
}

func (m *measurer) time(ctx context.Context, ex exchange, cs Case, dense []float32) (Result, error) {
	n := m.c.Size()
	r := Result{Codec: cs.Codec, Decision: cs.Decision, Ranks: n, Size: m.cfg.Size, Bytes: 4 * int64(m.cfg.Size)}
	var last sample
	for rep := -1; rep < m.cfg.Reps; rep++ { // rep -1 is the warm-up
		copy(m.grad, m.src)
		if err := barrier(ctx, m.c, m.cfg.Timeout); err != nil {
			return r, err
		}
		start := time.Now()
		s, err := ex.run(ctx, m.grad)
		took := time.Since(start)
		if err != nil {
			return r, err
		}
		secs, s, err := m.slowest(ctx, took, s)
		if err != nil {
			return r, err
		}
		if rep >= 0 {
			r.Runs = append(r.Runs, secs)
			last = s
		}
	}
	r.Seconds = median(r.Runs)
	r.Strategy, r.BytesSent, r.Buckets, r.Compressed, r.Reason = last.strategy, last.bytesSent, last.buckets, last.compressed, last.reason
	if dense != nil {
		e, err := m.maxOver(ctx, relL2(m.grad, dense))
		if err != nil {
			return r, err
		}
		r.RelErr = e
	}
	return r, nil
}

// slowest returns the time of the rank that took longest and the largest
// bytesSent of any rank; the rest of the sample is this rank's own (the
// engine makes the same choices on every rank).
func (m *measurer) slowest(ctx context.Context, took time.Duration, s sample) (float64, sample, error) {
	all, err := gatherFloats(ctx, m.c, m.cfg.Timeout, []float64{took.Seconds(), float64(s.bytesSent)})
	if err != nil {
		return 0, s, err
	}
	var secs, sent float64
	for i := 0; i < len(all); i += 2 {
		secs, sent = max(secs, all[i]), max(sent, all[i+1])
	}
	s.bytesSent = int64(sent)
	return secs, s, nil
}

// maxOver returns the largest v of any rank.
func (m *measurer) maxOver(ctx context.Context, v float64) (float64, error) {
	all, err := gatherFloats(ctx, m.c, m.cfg.Timeout, []float64{v})
	if err != nil {
		return 0, err
	}
	return slices.Max(all), nil
}

// median returns the median of xs (the mean of the middle two for an even
// count); xs is not modified.
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// relL2 returns ‖x − ref‖₂ / ‖ref‖₂ (‖x − ref‖₂ when ref is zero).
func relL2(x, ref []float32) float64 {
	var num, den float64
	for i, v := range ref {
		d := float64(x[i]) - float64(v)
		num += d * d
		den += float64(v) * float64(v)
	}
	if den == 0 {
		return math.Sqrt(num)
	}
	return math.Sqrt(num / den)
}
