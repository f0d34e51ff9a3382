package train

import (
	"context"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/overlap"
)

// EngineExchanger is the NewExchanger of the overlap engine: overlap.New
// over c with the scheme's spec, error feedback and strategy (StrategyAuto:
// top-k → sparse-gather, int8/4/2 and sign → quantized SRA, powersgd →
// low-rank over the parameters' shapes, none → dense), momentum correction with momentum (0: none), the scheme's ramp
// (overlap.Ramp) and accuracy guard, compression pinned on every bucket
// (DecideCompressed) so that the run shows each scheme's effect on training
// whatever the cost model would choose on this link (unless the scheme
// says +auto: DecideAuto), and one compressor
// goroutine per call (the ranks already share the cores).
func EngineExchanger(ctx context.Context, c comm.Comm, bucketSizes []int, shapes [][]overlap.Shape, s Scheme, momentum float64) (Exchanger, error) {
	var schedule []overlap.Phase
	if s.Ramp > 0 {
		var err error
		if schedule, err = overlap.Ramp(s.Spec, s.Ramp); err != nil {
			return nil, err
		}
	}
	decision := overlap.DecideCompressed
	if s.Auto {
		decision = overlap.DecideAuto
	}
	e, err := overlap.New(ctx, c, bucketSizes, overlap.Config{
		Spec:          s.Spec,
		ErrorFeedback: s.ErrorFeedback,
		Strategy:      s.Strategy,
		Decision:      decision,
		Workers:       1,
		Momentum:      momentum,
		Schedule:      schedule,
		Guard:         s.Guard,
		NodeSpec:      s.NodeSpec,
		Shapes:        shapes,
	})
	if err != nil {
		return nil, err
	}
	return engine{e}, nil
}

// engine adapts *overlap.Engine to Exchanger.
type engine struct{ *overlap.Engine }

func (e engine) Strategy() string { return e.Engine.Strategy().String() }

func (e engine) Wait(ctx context.Context) (StepStats, error) {
	st, err := e.Engine.Wait(ctx)
	out := StepStats{BytesSent: st.BytesSent, Exchange: st.ExchangeTotal, Exposed: st.Exposed}
	for _, b := range st.Buckets {
		out.BytesInNode += b.BytesInNode
	}
	return out, err
}
