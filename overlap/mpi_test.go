//go:build mpi && cgo

package overlap

// With -tags mpi the test binary also runs as the ranks of an mpirun job
// (see internal/mpilaunch): TestMPIEngine, started by `go test`, runs
// itself on 4 processes and reports what they said.

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm/mpi"
	"github.com/gradcomp/gradcomp/internal/mpilaunch"
)

const mpiRanks = 4

// world is this rank's world communicator; nil in the launcher.
var world *mpi.Comm

func TestMain(m *testing.M) {
	os.Exit(mpilaunch.Main(m, func() (*mpi.Comm, error) { return mpi.Init() }, func(c *mpi.Comm) { world = c }))
}

// TestMPIEngine runs the engine on 4 MPI processes: a few strategies
// against the reference (exact where the result is a local decode in rank
// order, within float32 rounding where MPI's all-reduce sums in its own
// order), the cost model's agreement across processes, and a handshake
// mismatch.
func TestMPIEngine(t *testing.T) {
	if world == nil {
		mpilaunch.Run(t, mpiRanks, nil, "-test.v=true", "-test.run=^TestMPIEngine$").Report(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rank := world.Rank()
	sizes := []int{5000, 3, 1 << 12}
	for _, tc := range []struct {
		spec  string
		exact bool
	}{{"topk:0.01", true}, {"int4", true}, {"fp16", true}, {"randomk:0.05", false}, {"none", false}} {
		t.Run(tc.spec, func(t *testing.T) {
			c, err := world.Dup(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			e, err := New(ctx, c, sizes, Config{Spec: tc.spec, ErrorFeedback: true, Decision: DecideCompressed, Timeout: 20 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer e.Close()
			ref := newRef(t, tc.spec, e.Strategy(), mpiRanks, true)
			for s := range 3 {
				mine := make([][]float32, len(sizes))
				want := make([][]float32, len(sizes))
				for b, n := range sizes {
					all := make([][]float32, mpiRanks)
					for r := range all {
						all[r] = gradient(r, s, b, n)
					}
					mine[b], want[b] = all[rank], ref.step(s, b, all)
				}
				if err := e.Step(); err != nil {
					t.Fatal(err)
				}
				for _, b := range reversedOnOdd(len(sizes))(rank) {
					if err := e.Ready(b, mine[b]); err != nil {
						t.Fatal(err)
					}
				}
				stats, err := e.Wait(ctx)
				if err != nil {
					t.Fatal(err)
				}
				for b := range sizes {
					for i, w := range want[b] {
						g := mine[b][i]
						if tc.exact && g != w || math.Abs(float64(g-w)) > 1e-5*(1+math.Abs(float64(w))) {
							t.Fatalf("step %d, bucket %d, element %d: %v, want %v", s, b, i, g, w)
						}
					}
				}
				if s == 2 {
					t.Logf("%s on %d ranks: %d bytes sent per step, %v", e.Strategy(), mpiRanks, stats.BytesSent, stats.Total)
				}
			}
		})
	}

	t.Run("cost model", func(t *testing.T) {
		c, err := world.Dup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		e, err := New(ctx, c, []int{1 << 16, 1 << 10}, Config{Spec: "int8", ErrorFeedback: true})
		if err != nil {
			t.Fatal(err)
		}
		defer e.Close()
		mine := []byte(fmt.Sprint(*e.model, e.Compressed()))
		all := make([]byte, mpiRanks*len(mine))
		if err := c.AllGather(ctx, all, mine); err != nil {
			t.Fatalf("ranks' models differ in length, or: %v", err)
		}
		for r := range mpiRanks {
			if got := string(all[r*len(mine) : (r+1)*len(mine)]); got != string(mine) {
				t.Errorf("rank %d has model and decisions %s, this rank %s", r, got, mine)
			}
		}
		t.Log(e.buckets[0].reason)
	})

	t.Run("mismatch", func(t *testing.T) {
		c, err := world.Dup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		spec := "topk:0.01"
		if rank == 2 {
			spec = "int8"
		}
		_, err = New(ctx, c, []int{100}, Config{Spec: spec})
		var me *ConfigMismatchError
		if !errors.As(err, &me) || err.Error() != "overlap: ranks disagree on spec: rank 2 has int8, rank 0 has topk:0.01" {
			t.Errorf("got %v, want the spec mismatch", err)
		}
	})
}

// TestConformanceMPI runs the engine conformance suite (conformance_test.go)
// on the host backend over 4 MPI processes, one engine per process on a
// duplicate of the world communicator.
func TestConformanceMPI(t *testing.T) {
	if world == nil {
		mpilaunch.Run(t, mpiRanks, nil, "-test.v=true", "-test.run=^TestConformanceMPI$").Report(t)
		return
	}
	build := func(ctx context.Context, sizes []int, cfg Config) (member, error) {
		c, err := world.Dup(ctx)
		if err != nil {
			return nil, err
		}
		m, err := newHostMember(ctx, c, sizes, cfg)
		if err != nil {
			c.Close()
			return nil, err
		}
		return mpiMember{m, c}, nil
	}
	for _, c := range conformanceCases {
		t.Run(c.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			p := peer{t: t, rank: world.Rank(), size: mpiRanks, build: build}
			if err := c.run(ctx, p); err != nil {
				t.Errorf("rank %d: %v", p.rank, err)
			}
		})
	}
}

// mpiMember is a conformance member that frees its communicator on Close.
type mpiMember struct {
	member
	c *mpi.Comm
}

func (m mpiMember) Close() error { return errors.Join(m.member.Close(), m.c.Close()) }

// TestMPIHier runs StrategyHier on 4 MPI processes placed as 2 nodes of 2
// (mpi.RanksPerNodeEnv=2, so comm/mpi splits with MPI_Comm_split): codec
// none gives the exact average within float32 rounding, top-k exactly
// what the flat engine gives, int8 the same result on every rank.
func TestMPIHier(t *testing.T) {
	if world == nil {
		mpilaunch.Run(t, mpiRanks, []string{mpi.RanksPerNodeEnv + "=2"}, "-test.v=true", "-test.run=^TestMPIHier$").Report(t)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	rank := world.Rank()
	sizes := []int{5001, 3}
	engine := func(t *testing.T, spec string, strategy Strategy) *Engine {
		c, err := world.Dup(ctx)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		e, err := New(ctx, c, sizes, Config{Spec: spec, Strategy: strategy, ErrorFeedback: true, Decision: DecideCompressed, Timeout: 20 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	run := func(t *testing.T, e *Engine, s int) [][]float32 {
		out := make([][]float32, len(sizes))
		if err := e.Step(); err != nil {
			t.Fatal(err)
		}
		for b, n := range sizes {
			out[b] = gradient(rank, s, b, n)
			if err := e.Ready(b, out[b]); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := e.Wait(ctx); err != nil {
			t.Fatal(err)
		}
		return out
	}
	for _, spec := range []string{"none", "topk:0.01", "int8"} {
		t.Run(spec, func(t *testing.T) {
			hier := engine(t, spec, StrategyHier)
			flat := engine(t, spec, StrategyAuto)
			for s := range 2 {
				got, ref := run(t, hier, s), run(t, flat, s)
				for b, n := range sizes {
					exact := make([]float64, n)
					for r := range mpiRanks {
						for i, v := range gradient(r, s, b, n) {
							exact[i] += float64(v) / mpiRanks
						}
					}
					for i, g := range got[b] {
						switch {
						case spec == "none" && math.Abs(float64(g)-exact[i]) > 1e-5*(1+math.Abs(exact[i])),
							spec == "topk:0.01" && g != ref[b][i]:
							t.Fatalf("step %d bucket %d element %d: hier %v, flat %v, exact %v", s, b, i, g, ref[b][i], exact[i])
						}
					}
					mine := []byte(fmt.Sprint(got[b]))
					all := make([]byte, mpiRanks*len(mine))
					if err := world.AllGather(ctx, all, mine); err != nil {
						t.Fatalf("step %d bucket %d: the ranks' results differ in length, or: %v", s, b, err)
					}
					for r := range mpiRanks {
						if string(all[r*len(mine):(r+1)*len(mine)]) != string(mine) {
							t.Fatalf("step %d bucket %d: rank %d's result differs from rank %d's", s, b, r, rank)
						}
					}
				}
			}
		})
	}
}
