package train

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/compress"
	"github.com/gradcomp/gradcomp/overlap"
)

// Exchanger averages gradient buckets over the ranks of a group, step by
// step: the part of the overlap engine the training loop drives. Per step
// the loop calls Step, then Ready once per bucket as backward completes it,
// then Wait, which leaves in every bucket the average over ranks of what
// the ranks handed in (after compression, for a compressing exchanger).
// The exchanger owns a bucket's slice from Ready until Wait returns.
// Strategy names how buckets cross the wire, for the report.
type Exchanger interface {
	Strategy() string
	Step() error
	Ready(bucket int, grad []float32) error
	Wait(ctx context.Context) (StepStats, error)
	Close() error
}

// StepStats is what the loop records of one exchange step on a rank.
type StepStats struct {
	BytesSent int64 // bytes this rank put on the wire
	// BytesInNode is the part of BytesSent that stayed inside the rank's
	// node (the hierarchical exchange's node stages).
	BytesInNode int64
	Exchange    time.Duration // time spent exchanging, summed over buckets
	Exposed     time.Duration // communication not hidden behind compute: the time Wait blocked
}

// NewExchanger builds a rank's Exchanger over c for buckets of the given
// element counts, whose parameters are shapes (overlap.Config.Shapes),
// compressing as scheme says, with momentum correction's momentum
// (overlap.Config.Momentum; 0 for none). Every rank of c calls it with the
// same arguments.
type NewExchanger func(ctx context.Context, c comm.Comm, bucketSizes []int, shapes [][]overlap.Shape, scheme Scheme, momentum float64) (Exchanger, error)

// Scheme is one compression setting the demo compares: a compressor spec
// (compress.Parse, or powersgd:R), whether error feedback is on, the exchange strategy
// (overlap.StrategyAuto: the codec's own), and the engine's accuracy
// options.
type Scheme struct {
	Spec          string
	ErrorFeedback bool
	Strategy      overlap.Strategy
	// MomentumCorrection moves SGD's momentum into the exchange
	// (overlap.Config.Momentum = Config.Momentum) and runs SGD without it.
	MomentumCorrection bool
	// Ramp is a compression warm-up, overlap.Ramp(Spec, Ramp): phases of
	// Ramp steps each from milder settings to Spec; 0 for none.
	Ramp int
	// Guard is the accuracy guard's threshold (overlap.Config.Guard); 0
	// for none.
	Guard float64
	// Auto lets the engine's cost model decide each bucket's path
	// (overlap.DecideAuto); otherwise every bucket is compressed.
	Auto bool
	// NodeSpec is the codec of strategy hier's node stages
	// (overlap.Config.NodeSpec); "" for float32.
	NodeSpec string
}

// Markers of a scheme's name.
const (
	optionMarker   = "+"
	strategyMarker = "@"
	efOption       = "ef"
	mcOption       = "mc"
	rampOption     = "ramp="
	guardOption    = "guard="
	autoOption     = "auto"
	nodeOption     = "node="
)

// String returns the scheme's name: the spec, then its options in this
// order, "+ef" with error feedback, "+mc" with momentum correction,
// "+ramp=N", "+guard=G", "+auto" and "+node=SPEC", then "@" and the
// strategy unless it is auto ("sign+ef+ramp=20@allgather",
// "int8+ef+node=bf16@hier"). ParseScheme reads it back.
func (s Scheme) String() string {
	name := s.Spec
	if s.ErrorFeedback {
		name += optionMarker + efOption
	}
	if s.MomentumCorrection {
		name += optionMarker + mcOption
	}
	if s.Ramp > 0 {
		name += optionMarker + rampOption + strconv.Itoa(s.Ramp)
	}
	if s.Guard > 0 {
		name += optionMarker + guardOption + strconv.FormatFloat(s.Guard, 'g', -1, 64)
	}
	if s.Auto {
		name += optionMarker + autoOption
	}
	if s.NodeSpec != "" {
		name += optionMarker + nodeOption + s.NodeSpec
	}
	if s.Strategy != overlap.StrategyAuto {
		name += strategyMarker + s.Strategy.String()
	}
	return name
}

