package overlap

import (
	"context"
	"encoding/binary"
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"time"

	"github.com/gradcomp/gradcomp/compress"
)

// costModel holds what New measured, identical on every rank: the link as
// t(V) = α + V/β for V bytes sent per rank, and the compressed path's
// encode and decode times as linear functions of the element count.
type costModel struct {
	alpha   float64 // seconds
	perByte float64 // seconds per byte sent (1/β); 0 when unmeasurable (one rank)
	encA    float64 // encode: encA + encB·n seconds
	encB    float64
	decA    float64 // decode of n elements
	decB    float64
}

// stageCosts are a bucket's predicted stage times on the compressed path:
// encode on the compute stream, exchange on the wire stream (collectives,
// and SRA's sum and re-encode between them), decode on the decode stream.
type stageCosts struct{ encode, exchange, decode float64 }

// total is the time the bucket adds to a pipelined step: the exchange,
// plus the part of encode and decode that the neighbouring buckets'
// exchanges cannot hide. Bucket i's encode runs while bucket i−1 is on the
// wire and its decode while bucket i+1 is; with neighbours of about the
// same size, up to one exchange time of each hides.
func (c stageCosts) total() float64 {
	return c.exchange + max(0, c.encode-c.exchange) + max(0, c.decode-c.exchange)
}

func (m *costModel) link(bytes int64) float64 { return m.alpha + float64(bytes)*m.perByte }
func (m *costModel) enc(n int) float64        { return m.encA + m.encB*float64(n) }
func (m *costModel) dec(n int) float64        { return m.decA + m.decB*float64(n) }

// The measurement's size.
const (
	probeReps   = 3 // timed all-reduces per probe size, after one untimed
	measureReps = 2 // timed encodes and decodes per size, after one untimed
)

// measure probes the link with all-reduces of a few sizes and times the
// compressed path's encode and decode on up to three bucket sizes (the
// smallest, the median, the largest), on a synthetic gradient. Every rank
// measures; the element-wise maximum over ranks (an all-gather) is what
// every rank fits, so all of them hold the same model.
func measure(ctx context.Context, e *Engine) (*costModel, error) {
	m := &costModel{}
	probeLen := []int{1 << 8, 1 << 14, 1 << 18} // float32s
	sizes := make([]int, len(e.buckets))
	for i, b := range e.buckets {
		sizes[i] = b.n
	}
	slices.Sort(sizes)
	if sizes[len(sizes)-1] >= 1<<19 {
		probeLen = append(probeLen, 1<<20)
	}
	ns := slices.Compact([]int{sizes[0], sizes[len(sizes)/2], sizes[len(sizes)-1]})

	var v []float64
	buf := make([]float32, probeLen[len(probeLen)-1])
	for _, l := range probeLen {
		best := math.Inf(1)
		for rep := range probeReps + 1 {
			tctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
			t := time.Now()
			err := e.c.AllReduce(tctx, buf[:l])
			d := time.Since(t).Seconds()
			cancel()
			if err != nil {
				return nil, fmt.Errorf("overlap: cost model: link probe on rank %d: %w", e.rank, err)
			}
			if rep > 0 {
				best = min(best, d)
			}
		}
		v = append(v, best)
	}
	enc, dec, err := timeCodec(e, ns)
	if err != nil {
		return nil, fmt.Errorf("overlap: cost model: timing %s on rank %d: %w", e.spec, e.rank, err)
	}
	v = append(append(v, enc...), dec...)

	// Element-wise maximum over ranks.
	mine := make([]byte, 8*len(v))
	for i, x := range v {
		binary.LittleEndian.PutUint64(mine[8*i:], math.Float64bits(x))
	}
	all := make([]byte, e.size*len(mine))
	tctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.c.AllGather(tctx, all, mine); err != nil {
		return nil, fmt.Errorf("overlap: cost model: sharing measurements on rank %d: %w", e.rank, err)
	}
	for r := range e.size {
		for i := range v {
			v[i] = max(v[i], math.Float64frombits(binary.LittleEndian.Uint64(all[r*len(mine)+8*i:])))
		}
	}

	probes := v[:len(probeLen)]
	xs := make([]float64, len(probes))
	for i, l := range probeLen {
		xs[i] = float64(allReduceVolume(e.size, 4*l))
	}
	m.alpha, m.perByte = fitLine(xs, probes)
	fns := make([]float64, len(ns))
	for i, n := range ns {
		fns[i] = float64(n)
	}
	m.encA, m.encB = fitLine(fns, v[len(probes):len(probes)+len(ns)])
	m.decA, m.decB = fitLine(fns, v[len(probes)+len(ns):])
	return m, nil
}

