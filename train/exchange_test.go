package train

import (
	"context"
	"fmt"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/overlap"
)

// averager is the Exchanger of the tests: at Wait it all-reduces every
// bucket, in bucket order, and divides by the group size. It counts the
// fp32 bytes as sent.
type averager struct {
	c       comm.Comm
	sizes   []int
	ready   [][]float32
	stepped bool
}

func newAverager(_ context.Context, c comm.Comm, sizes []int, _ [][]overlap.Shape, s Scheme, momentum float64) (Exchanger, error) {
	if s.Spec != "none" || momentum != 0 {
		return nil, fmt.Errorf("averager: scheme %s, momentum %v: only none without momentum correction", s, momentum)
	}
	return &averager{c: c, sizes: sizes, ready: make([][]float32, len(sizes))}, nil
}

func (a *averager) Strategy() string { return "dense" }

func (a *averager) Step() error {
	if a.stepped {
		return fmt.Errorf("averager: Step twice")
	}
	a.stepped = true
	clear(a.ready)
	return nil
}

func (a *averager) Ready(i int, g []float32) error {
	switch {
	case !a.stepped:
		return fmt.Errorf("averager: Ready without Step")
	case i < 0 || i >= len(a.sizes) || a.ready[i] != nil:
		return fmt.Errorf("averager: bucket %d unknown or ready", i)
	case len(g) != a.sizes[i]:
		return fmt.Errorf("averager: bucket %d has %d elements, want %d", i, len(g), a.sizes[i])
	}
	a.ready[i] = g
	return nil
}

func (a *averager) Wait(ctx context.Context) (StepStats, error) {
	start := time.Now()
	a.stepped = false
	var st StepStats
	for i, g := range a.ready {
		if g == nil {
			return st, fmt.Errorf("averager: bucket %d not ready at Wait", i)
		}
		if err := a.c.AllReduce(ctx, g); err != nil {
			return st, err
		}
		for j := range g {
			g[j] /= float32(a.c.Size())
		}
		st.BytesSent += 4 * int64(len(g))
	}
	st.Exchange = time.Since(start)
	st.Exposed = st.Exchange
	return st, nil
}

func (a *averager) Close() error { return nil }
