package overlap

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sync"
	"testing"

	"github.com/gradcomp/gradcomp/comm"

	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
)

// The reference: a direct computation, with the compress package, of the
// result the package doc defines for each strategy. It shares no code with
// the engine.

// refKey is the compress.Key of the payload rank writes for part j of a
// bucket (stage 1), or for its own part (stage 2), per the package doc.
func refKey(bucket, step, rank, part, ranks, stage int, shared bool) compress.Key {
	if shared {
		return compress.Key{Bucket: uint64(bucket), Step: uint64(step)}
	}
	tag := 1 + rank*ranks + part
	if stage == 2 {
		tag = 1 + ranks*ranks + rank
	}
	return compress.Key{Bucket: uint64(tag)<<32 | uint64(bucket), Step: uint64(step)}
}

// refModel holds every rank's error-feedback memories.
type refModel struct {
	t          *testing.T
	c          compress.Compressor
	strategy   Strategy
	ranks      int
	ef         bool
	e1, e2     map[[2]int][]float32 // (rank, bucket) → residual
	parts      int
	sra        bool // scatter-reduce-allgather: parts = ranks, second stage
	sharedKeys bool
	beta       float32 // Config.FeedbackDecay: the stage-1 residual's factor; 0 for none
}

func newRef(t *testing.T, spec string, strategy Strategy, ranks int, ef bool) *refModel {
	m := &refModel{t: t, c: compresstest.MustParse(t, spec), strategy: strategy, ranks: ranks, ef: ef,
		e1: map[[2]int][]float32{}, e2: map[[2]int][]float32{}, parts: 1}
	if strategy == StrategyQuantSRA || strategy == StrategyDense {
		m.parts, m.sra = ranks, true
	}
	m.sharedKeys = strategy == StrategySharedIndex
	return m
}

// feed returns e + g (and the memory slot), or g without error feedback.
func (m *refModel) feed(mem map[[2]int][]float32, rank, bucket int, g []float32) ([]float32, []float32) {
	s := append([]float32(nil), g...)
	if !m.ef {
		return s, nil
	}
	e, ok := mem[[2]int{rank, bucket}]
	if !ok {
		e = make([]float32, len(g))
		mem[[2]int{rank, bucket}] = e
	}
	for i := range s {
		s[i] = e[i] + g[i]
	}
	return s, e
}

func (m *refModel) compress(x []float32, key compress.Key) ([]byte, []float32) {
	p, err := m.c.Compress(nil, x, key)
	if err != nil {
		m.t.Fatal(err)
	}
	d := make([]float32, len(x))
	if err := m.c.Decompress(d, p); err != nil {
		m.t.Fatal(err)
	}
	return p, d
}

func (m *refModel) add(dst []float32, p []byte) {
	if err := m.c.DecompressAdd(dst, p); err != nil {
		m.t.Fatal(err)
	}
}

func divide(x []float32, n int) {
	for i := range x {
		x[i] /= float32(n)
	}
}

// step returns the average every rank must hold for one bucket, given
// every rank's gradient.
func (m *refModel) step(step, bucket int, grads [][]float32) []float32 {
	n, N := len(grads[0]), m.ranks
	if m.c.Codec() == compress.CodecNone {
		out := make([]float32, n)
		for _, g := range grads {
			for i := range out {
				out[i] += g[i]
			}
		}
		divide(out, N)
		return out
	}
	bounds := func(j int) (int, int) { return j * n / m.parts, (j + 1) * n / m.parts }
	payloads := make([][][]byte, N) // [rank][part]
	for r, g := range grads {
		s, e := m.feed(m.e1, r, bucket, g)
		for j := range m.parts {
			lo, hi := bounds(j)
			p, d := m.compress(s[lo:hi], refKey(bucket, step, r, j, N, 1, m.sharedKeys))
			payloads[r] = append(payloads[r], p)
			if e != nil {
				for i := lo; i < hi; i++ {
					e[i] = s[i] - d[i-lo]
					if m.beta != 0 {
						e[i] = m.beta * e[i]
					}
				}
			}
		}
	}
	out := make([]float32, n)
	if !m.sra {
		for r := range N {
			m.add(out, payloads[r][0])
		}
		divide(out, N)
		return out
	}
	for j := range N { // owner j
		lo, hi := bounds(j)
		mid := make([]float32, hi-lo)
		for r := range N {
			m.add(mid, payloads[r][j])
		}
		divide(mid, N)
		s, e := m.feed(m.e2, j, bucket, mid)
		if m.c.Codec() == compress.CodecSign { // no second memory for sign (core.memories)
			s, e = mid, nil
		}
		_, d := m.compress(s, refKey(bucket, step, j, 0, N, 2, false))
		for i := range e {
			e[i] = s[i] - d[i]
		}
		copy(out[lo:hi], d)
	}
	return out
}

