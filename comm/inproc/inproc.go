// Package inproc implements comm.Comm for N ranks in one process, one
// goroutine per rank, moving data with plain memory copies. It serves tests
// and single-machine runs; it is not a transport between processes.
//
// # How a collective runs
//
// Calls are matched by their sequence number on each rank. A call first
// checks its own arguments, then arrives at its rendezvous; the last rank to
// arrive compares every rank's call (operation, lengths, root) and, when they
// agree, starts one goroutine per rank computing that rank's share of the
// result — for AllReduce and AllGather, the elements of chunk Rank() of every
// rank's buffer; for ReduceScatter, AllToAll and Broadcast, its own dst.
// Every rank returns once every share is done, since other ranks write into
// its buffers. Only the arrival takes a lock shared by the group; the data
// path runs in parallel without one.
//
// # Several in flight
//
// Every rank is a comm.Starter with InFlight collectives: a start arrives
// at its rendezvous and returns; its Request's Wait is the rest of the
// call. Since no share waits for its rank, ranks may wait for their
// requests in any order.
//
// A rank whose arguments are invalid returns its *comm.ArgumentError at once;
// the other ranks get the same error when they arrive, and a disagreement
// between ranks gives every rank the same *comm.MismatchError. Neither moves
// data, and the group stays usable.
//
// # Sum order
//
// AllReduce and ReduceScatter add in rank order, left to right, in float32:
// ((x₀ + x₁) + x₂) + … — the order the comm package documents. Results are
// bit-identical across runs and to a serial loop over ranks.
//
// # Failure
//
// A rank whose ctx ends before every rank has arrived withdraws, returns a
// *comm.IncompleteError naming the ranks that had not arrived, and poisons
// the group: ranks waiting in that collective are released at once with a
// *comm.PoisonedError wrapping that IncompleteError, and every later call on
// any rank fails the same way without waiting. Once every rank has arrived,
// the collective completes even if a ctx ends meanwhile (the remaining work
// is bounded memory copies), and it returns nil.
//
// Close of one rank poisons the group likewise with a *comm.ClosedError:
// the other ranks' pending and later calls fail at once. Close never waits.
// A poisoned group cannot be repaired; build a new one.
package inproc

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/internal/check"
)

// NewGroup returns the n ranks of a new group; element r is rank r. Each
// rank is meant to be driven by its own goroutine. Every rank implements
// comm.Topologist and reports one node holding all n ranks.
func NewGroup(n int) ([]comm.Comm, error) {
	if n < 1 {
		return nil, fmt.Errorf("inproc: group size %d, want at least 1", n)
	}
	return NewNodeGroup(make([]int, n))
}

// NewNodeGroup returns the len(nodeOf) ranks of a new group in which rank r
// pretends to run on the node named nodeOf[r]; each rank's Topology is the
// one comm.NodeTopologies gives. Nodes holding different numbers of ranks
// are refused with NodeTopologies' error.
func NewNodeGroup(nodeOf []int) ([]comm.Comm, error) {
	topo, err := comm.NodeTopologies(nodeOf)
	if err != nil {
		return nil, fmt.Errorf("inproc: %w", err)
	}
	n := len(nodeOf)
	g := &group{n: n, topo: topo, rounds: make(map[uint64]*round), splits: make(map[int]*split), failedCh: make(chan struct{})}
	ranks := make([]comm.Comm, n)
	for r := range ranks {
		ranks[r] = &rank{g: g, r: r, topo: topo[r]}
	}
	return ranks, nil
}

// group is the state the ranks share.
type group struct {
	n    int
	topo []comm.Topology // of every rank

	mu       sync.Mutex
	rounds   map[uint64]*round // collectives some but not all ranks have reached
	splits   map[int]*split    // the k-th Split's groups, until every rank has taken its own
	failed   error             // the poison cause; nil while the group is healthy
	failedCh chan struct{}     // closed when failed is set
}

// round is one collective: the k-th call of every rank.
type round struct {
	op      comm.Op
	calls   []check.Call
	args    []args
	arrived []bool
	count   int           // ranks arrived
	ready   chan struct{} // closed when every rank has arrived
	err     error         // set before ready closes: the agreement error

	left     atomic.Int32  // shares not yet computed
	finished chan struct{} // closed when every share is computed
}

