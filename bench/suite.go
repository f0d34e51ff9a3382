package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/gradcomp/gradcomp/compress"
)

// DefaultCodecs is the codec list the gradcomp CLI measures by default: every
// codec at its usual setting, SparseLoCo's chunked top-k with 2-bit values,
// and the lossless stages on the two bodies they target (top-k indices,
// 4-bit codes).
const DefaultCodecs = "none,fp16,bf16,topk:0.01,topk:0.01:sampled,randomk:0.01,int8,int4,int2,sign," +
	"topk:0.02:chunk=4096:bits=2," +
	"topk:0.01:lossless=zstd,topk:0.01:lossless=huff0,int4:lossless=zstd,int4:lossless=huff0"

// DefaultSizes is the size list the gradcomp CLI measures by default: one
// gradient that fits in cache and one that does not. With DefaultCodecs it
// runs in 10 to 20 seconds on two cores with 1 worker.
const DefaultSizes = "1M,16M"

// Config describes one run of the compressor suite. The zero value of every
// field but Codecs and Sizes selects the documented default.
type Config struct {
	Codecs []string // codec specs (see compress.Parse), measured in this order
	Sizes  []int    // gradient sizes in elements, measured in this order

	Dist Distribution // gradients' distribution; default "mixture"
	Seed uint64       // seed of the gradients (see Generate)

	// Workers is the number of goroutines one call may use (default 1,
	// the setting the single-core throughput targets are stated for).
	Workers int

	// Each figure is the best of at least MinRounds rounds (default 3) and
	// at most MaxRounds (default 10); rounds stop after MinRounds once the
	// codec×size cell has run for Budget (default 250ms).
	MinRounds, MaxRounds int
	Budget               time.Duration

	// Progress, if set, is called after each codec×size cell with the
	// number of cells done and the total.
	Progress func(done, total int)
}

// withDefaults returns c with its zero fields set to their defaults, or an
// error for a value out of range.
func (c Config) withDefaults() (Config, error) {
	if !c.Dist.Valid() {
		c.Dist = Distributions()[0]
	}
	if c.Workers == 0 {
		c.Workers = 1
	}
	if c.MinRounds == 0 {
		c.MinRounds = 3
	}
	if c.MaxRounds == 0 {
		c.MaxRounds = max(10, c.MinRounds)
	}
	if c.Budget == 0 {
		c.Budget = 250 * time.Millisecond
	}
	switch {
	case len(c.Codecs) == 0:
		return c, errors.New("bench: no codec to measure")
	case len(c.Sizes) == 0:
		return c, errors.New("bench: no size to measure")
	case c.Workers < 0:
		return c, fmt.Errorf("bench: %d workers: need at least 1", c.Workers)
	case c.MinRounds < 1 || c.MaxRounds < c.MinRounds:
		return c, fmt.Errorf("bench: rounds [%d, %d]: need 1 ≤ MinRounds ≤ MaxRounds", c.MinRounds, c.MaxRounds)
	case c.Budget < 0:
		return c, fmt.Errorf("bench: negative budget %v", c.Budget)
	}
	for _, n := range c.Sizes {
		if n < 1 || int64(n) > compress.MaxElements {
			return c, fmt.Errorf("bench: size %d: want 1 to %d elements", n, uint64(compress.MaxElements))
		}
	}
	return c, nil
}

// ParseCodecs parses codec specs (see compress.Parse) into
// compressors using workers goroutines per call. Every spec is tried: the
// error joins one *compress.SpecError per spec that does not parse (each
// names the valid codecs), and reports a spec listed twice.
func ParseCodecs(specs []string, workers int) ([]compress.Compressor, error) {
	var errs []error
	var cs []compress.Compressor
	seen := map[compress.Spec]string{}
	for _, s := range specs {
		c, err := compress.Parse(s, compress.WithWorkers(workers))
		if err != nil {
			errs = append(errs, err)
			continue
		}
		if first, dup := seen[c.Spec()]; dup {
			errs = append(errs, fmt.Errorf("bench: codec %q is listed twice (as %q and %q)", c.Spec(), first, s))
			continue
		}
		seen[c.Spec()] = s
		cs = append(cs, c)
	}
	return cs, errors.Join(errs...)
}

// SplitList splits a comma-separated list, trimming spaces around items.
func SplitList(list string) []string {
	items := strings.Split(list, ",")
	for i, s := range items {
		items[i] = strings.TrimSpace(s)
	}
	return items
}

// Run measures every codec of cfg on a gradient of every size, sizes in the
// outer loop, and returns one Result per pair in that order. It fails before
// measuring anything if a spec does not parse or cfg is out of range, and
// stops with ctx's error when ctx is done. A codec that refuses the input
// does not stop the run: its Result carries the Error.
func Run(ctx context.Context, cfg Config) ([]Result, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	codecs, err := ParseCodecs(cfg.Codecs, cfg.Workers)
	if err != nil {
		return nil, err
	}
	refs := make([]references, len(codecs))
	for i, c := range codecs {
		if refs[i], err = referencesOf(c, cfg.Workers); err != nil {
			return nil, err
		}
	}
	total := len(codecs) * len(cfg.Sizes)
	results := make([]Result, 0, total)
	for _, n := range cfg.Sizes {
		b := newBuffers(Generate(cfg.Dist, n, cfg.Seed))
		for i, c := range codecs {
			if err := ctx.Err(); err != nil {
				return results, err
			}
			r, err := measure(ctx, c, refs[i], b, cfg)
			if err != nil {
				return results, err
			}
			results = append(results, r)
			if cfg.Progress != nil {
				cfg.Progress(len(results), total)
			}
		}
	}
	return results, nil
}
