// Package netbench times gradient exchanges over a real transport: a dense
// float32 all-reduce against compressed exchanges of the same gradient, on
// every rank of a comm.Comm group, as `gradcomp netbench` runs them over
// emulated links (scripts/netbench).
//
// # What is timed
//
// Each rank draws its own gradient of Config.Size float32s (rank r uses
// synth.Generate(mixture, Size, Seed+r)). A timed run starts after a
// barrier and ends when the rank average is in the rank's gradient buffer;
// the run's time is that of the slowest rank. Setting an exchange up (the
// engine's handshake, its cost-model probe) and refilling the gradient
// between runs are not timed.
//
// The baseline is a dense all-reduce of the whole gradient followed by the
// division by the rank count: what a framework without compression does.
// It is measured first on its own (one untimed warm-up run, then
// Config.Reps timed runs, median). Each case then goes through the overlap
// engine, in pairs of runs: a baseline run, then a run of the case, one
// untimed warm-up pair (with the cost model, also the engine's verification
// window: overlap.VerifyWindow more) and Config.Reps timed ones. A case's
// time is the median of its runs, its speedup the median of the baseline
// runs paired with it divided by that, so load that drifts on a shared
// machine affects both sides alike. Its output is compared with the baseline's
// (Result.RelErr).
package netbench

import (
	"context"
	"fmt"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/internal/synth"
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
	// Codec is the compressor spec (compress.Parse), e.g. "topk:0.01", or
	// "powersgd:R", each bucket viewed as the weights of layers of 1024
	// inputs (weightShapes).
	// The baseline's is "none".
	Codec string
	// Decision is Baseline, Pinned or CostModel.
	Decision string
	// Strategy is the engine's strategy (overlap.ParseStrategy): "" or
	// "auto" for the codec's flat one — on several nodes of several ranks,
	// the faster of it and the hierarchical exchange, chosen by New's
	// trials —, "hier" for the hierarchical exchange (which needs ranks
	// that know their nodes), or a flat strategy by name. Result.Strategy
	// says which one ran ("auto:" and the one kept, where New chose).
	Strategy string
}

// label names cs in messages: codec and decision, and the strategy when
// it is not the flat default ("int8 pinned, strategy hier").
func (cs Case) label() string {
	if cs.Strategy == "" || cs.Strategy == "auto" {
		return cs.Codec + " " + cs.Decision
	}
	return cs.Codec + " " + cs.Decision + ", strategy " + cs.Strategy
}

