package overlap

import (
	"encoding/binary"
	"fmt"
	"math"
	"time"

	"github.com/gradcomp/gradcomp/compress"
)

// exchanger is a strategy's compressed path for one bucket, in the three
// stages of the pipeline. The engine calls encode on the compute stream,
// exchange on the wire stream and decode on the decode stream, one bucket
// at a time per stream.
type exchanger interface {
	// first returns the stage-1 coder (error-feedback memory gradEF).
	first() coder
	// useMemory makes the coders use these memories (nil: none).
	useMemory(gradEF, partEF *compress.ErrorFeedback)
	// setup allocates b's buffers.
	setup(b *bucket)
	// bufferBytes is what setup allocates for a bucket of n elements.
	bufferBytes(n int) uint64
	// encode compresses r.grad into the send buffer, setting r.local and
	// r.pend1; a gradient that cannot be compressed is a status, not an
	// error.
	encode(r *run) error
	// exchange makes the bucket's collectives and returns the statuses
	// that decide its path (all statusOK: compressed), the same on every
	// rank. It stops after a collective whose statuses are not all ok.
	exchange(st *step, r *run) ([]status, error)
	// decode writes the average into r.grad and returns the index of a
	// non-finite element in it, or -1.
	decode(r *run) (int, error)
	// linkCost predicts the time of a bucket's collectives on the link.
	linkCost(m *costModel, b *bucket) float64
}

// twoRounds is an exchanger whose collectives come in two rounds with
// work between them (SRA: the all-to-all, the sum and re-encode of this
// rank's part, the all-gather). exchange is the first round; the engine
// runs reduce on its own stream, off the wire, so that the next bucket's
// first round uses the link meanwhile, and then exchange2.
type twoRounds interface {
	// reduce does the work between the rounds of a bucket whose first
	// round's statuses were all ok.
	reduce(st *step, r *run) error
	// exchange2 makes the second round's collectives and returns its
	// statuses, the same on every rank.
	exchange2(st *step, r *run) ([]status, error)
}

// encodeInto runs c.begin into send (exactly c's slots) and turns a
// gradient it cannot compress into a status, which it writes to every slot
// head and returns. With measure (Config.Guard's stage 1), an ok status
// carries the gradient's ρ (heldBack).
func encodeInto(c coder, send []byte, grad []float32, key compress.Key, measure bool) (*compress.Pending, status, error) {
	_, p, err := c.begin(send[:0], grad, key)
	var s status
	switch {
	case err == nil && (!measure || p == nil):
		return p, s, nil
	case err == nil:
		s.rho = heldBack(p, grad)
	default:
		if s, err = statusOf(err); err != nil {
			return nil, s, err
		}
	}
	stride := len(send) / c.p.count
	for j := range c.p.count {
		s.put(send[j*stride:], c.p.guard)
	}
	return p, s, nil
}

// heldBack is the accuracy guard's ρ of a gradient whose compression p
// holds (Config.Guard): ‖what p's Commit keeps‖ / ‖grad‖, +Inf for a zero
// gradient with something held back.
func heldBack(p *compress.Pending, grad []float32) float64 {
	var g float64
	for _, v := range grad {
		g += float64(v) * float64(v)
	}
	h := p.HeldBack()
	if h == 0 {
		return 0
	}
	return h / math.Sqrt(g)
}

// maxHeldBack is the largest ρ the ok statuses sts carry (0 without the
// guard).
func maxHeldBack(sts []status) float64 {
	m := 0.0
	for _, s := range sts {
		if s.rho > m {
			m = s.rho
		}
	}
	return m
}

// readStatuses decodes the heads of the count slots in buf (with guard:
// heads that carry ρ).
func readStatuses(buf []byte, count int, guard bool) ([]status, error) {
	stride := len(buf) / count
	sts := make([]status, count)
	for q := range sts {
		var err error
		if sts[q], err = readStatus(buf[q*stride:], guard); err != nil {
			return nil, fmt.Errorf("slot %d: %w", q, err)
		}
	}
	return sts, nil
}

// gatherExchanger is sparse-gather and quantized all-gather: every rank's payload
// of the whole bucket is all-gathered, and every rank decodes and adds
// them in rank order, then divides by N.
type gatherExchanger struct {
	e *Engine
	c coder
}

func (g *gatherExchanger) first() coder                                { return g.c }
func (g *gatherExchanger) useMemory(gradEF, _ *compress.ErrorFeedback) { g.c.ef = gradEF }

func (g *gatherExchanger) setup(b *bucket) {
	b.slot = g.c.p.slotLen(b.n)
	b.send = make([]byte, b.slot)
	b.recv = make([]byte, g.e.size*b.slot)
}

func (g *gatherExchanger) bufferBytes(n int) uint64 {
	return uint64(g.e.size+1) * uint64(g.c.p.slotLen(n))
}