// ParseScheme reads a scheme name: a compressor spec, then options in any
// order, each once: "+ef" for error feedback, "+mc" for momentum
// correction, "+ramp=N" for a compression warm-up of N steps per phase,
// "+guard=G" for the accuracy guard, "+auto" for the cost model's
// decisions, "+node=SPEC" for strategy hier's node stages' codec (bf16,
// fp16 or int8); then optionally "@" and a strategy
// name (overlap.ParseStrategy): "topk:0.01+ef", "topk:0.01+ef+mc+ramp=20",
// "int4+ef@allgather", "powersgd:2+ef". The spec must parse (compress.Parse;
// powersgd through compress.ParseSpec) and the
// strategy must be known; their errors are returned otherwise. Error
// feedback on the codec none is an error (there is nothing to feed back),
// and so is a guard without error feedback or a ramp of a codec that has
// no milder setting. Whether the strategy suits the codec is the engine's
// to say, when it starts.
func ParseScheme(name string) (Scheme, error) {
	name = strings.TrimSpace(name)
	fail := func(format string, args ...any) (Scheme, error) {
		return Scheme{}, fmt.Errorf("train: scheme %q: "+format, append([]any{name}, args...)...)
	}
	var s Scheme
	rest := name
	if i := strings.LastIndex(rest, strategyMarker); i >= 0 {
		st, err := overlap.ParseStrategy(rest[i+len(strategyMarker):])
		if err != nil {
			return fail("%w", err)
		}
		s.Strategy, rest = st, rest[:i]
	}
	parts := strings.Split(rest, optionMarker)
	seen := map[string]bool{}
	for _, opt := range parts[1:] {
		key, _, _ := strings.Cut(opt, "=")
		if seen[key] {
			return fail("option %q given twice", key)
		}
		seen[key] = true
		var err error
		switch {
		case opt == efOption:
			s.ErrorFeedback = true
		case opt == mcOption:
			s.MomentumCorrection = true
		case opt == autoOption:
			s.Auto = true
		case strings.HasPrefix(opt, rampOption):
			if s.Ramp, err = strconv.Atoi(opt[len(rampOption):]); err != nil || s.Ramp < 1 {
				return fail("%q: want ramp=STEPS, STEPS ≥ 1", opt)
			}
		case strings.HasPrefix(opt, nodeOption):
			nc, err := compress.Parse(opt[len(nodeOption):])
			if err != nil {
				return fail("%q: %w", opt, err)
			}
			s.NodeSpec = nc.Spec().String()
		case strings.HasPrefix(opt, guardOption):
			if s.Guard, err = strconv.ParseFloat(opt[len(guardOption):], 64); err != nil || !(s.Guard > 0) || math.IsInf(s.Guard, 0) {
				return fail("%q: want guard=G, G > 0", opt)
			}
		default:
			return fail("unknown option %q (ef, mc, ramp=N, guard=G, auto, node=SPEC)", opt)
		}
	}
	c, err := compress.ParseSpec(parts[0])
	if err == nil && c.Codec != compress.CodecPowerSGD {
		_, err = compress.New(c) // powersgd has no compressor: the engine runs it
	}
	if err != nil {
		return fail("%w", err)
	}
	s.Spec = c.String()
	switch {
	case s.ErrorFeedback && c.Codec == compress.CodecNone:
		return fail("error feedback on an uncompressed codec")
	case s.Guard > 0 && !s.ErrorFeedback:
		return fail("an accuracy guard needs error feedback (+ef)")
	}
	if s.Ramp > 0 {
		if phases, err := overlap.Ramp(s.Spec, s.Ramp); err != nil || len(phases) == 0 {
			return fail("%s has no milder setting to ramp from", s.Spec)
		}
	}
	return s, nil
}

// DefaultSchemes are the schemes "gradcomp train" compares by default.
const DefaultSchemes = "none,topk:0.01+ef,topk:0.01,int4+ef,sign+ef"

// ParseSchemes reads a comma-separated list of scheme names (see
// ParseScheme); an empty name or a repeated scheme is an error.
func ParseSchemes(list string) ([]Scheme, error) {
	var schemes []Scheme
	seen := map[Scheme]bool{}
	for _, name := range strings.Split(list, ",") {
		s, err := ParseScheme(name)
		if err != nil {
			return nil, err
		}
		if seen[s] {
			return nil, fmt.Errorf("train: scheme %s listed twice", s)
		}
		seen[s] = true
		schemes = append(schemes, s)
	}
	return schemes, nil
}

