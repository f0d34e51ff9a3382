package overlap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/hosted"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/compress/compresstest"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
	"github.com/gradcomp/gradcomp/internal/fakegpu"
)

// The engine conformance suite: one set of checks of what every backend ×
// transport pair must do alike (results against the reference, warm-up,
// checkpoints, non-finite gradients, the handshake, misuse), written as
// the program of one rank, so that the same checks run on in-process
// ranks (TestConformance: the host backend on comm/inproc and on the
// hosted transport, the device backend on a fake device with a fake
// device communicator and on the hosted transport) and on MPI processes
// (TestConformanceMPI, -tags mpi). Where the backends differ by design
// (what a failed step leaves in memory, a non-finite bucket's other
// elements), the suite checks only what they share.

// member is one rank's engine as the suite drives it: gradients go in and
// averages come out as host slices, whatever memory the backend uses.
type member interface {
	Step() error
	// Ready hands bucket i a copy of g.
	Ready(i int, g []float32) error
	// Wait is the engine's Wait, with the buckets' contents after it.
	Wait(ctx context.Context) ([][]float32, StepStats, error)
	Strategy() Strategy
	Save(w io.Writer) error
	Load(r io.Reader) error
	Close() error
}

// peer is one rank of a conformance run.
type peer struct {
	t          *testing.T // for the reference's compressor errors only
	rank, size int
	// build makes this rank's engine on a fresh transport; every rank
	// calls it the same number of times.
	build func(ctx context.Context, sizes []int, cfg Config) (member, error)
	// exactSum: the transport's all-reduce sums in rank order (the
	// reference's), so dense results are exact.
	exactSum bool
}

// conformanceCase is one check, run by every rank of a group at once.
type conformanceCase struct {
	name string
	run  func(ctx context.Context, p peer) error
}

// conformanceRanks is the group size of every in-process run (MPI's
// launcher uses 4 too): > 2, so the quantizers take SRA.
const conformanceRanks = 4

var conformanceSizes = []int{700, 3, 1025}

var conformanceCases = []conformanceCase{
	{"results", checkResults},
	{"warm-up", checkWarmup},
	{"checkpoint", checkCheckpoint},
	{"non-finite", checkNonFinite},
	{"handshake", checkHandshake},
	{"misuse", checkMisuse},
}

// TestConformance runs the suite on every backend × transport pair of
// this process.
func TestConformance(t *testing.T) {
	rigs := []struct {
		name  string
		build func(t *testing.T, rank, size int, g *generations) func(context.Context, []int, Config) (member, error)
	}{
		{"host/inproc", hostOnInproc},
		{"host/hosted", hostOnHosted},
		{"device/fake", deviceOnFake},
		{"device/hosted", deviceOnHosted},
	}
	for _, rig := range rigs {
		for _, c := range conformanceCases {
			t.Run(rig.name+"/"+c.name, func(t *testing.T) {
				t.Parallel()
				ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
				defer cancel()
				g := &generations{t: t, size: conformanceRanks}
				var wg sync.WaitGroup
				errs := make([]error, conformanceRanks)
				for r := range conformanceRanks {
					p := peer{t: t, rank: r, size: conformanceRanks, build: rig.build(t, r, conformanceRanks, g), exactSum: true}
					wg.Go(func() { errs[r] = c.run(ctx, p) })
				}
				wg.Wait()
				for r, err := range errs {
					if err != nil {
						t.Errorf("rank %d: %v", r, err)
					}
				}
			})
		}
	}
}

// generations hands the k-th build of every rank the comms of group k, so
// that each engine gets a fresh transport shared with its peers.
type generations struct {
	t      *testing.T
	size   int
	mu     sync.Mutex
	groups [][2][]comm.Comm // per generation: the host and the wire group
}

func (g *generations) comms(k int) (host, wire []comm.Comm) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for len(g.groups) <= k {
		g.groups = append(g.groups, [2][]comm.Comm{group(g.t, g.size), group(g.t, g.size)})
	}
	return g.groups[k][0], g.groups[k][1]
}

