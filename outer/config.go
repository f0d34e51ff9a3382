package outer

import (
	"fmt"
	"slices"
	"time"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/overlap"
)

// DefaultBucketElements is Config.BucketElements' default: 4 Mi float32s
// (16 MiB) per engine bucket.
const DefaultBucketElements = 1 << 22

// Config configures a Loop. Every field but Engine's local ones (Timeout,
// Workers) must be equal on every rank: New's handshake compares them.
type Config struct {
	// SyncEvery is H ≥ 1: each fragment synchronizes once every H inner
	// steps.
	SyncEvery int
	// Fragments is F: the tensors are split into F fragments, each
	// synchronized at its own inner steps (see the package doc). 0 means
	// one fragment, or with FragmentOf as many as FragmentOf names.
	// Without FragmentOf the fragments are F contiguous groups of
	// tensors, in order, balanced by elements (F at most the number of
	// tensors): fragment k takes one tensor, then the next ones while
	// that brings its end closer to (k+1)/F of the elements.
	Fragments int
	// FragmentOf, when not nil, gives the fragment of each tensor (one
	// entry per tensor, fragments numbered from 0, every fragment holding
	// at least one tensor with at least one element).
	FragmentOf []int
	// Delay is τ ≥ 0: a fragment's exchange starts at its sync step and is
	// applied τ inner steps later, overlapping them (0: within the same
	// Step). Delay·F must be below SyncEvery, so that at most one
	// fragment's exchange is in flight at a time.
	Delay int
	// Alpha is α in [0, 1): when a fragment's average is applied, its
	// local weights become α·θ_local + (1−α)·θ_global (0: the global
	// weights).
	Alpha float64
	// Optimizer is the outer optimizer (the zero value: Nesterov, lr 0.7,
	// momentum 0.9).
	Optimizer Optimizer
	// OnNonFinite says what a non-finite averaged pseudo-gradient does:
	// SkipNonFinite (the default) skips that sync on every rank and
	// reports it; FailNonFinite also makes Step return the error.
	OnNonFinite NonFinitePolicy
	// Engine configures the fragment engines that average the
	// pseudo-gradients (codec, strategy, error feedback, Timeout, …), as
	// overlap.New takes it. The Loop sets FailOnNonFinite itself (a NaN is
	// never averaged in) and Shapes from the Shapes below; leave Shapes
	// nil. Timeout also bounds the Loop's own collectives (default
	// overlap.DefaultTimeout).
	Engine overlap.Config
	// BucketElements is the largest engine bucket, in float32s (0:
	// DefaultBucketElements): a fragment's tensors are laid out in
	// buckets along tensor boundaries, a tensor larger than it in buckets
	// of its own, split (but not with Shapes: then it is one bucket).
	BucketElements int
	// Shapes, when not nil, gives each tensor as a matrix (one entry per
	// tensor, Rows·Cols its elements; a 1-D tensor 1×n); the Loop passes
	// them to the engines as overlap.Config.Shapes, which spec powersgd
	// needs. An empty tensor's entry is ignored.
	Shapes []overlap.Shape
}

// NonFinitePolicy says what a sync with a non-finite average does
// (Config.OnNonFinite).
type NonFinitePolicy int

// The policies.
const (
	// SkipNonFinite: the sync is skipped on every rank and reported in
	// Sync.Skipped; Step succeeds.
	SkipNonFinite NonFinitePolicy = iota
	// FailNonFinite: the sync is skipped on every rank and Step returns
	// its *NonFiniteSyncError; the Loop stays usable.
	FailNonFinite
)

// String returns the policy's name: "skip", "fail", or "NonFinitePolicy(N)".
func (p NonFinitePolicy) String() string {
	switch p {
	case SkipNonFinite:
		return "skip"
	case FailNonFinite:
		return "fail"
	}
	return fmt.Sprintf("NonFinitePolicy(%d)", int(p))
}

