package overlap

import (
	"context"
	"testing"

	"github.com/gradcomp/gradcomp/comm"
)

// fixedTiming is a timing whose times are given: a link t(V) = alpha +
// V·perByte for the probes, compute lines for the paths, and per bucket a
// step time on each path for verification. It makes the cost model's and
// verification's decisions arithmetic, whatever the machine's load.
type fixedTiming struct {
	alpha, perByte     float64
	enc, mid, dec, avg line
	// dense and compressed are the seconds a bucket adds to a step on each
	// path (verification's measurements), in bucket order.
	dense, compressed float64
	// shapes are the step times of chooseShape's trials by strategy (the
	// measured one where absent).
	shapes map[Strategy]float64
}

func (f *fixedTiming) trial(s Strategy, measured float64) float64 {
	if t, ok := f.shapes[s]; ok {
		return t
	}
	return measured
}

func (f *fixedTiming) probe(ctx context.Context, p prober, size, floats int) (float64, error) {
	if err := p.probeAllReduce(ctx, floats); err != nil {
		return 0, err
	}
	return f.alpha + float64(allReduceVolume(size, 4*floats))*f.perByte, nil
}

func (f *fixedTiming) paths(_ prober, ns []int) ([4][]float64, error) {
	var times [4][]float64
	for k, l := range []line{f.enc, f.mid, f.dec, f.avg} {
		for _, n := range ns {
			times[k] = append(times[k], l.at(n))
		}
	}
	return times, nil
}

func (f *fixedTiming) spans(measured []span) []span {
	out := make([]span, len(measured))
	at := 0.0
	for i, s := range measured {
		d := f.dense
		if s.path == compressedPath {
			d = f.compressed
		}
		out[i] = span{ready: 0, done: at + d, path: s.path, clean: s.clean}
		at += d
	}
	return out
}

// newTimedEngines builds an engine per rank of comms whose cost model and
// verification take their times from t.
func newTimedEngines(t *testing.T, comms []comm.Comm, sizes []int, cfg Config, tm timing) []*Engine {
	t.Helper()
	engines := make([]*Engine, len(comms))
	mustNoErrors(t, "New", onRanks(comms, func(r int, c comm.Comm) error {
		var err error
		engines[r], err = newEngine(context.Background(), c, sizes, cfg, tm)
		return err
	}))
	t.Cleanup(func() {
		for _, e := range engines {
			e.Close()
		}
	})
	return engines
}