// hostOnInproc: Engine on a comm/inproc group.
func hostOnInproc(t *testing.T, rank, size int, g *generations) func(context.Context, []int, Config) (member, error) {
	k := 0
	return func(ctx context.Context, sizes []int, cfg Config) (member, error) {
		host, _ := g.comms(k)
		k++
		return newHostMember(ctx, host[rank], sizes, cfg)
	}
}

// hostOnHosted: Engine on the hosted transport, whose posts a Go host
// carries out on a comm/inproc group (hosted.Serve).
func hostOnHosted(t *testing.T, rank, size int, g *generations) func(context.Context, []int, Config) (member, error) {
	k := 0
	return func(ctx context.Context, sizes []int, cfg Config) (member, error) {
		host, _ := g.comms(k)
		k++
		tr, err := hosted.New(rank, size)
		if err != nil {
			return nil, err
		}
		serve(t, tr, host[rank], nil)
		return newHostMember(ctx, tr.Host(), sizes, cfg)
	}
}

// serve carries out tr's posts until the test ends.
func serve(t *testing.T, tr *hosted.Transport, c comm.Comm, dc comm.DeviceComm) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- hosted.Serve(ctx, tr, c, dc) }()
	t.Cleanup(func() {
		cancel()
		tr.Close()
		if err := <-done; err != nil {
			t.Errorf("hosted.Serve on rank %d: %v", tr.Rank(), err)
		}
	})
}

// deviceOnFake: DeviceEngine on a fake device, its collectives on a fake
// device communicator over comm/inproc.
func deviceOnFake(t *testing.T, rank, size int, g *generations) func(context.Context, []int, Config) (member, error) {
	k := 0
	return func(ctx context.Context, sizes []int, cfg Config) (member, error) {
		host, wire := g.comms(k)
		k++
		plat := fakegpu.New(1)
		return newDeviceMember(ctx, plat, fakegpu.NewComm(wire[rank], plat.Device(0), fakeTimeout), host[rank], sizes, cfg)
	}
}

// deviceOnHosted: DeviceEngine on the hosted transport (both faces: the
// handshake on its host face, the exchanges on its device face), whose
// posts a Go host carries out on comm/inproc and a fake device
// communicator.
func deviceOnHosted(t *testing.T, rank, size int, g *generations) func(context.Context, []int, Config) (member, error) {
	k := 0
	return func(ctx context.Context, sizes []int, cfg Config) (member, error) {
		host, wire := g.comms(k)
		k++
		tr, err := hosted.New(rank, size)
		if err != nil {
			return nil, err
		}
		plat := fakegpu.New(1)
		serve(t, tr, host[rank], fakegpu.NewComm(wire[rank], plat.Device(0), fakeTimeout))
		return newDeviceMember(ctx, plat, tr.Device(), tr.Host(), sizes, cfg)
	}
}

// fakeTimeout bounds the fake device communicators' collectives.
const fakeTimeout = 20 * time.Second

// hostMember is an Engine with a buffer per bucket.
type hostMember struct {
	*Engine
	bufs [][]float32
}

func newHostMember(ctx context.Context, c comm.Comm, sizes []int, cfg Config) (member, error) {
	e, err := New(ctx, c, sizes, cfg)
	if err != nil {
		return nil, err
	}
	m := &hostMember{Engine: e}
	for _, n := range sizes {
		m.bufs = append(m.bufs, make([]float32, n))
	}
	return m, nil
}

// Ready hands the engine a copy of g, which becomes the bucket's buffer
// if the engine takes it (a refused Ready must not touch the buffer the
// engine owns).
func (m *hostMember) Ready(i int, g []float32) error {
	buf := append([]float32(nil), g...)
	err := m.Engine.Ready(i, buf)
	if err == nil {
		m.bufs[i] = buf
	}
	return err
}

func (m *hostMember) Wait(ctx context.Context) ([][]float32, StepStats, error) {
	st, err := m.Engine.Wait(ctx)
	out := make([][]float32, len(m.bufs))
	for i, b := range m.bufs {
		out[i] = append([]float32(nil), b...)
	}
	return out, st, err
}