// Config holds the hyper-parameters of a run. Every rank uses the same.
type Config struct {
	Widths    []int   // layer widths, input (Features) first, Classes last
	TrainSize int     // examples in the train set (Digits)
	TestSize  int     // examples in the test set
	Epochs    int     // passes over the train set
	Batch     int     // examples per rank per step: the global batch is ranks × Batch
	LR        float64 // peak SGD learning rate; step t of T uses LR·(1 + cos(πt/T))/2 (cosine decay)
	Momentum  float64 // SGD momentum μ: v ← μv + g; θ ← θ − lr·v
	Seed      uint64  // data, initial weights and shuffling
	// BucketBytes caps a gradient bucket (overlap.BucketSizes); small enough
	// that the model's layers land in separate buckets, so the exchange of
	// the last layers overlaps backward through the first.
	BucketBytes int
}

// DefaultConfig returns the settings "gradcomp train" uses by default,
// chosen so the five default schemes train in about a minute with four
// in-process ranks on two cores, with the same learning rate for all.
func DefaultConfig() Config {
	return Config{
		Widths:      []int{Features, 256, 128, Classes},
		TrainSize:   8000,
		TestSize:    5000,
		Epochs:      12,
		Batch:       32,
		LR:          0.1,
		Momentum:    0.9,
		Seed:        1,
		BucketBytes: 128 << 10,
	}
}

// check validates c for a group of ranks.
func (c Config) check(ranks int) error {
	switch {
	case len(c.Widths) < 2 || c.Widths[0] != Features || c.Widths[len(c.Widths)-1] != Classes:
		return fmt.Errorf("train: widths %v: want %d inputs first and %d outputs last", c.Widths, Features, Classes)
	case c.Epochs < 1:
		return fmt.Errorf("train: %d epochs, want ≥ 1", c.Epochs)
	case c.Batch < 1:
		return fmt.Errorf("train: batch %d per rank, want ≥ 1", c.Batch)
	case c.TestSize < 1:
		return fmt.Errorf("train: test set of %d examples, want ≥ 1", c.TestSize)
	case c.TrainSize < ranks*c.Batch:
		return fmt.Errorf("train: train set of %d examples is smaller than one global batch (%d ranks × %d)", c.TrainSize, ranks, c.Batch)
	case !(c.LR > 0) || math.IsInf(c.LR, 0):
		return fmt.Errorf("train: learning rate %v, want > 0", c.LR)
	case !(c.Momentum >= 0 && c.Momentum < 1):
		return fmt.Errorf("train: momentum %v, want in [0, 1)", c.Momentum)
	case c.BucketBytes < 4:
		return fmt.Errorf("train: bucket cap %d bytes, want ≥ 4", c.BucketBytes)
	}
	return nil
}

// steps returns the run's steps on ranks ranks.
func (c Config) steps(ranks int) int { return c.Epochs * (c.TrainSize / (ranks * c.Batch)) }

// checkScheme refuses a scheme the run cannot carry out: a ramp that does
// not end before the run does (the target spec would never be reached).
func (c Config) checkScheme(s Scheme, ranks int) error {
	if s.Ramp == 0 {
		return nil
	}
	phases, err := overlap.Ramp(s.Spec, s.Ramp)
	if err != nil {
		return err
	}
	n := 0
	for _, p := range phases {
		n += p.Steps
	}
	if steps := c.steps(ranks); n >= steps {
		return fmt.Errorf("train: scheme %s: its ramp takes %d steps (%s), the run has %d: it would never reach %s", s, n, overlap.FormatSchedule(phases), steps, s.Spec)
	}
	return nil
}

// Epoch is the state of a run after an epoch; epoch 0 is before training.
type Epoch struct {
	Epoch        int     `json:"epoch"`
	TrainLoss    float64 `json:"train_loss"` // mean loss of rank 0's batches during the epoch (0 for epoch 0)
	TestLoss     float64 `json:"test_loss"`  // mean cross-entropy on the test set
	TestAccuracy float64 `json:"test_accuracy"`
}