// args holds one rank's buffers.
type args struct {
	f32, f32src []float32
	b, bsrc     []byte
	root        int
}

// rank is one rank's comm.Comm and comm.Starter.
type rank struct {
	g      *group
	r      int
	topo   comm.Topology
	guard  check.Guard
	seq    uint64 // sequence number of this rank's next call; guarded by guard
	splits int    // Split calls made; guarded by g.mu
	closed bool   // Close was called; guarded by g.mu
}

func (k *rank) Rank() int { return k.r }
func (k *rank) Size() int { return k.g.n }

// Topology implements comm.Topologist.
func (k *rank) Topology() comm.Topology { return k.topo }

// Split implements comm.Splitter. It is a Barrier on the parent, after
// which every rank takes its node and cross groups from the new groups its
// split made, one per node and one per local rank. A node group reports
// one node holding its ranks, a cross group one rank per node (as
// comm/mpi's). The Barrier's failure (a deadline, which poisons the
// parent; a poisoned or closed parent) comes back wrapped in an error
// naming Split and this rank.
func (k *rank) Split(ctx context.Context) (node, cross comm.Comm, err error) {
	if err := k.Barrier(ctx); err != nil {
		return nil, nil, fmt.Errorf("inproc: Split on rank %d: %w", k.r, err)
	}
	g := k.g
	g.mu.Lock()
	defer g.mu.Unlock()
	k.splits++
	s, ok := g.splits[k.splits]
	if !ok {
		t := g.topo[0]
		s = &split{groups: make([][]comm.Comm, t.Nodes+t.LocalSize)}
		for i := range s.groups {
			if i < t.Nodes {
				s.groups[i], _ = NewGroup(t.LocalSize) // one node
				continue
			}
			nodes := make([]int, t.Nodes)
			for n := range nodes {
				nodes[n] = n
			}
			s.groups[i], _ = NewNodeGroup(nodes) // one rank per node
		}
		g.splits[k.splits] = s
	}
	if s.taken++; s.taken == g.n {
		delete(g.splits, k.splits) // every rank holds its own: the group keeps nothing
	}
	t := k.topo
	return s.groups[t.Node][t.LocalRank], s.groups[t.Nodes+t.LocalRank][t.Node], nil
}

// split is one Split's groups: the node groups, then the cross groups,
// and how many ranks have taken theirs.
type split struct {
	groups [][]comm.Comm
	taken  int
}

// AllReduce implements comm.Comm.AllReduce.
func (k *rank) AllReduce(ctx context.Context, buf []float32) error {
	return k.run(ctx, check.AllReduce(buf), args{f32: buf})
}

// AllGather implements comm.Comm.AllGather.
func (k *rank) AllGather(ctx context.Context, dst, src []byte) error {
	return k.run(ctx, check.AllGather(k.r, k.g.n, dst, src), args{b: dst, bsrc: src})
}

// ReduceScatter implements comm.Comm.ReduceScatter.
func (k *rank) ReduceScatter(ctx context.Context, dst, src []float32) error {
	return k.run(ctx, check.ReduceScatter(k.r, k.g.n, dst, src), args{f32: dst, f32src: src})
}

// AllToAll implements comm.Comm.AllToAll.
func (k *rank) AllToAll(ctx context.Context, dst, src []byte) error {
	return k.run(ctx, check.AllToAll(k.r, k.g.n, dst, src), args{b: dst, bsrc: src})
}

// Broadcast implements comm.Comm.Broadcast.
func (k *rank) Broadcast(ctx context.Context, buf []byte, root int) error {
	return k.run(ctx, check.Broadcast(k.r, k.g.n, buf, root), args{b: buf, root: root})
}

// Barrier implements comm.Comm.Barrier.
func (k *rank) Barrier(ctx context.Context) error {
	return k.run(ctx, check.Barrier(), args{})
}

// Close poisons the group with a *comm.ClosedError naming this rank (unless
// it already failed): pending and later calls on every rank fail at once.
// It never waits and always returns nil.
func (k *rank) Close() error {
	g := k.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if !k.closed {
		k.closed = true
		g.fail(&comm.ClosedError{Rank: k.r})
	}
	return nil
}