// deviceMember is a DeviceEngine on a one-device fake platform, with a
// caller stream and a device buffer per bucket, plus a scratch buffer for
// the Ready of a bucket already given this step (which must not touch the
// buffer the engine owns).
type deviceMember struct {
	*DeviceEngine
	plat    *fakegpu.Platform
	dev     *fakegpu.Device
	s       gpu.Stream
	sizes   []int
	ptrs    []gpu.Ptr
	scratch gpu.Ptr
	given   []bool
}

func newDeviceMember(ctx context.Context, plat *fakegpu.Platform, dc comm.DeviceComm, host comm.Comm, sizes []int, cfg Config) (member, error) {
	dev := plat.Device(0)
	m := &deviceMember{plat: plat, dev: dev, sizes: sizes, given: make([]bool, len(sizes))}
	var err error
	if m.s, err = dev.NewStream(); err != nil {
		return nil, err
	}
	if m.scratch, err = dev.Alloc(4 * slices.Max(sizes)); err != nil {
		return nil, err
	}
	for _, n := range sizes {
		p, err := dev.Alloc(4 * n)
		if err != nil {
			return nil, err
		}
		m.ptrs = append(m.ptrs, p)
	}
	if m.DeviceEngine, err = NewDevice(ctx, dev, dc, host, sizes, cfg); err != nil {
		plat.Close()
		return nil, err
	}
	return m, nil
}

func (m *deviceMember) Step() error {
	err := m.DeviceEngine.Step()
	if err == nil {
		clear(m.given)
	}
	return err
}

func (m *deviceMember) Ready(i int, g []float32) error {
	p := m.scratch
	if i >= 0 && i < len(m.ptrs) && !m.given[i] {
		p = m.ptrs[i]
	}
	if err := m.dev.CopyIn(m.s, p, f32.Bytes(g)); err != nil {
		return err
	}
	err := m.DeviceEngine.Ready(i, p, m.s)
	if err == nil {
		m.given[i] = true
	}
	return err
}

func (m *deviceMember) Wait(ctx context.Context) ([][]float32, StepStats, error) {
	st, err := m.DeviceEngine.Wait(ctx)
	out := make([][]float32, len(m.sizes))
	for i, n := range m.sizes {
		out[i] = make([]float32, n)
		if cerr := m.dev.CopyOut(m.s, f32.Bytes(out[i]), m.ptrs[i]); cerr != nil && err == nil {
			err = cerr
		}
	}
	return out, st, err
}

func (m *deviceMember) Close() error {
	err := m.DeviceEngine.Close()
	m.plat.Close()
	return err
}

// refFor is the reference of m's exchange: its strategy, and for random-k
// the shared key (the device's gather under it gives shared-index's
// result).
func refFor(p peer, spec string, m member, ef bool) *refModel {
	st := m.Strategy()
	if compresstest.MustParse(p.t, spec).Codec() == compress.CodecRandomK {
		st = StrategySharedIndex
	}
	return newRef(p.t, spec, st, p.size, ef)
}

// want returns the reference's averages of step s for the buckets not in
// skip (nil there), advancing its memory for those only.
func (ref *refModel) want(s int, grads [][][]float32, skip map[int]bool) [][]float32 {
	out := make([][]float32, len(grads[0]))
	for b := range out {
		if skip[b] {
			continue
		}
		in := make([][]float32, len(grads))
		for r := range in {
			in[r] = grads[r][b]
		}
		out[b] = ref.step(s, b, in)
	}
	return out
}

// exchange runs one step of m with this rank's gradients (buckets ready in
// reverse order on odd ranks), and returns the averages and statistics.
func exchange(ctx context.Context, p peer, m member, grads [][][]float32) ([][]float32, StepStats, error) {
	if err := m.Step(); err != nil {
		return nil, StepStats{}, err
	}
	for _, b := range reversedOnOdd(len(grads[p.rank]))(p.rank) {
		if err := m.Ready(b, grads[p.rank][b]); err != nil {
			return nil, StepStats{}, err
		}
	}
	return m.Wait(ctx)
}

