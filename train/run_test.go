package train

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/inproc"
	"github.com/gradcomp/gradcomp/internal/imagetest"
	"github.com/gradcomp/gradcomp/overlap"
)

var errTest = errors.New("test error")

// smallConfig trains in well under a second.
func smallConfig() Config {
	c := DefaultConfig()
	c.Widths = []int{Features, 32, Classes}
	c.TrainSize, c.TestSize = 1600, 400
	c.Epochs, c.Batch = 3, 16
	c.BucketBytes = 1 << 10
	return c
}

func smallJob(t *testing.T, c Config, newEx NewExchanger) Job {
	t.Helper()
	tr, te, err := Digits(c.Seed, c.TrainSize, c.TestSize)
	if err != nil {
		t.Fatal(err)
	}
	return Job{Config: c, Scheme: Scheme{Spec: "none"}, Train: tr, Test: te, NewExchanger: newEx}
}

// runInProc runs job on a new in-process group of n ranks.
func runInProc(ctx context.Context, n int, job Job) (*Result, error) {
	group, err := inproc.NewGroup(n)
	if err != nil {
		return nil, err
	}
	defer closeAll(group)
	return runRanks(ctx, group, job)
}

func closeAll(group []comm.Comm) {
	for _, c := range group {
		c.Close()
	}
}

func TestTrainingLearns(t *testing.T) {
	c := smallConfig()
	var mu sync.Mutex
	var progress []int
	job := smallJob(t, c, newAverager)
	job.Progress = func(done, total int) {
		mu.Lock()
		progress = append(progress, done, total)
		mu.Unlock()
	}
	res, err := runInProc(context.Background(), 2, job)
	if err != nil {
		t.Fatal(err)
	}
	steps := c.Epochs * (c.TrainSize / (2 * c.Batch))
	if res.Steps != steps || len(res.Epochs) != c.Epochs+1 || res.Ranks != 2 {
		t.Fatalf("%d steps, %d epochs recorded, %d ranks; want %d, %d, 2", res.Steps, len(res.Epochs), res.Ranks, steps, c.Epochs+1)
	}
	if len(progress) != 2*steps || progress[len(progress)-2] != steps || progress[1] != steps {
		t.Errorf("progress calls %v…, want %d calls ending at %d of %d", progress[:min(4, len(progress))], steps, steps, steps)
	}
	first, last := res.Epochs[0], res.Epochs[len(res.Epochs)-1]
	t.Logf("test accuracy %.3f → %.3f, loss %.3f → %.3f", first.TestAccuracy, last.TestAccuracy, first.TestLoss, last.TestLoss)
	// Chance is 0.1; three short epochs of this small net reach about 0.6.
	if last.TestAccuracy < 0.4 || last.TestLoss > 0.8*first.TestLoss {
		t.Errorf("did not learn: accuracy %.3f → %.3f, loss %.3f → %.3f", first.TestAccuracy, last.TestAccuracy, first.TestLoss, last.TestLoss)
	}
	if res.FinalAccuracy != last.TestAccuracy || res.BytesPerStep <= 0 || res.StepTime <= 0 || res.Strategy != "dense" {
		t.Errorf("summary %+v", res)
	}
	// The same seed gives the same run.
	job.Progress = nil
	again, err := runInProc(context.Background(), 2, job)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(again.Epochs, res.Epochs) {
		t.Errorf("rerun differs:\n%v\n%v", again.Epochs, res.Epochs)
	}
}

// recorder wraps the averager and records, per step, the order in which
// the buckets arrived and whether each bucket held its layers' gradients.
type recorder struct {
	*averager
	mu     *sync.Mutex
	orders *[][]int
	order  []int
}

func (r *recorder) Ready(i int, g []float32) error {
	r.order = append(r.order, i)
	return r.averager.Ready(i, g)
}

func (r *recorder) Wait(ctx context.Context) (StepStats, error) {
	if r.c.Rank() == 0 {
		r.mu.Lock()
		*r.orders = append(*r.orders, r.order)
		r.mu.Unlock()
	}
	r.order = nil
	return r.averager.Wait(ctx)
}

func TestBucketsReadyInBackwardOrder(t *testing.T) {
	c := smallConfig()
	c.Widths = []int{Features, 24, 16, Classes}
	c.Epochs = 1
	var mu sync.Mutex
	var orders [][]int
	var sizes []int
	newEx := func(ctx context.Context, cm comm.Comm, s []int, shapes [][]overlap.Shape, sc Scheme, momentum float64) (Exchanger, error) {
		mu.Lock()
		sizes = s
		mu.Unlock()
		ex, err := newAverager(ctx, cm, s, shapes, sc, momentum)
		return &recorder{averager: ex.(*averager), mu: &mu, orders: &orders}, err
	}
	// A cap of 300 floats: {b2, W2, b1} (10+160+16, as W1 would overflow
	// it), {W1} (384), {b0} (24, as W0 would overflow it) and {W0}.
	c.BucketBytes = 4 * 300
	if _, err := runInProc(context.Background(), 2, smallJob(t, c, newEx)); err != nil {
		t.Fatal(err)
	}
	if want := []int{10 + 160 + 16, 16 * 24, 24, 24 * 64}; !slices.Equal(sizes, want) {
		t.Fatalf("bucket sizes %v, want %v", sizes, want)
	}
	if len(orders) != c.TrainSize/(2*c.Batch) {
		t.Fatalf("%d steps recorded", len(orders))
	}
	for s, o := range orders {
		if !slices.Equal(o, []int{0, 1, 2, 3}) {
			t.Fatalf("step %d: buckets ready in order %v, want [0 1 2 3]", s, o)
		}
	}
}