// fail poisons the group with cause unless it already failed, and drops the
// rounds that can no longer complete. g.mu is held.
func (g *group) fail(cause error) {
	if g.failed == nil {
		g.failed = cause
		g.rounds = nil
		close(g.failedCh)
	}
}

// run performs one collective for rank k: arrive, wait for the others, do
// this rank's share, wait for every share.
func (k *rank) run(ctx context.Context, c check.Call, a args) error {
	if err := k.guard.Enter(c.Op, k.r); err != nil {
		return err
	}
	defer k.guard.Exit()
	rd, err := k.arrive(c, a)
	if err != nil {
		return err
	}
	return k.complete(ctx, rd, c.Op)
}

// arrive makes rank k's next call c at its round and returns the round,
// or the error that ends the call at once (k closed, the group poisoned,
// c invalid).
func (k *rank) arrive(c check.Call, a args) (*round, error) {
	g := k.g
	g.mu.Lock()
	defer g.mu.Unlock()
	if k.closed {
		return nil, &comm.PoisonedError{Op: c.Op, Rank: k.r, Cause: &comm.ClosedError{Rank: k.r}}
	}
	if g.failed != nil {
		return nil, &comm.PoisonedError{Op: c.Op, Rank: k.r, Cause: g.failed}
	}
	seq := k.seq
	k.seq++
	rd := g.rounds[seq]
	if rd == nil {
		rd = &round{
			calls: make([]check.Call, g.n), args: make([]args, g.n), arrived: make([]bool, g.n),
			ready: make(chan struct{}), finished: make(chan struct{}),
		}
		rd.left.Store(int32(g.n))
		g.rounds[seq] = rd
	}
	rd.calls[k.r] = c
	if c.Err == nil {
		rd.args[k.r] = a
	}
	rd.arrived[k.r] = true
	rd.count++
	if rd.count == g.n {
		delete(g.rounds, seq)
		rd.op = c.Op
		rd.err = check.Agree(rd.calls)
		close(rd.ready)
		rd.compute()
	}
	// An invalid call's peers learn of it from rd.calls; nothing of ours
	// is read.
	return rd, c.Err
}

// complete waits until every rank has arrived at rd, then computes rank
// k's share and waits for every share.
func (k *rank) complete(ctx context.Context, rd *round, op comm.Op) error {
	g := k.g
	select {
	case <-rd.ready:
	case <-ctx.Done():
		if err := k.withdraw(rd, op, func(missing []int) error {
			return &comm.IncompleteError{Op: op, Rank: k.r, Missing: missing, Err: ctx.Err()}
		}); err != nil {
			return err
		}
	case <-g.failedCh:
		if err := k.withdraw(rd, op, func([]int) error {
			return &comm.PoisonedError{Op: op, Rank: k.r, Cause: g.failed}
		}); err != nil {
			return err
		}
	}
	if rd.err != nil {
		return rd.err
	}
	<-rd.finished
	return nil
}

// compute computes every rank's share of a round every rank has reached,
// each on a goroutine of its own, and closes rd.finished once all are
// done (at once when the calls disagree). Shares do not wait for their
// ranks: a rank may wait for its started collectives in any order.
func (rd *round) compute() {
	if rd.err != nil {
		close(rd.finished)
		return
	}
	for r := range rd.args {
		go func() {
			share(rd.op, rd.args, r)
			if rd.left.Add(-1) == 0 {
				close(rd.finished)
			}
		}()
	}
}

// InFlight implements comm.Starter: a rank may have this many collectives
// started and not yet waited for.
func (k *rank) InFlight() int { return InFlight }

// InFlight is what every rank's comm.Starter.InFlight returns.
const InFlight = 8

// StartAllReduce implements comm.Starter.
func (k *rank) StartAllReduce(ctx context.Context, buf []float32) (comm.Request, error) {
	return k.start(ctx, check.AllReduce(buf), args{f32: buf})
}