// compare checks got against want for the buckets want holds: bit for bit
// where exact, else within float32 rounding of a sum in another order.
func compare(what string, got, want [][]float32, exact bool) error {
	for b := range want {
		if want[b] == nil {
			continue
		}
		for i := range want[b] {
			g, w := got[b][i], want[b][i]
			if math.Float32bits(g) == math.Float32bits(w) {
				continue
			}
			if exact || math.Abs(float64(g-w)) > 1e-5*(1+math.Abs(float64(w))) {
				return fmt.Errorf("%s: bucket %d element %d = %v, want %v", what, b, i, g, w)
			}
		}
	}
	return nil
}

// exactFor says whether spec's results must match the reference bit for
// bit on p's transport: always, but where an all-reduce's order shows.
func exactFor(p peer, spec string) bool {
	c := compresstest.MustParse(p.t, spec).Codec()
	return p.exactSum || (c != compress.CodecNone && c != compress.CodecRandomK)
}

// checkResults: every codec under its automatic strategy, pinned
// compressed, with error feedback, for three steps, against the
// reference; the statistics say compressed, with one strategy on every
// rank.
func checkResults(ctx context.Context, p peer) error {
	for _, spec := range []string{"none", "fp16", "int8", "int4:bucket=64", "sign", "topk:0.05", "randomk:0.1"} {
		ef := spec != "none"
		m, err := p.build(ctx, conformanceSizes, Config{Spec: spec, ErrorFeedback: ef, Decision: DecideCompressed})
		if err != nil {
			return fmt.Errorf("%s: %w", spec, err)
		}
		ref := refFor(p, spec, m, ef)
		for s := range 3 {
			grads := stepGrads(p.size, s, conformanceSizes)
			got, st, err := exchange(ctx, p, m, grads)
			if err != nil {
				m.Close()
				return fmt.Errorf("%s step %d: %w", spec, s, err)
			}
			if err := compare(fmt.Sprintf("%s step %d", spec, s), got, ref.want(s, grads, nil), exactFor(p, spec)); err != nil {
				m.Close()
				return err
			}
			for b, bs := range st.Buckets {
				if bs.Compressed != (spec != "none") || bs.NonFinite || bs.Strategy != m.Strategy() || bs.BytesSent <= 0 {
					m.Close()
					return fmt.Errorf("%s step %d bucket %d: stats %+v", spec, s, b, bs)
				}
			}
		}
		if err := m.Close(); err != nil {
			return fmt.Errorf("%s: Close: %w", spec, err)
		}
	}
	return nil
}

// checkWarmup: with Warmup 2 the first two steps are dense (the plain
// average) and leave error feedback untouched; the compressed steps after
// them match a reference that starts at step 2.
func checkWarmup(ctx context.Context, p peer) error {
	const spec = "int8"
	m, err := p.build(ctx, conformanceSizes, Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, Warmup: 2})
	if err != nil {
		return err
	}
	defer m.Close()
	dense, ref := newRef(p.t, "none", StrategyDense, p.size, false), refFor(p, spec, m, true)
	for s := range 4 {
		grads := stepGrads(p.size, s, conformanceSizes)
		got, st, err := exchange(ctx, p, m, grads)
		if err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		want, exact := dense, p.exactSum
		if s >= 2 {
			want, exact = ref, true
		}
		if err := compare(fmt.Sprintf("step %d", s), got, want.want(s, grads, nil), exact); err != nil {
			return err
		}
		for b, bs := range st.Buckets {
			if bs.Compressed != (s >= 2) {
				return fmt.Errorf("step %d bucket %d: Compressed %v (%s)", s, b, bs.Compressed, bs.Reason)
			}
		}
	}
	return nil
}