// Result is one scheme's run, as rank 0 saw it.
type Result struct {
	Scheme        string  `json:"scheme"`
	Spec          string  `json:"spec"`
	ErrorFeedback bool    `json:"error_feedback"`
	Strategy      string  `json:"strategy"` // as the exchanger named it
	Ranks         int     `json:"ranks"`
	Steps         int     `json:"steps"`
	Epochs        []Epoch `json:"epochs"`
	// Diverged is the epoch whose test loss was not finite, which ended the
	// run; 0 when it did not diverge.
	Diverged      int     `json:"diverged,omitempty"`
	FinalAccuracy float64 `json:"final_test_accuracy"`
	FinalLoss     float64 `json:"final_test_loss"`
	// Per step on rank 0, means over the run: the bytes the rank sent, the
	// wall time of the whole step (batch, forward, backward, exchange,
	// optimizer), the exchange time summed over buckets, and the part of
	// it Wait was blocked on.
	BytesPerStep float64 `json:"bytes_per_step"`
	// BytesInNodePerStep is the part of BytesPerStep that stayed inside
	// the node (strategy hier's node stages); 0 for the flat strategies.
	BytesInNodePerStep float64       `json:"bytes_in_node_per_step"`
	StepTime           time.Duration `json:"step_ns"`
	ExchangeTime       time.Duration `json:"exchange_ns"`
	ExposedTime        time.Duration `json:"exposed_ns"`
}

// Job is one scheme's training run over a group of ranks.
type Job struct {
	Config
	Scheme       Scheme
	Train, Test  *Dataset // Digits(Seed, TrainSize, TestSize), shared read-only by the ranks
	NewExchanger NewExchanger
	// Progress, if set, is called by rank 0 after each step with the steps
	// done and the run's total.
	Progress func(done, total int)
}

// RunRank trains on rank c of a group: every rank of the group calls it
// with the same job. Each step, rank r takes its Batch examples of the
// step's global batch (ranks × Batch consecutive examples of the epoch's
// shuffle), runs backward handing each gradient bucket to the exchanger as
// soon as its layers are done, waits for the averages and takes an SGD
// step; the ranks stay identical. Rank 0 evaluates the test set after each
// epoch (the others go on to the next step's exchange and wait there) and
// returns the Result; the other ranks return a Result without epochs.
// Training stops early, without an error, when the test loss is not finite.
func RunRank(ctx context.Context, c comm.Comm, job Job) (*Result, error) {
	ranks, rank := c.Size(), c.Rank()
	if err := job.Config.check(ranks); err != nil {
		return nil, err
	}
	if err := job.Config.checkScheme(job.Scheme, ranks); err != nil {
		return nil, err
	}
	if job.Train.Len() != job.TrainSize || job.Test.Len() != job.TestSize {
		return nil, fmt.Errorf("train: datasets of %d and %d examples, config says %d and %d", job.Train.Len(), job.Test.Len(), job.TrainSize, job.TestSize)
	}
	model, err := NewMLP(job.Widths, job.Seed^modelDomain)
	if err != nil {
		return nil, err
	}
	sizes := model.ParamSizes()
	buckets, bucketElems := overlap.BucketSizes(sizes, job.BucketBytes)
	grads, views := layoutBuckets(sizes, buckets)
	if err := model.BindGrads(views); err != nil {
		return nil, err
	}
	_, mc := job.momenta()
	ex, err := job.NewExchanger(ctx, c, bucketElems, bucketShapes(model.ParamShapes(), buckets), job.Scheme, mc)
	if err != nil {
		return nil, err
	}
	res, err := trainLoop(ctx, ex, model, rank, ranks, job, buckets, grads)
	if res != nil {
		res.Strategy = ex.Strategy()
	}
	if cerr := ex.Close(); err == nil && cerr != nil {
		err = fmt.Errorf("train: closing the exchanger: %w", cerr)
	}
	return res, err
}

// Seeds of the random streams other than the data's (which use Seed as is).
const (
	modelDomain   = 0x6d6f64656c000001
	shuffleDomain = 0x73687566666c0002
)

// momenta returns SGD's momentum and momentum correction's: Config.Momentum
// goes to the exchange for a "+mc" scheme, to SGD otherwise.
func (j Job) momenta() (sgd float32, mc float64) {
	if j.Scheme.MomentumCorrection {
		return 0, j.Momentum
	}
	return float32(j.Momentum), 0
}