// timeCodec returns the fastest of measureReps encodes (through fresh
// error-feedback memory when the engine has it, so the engine's own stays
// untouched) and decodes of the stage-1 payload, for each size in ns.
func timeCodec(e *Engine, ns []int) (enc, dec []float64, err error) {
	rng := rand.New(rand.NewPCG(1, 2))
	grad := make([]float32, ns[len(ns)-1])
	for i := range grad {
		grad[i] = float32(rng.NormFloat64())
	}
	p := e.x.first().p
	for _, n := range ns {
		c := coder{p: p}
		if e.cfg.ErrorFeedback {
			c.ef = compress.NewErrorFeedback(p)
		}
		payload := make([]byte, p.MaxEncodedLen(n))
		out := make([]float32, n)
		bestEnc, bestDec := math.Inf(1), math.Inf(1)
		for rep := range measureReps + 1 {
			t := time.Now()
			_, pend, err := c.begin(payload[:0], grad[:n], compress.Key{Bucket: 0, Step: uint64(rep)})
			d := time.Since(t).Seconds()
			if err != nil {
				return nil, nil, err
			}
			discard(pend)
			t = time.Now()
			err = p.DecompressAdd(out, payload)
			d2 := time.Since(t).Seconds()
			if err != nil {
				return nil, nil, err
			}
			if rep > 0 {
				bestEnc, bestDec = min(bestEnc, d), min(bestDec, d2)
			}
		}
		enc, dec = append(enc, bestEnc), append(dec, bestDec)
	}
	return enc, dec, nil
}

// fitLine fits y = a + b·x by least squares, with a, b ≥ 0: a negative
// intercept is refitted through the origin, a negative slope (noise on a
// link too fast to resolve) becomes 0 with a = mean(y).
func fitLine(xs, ys []float64) (a, b float64) {
	var mx, my float64
	for i := range xs {
		mx += xs[i]
		my += ys[i]
	}
	mx /= float64(len(xs))
	my /= float64(len(xs))
	var sxy, sxx float64
	for i := range xs {
		sxy += (xs[i] - mx) * (ys[i] - my)
		sxx += (xs[i] - mx) * (xs[i] - mx)
	}
	if sxx > 0 {
		b = sxy / sxx
	}
	a = my - b*mx
	switch {
	case b <= 0:
		return my, 0
	case a < 0:
		var sxy, sxx float64
		for i := range xs {
			sxy += xs[i] * ys[i]
			sxx += xs[i] * xs[i]
		}
		return 0, sxy / sxx
	}
	return a, b
}

// decide predicts every bucket's dense and compressed times and chooses the
// faster. Rank 0's choices are broadcast, so every rank takes the same path
// whatever its floating point does.
func (m *costModel) decide(ctx context.Context, e *Engine) error {
	choice := make([]byte, len(e.buckets))
	bw := "unresolved"
	if m.perByte > 0 {
		bw = fmt.Sprintf("%.3g GB/s", 1e-9/m.perByte)
	}
	for i, b := range e.buckets {
		c := e.x.costs(m, b.n)
		dense, comp := m.link(allReduceVolume(e.size, 4*b.n)), c.total()
		b.predDense, b.predComp = seconds(dense), seconds(comp)
		if comp < dense {
			choice[i] = 1
		}
		b.reason = fmt.Sprintf("cost model: compressed %v (encode %v, exchange %v, decode %v) vs dense %v; link α=%v β=%s",
			b.predComp, seconds(c.encode), seconds(c.exchange), seconds(c.decode), b.predDense, seconds(m.alpha), bw)
	}
	tctx, cancel := context.WithTimeout(ctx, e.cfg.Timeout)
	defer cancel()
	if err := e.c.Broadcast(tctx, choice, 0); err != nil {
		return fmt.Errorf("overlap: cost model: broadcasting the decisions on rank %d: %w", e.rank, err)
	}
	for i, b := range e.buckets {
		b.compressed = choice[i] == 1
	}
	return nil
}

func seconds(s float64) time.Duration {
	return time.Duration(s * 1e9).Round(time.Microsecond / 10)
}

func (g *gatherX) costs(m *costModel, n int) stageCosts {
	return stageCosts{
		encode:   m.enc(n),
		exchange: m.link(allGatherVolume(g.e.size, g.c.p.slotLen(n))),
		decode:   float64(g.e.size) * m.dec(n),
	}
}

func (s *sraX) costs(m *costModel, n int) stageCosts {
	N := s.e.size
	slot := s.c1.p.slotLen(n)
	return stageCosts{
		encode: m.enc(n),
		exchange: m.link(allToAllVolume(N, N*slot)) + m.dec(n) + m.enc((n+N-1)/N) +
			m.link(allGatherVolume(N, slot)),
		decode: m.dec(n),
	}
}

func (s *sharedX) costs(m *costModel, n int) stageCosts {
	return stageCosts{
		encode:   m.enc(n),
		exchange: m.link(allReduceVolume(s.e.size, 4*(s.e.size+s.k(n)))),
		decode:   m.dec(n),
	}
}
