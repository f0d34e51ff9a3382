package overlap

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// TestHandshakeMismatch: one rank configured differently makes New fail on
// every rank with the same error naming the field and both values.
func TestHandshakeMismatch(t *testing.T) {
	base := Config{Spec: "topk:0.01", ErrorFeedback: true, Decision: DecideCompressed}
	sizes := []int{10, 20}
	cases := []struct {
		name  string
		cfg   func(c Config) Config
		sizes []int
		want  string
	}{
		{"spec", func(c Config) Config { c.Spec = "int8"; return c }, sizes,
			"overlap: ranks disagree on spec: rank 2 has int8, rank 0 has topk:0.01"},
		{"canonical spec", func(c Config) Config { c.Spec = "topk:0.010"; return c }, sizes, ""},
		{"strategy", func(c Config) Config { c.Strategy = StrategyQuantSRA; return c }, sizes,
			"overlap: ranks disagree on strategy: rank 2 has sra, rank 0 has sparse-gather"},
		{"error feedback", func(c Config) Config { c.ErrorFeedback = false; return c }, sizes,
			"overlap: ranks disagree on error feedback: rank 2 has off, rank 0 has on"},
		{"decision", func(c Config) Config { c.Decision = DecideDense; return c }, sizes,
			"overlap: ranks disagree on decision: rank 2 has dense, rank 0 has compressed"},
		{"fail on non-finite", func(c Config) Config { c.FailOnNonFinite = true; return c }, sizes,
			"overlap: ranks disagree on fail on non-finite: rank 2 has on, rank 0 has off"},
		{"warm-up", func(c Config) Config { c.Warmup = 3; return c }, sizes,
			"overlap: ranks disagree on warm-up steps: rank 2 has 3, rank 0 has 0"},
		{"bucket size", func(c Config) Config { return c }, []int{10, 21},
			"overlap: ranks disagree on bucket 1 elements: rank 2 has 21, rank 0 has 20"},
		{"bucket count", func(c Config) Config { return c }, []int{10, 20, 5},
			"overlap: ranks disagree on buckets: rank 2 has 3, rank 0 has 2"},
		{"local settings may differ", func(c Config) Config { c.Timeout, c.Workers = time.Minute, 1; return c }, sizes, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			errs := onRanks(group(t, 3), func(r int, c comm.Comm) error {
				cfg, sz := base, sizes
				if r == 2 {
					cfg, sz = tc.cfg(base), tc.sizes
				}
				e, err := New(context.Background(), c, sz, cfg)
				if err == nil {
					e.Close()
				}
				return err
			})
			for r, err := range errs {
				if tc.want == "" {
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
					continue
				}
				var me *ConfigMismatchError
				if !errors.As(err, &me) || err.Error() != tc.want {
					t.Errorf("rank %d: got %v, want *ConfigMismatchError %q", r, err, tc.want)
				}
			}
		})
	}
}

// TestHandshakeInvalid: a rank with an invalid configuration gets its own
// error; the others learn of it at once instead of waiting.
func TestHandshakeInvalid(t *testing.T) {
	for _, tc := range []struct {
		name  string
		cfg   Config
		sizes []int
	}{
		{"spec", Config{Spec: "topk:2"}, []int{8}},
		{"lossless", Config{Spec: "int8:lossless=zstd"}, []int{8}},
		{"strategy", Config{Spec: "topk:0.1", Strategy: StrategySharedIndex}, []int{8}},
		{"size", Config{Spec: "int8"}, []int{8, 0}},
		{"no buckets", Config{Spec: "int8"}, nil},
		{"timeout", Config{Spec: "int8", Timeout: -1}, []int{8}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Now()
			errs := onRanks(group(t, 3), func(r int, c comm.Comm) error {
				cfg, sizes := Config{Spec: "int8"}, []int{8}
				if r == 1 {
					cfg, sizes = tc.cfg, tc.sizes
				}
				cfg.Decision = DecideCompressed
				_, err := New(context.Background(), c, sizes, cfg)
				return err
			})
			for r, err := range errs {
				var ce *ConfigError
				if !errors.As(err, &ce) || ce.Rank != 1 {
					t.Errorf("rank %d: got %v, want a *ConfigError naming rank 1", r, err)
				}
			}
			t.Log(errs[0])
			if err := within(time.Since(t0), 5*time.Second); err != nil {
				t.Error(err)
			}
		})
	}
}

// TestRefuse: a rank that cannot build its engine refuses in the
// handshake, and the ranks calling New fail at once with a *ConfigError
// naming it and its reason, although their timeout is long.
func TestRefuse(t *testing.T) {
	reason := errors.New("warmup -1 is negative")
	t0 := time.Now()
	errs := onRanks(group(t, 3), func(r int, c comm.Comm) error {
		if r == 1 {
			return Refuse(context.Background(), c, 0, reason)
		}
		_, err := New(context.Background(), c, []int{8}, Config{Spec: "int8", Decision: DecideCompressed, Timeout: time.Minute})
		return err
	})
	for r, err := range errs {
		var ce *ConfigError
		if !errors.As(err, &ce) || ce.Rank != 1 || ce.Reason != reason.Error() {
			t.Errorf("rank %d: got %v, want a *ConfigError naming rank 1 and %q", r, err, reason)
		}
	}
	if !errors.Is(errs[1], reason) {
		t.Errorf("the refusing rank's error %v does not wrap its reason", errs[1])
	}
	if err := within(time.Since(t0), 5*time.Second); err != nil {
		t.Error(err)
	}
}