// layoutBuckets lays the gradients out in one buffer, bucket after bucket,
// each bucket's parameters contiguous in the bucket's order; it returns each
// bucket's slice and each parameter's view.
// bucketShapes is each bucket's parameters' shapes, in the order
// layoutBuckets lays them out.
func bucketShapes(paramShapes []overlap.Shape, buckets [][]int) [][]overlap.Shape {
	out := make([][]overlap.Shape, len(buckets))
	for b, params := range buckets {
		for _, p := range params {
			out[b] = append(out[b], paramShapes[p])
		}
	}
	return out
}

func layoutBuckets(paramSizes []int, buckets [][]int) (grads, views [][]float32) {
	total := 0
	for _, n := range paramSizes {
		total += n
	}
	flat := make([]float32, total)
	views = make([][]float32, len(paramSizes))
	off := 0
	for _, params := range buckets {
		start := off
		for _, p := range params {
			views[p] = flat[off : off+paramSizes[p]]
			off += paramSizes[p]
		}
		grads = append(grads, flat[start:off])
	}
	return grads, views
}

// trainLoop runs the epochs of job on one rank.
func trainLoop(ctx context.Context, ex Exchanger, model *MLP, rank, ranks int, job Job, buckets [][]int, grads [][]float32) (*Result, error) {
	sgd, _ := job.momenta()
	res := &Result{Scheme: job.Scheme.String(), Spec: job.Scheme.Spec, ErrorFeedback: job.Scheme.ErrorFeedback, Ranks: ranks}
	bucketOf := make([]int, len(model.ParamSizes()))
	for b, params := range buckets {
		for _, p := range params {
			bucketOf[p] = b
		}
	}
	pending := make([]int, len(buckets))
	layerDone := func(l int) error {
		for _, p := range []int{2*l + 1, 2 * l} { // reverse registration order, as the buckets
			b := bucketOf[p]
			if pending[b]--; pending[b] == 0 {
				if err := ex.Ready(b, grads[b]); err != nil {
					return fmt.Errorf("train: bucket %d ready: %w", b, err)
				}
			}
		}
		return nil
	}
	evaluate := func(epoch int, trainLoss float64) bool {
		loss, correct, _ := model.Loss(job.Test.X, job.Test.Y) // shapes checked by Digits
		if math.IsNaN(loss) || math.IsInf(loss, 0) {
			res.Diverged = epoch
			return false
		}
		res.Epochs = append(res.Epochs, Epoch{Epoch: epoch, TrainLoss: trainLoss, TestLoss: loss, TestAccuracy: float64(correct) / float64(job.Test.Len())})
		res.FinalLoss, res.FinalAccuracy = loss, float64(correct)/float64(job.Test.Len())
		return true
	}
	if rank == 0 && !evaluate(0, 0) {
		return res, nil
	}
	params := model.Params()
	velocity := make([][]float32, len(params))
	for p := range params {
		velocity[p] = make([]float32, len(params[p]))
	}
	global := ranks * job.Batch
	perEpoch := job.TrainSize / global
	total := job.steps(ranks)
	order := make([]int32, job.TrainSize)
	x, y := make([]float32, job.Batch*Features), make([]uint8, job.Batch)
	var bytes, inNode int64
	var stepTime, exchange, exposed time.Duration
	for epoch := 1; epoch <= job.Epochs; epoch++ {
		for i := range order {
			order[i] = int32(i)
		}
		r := newRNG(job.Seed^shuffleDomain, uint64(epoch))
		r.shuffle(order)
		var lossSum float64
		for s := range perEpoch {
			start := time.Now()
			mine := order[s*global+rank*job.Batch:][:job.Batch]
			for i, e := range mine {
				copy(x[i*Features:(i+1)*Features], job.Train.Example(int(e)))
				y[i] = job.Train.Y[e]
			}
			for b, params := range buckets {
				pending[b] = len(params)
			}
			if err := ex.Step(); err != nil {
				return nil, fmt.Errorf("train: epoch %d step %d: %w", epoch, s, err)
			}
			loss, err := model.Backward(x, y, layerDone)
			if err != nil {
				return nil, fmt.Errorf("train: epoch %d step %d: %w", epoch, s, err)
			}
			st, err := ex.Wait(ctx)
			if err != nil {
				return nil, fmt.Errorf("train: epoch %d step %d: %w", epoch, s, err)
			}
			lr := float32(job.LR * (1 + math.Cos(math.Pi*float64(res.Steps)/float64(total))) / 2)
			g := model.Grads()
			for p, theta := range params {
				v := velocity[p]
				for i, gi := range g[p] {
					v[i] = sgd*v[i] + gi
					theta[i] -= lr * v[i]
				}
			}
			lossSum += loss
			bytes += st.BytesSent
			inNode += st.BytesInNode
			exchange += st.Exchange
			exposed += st.Exposed
			stepTime += time.Since(start)
			res.Steps++
			if rank == 0 && job.Progress != nil {
				job.Progress(res.Steps, total)
			}
		}
		if rank == 0 && !evaluate(epoch, lossSum/float64(perEpoch)) {
			break
		}
		if res.Diverged > 0 {
			break
		}
	}
	if res.Steps > 0 {
		n := time.Duration(res.Steps)
		res.BytesPerStep = float64(bytes) / float64(res.Steps)
		res.BytesInNodePerStep = float64(inNode) / float64(res.Steps)
		res.StepTime, res.ExchangeTime, res.ExposedTime = stepTime/n, exchange/n, exposed/n
	}
	return res, nil
}