// checkCheckpoint: a state saved after two steps and loaded into a new
// engine continues exactly as the uninterrupted run; a corrupt state and
// one of another spec are refused with a *StateError and change nothing.
func checkCheckpoint(ctx context.Context, p peer) error {
	const spec = "topk:0.1"
	cfg := Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed}
	m, err := p.build(ctx, conformanceSizes, cfg)
	if err != nil {
		return err
	}
	ref := refFor(p, spec, m, true)
	run := func(m member, s int) error {
		grads := stepGrads(p.size, s, conformanceSizes)
		got, _, err := exchange(ctx, p, m, grads)
		if err != nil {
			return fmt.Errorf("step %d: %w", s, err)
		}
		return compare(fmt.Sprintf("step %d", s), got, ref.want(s, grads, nil), true)
	}
	for s := range 2 {
		if err := run(m, s); err != nil {
			m.Close()
			return err
		}
	}
	var state bytes.Buffer
	err = m.Save(&state)
	m.Close()
	if err != nil {
		return fmt.Errorf("Save: %w", err)
	}
	other, err := p.build(ctx, conformanceSizes, Config{Spec: "topk:0.2", ErrorFeedback: true, Decision: DecideCompressed})
	if err != nil {
		return err
	}
	var se *StateError
	err = other.Load(bytes.NewReader(state.Bytes()))
	other.Close()
	if !errors.As(err, &se) {
		return fmt.Errorf("Load of a topk:0.1 state into topk:0.2: %v, want a *StateError", err)
	}
	m, err = p.build(ctx, conformanceSizes, cfg)
	if err != nil {
		return err
	}
	defer m.Close()
	corrupt := bytes.Clone(state.Bytes())
	corrupt[len(corrupt)/2] ^= 0x10
	if err := m.Load(bytes.NewReader(corrupt)); !errors.As(err, &se) {
		return fmt.Errorf("Load of a corrupt state: %v, want a *StateError", err)
	}
	if err := m.Load(bytes.NewReader(state.Bytes())); err != nil {
		return fmt.Errorf("Load: %w", err)
	}
	for s := 2; s < 4; s++ {
		if err := run(m, s); err != nil {
			return fmt.Errorf("after Load: %w", err)
		}
	}
	return nil
}

// checkNonFinite: a NaN on one rank is seen on every rank. Without
// FailOnNonFinite the step succeeds, the bucket is flagged and holds the
// NaN, its memory is unchanged and the other buckets are exact; with it,
// every rank gets a *NonFiniteStepError naming the bucket, every memory
// skips the step, and the engine goes on.
func checkNonFinite(ctx context.Context, p peer) error {
	const spec, bad, at = "int8", 0, 5
	for _, fail := range []bool{false, true} {
		m, err := p.build(ctx, conformanceSizes, Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed, FailOnNonFinite: fail})
		if err != nil {
			return err
		}
		ref := refFor(p, spec, m, true)
		grads := stepGrads(p.size, 0, conformanceSizes)
		grads[1][bad][at] = float32(math.NaN())
		got, st, err := exchange(ctx, p, m, grads)
		var nf *NonFiniteStepError
		switch {
		case fail && (!errors.As(err, &nf) || len(nf.Buckets) != 1 || nf.Buckets[0] != bad):
			err = fmt.Errorf("FailOnNonFinite: Wait: %v, want a *NonFiniteStepError for bucket %d", err, bad)
		case fail:
			err = nil
		case err != nil:
			err = fmt.Errorf("Wait: %w", err)
		case !st.Buckets[bad].NonFinite || !math.IsNaN(float64(got[bad][at])):
			err = fmt.Errorf("bucket %d: NonFinite %v, element %d = %v; want flagged and NaN", bad, st.Buckets[bad].NonFinite, at, got[bad][at])
		default:
			err = compare("step 0", got, ref.want(0, grads, map[int]bool{bad: true}), true)
		}
		if err == nil {
			// The bucket's memory (with FailOnNonFinite, every bucket's
			// on every rank) did not take the step: step 1 matches a
			// reference that skipped it.
			grads := stepGrads(p.size, 1, conformanceSizes)
			if got, _, err = exchange(ctx, p, m, grads); err == nil {
				err = compare("step 1", got, ref.want(1, grads, nil), true)
			}
		}
		m.Close()
		if err != nil {
			return err
		}
	}
	return nil
}