// Config describes one measurement run. Every rank must pass the same
// Config.
type Config struct {
	Link  string // label copied into every Result, e.g. "1gbit"
	Size  int    // gradient length in float32 elements, at least 1
	Reps  int    // timed runs per case, at least 1
	Seed  uint64 // rank r's gradient is drawn with seed Seed+r
	Cases []Case // in order, each Pinned or CostModel; the baseline runs first

	// BucketElems is the largest bucket the engine is given, in elements
	// (the gradient is cut into buckets of this size, the last one
	// shorter); at least 1.
	BucketElems int
	// ErrorFeedback turns the engine's error-feedback memory on.
	ErrorFeedback bool
	// NodeSpec is the codec of strategy hier's node stages
	// (overlap.Config.NodeSpec; "" for float32).
	NodeSpec string
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
	Strategy string  `json:"strategy"`         // how the buckets crossed the wire: "dense" (MPI all-reduce), "sparse-gather", "sra", "shared-index", …, "auto:hier" (chosen by trial)
	Codec    string  `json:"codec"`            // compressor spec; "none" for the baseline
	Decision string  `json:"decision"`         // Baseline, Pinned or CostModel
	Link     string  `json:"link"`             // Config.Link
	Seconds  float64 `json:"seconds"`          // median over the timed runs of the slowest rank's time
	Speedup  float64 `json:"speedup_vs_dense"` // DenseSeconds / Seconds
	// DenseSeconds is the median time of the dense all-reduce runs made
	// between this case's runs (each run of a case follows one of the
	// baseline, so both see the same load); the baseline's own Seconds for
	// the baseline.
	DenseSeconds float64 `json:"dense_seconds"`
	Ranks        int     `json:"ranks"` // group size
	// Nodes is the number of nodes the ranks run on (comm.Topologist), 1
	// when the comm does not tell.
	Nodes int   `json:"nodes"`
	Size  int   `json:"size"`  // gradient length, float32 elements
	Bytes int64 `json:"bytes"` // gradient size in bytes (4·Size)
	// BytesSent is what the busiest rank put on the wire in one exchange:
	// the engine's count for compressed cases, the ring all-reduce volume
	// 2(n−1)/n·Bytes for the baseline.
	BytesSent int64 `json:"bytes_sent"`
	// CrossNodeBytes is what crossed between nodes per rank in one run, by
	// the kernel's count: the bytes the node's network interfaces (all but
	// loopback, of the rank's network namespace: /proc/net/dev) sent during
	// the run, divided by the ranks of the node; median over the runs of
	// the largest over ranks. Only with more than one node (0 otherwise).
	CrossNodeBytes float64 `json:"cross_node_bytes"`
	// Buckets and Compressed count the buckets of one exchange and those
	// that crossed compressed (in the last run).
	Buckets    int `json:"buckets"`
	Compressed int `json:"compressed_buckets"`
	// Time in each stage, summed over the buckets, of the rank that spent
	// the most in it, median over the runs: compressing, in collectives,
	// decoding and averaging. Stages of different buckets overlap, so the
	// sum can exceed Seconds. The baseline has only the all-reduce and the
	// division.
	CompressSeconds   float64 `json:"compress_s"`
	ExchangeSeconds   float64 `json:"exchange_s"`
	DecompressSeconds float64 `json:"decompress_s"`
	// Reason is the engine's explanation of its choice for the first
	// bucket (cost-model inputs) on the reporting rank, when it gives one.
	Reason string `json:"reason,omitempty"`
	// RelErr is ‖avg − dense‖₂ / ‖dense‖₂ on the rank with the largest
	// value, where avg is the output of this case's first warm-up run,
	// before error-feedback memory holds anything, and dense the
	// baseline's. (Later runs exchange the same gradient again, plus the
	// residuals error feedback carries over.)
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
		if cs.Decision != Pinned && cs.Decision != CostModel {
			return fmt.Errorf("netbench: case %q: decision %q, want %q or %q", cs.Codec, cs.Decision, Pinned, CostModel)
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
	nodes, local := 1, 1
	if t, ok := c.(comm.Topologist); ok {
		nodes, local = t.Topology().Nodes, t.Topology().LocalSize
	}
	m := &measurer{c: c, cfg: cfg, nodes: nodes, local: local, src: synth.Generate(mixture, cfg.Size, cfg.Seed+uint64(c.Rank())), grad: make([]float32, cfg.Size)}
	baseline := &denseAllReduce{c: c, timeout: cfg.Timeout}
	progress("dense all-reduce (the baseline)")
	r, err := m.measure(ctx, Case{Codec: "none", Decision: Baseline}, baseline, nil, nil)
	if err != nil {
		return nil, fmt.Errorf("netbench: dense all-reduce on rank %d: %w", c.Rank(), err)
	}
	dense := slices.Clone(m.grad)
	results := []Result{r}
	for _, cs := range cfg.Cases {
		progress("%s", cs.label())
		r, err := m.measureCase(ctx, cs, baseline, dense)
		if err != nil {
			return results, fmt.Errorf("netbench: %s on rank %d: %w", cs.label(), c.Rank(), err)
		}
		results = append(results, r)
	}
	for i := range results {
		results[i].Link, results[i].LinkGbps = cfg.Link, gbps
	}
	return results, nil
}

// mixture is the distribution the gradients are drawn from.
var mixture = func() synth.Distribution {
	d, err := synth.ByName("mixture")
	if err != nil {
		panic(err) // a built-in name: cannot happen
	}
	return d
}()

// measurer runs the cases of one Run on one rank.
type measurer struct {
	c            comm.Comm
	cfg          Config
	nodes, local int       // the layout: nodes, ranks per node
	src          []float32 // this rank's gradient, never modified
	grad         []float32 // the exchange buffer, refilled from src before each run
}

// measureCase builds case cs's exchange, measures it (see measure) and
// closes it.
func (m *measurer) measureCase(ctx context.Context, cs Case, baseline exchange, dense []float32) (Result, error) {
	ex, err := newExchange(ctx, m.c, cs, m.cfg)
	if err != nil {
		return Result{}, err
	}
	r, err := m.measure(ctx, cs, ex, baseline, dense)
	if cerr := ex.close(); err == nil {
		err = cerr
	}
	return r, err
}

// measure times ex for case cs. When baseline is not nil, each run of ex
// follows a run of baseline, so both see the same conditions on a noisy
// machine, and the speedup is taken against those baseline runs; dense is
// then the baseline's output, to compare ex's output with.
func (m *measurer) measure(ctx context.Context, cs Case, ex, baseline exchange, dense []float32) (Result, error) {
	r := Result{Codec: cs.Codec, Decision: cs.Decision, Ranks: m.c.Size(), Nodes: m.nodes, Size: m.cfg.Size, Bytes: 4 * int64(m.cfg.Size)}
	var last sample
	var runs [6][]float64 // per timed run, the largest over ranks of each of sample.numbers
	var paired []float64  // the baseline's times
	first := -ex.warmups()
	for rep := first; rep < m.cfg.Reps; rep++ { // reps below 0 are the warm-up
		if baseline != nil {
			worst, _, err := m.once(ctx, baseline)
			if err != nil {
				return r, fmt.Errorf("dense all-reduce: %w", err)
			}
			if rep >= 0 {
				paired = append(paired, worst[0])
			}
		}
		worst, s, err := m.once(ctx, ex)
		if err != nil {
			return r, err
		}
		if rep == first && dense != nil {
			e, err := m.maxOver(ctx, []float64{relL2(m.grad, dense)})
			if err != nil {
				return r, err
			}
			r.RelErr = e[0]
		}
		if rep >= 0 {
			for i, v := range worst {
				runs[i] = append(runs[i], v)
			}
			last = s
		}
	}
	r.Strategy, r.Buckets, r.Compressed, r.Reason = last.strategy, last.buckets, last.compressed, last.reason
	r.Runs, r.Seconds = runs[0], median(runs[0])
	r.BytesSent = int64(slices.Max(runs[1]))
	r.CompressSeconds, r.ExchangeSeconds, r.DecompressSeconds = median(runs[2]), median(runs[3]), median(runs[4])
	if m.nodes > 1 {
		r.CrossNodeBytes = median(runs[5])
	}
	r.DenseSeconds = r.Seconds
	if baseline != nil {
		r.DenseSeconds = median(paired)
	}
	if r.Seconds > 0 {
		r.Speedup = r.DenseSeconds / r.Seconds
	}
	return r, nil
}

// once refills the gradient, waits for every rank and times one run of ex.
// It returns, element by element, the largest over ranks of the run's
// sample.numbers, and this rank's sample.
func (m *measurer) once(ctx context.Context, ex exchange) ([]float64, sample, error) {
	copy(m.grad, m.src)
	if err := barrier(ctx, m.c, m.cfg.Timeout); err != nil {
		return nil, sample{}, err
	}
	sent0, err := m.sentByNode()
	if err != nil {
		return nil, sample{}, err
	}
	start := time.Now()
	s, err := ex.run(ctx, m.grad)
	took := time.Since(start)
	if err != nil {
		return nil, s, err
	}
	sent1, err := m.sentByNode()
	if err != nil {
		return nil, s, err
	}
	worst, err := m.maxOver(ctx, append(s.numbers(took), float64(sent1-sent0)/float64(m.local)))
	return worst, s, err
}

// sentByNode returns the bytes the network interfaces of this rank's
// network namespace, but loopback, have sent (/proc/net/dev): with more
// than one node, what left the node; 0 with one node.
func (m *measurer) sentByNode() (uint64, error) {
	if m.nodes < 2 {
		return 0, nil
	}
	b, err := os.ReadFile("/proc/net/dev")
	if err != nil {
		return 0, fmt.Errorf("reading the interface counters: %w", err)
	}
	return txBytes(string(b))
}

// txBytes sums the transmitted bytes of every interface but lo in the
// text of /proc/net/dev.
func txBytes(dev string) (uint64, error) {
	var sum uint64
	for _, line := range strings.Split(dev, "\n") {
		name, counters, ok := strings.Cut(line, ":")
		name = strings.TrimSpace(name)
		if !ok || name == "lo" {
			continue
		}
		f := strings.Fields(counters)
		if len(f) < 9 {
			return 0, fmt.Errorf("/proc/net/dev: interface %s has %d counters, want at least 9", name, len(f))
		}
		v, err := strconv.ParseUint(f[8], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/net/dev: interface %s: transmitted bytes %q: %w", name, f[8], err)
		}
		sum += v
	}
	return sum, nil
}

// maxOver returns, element by element, the largest of every rank's xs
// (the same length on every rank).
func (m *measurer) maxOver(ctx context.Context, xs []float64) ([]float64, error) {
	all, err := gatherFloats(ctx, m.c, m.cfg.Timeout, xs)
	if err != nil {
		return nil, err
	}
	worst := slices.Clone(all[:len(xs)])
	for i, v := range all[len(xs):] {
		worst[i%len(xs)] = max(worst[i%len(xs)], v)
	}
	return worst, nil
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