// failing is an Exchanger whose Ready fails at one step (-1: never); the
// test gives that step to one rank.
type failing struct {
	Exchanger
	step, steps int
}

func (f *failing) Ready(i int, g []float32) error {
	if i == 0 {
		f.steps++
	}
	if f.steps == f.step {
		return errTest
	}
	return f.Exchanger.Ready(i, g)
}

func TestFailingRankEndsRun(t *testing.T) {
	c := smallConfig()
	newEx := func(ctx context.Context, cm comm.Comm, s []int, shapes [][]overlap.Shape, sc Scheme, momentum float64) (Exchanger, error) {
		ex, err := newAverager(ctx, cm, s, shapes, sc, momentum)
		step := -1
		if cm.Rank() == 1 {
			step = 3
		}
		return &failing{Exchanger: ex, step: step}, err
	}
	done := make(chan error, 1)
	go func() {
		_, err := runInProc(context.Background(), 3, smallJob(t, c, newEx))
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, errTest) || !strings.Contains(err.Error(), "rank 1") {
			t.Errorf("error %v, want rank 1's test error", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a failing rank left the others waiting")
	}
}

func TestConfigChecks(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(*Config)
	}{
		{"widths", func(c *Config) { c.Widths = []int{Features, 5} }},
		{"epochs", func(c *Config) { c.Epochs = 0 }},
		{"batch", func(c *Config) { c.Batch = 0 }},
		{"lr", func(c *Config) { c.LR = 0 }},
		{"momentum", func(c *Config) { c.Momentum = 1 }},
		{"train size", func(c *Config) { c.TrainSize = 10 }},
		{"test size", func(c *Config) { c.TestSize = 0 }},
	} {
		c := smallConfig()
		tc.edit(&c)
		group, err := inproc.NewGroup(2)
		if err != nil {
			t.Fatal(err)
		}
		_, err = Compare(context.Background(), group, c, []Scheme{{Spec: "none"}}, newAverager, nil)
		closeAll(group)
		if err == nil {
			t.Errorf("%s: accepted %+v", tc.name, c)
		}
	}
}

func TestParseSchemes(t *testing.T) {
	s, err := ParseSchemes(DefaultSchemes)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, x := range s {
		names = append(names, x.String())
	}
	if got := strings.Join(names, ","); got != DefaultSchemes {
		t.Errorf("round trip %q, want %q", got, DefaultSchemes)
	}
	if !s[1].ErrorFeedback || s[2].ErrorFeedback || s[1].Spec != "topk:0.01" {
		t.Errorf("schemes %+v", s)
	}
	s, err = ParseSchemes("sign+ef@allgather, int4@sra,topk:0.01@auto")
	if err != nil {
		t.Fatal(err)
	}
	want := []Scheme{{Spec: "sign", ErrorFeedback: true, Strategy: overlap.StrategyQuantAllGather},
		{Spec: "int4", Strategy: overlap.StrategyQuantSRA}, {Spec: "topk:0.01"}}
	if !slices.Equal(s, want) {
		t.Errorf("schemes %v, want %v", s, want)
	}
	if s[0].String() != "sign+ef@allgather" || s[2].String() != "topk:0.01" {
		t.Errorf("names %s, %s", s[0], s[2])
	}
	if p, err := ParseScheme("powersgd:2:warm=on+ef"); err != nil || p.Spec != "powersgd:2" || !p.ErrorFeedback {
		t.Errorf("ParseScheme(powersgd:2:warm=on+ef) = %+v, %v; want the canonical powersgd:2 with error feedback", p, err)
	}
	if _, err := ParseScheme("powersgd:0+ef"); err == nil {
		t.Errorf("ParseScheme(powersgd:0+ef) succeeded")
	}
	mc, err := ParseScheme("topk:0.01+ef+mc@sparse-gather")
	if err != nil || !mc.ErrorFeedback || !mc.MomentumCorrection || mc.String() != "topk:0.01+ef+mc@sparse-gather" {
		t.Errorf("ParseScheme(topk:0.01+ef+mc@sparse-gather) = %+v, %v", mc, err)
	}
	full, err := ParseScheme("topk:0.01+auto+guard=20+ramp=10+mc+ef@sparse-gather")
	if want := (Scheme{Spec: "topk:0.01", ErrorFeedback: true, MomentumCorrection: true, Ramp: 10, Guard: 20, Auto: true, Strategy: overlap.StrategySparseGather}); err != nil || full != want {
		t.Errorf("ParseScheme with every option = %+v, %v; want %+v", full, err, want)
	}
	if got := full.String(); got != "topk:0.01+ef+mc+ramp=10+guard=20+auto@sparse-gather" {
		t.Errorf("canonical name %s", got)
	}
	for _, bad := range []string{"", "nope", "topk:2+ef", "none+ef", "int4+ef,int4+ef", "topk:0.01+EF", "int4@nope", "int4@", "int4@sra+ef", "none,",
		"topk:0.01+ef+ef", "topk:0.01+ramp=0", "topk:0.01+ramp=x", "topk:0.01+guard=2", "topk:0.01+ef+guard=-1", "topk:0.01+ef+guard=inf",
		"int8+ef+ramp=5", "topk:0.5+ramp=5", "topk:0.01+ramp=5+ramp=6", "topk:0.01+nope", "int4+auto+auto"} {
		if _, err := ParseSchemes(bad); err == nil {
			t.Errorf("ParseSchemes(%q) accepted", bad)
		}
	}
}