// TestStrategiesMatchReference runs every strategy on 1 to 4 ranks for a
// few steps, with and without error feedback, buckets readied out of order
// on odd ranks, and compares every rank's result with the reference bit
// for bit (in-process ranks sum in rank order, as the reference does).
func TestStrategiesMatchReference(t *testing.T) {
	cases := []struct {
		spec     string
		strategy Strategy
		want     Strategy // the strategy Auto resolves to on 3 ranks
	}{
		{"none", StrategyAuto, StrategyDense},
		{"fp16", StrategyAuto, StrategyDense},
		{"bf16", StrategyDense, StrategyDense},
		{"randomk:0.1", StrategyAuto, StrategySharedIndex},
		{"randomk:0.3:seed=7", StrategySharedIndex, StrategySharedIndex},
		{"topk:0.05", StrategyAuto, StrategySparseGather},
		{"topk:0.2", StrategyQuantSRA, StrategyQuantSRA},
		{"int8", StrategyAuto, StrategyQuantSRA},
		{"int4:bucket=64", StrategyQuantAllGather, StrategyQuantAllGather},
		{"int2:round=nearest", StrategyQuantSRA, StrategyQuantSRA},
		{"sign:bucket=32", StrategyAuto, StrategyQuantSRA},
		{"int8", StrategySparseGather, StrategySparseGather},
		{"topk:0.05:chunk=64:bits=2", StrategyAuto, StrategySparseGather},
		{"topk:0.1:chunk=100", StrategyAuto, StrategySparseGather},
		{"topk:0.1:chunk=64:bits=4:round=nearest", StrategyQuantSRA, StrategyQuantSRA},
	}
	sizes := []int{700, 3, 1025}
	const steps = 3
	for _, tc := range cases {
		for _, ranks := range []int{1, 2, 3, 4} {
			for _, ef := range []bool{false, true} {
				if tc.spec == "none" && ef {
					continue
				}
				name := fmt.Sprintf("%s/%v/N=%d/ef=%v", tc.spec, tc.strategy, ranks, ef)
				t.Run(name, func(t *testing.T) {
					engines := newEngines(t, ranks, sizes, Config{Spec: tc.spec, Strategy: tc.strategy, ErrorFeedback: ef, Decision: DecideCompressed})
					st := engines[0].Strategy()
					if ranks == 3 && st != tc.want {
						t.Errorf("strategy %v, want %v", st, tc.want)
					}
					ref := newRef(t, tc.spec, st, ranks, ef)
					for s := range steps {
						grads := make([][][]float32, ranks)
						for r := range grads {
							for b, n := range sizes {
								grads[r] = append(grads[r], gradient(r, s, b, n))
							}
						}
						want := make([][]float32, len(sizes))
						for b := range sizes {
							in := make([][]float32, ranks)
							for r := range in {
								in[r] = grads[r][b]
							}
							want[b] = ref.step(s, b, in)
						}
						stats, errs := runStep(engines, grads, reversedOnOdd(len(sizes)))
						mustNoErrors(t, fmt.Sprintf("step %d", s), errs)
						for r := range ranks {
							for b := range sizes {
								if i := sameFloats(grads[r][b], want[b]); i >= 0 {
									t.Fatalf("step %d, rank %d, bucket %d: element %d = %v, want %v", s, r, b, i, grads[r][b][i], want[b][i])
								}
								bs := stats[r].Buckets[b]
								if bs.Compressed != (tc.spec != "none") || bs.NonFinite || bs.Strategy != st {
									t.Errorf("step %d, rank %d, bucket %d: stats %+v", s, r, b, bs)
								}
							}
						}
					}
				})
			}
		}
	}
}

// opLog is a comm.Comm that records the engine's collectives after New
// (the handshake's are not recorded until start is set): the op and the
// length of its source.
type opLog struct {
	comm.Comm
	mu    sync.Mutex
	start bool
	ops   []string
}

func (l *opLog) record(op string, n int) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.start {
		l.ops = append(l.ops, fmt.Sprintf("%s %d", op, n))
	}
}

func (l *opLog) AllToAll(ctx context.Context, dst, src []byte) error {
	l.record("AllToAll", len(src))
	return l.Comm.AllToAll(ctx, dst, src)
}

func (l *opLog) AllGather(ctx context.Context, dst, src []byte) error {
	l.record("AllGather", len(src))
	return l.Comm.AllGather(ctx, dst, src)
}

func (l *opLog) AllReduce(ctx context.Context, buf []float32) error {
	l.record("AllReduce", 4*len(buf))
	return l.Comm.AllReduce(ctx, buf)
}

// TestSRARoundsInterleave: under SRA, bucket i's all-gather follows bucket
// i+1's all-to-all on the wire (the reduce between them runs off it), a
// dense bucket takes its place in the same order, the order is the same
// on every rank whatever order Ready comes in. (TestStrategiesMatchReference
// checks the results.)
func TestSRARoundsInterleave(t *testing.T) {
	const ranks = 3
	sizes := []int{300, 200, 100, 400}
	base := group(t, ranks)
	logs := make([]*opLog, ranks)
	comms := make([]comm.Comm, ranks)
	for r, c := range base {
		logs[r] = &opLog{Comm: c}
		comms[r] = logs[r]
	}
	cfg := Config{Spec: "int8", ErrorFeedback: true, Decision: DecideCompressed}
	engines := newEnginesOn(t, comms, sizes, cfg)
	for _, l := range logs {
		l.start = true
	}
	grads := stepGrads(ranks, 0, sizes)
	grads[1][2][5] = float32(math.NaN()) // bucket 2 falls back dense after its all-to-all
	_, errs := runStep(engines, grads, reversedOnOdd(len(sizes)))
	mustNoErrors(t, "step", errs)
	slot := func(b int) int { return engines[0].buckets[b].slot }
	want := []string{
		fmt.Sprintf("AllToAll %d", ranks*slot(0)),
		fmt.Sprintf("AllToAll %d", ranks*slot(1)),
		fmt.Sprintf("AllGather %d", slot(0)),
		fmt.Sprintf("AllToAll %d", ranks*slot(2)),
		fmt.Sprintf("AllReduce %d", 4*sizes[2]),
		fmt.Sprintf("AllGather %d", slot(1)),
		fmt.Sprintf("AllToAll %d", ranks*slot(3)),
		fmt.Sprintf("AllGather %d", slot(3)),
	}
	for r, l := range logs {
		if !slices.Equal(l.ops, want) {
			t.Errorf("rank %d made\n%v\nwant\n%v", r, l.ops, want)
		}
	}
}