func (g *gatherExchanger) encode(r *run) (err error) {
	r.pend1, r.local, err = encodeInto(g.c, r.b.send, r.grad, r.key, g.e.cfg.Guard > 0)
	return err
}

func (g *gatherExchanger) exchange(st *step, r *run) ([]status, error) {
	statuses := func() ([]status, error) { return stepStatuses(st, r, "AllGather", r.b.recv, g.e.size, g.c.p.guard) }
	if err := g.e.allGatherLast(st, r, g.e.strategy.String()+" AllGather", r.b.recv, r.b.send, statuses); err != nil || r.tail != nil {
		return nil, err
	}
	return statuses()
}

func (g *gatherExchanger) decode(r *run) (int, error) {
	return g.c.p.averageSlots(r.grad, r.b.recv, g.e.size, "rank %d's payload")
}

// sraExchanger is scatter-reduce-allgather: the bucket is cut into N parts; rank
// j owns part j. Stage 1 compresses every part (memory gradEF) and an
// all-to-all sends part j to rank j; rank j decodes and adds the N
// payloads of its part in rank order, divides by N, compresses the result
// again (memory partEF), and an all-gather gives every rank every part.
type sraExchanger struct {
	e      *Engine
	c1, c2 coder
}

func (s *sraExchanger) first() coder { return s.c1 }
func (s *sraExchanger) useMemory(gradEF, partEF *compress.ErrorFeedback) {
	s.c1.ef, s.c2.ef = gradEF, partEF
}

func (s *sraExchanger) setup(b *bucket) {
	n := s.e.size
	b.slot = s.c1.p.slotLen(b.n)
	b.send, b.recv = make([]byte, n*b.slot), make([]byte, n*b.slot)
	lo, hi := s.c1.p.bounds(b.n, s.e.rank)
	b.mid = make([]float32, hi-lo)
	b.send2, b.recv2 = make([]byte, b.slot), make([]byte, n*b.slot)
}

func (s *sraExchanger) bufferBytes(n int) uint64 {
	lo, hi := s.c1.p.bounds(n, s.e.rank)
	return uint64(3*s.e.size+1)*uint64(s.c1.p.slotLen(n)) + 4*uint64(hi-lo)
}

func (s *sraExchanger) encode(r *run) (err error) {
	r.pend1, r.local, err = encodeInto(s.c1, r.b.send, r.grad, r.key, s.e.cfg.Guard > 0)
	return err
}

func (s *sraExchanger) exchange(st *step, r *run) ([]status, error) {
	b, e := r.b, s.e
	if err := e.allToAll(st, r, e.strategy.String()+" AllToAll", b.recv, b.send); err != nil {
		return nil, err
	}
	sts, err := stepStatuses(st, r, "AllToAll", b.recv, e.size, s.c1.p.guard)
	if err == nil && allOK(sts) {
		// Stage 1's ρ of every rank, which every owner saw alike.
		r.heldBack = maxHeldBack(sts)
	}
	return sts, err
}

// reduce sums and averages this rank's part of the N payloads and
// compresses it again into send2.
func (s *sraExchanger) reduce(st *step, r *run) error {
	b, e := r.b, s.e
	t := time.Now()
	if _, err := s.c1.p.averageSlots(b.mid, b.recv, e.size, fmt.Sprintf("rank %%d's part %d", e.rank)); err != nil {
		return &StepError{Step: st.num, Bucket: b.idx, Stage: "sra reduce", Err: err}
	}
	r.stats.Decompress += time.Since(t)
	t = time.Now()
	pend, local, err := encodeInto(s.c2, b.send2[:s.c2.p.slotLen(len(b.mid))], b.mid, r.key, false)
	r.stats.Compress += time.Since(t)
	if err != nil {
		return &StepError{Step: st.num, Bucket: b.idx, Stage: "sra re-encode", Err: err}
	}
	if local.code != statusOK {
		lo, _ := s.c1.p.bounds(b.n, e.rank)
		local.index += uint32(lo)
	} else {
		local.rho = r.heldBack
	}
	local.put(b.send2, s.c2.p.guard)
	r.pend2 = pend
	return nil
}

func (s *sraExchanger) exchange2(st *step, r *run) ([]status, error) {
	b, e := r.b, s.e
	statuses := func() ([]status, error) { return stepStatuses(st, r, "AllGather", b.recv2, e.size, s.c2.p.guard) }
	if err := e.allGatherLast(st, r, e.strategy.String()+" AllGather", b.recv2, b.send2, statuses); err != nil || r.tail != nil {
		return nil, err
	}
	return statuses()
}

func (s *sraExchanger) decode(r *run) (int, error) {
	b := r.b
	for j := range s.e.size {
		lo, hi := s.c1.p.bounds(b.n, j)
		if err := s.c2.p.decodeSlot(r.grad[lo:hi], b.recv2[j*b.slot:(j+1)*b.slot], false); err != nil {
			return -1, fmt.Errorf("rank %d's reduced part: %w", j, err)
		}
	}
	return -1, nil // decoded values are finite: the decoder checks them
}