// StartAllGather implements comm.Starter.
func (k *rank) StartAllGather(ctx context.Context, dst, src []byte) (comm.Request, error) {
	return k.start(ctx, check.AllGather(k.r, k.g.n, dst, src), args{b: dst, bsrc: src})
}

// StartReduceScatter implements comm.Starter.
func (k *rank) StartReduceScatter(ctx context.Context, dst, src []float32) (comm.Request, error) {
	return k.start(ctx, check.ReduceScatter(k.r, k.g.n, dst, src), args{f32: dst, f32src: src})
}

// StartAllToAll implements comm.Starter.
func (k *rank) StartAllToAll(ctx context.Context, dst, src []byte) (comm.Request, error) {
	return k.start(ctx, check.AllToAll(k.r, k.g.n, dst, src), args{b: dst, bsrc: src})
}

// start arrives at the collective's round and returns the request that
// completes it.
func (k *rank) start(ctx context.Context, c check.Call, a args) (comm.Request, error) {
	if err := ctx.Err(); err != nil {
		return nil, &comm.IncompleteError{Op: c.Op, Rank: k.r, Err: err}
	}
	if err := k.guard.Start(c.Op, k.r, InFlight); err != nil {
		return nil, err
	}
	rd, err := k.arrive(c, a)
	if err != nil {
		k.guard.Finish()
		return nil, err
	}
	return &request{k: k, rd: rd, op: c.Op}, nil
}

// request is a started collective of comm/inproc.
type request struct {
	k    *rank
	rd   *round
	op   comm.Op
	once sync.Once
	err  error
}

// Wait implements comm.Request.
func (q *request) Wait(ctx context.Context) error {
	q.once.Do(func() {
		q.err = q.k.complete(ctx, q.rd, q.op)
		q.k.guard.Finish()
	})
	return q.err
}

// withdraw leaves rd unless every rank has arrived already (then it returns
// nil and the caller completes the collective). Otherwise it returns
// failure(missing ranks) and poisons the group with it if it is not poisoned
// yet. A round left this way never completes: no rank can arrive at a
// poisoned group.
func (k *rank) withdraw(rd *round, op comm.Op, failure func(missing []int) error) error {
	g := k.g
	g.mu.Lock()
	defer g.mu.Unlock()
	select {
	case <-rd.ready:
		return nil
	default:
	}
	var missing []int
	for r, ok := range rd.arrived {
		if !ok {
			missing = append(missing, r)
		}
	}
	err := failure(missing)
	g.fail(err)
	return err
}

// share computes rank r's share of a collective whose arguments agree.
// Shares of different ranks write disjoint memory.
func share(op comm.Op, a []args, r int) {
	n := len(a)
	switch op {
	case comm.OpAllReduce:
		lo, hi := chunk(len(a[0].f32), n, r)
		sum := a[0].f32[lo:hi]
		for _, x := range a[1:] {
			addTo(sum, x.f32[lo:hi])
		}
		for _, x := range a[1:] {
			copy(x.f32[lo:hi], sum)
		}
	case comm.OpReduceScatter:
		m := len(a[r].f32)
		dst := a[r].f32
		copy(dst, a[0].f32src[r*m:(r+1)*m])
		for _, x := range a[1:] {
			addTo(dst, x.f32src[r*m:(r+1)*m])
		}
	case comm.OpAllGather:
		m := len(a[r].bsrc)
		for _, x := range a {
			copy(x.b[r*m:(r+1)*m], a[r].bsrc)
		}
	case comm.OpAllToAll:
		m := len(a[r].bsrc) / n
		for i, x := range a {
			copy(a[r].b[i*m:(i+1)*m], x.bsrc[r*m:(r+1)*m])
		}
	case comm.OpBroadcast:
		if root := a[r].root; root != r {
			copy(a[r].b, a[root].b)
		}
	}
}

// chunk returns rank r's element range [lo, hi) of a length-l buffer split
// among n ranks.
func chunk(l, n, r int) (lo, hi int) {
	return l * r / n, l * (r + 1) / n
}

// addTo adds src to dst element by element, in float32.
func addTo(dst, src []float32) {
	src = src[:len(dst)]
	for i := range dst {
		dst[i] += src[i]
	}
}