func TestReports(t *testing.T) {
	results := []Result{
		{Scheme: "none", Spec: "none", Ranks: 4, Steps: 10, FinalAccuracy: 0.8, FinalLoss: 0.5, BytesPerStep: 4000, StepTime: 2 * time.Millisecond,
			Epochs: []Epoch{{0, 0, 2.3, 0.1}, {1, 1.0, 0.6, 0.7}, {2, 0.5, 0.5, 0.8}}},
		{Scheme: "topk:0.01+ef", Spec: "topk:0.01", ErrorFeedback: true, Strategy: "sparse-gather", Ranks: 4, Steps: 10, FinalAccuracy: 0.79, FinalLoss: 0.55, BytesPerStep: 250,
			Epochs: []Epoch{{0, 0, 2.3, 0.1}, {1, 1.1, 0.7, 0.6}, {2, 0.6, 0.55, 0.79}}},
		{Scheme: "sign", Spec: "sign", Ranks: 4, Steps: 5, Diverged: 2, BytesPerStep: 150,
			Epochs: []Epoch{{0, 0, 2.3, 0.1}, {1, 1.1, 0.9, 0.5}}},
	}
	var b bytes.Buffer
	if err := WriteTable(&b, results); err != nil {
		t.Fatal(err)
	}
	table := b.String()
	for _, want := range []string{"-1.00", "16.0×", "diverged at epoch 2", "80.00"} {
		if !strings.Contains(table, want) {
			t.Errorf("table lacks %q:\n%s", want, table)
		}
	}
	dir := filepath.Join(t.TempDir(), "a", "b")
	paths, err := WriteReports(dir, results)
	if err != nil {
		t.Fatal(err)
	}
	if len(paths) != 5 {
		t.Errorf("paths %v", paths)
	}
	curves, err := os.ReadFile(filepath.Join(dir, FileCurves))
	if err != nil {
		t.Fatal(err)
	}
	if n := strings.Count(string(curves), "\n"); n != 1+3+3+2 {
		t.Errorf("curves.csv has %d lines:\n%s", n, curves)
	}
	summary, err := os.ReadFile(filepath.Join(dir, FileCSV))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(summary), "\ntopk:0.01+ef,topk:0.01,true,sparse-gather,4,10,0.79,0.55,0,250,0,0,0,0\n") {
		t.Errorf("results.csv:\n%s", summary)
	}
	for _, name := range []string{FileAccuracy, FileLoss} {
		imagetest.CheckPNG(t, filepath.Join(dir, name), 1, 1)
	}
}

func ExampleScheme_String() {
	s, err := ParseScheme("topk:0.01+ef")
	fmt.Println(s.Spec, s.ErrorFeedback, s, err)
	// Output: topk:0.01 true topk:0.01+ef <nil>
}

// TestRampLongerThanRun: a scheme whose ramp does not end before the run
// does is refused before anything runs, naming both lengths.
func TestRampLongerThanRun(t *testing.T) {
	c := smallConfig()
	group, err := inproc.NewGroup(2)
	if err != nil {
		t.Fatal(err)
	}
	defer closeAll(group)
	steps := c.steps(2)
	long, err := ParseScheme(fmt.Sprintf("topk:0.01+ef+ramp=%d", steps/3+1)) // three phases
	if err != nil {
		t.Fatal(err)
	}
	_, err = Compare(t.Context(), group, c, []Scheme{{Spec: "none"}, long}, EngineExchanger, nil)
	if err == nil || !strings.Contains(err.Error(), fmt.Sprintf("the run has %d", steps)) {
		t.Fatalf("Compare with a ramp of %d steps in a run of %d: %v", 3*(steps/3+1), steps, err)
	}
	if err := c.checkScheme(Scheme{Spec: "topk:0.01", ErrorFeedback: true, Ramp: (steps - 1) / 3}, 2); err != nil {
		t.Errorf("a ramp that ends a step before the run: %v", err)
	}
}