// sharedExchanger is shared-index: every rank compresses with random-k under the
// same key, so the k indices agree, and the k values are all-reduced in
// fp32, preceded by one status per rank (rank q writes element q: 0 ok, 1
// unrepresentable, 2 non-finite) and, with the accuracy guard, one ρ per
// rank (rank q writes element N + q). Every rank then divides the sums by
// N and scatters them to the indices.
type sharedExchanger struct {
	e *Engine
	c coder
}

func (s *sharedExchanger) first() coder                                { return s.c }
func (s *sharedExchanger) useMemory(gradEF, _ *compress.ErrorFeedback) { s.c.ef = gradEF }

func (s *sharedExchanger) k(n int) int {
	return (s.e.comp.MaxEncodedLen(n) - s.e.comp.MaxEncodedLen(0)) / 4
}

// head is the number of elements before the values: the statuses, and
// with the accuracy guard the ρ.
func (s *sharedExchanger) head() int {
	if s.e.cfg.Guard > 0 {
		return 2 * s.e.size
	}
	return s.e.size
}

func (s *sharedExchanger) setup(b *bucket) {
	b.slot = s.c.p.slotLen(b.n)
	b.send = make([]byte, b.slot)
	b.vals = make([]float32, s.head()+s.k(b.n))
	b.picks = make([]uint32, 0, s.k(b.n))
}

func (s *sharedExchanger) bufferBytes(n int) uint64 {
	return uint64(s.c.p.slotLen(n)) + 4*uint64(s.head()+2*s.k(n))
}

func (s *sharedExchanger) encode(r *run) error {
	b, n, head := r.b, s.e.size, s.head()
	var err error
	if r.pend1, r.local, err = encodeInto(s.c, b.send, r.grad, r.key, head > n); err != nil {
		return err
	}
	clear(b.vals[:head])
	vals := b.vals[head:]
	if r.local.code != statusOK {
		b.vals[s.e.rank] = float32(r.local.code)
		clear(vals)
		return nil
	}
	if head > n {
		b.vals[n+s.e.rank] = float32(r.local.rho)
	}
	h, body, err := compress.ParseHeader(b.send[s.c.p.head() : s.c.p.head()+s.e.comp.MaxEncodedLen(b.n)])
	if err != nil {
		return err
	}
	if len(body) != 4*len(vals) {
		return fmt.Errorf("random-k body of %d bytes, want %d values", len(body), len(vals))
	}
	r.seed = h.Seed
	for j := range vals {
		vals[j] = math.Float32frombits(binary.LittleEndian.Uint32(body[4*j:]))
	}
	return nil
}

func (s *sharedExchanger) exchange(st *step, r *run) ([]status, error) {
	statuses := func() ([]status, error) { return s.statuses(st, r) }
	if err := s.e.allReduceLast(st, r, "shared-index AllReduce", r.b.vals, statuses); err != nil || r.tail != nil {
		return nil, err
	}
	return statuses()
}

// statuses reads the statuses (and ρ) at the head of the summed values.
func (s *sharedExchanger) statuses(st *step, r *run) ([]status, error) {
	b, n := r.b, s.e.size
	sts := make([]status, n)
	for q, v := range b.vals[:n] {
		switch v {
		case statusOK:
			if s.head() > n {
				sts[q].rho = float64(b.vals[n+q])
			}
		case statusUnrepresentable, statusNonFinite:
			sts[q] = status{code: uint8(v), index: noIndex, value: float32(math.NaN())}
		default:
			return nil, &StepError{Step: st.num, Bucket: b.idx, Stage: "shared-index AllReduce", Err: fmt.Errorf("rank %d's status is %v", q, v)}
		}
	}
	return sts, nil
}

func (s *sharedExchanger) decode(r *run) (int, error) {
	b, n := r.b, s.e.size
	vals := b.vals[s.head():]
	idx, err := compress.RandomKIndices(b.picks[:0], b.n, len(vals), r.seed, r.key)
	if err != nil {
		return -1, err
	}
	clear(r.grad)
	bad := compress.Average(vals, n)
	for j, i := range idx {
		r.grad[i] = vals[j]
	}
	if bad >= 0 {
		bad = int(idx[bad])
	}
	return bad, nil
}

// stepStatuses reads the slot headers of buf, a failure being a StepError
// of bucket r.
func stepStatuses(st *step, r *run, stage string, buf []byte, count int, guard bool) ([]status, error) {
	sts, err := readStatuses(buf, count, guard)
	if err != nil {
		return nil, &StepError{Step: st.num, Bucket: r.b.idx, Stage: stage, Err: err}
	}
	return sts, nil
}

func allOK(sts []status) bool {
	for _, s := range sts {
		if s.code != statusOK {
			return false
		}
	}
	return true
}