// checkHandshake: ranks that differ in a setting that changes their
// collectives all get a *ConfigMismatchError.
func checkHandshake(ctx context.Context, p peer) error {
	last := p.rank == p.size-1
	for _, tc := range []struct {
		field string
		cfg   Config
		odd   func(*Config)
	}{
		{"spec", Config{Spec: "int8"}, func(c *Config) { c.Spec = "int4" }},
		{"warm-up", Config{Spec: "int8"}, func(c *Config) { c.Warmup = 3 }},
		{"decision", Config{Spec: "topk:0.1"}, func(c *Config) { c.Decision = DecideDense }},
		{"error feedback", Config{Spec: "topk:0.1", ErrorFeedback: true}, func(c *Config) { c.ErrorFeedback = false }},
	} {
		cfg := tc.cfg
		if cfg.Decision == DecideAuto {
			cfg.Decision = DecideCompressed
		}
		if last {
			tc.odd(&cfg)
		}
		m, err := p.build(ctx, conformanceSizes, cfg)
		var mm *ConfigMismatchError
		if !errors.As(err, &mm) {
			if m != nil {
				m.Close()
			}
			return fmt.Errorf("%s differs on rank %d: %v, want a *ConfigMismatchError", tc.field, p.size-1, err)
		}
	}
	return nil
}

// checkMisuse: each misuse is a *UsageError that changes nothing (the
// step after them is exact), and a step with a bucket never ready fails
// with ErrNotReady on every rank and breaks the engine.
func checkMisuse(ctx context.Context, p peer) error {
	const spec = "int4:bucket=64"
	m, err := p.build(ctx, conformanceSizes, Config{Spec: spec, ErrorFeedback: true, Decision: DecideCompressed})
	if err != nil {
		return err
	}
	defer m.Close()
	usage := func(what string, err error, want error) error {
		var ue *UsageError
		if !errors.As(err, &ue) || !errors.Is(err, want) {
			return fmt.Errorf("%s: %v, want a *UsageError (%v)", what, err, want)
		}
		return nil
	}
	g := gradient(p.rank, 0, 0, conformanceSizes[0])
	if err := usage("Ready before Step", m.Ready(0, g), ErrNoStep); err != nil {
		return err
	}
	if _, _, err := m.Wait(ctx); usage("Wait before Step", err, ErrNoStep) != nil {
		return usage("Wait before Step", err, ErrNoStep)
	}
	if err := m.Step(); err != nil {
		return err
	}
	if err := usage("Step in flight", m.Step(), ErrStepInFlight); err != nil {
		return err
	}
	if err := usage("Save in flight", m.Save(io.Discard), ErrStepInFlight); err != nil {
		return err
	}
	if err := usage("Ready of bucket 99", m.Ready(99, g), ErrUnknownBucket); err != nil {
		return err
	}
	grads := stepGrads(p.size, 0, conformanceSizes)
	for b := range conformanceSizes {
		if err := m.Ready(b, grads[p.rank][b]); err != nil {
			return err
		}
	}
	if err := usage("Ready twice", m.Ready(0, g), ErrAlreadyReady); err != nil {
		return err
	}
	got, _, err := m.Wait(ctx)
	if err != nil {
		return err
	}
	if err := compare("after misuse", got, refFor(p, spec, m, true).want(0, grads, nil), true); err != nil {
		return err
	}
	if err := m.Step(); err != nil {
		return err
	}
	if err := m.Ready(0, grads[p.rank][0]); err != nil {
		return err
	}
	if _, _, err := m.Wait(ctx); usage("Wait with buckets never ready", err, ErrNotReady) != nil {
		return usage("Wait with buckets never ready", err, ErrNotReady)
	}
	var be *BrokenError
	if err := m.Step(); !errors.As(err, &be) {
		return fmt.Errorf("Step after a failed step: %v, want a *BrokenError", err)
	}
	return nil
}