// settings is a Config checked against the parameters, with its defaults
// filled in and its fragment layout resolved.
type settings struct {
	Config
	sizes      []int // elements per tensor
	fragmentOf []int // per tensor
}

// resolve checks cfg against the parameter sizes and fills in the
// defaults. Its error is a *ConfigError naming the field, for rank.
func resolve(cfg Config, sizes []int, rank int) (*settings, *ConfigError) {
	bad := func(field, format string, args ...any) *ConfigError {
		return &ConfigError{Rank: rank, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	cfg.FragmentOf, cfg.Shapes = slices.Clone(cfg.FragmentOf), slices.Clone(cfg.Shapes) // the caller's may change
	var total int64
	for _, n := range sizes {
		total += int64(n)
	}
	switch {
	case len(sizes) == 0:
		return nil, bad("params", "no tensors")
	case total == 0:
		return nil, bad("params", "%d tensors, all empty", len(sizes))
	case cfg.SyncEvery < 1:
		return nil, bad("SyncEvery", "%d: want at least 1", cfg.SyncEvery)
	case cfg.Fragments < 0:
		return nil, bad("Fragments", "%d: want at least 1 (0: one, or as many as FragmentOf names)", cfg.Fragments)
	case cfg.Delay < 0:
		return nil, bad("Delay", "%d: want at least 0", cfg.Delay)
	case !(cfg.Alpha >= 0 && cfg.Alpha < 1):
		return nil, bad("Alpha", "%v: want 0 ≤ Alpha < 1", cfg.Alpha)
	case cfg.OnNonFinite != SkipNonFinite && cfg.OnNonFinite != FailNonFinite:
		return nil, bad("OnNonFinite", "%v: want SkipNonFinite or FailNonFinite", cfg.OnNonFinite)
	case cfg.BucketElements < 0 || int64(cfg.BucketElements) > compress.MaxElements:
		return nil, bad("BucketElements", "%d: want 1 to %d (0: %d)", cfg.BucketElements, uint64(compress.MaxElements), DefaultBucketElements)
	case cfg.Engine.Shapes != nil:
		return nil, bad("Engine.Shapes", "the loop sets it from Config.Shapes (per tensor); leave it nil")
	case cfg.Engine.Timeout < 0:
		return nil, bad("Engine.Timeout", "%v is negative", cfg.Engine.Timeout)
	}
	o, err := cfg.Optimizer.resolve()
	if err != nil {
		err.Rank = rank
		return nil, err
	}
	cfg.Optimizer = o
	if cfg.BucketElements == 0 {
		cfg.BucketElements = DefaultBucketElements
	}
	if cfg.Shapes != nil {
		if len(cfg.Shapes) != len(sizes) {
			return nil, bad("Shapes", "%d entries for %d tensors", len(cfg.Shapes), len(sizes))
		}
		for i, s := range cfg.Shapes {
			if sizes[i] > 0 && (s.Rows < 1 || s.Cols < 1 || int64(s.Rows)*int64(s.Cols) != int64(sizes[i])) {
				return nil, bad(fmt.Sprintf("Shapes[%d]", i), "%d×%d for tensor %d of %d elements", s.Rows, s.Cols, i, sizes[i])
			}
		}
	}
	of, err := fragments(cfg, sizes, rank)
	if err != nil {
		return nil, err
	}
	cfg.Fragments = max(cfg.Fragments, 1)
	if cfg.FragmentOf != nil {
		cfg.Fragments = maxFragment(of) + 1
	}
	if cfg.Delay > (cfg.SyncEvery-1)/cfg.Fragments { // Delay·Fragments ≥ SyncEvery, without overflow
		return nil, bad("Delay", "%d with Fragments %d and SyncEvery %d: want Delay·Fragments < SyncEvery, so that at most one fragment's exchange is in flight",
			cfg.Delay, cfg.Fragments, cfg.SyncEvery)
	}
	return &settings{Config: cfg, sizes: sizes, fragmentOf: of}, nil
}

// timeout is what bounds each of the Loop's own collectives: Engine's
// Timeout, or its default.
func (cfg Config) timeout() time.Duration {
	if cfg.Engine.Timeout > 0 {
		return cfg.Engine.Timeout
	}
	return overlap.DefaultTimeout
}

// fragments returns each tensor's fragment: FragmentOf checked, or the
// default layout of Fragments (at least 1) contiguous groups.
func fragments(cfg Config, sizes []int, rank int) ([]int, *ConfigError) {
	bad := func(field, format string, args ...any) *ConfigError {
		return &ConfigError{Rank: rank, Field: field, Reason: fmt.Sprintf(format, args...)}
	}
	if cfg.FragmentOf == nil {
		f := max(cfg.Fragments, 1)
		if f > len(sizes) {
			return nil, bad("Fragments", "%d for %d tensors: every fragment needs one", f, len(sizes))
		}
		of := balanced(sizes, f)
		return of, checkCover(of, sizes, f, rank)
	}
	of := cfg.FragmentOf
	if len(of) != len(sizes) {
		if len(of) < len(sizes) {
			return nil, bad("FragmentOf", "%d entries for %d tensors: tensor %d is in no fragment", len(of), len(sizes), len(of))
		}
		return nil, bad("FragmentOf", "%d entries for %d tensors", len(of), len(sizes))
	}
	n := cfg.Fragments // fragments 0 to n−1; without Fragments, at most one per tensor
	if n == 0 {
		n = len(sizes)
	}
	for i, f := range of {
		if f < 0 || f >= n {
			return nil, bad(fmt.Sprintf("FragmentOf[%d]", i), "%d: want a fragment from 0 to %d", f, n-1)
		}
	}
	if cfg.Fragments == 0 {
		n = maxFragment(of) + 1
	}
	return of, checkCover(of, sizes, n, rank)
}

// checkCover refuses a fragment without a tensor, or whose tensors are all
// empty.
func checkCover(of, sizes []int, n, rank int) *ConfigError {
	elements := make([]int64, n)
	tensors := make([]int, n)
	for i, f := range of {
		elements[f] += int64(sizes[i])
		tensors[f]++
	}
	for f := range n {
		switch {
		case tensors[f] == 0:
			return &ConfigError{Rank: rank, Field: "FragmentOf", Reason: fmt.Sprintf("fragment %d has no tensor (fragments 0 to %d)", f, n-1)}
		case elements[f] == 0:
			return &ConfigError{Rank: rank, Field: "FragmentOf", Reason: fmt.Sprintf("fragment %d holds no elements (its %d tensors are empty)", f, tensors[f])}
		}
	}
	return nil
}

func maxFragment(of []int) int {
	m := 0
	for _, f := range of {
		m = max(m, f)
	}
	return m
}

// balanced splits the tensors, in order, into f contiguous groups of about
// equal elements (f ≤ len(sizes)): fragment k takes at least one tensor,
// then the next ones while that brings its end closer to (or as close as)
// the k+1-th f-th of the elements and leaves a tensor for each later
// fragment; the last takes the rest.
func balanced(sizes []int, f int) []int {
	var total int64
	for _, n := range sizes {
		total += int64(n)
	}
	of := make([]int, len(sizes))
	i := 0
	var done int64 // elements before tensor i, times f
	for k := range f {
		target := int64(k+1) * total
		of[i] = k
		done += int64(sizes[i]) * int64(f)
		i++
		for i < len(sizes) && (k == f-1 || len(sizes)-i > f-1-k) {
			next := done + int64(sizes[i])*int64(f)
			if k < f-1 && absDiff(next, target) > absDiff(done, target) {
				break
			}
			of[i] = k
			done = next
			i++
		}
	}
	return of
}

func absDiff(a, b int64) int64 {
	if a > b {
		return a - b
	}
	return b - a
}