// runRanks runs job on the ranks this process drives, one goroutine each,
// and returns rank 0's Result, or nil when rank 0 is not among them. When a
// rank fails, it closes its end of the group so that the others fail at
// once instead of waiting out their timeouts; the error returned is the
// lowest rank's own failure (not one caused by another rank poisoning the
// group), if any.
func runRanks(ctx context.Context, ranks []comm.Comm, job Job) (*Result, error) {
	results := make([]*Result, len(ranks))
	errs := make([]error, len(ranks))
	var wg sync.WaitGroup
	for i, c := range ranks {
		wg.Go(func() {
			results[i], errs[i] = RunRank(ctx, c, job)
			if errs[i] != nil {
				errs[i] = fmt.Errorf("rank %d: %w", c.Rank(), errs[i])
				c.Close()
			}
		})
	}
	wg.Wait()
	if err := firstError(errs); err != nil {
		return nil, err
	}
	for i, c := range ranks {
		if c.Rank() == 0 {
			return results[i], nil
		}
	}
	return nil, nil
}

// firstError returns the first error of errs that is not a consequence of
// another rank's failure (a poisoned group), or else the first error.
func firstError(errs []error) error {
	var first error
	for _, err := range errs {
		if err == nil {
			continue
		}
		var poisoned *comm.PoisonedError
		if !errors.As(err, &poisoned) {
			return err
		}
		if first == nil {
			first = err
		}
	}
	return first
}

// Compare trains each scheme in turn and returns the results in the order
// of schemes. ranks are the ranks of one group this process drives, one
// goroutine each: every rank of an in-process group (comm/inproc), or this
// process's rank of an MPI job, whose other processes call Compare with the
// same arguments. Every scheme starts from the same initial weights, on the
// data Digits generates from cfg.Seed. Only a process that drives rank 0
// gets results (the others get nil); progress, if set, is called there
// after every step with the steps done and the total over all schemes. The
// first failure ends the comparison, and leaves the group unusable.
func Compare(ctx context.Context, ranks []comm.Comm, cfg Config, schemes []Scheme, newEx NewExchanger, progress func(done, total int)) ([]Result, error) {
	if len(ranks) == 0 {
		return nil, fmt.Errorf("train: no rank to run")
	}
	size := ranks[0].Size()
	if err := cfg.check(size); err != nil {
		return nil, err
	}
	for _, s := range schemes {
		if err := cfg.checkScheme(s, size); err != nil {
			return nil, err
		}
	}
	trainSet, testSet, err := Digits(cfg.Seed, cfg.TrainSize, cfg.TestSize)
	if err != nil {
		return nil, err
	}
	perScheme := cfg.steps(size)
	var results []Result
	for i, s := range schemes {
		job := Job{Config: cfg, Scheme: s, Train: trainSet, Test: testSet, NewExchanger: newEx}
		if progress != nil {
			job.Progress = func(done, _ int) { progress(i*perScheme+done, len(schemes)*perScheme) }
		}
		res, err := runRanks(ctx, ranks, job)
		if err != nil {
			return results, fmt.Errorf("train: scheme %s: %w", s, err)
		}
		if res != nil {
			results = append(results, *res)
		}
	}
	return results, nil
}
