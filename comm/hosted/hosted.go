// Package hosted is the transport whose collectives the host program
// carries out: the engine (or any caller of comm.Comm / comm.DeviceComm)
// posts each collective, and the program that hosts it — a PyTorch
// process with its process group, a C++ framework with its own NCCL
// communicator — takes the post, runs the collective with its own
// communicator and completes it. It is how the C ABI serves any framework
// without gradcomp owning the network.
//
//	t, _ := hosted.New(rank, size)
//	go func() { // the host's side, on a thread of its own
//		for {
//			op, err := t.Take(ctx)
//			if err != nil { return }               // ErrClosed
//			n, err := runWithMyCommunicator(op)    // e.g. hosted.Run(ctx, op, c)
//			t.Complete(op.ID, n, err)
//		}
//	}()
//	e, _ := overlap.New(ctx, t.Host(), sizes, cfg)  // the engine posts through t
//
// # Order and matching
//
// Posts come out of Take in the order they were made. The engine makes its
// collectives in the same order on every rank, so a host that carries them
// out in Take's order on one communicator matches them across ranks. (A
// transport with a Split has three groups: see "Groups" below.)
//
// # Several in flight
//
// Every face is a comm.Starter: up to InFlight collectives per group
// (WithInFlight, default DefaultInFlight) may be posted and not yet
// complete. A host may take the next post before it completes the previous
// one, launch each on its communicator as it takes it (torch's
// async_op=True, an NCCL call on a stream) and complete them in any order,
// as its framework finishes them; it must launch them in Take's order. A
// host that carries out one post at a time is correct too, just not
// concurrent.
//
// # Launching without a thread
//
// Instead of a thread waiting in Take, a host may set a launcher per group
// (SetLauncher; Launch for a Go host): the goroutine that posts hands the
// launcher each post as it makes it, in post order, and the launcher
// starts the collective and returns. The post is taken from then on and
// completed with Complete as any taken post. It spares the host a thread
// and the wake-up of that thread at every post.
//
// # Buffers
//
// An Op carries the caller's buffers: Go slices for host collectives,
// device addresses and a stream for device ones. They belong to the host
// from Take until Complete, and the transport keeps them reachable until
// then even if the caller gave up (so a late host never writes freed
// memory); the host must not touch them after Complete or Close. A device
// op is complete once the host has enqueued the collective on Op.Stream
// (comm.DeviceComm's calls return once enqueued).
//
// # Groups: the hierarchical exchange
//
// A transport given this rank's place among the nodes (WithTopology,
// SetTopology) is a comm.Topologist and a comm.Splitter, so overlap's
// StrategyHier runs over it. Split adds two groups to the transport: the
// node group (GroupNode: the ranks of this rank's node) and the cross-node
// group (GroupCross: the ranks with this rank's local rank, one per node).
// Their posts carry Op.Group; each group has its own queue, collective in
// flight and failures, and the engine runs collectives on them at once
// from different goroutines. The host maps each group id to a
// communicator of its own over those ranks and carries out each group's
// posts in order, independently of the others' (a thread per group, e.g.
// ServeGroup or TakeGroup): running them on one thread in Take's order
// would deadlock, since ranks of different nodes see the groups' posts
// interleaved differently.
//
//	t, _ := hosted.New(rank, size, hosted.WithTopology(comm.Topology{Node: rank / 2, Nodes: size / 2, LocalRank: rank % 2, LocalSize: 2}))
//	go hosted.ServeGroup(ctx, t, hosted.GroupWorld, world, nil)
//	go hosted.ServeGroup(ctx, t, hosted.GroupNode, myNode, nil)
//	go hosted.ServeGroup(ctx, t, hosted.GroupCross, myCross, nil)
//
// # Failures
//
// A post nobody takes within the caller's ctx, a host error (Complete with
// a non-nil error), a completion of an unknown or finished id, or a
// completion with a wrong length ends that collective with an error and
// poisons its group: every other collective of the group not complete by
// then fails with a *comm.PoisonedError wrapping that first failure, its
// posts not yet taken leave the queue, and later calls fail the same way
// (the ranks are out of step). Nothing waits forever: every wait is
// bounded by a ctx, and Close wakes everyone.
package hosted

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/gpu"
	"github.com/gradcomp/gradcomp/internal/f32"
)

// Op is one posted collective. With N ranks and n = Count:
//
//	AllReduce      Send == Recv: n float32 (4n bytes) summed over ranks in place
//	AllGather      Send: n bytes; Recv: N·n bytes, rank q's Send at [q·n, (q+1)·n)
//	ReduceScatter  Send: N·n float32; Recv: n float32, this rank's chunk of the sum
//	AllToAll       Send, Recv: n bytes, a multiple of N; chunk j of Send to rank j
//	Broadcast      Send == Recv: n bytes, Root's on every rank
//	Barrier        no buffers
//
// Host ops carry Send and Recv as byte slices (float32 data as its bytes,
// see Float32s); device ops (Device true) carry SendPtr, RecvPtr, their
// byte lengths and the stream to enqueue on.
type Op struct {
	ID     uint64  // from 1, per transport (unique across its groups)
	Group  int     // GroupWorld; a Split's comms post GroupNode and GroupCross
	Kind   comm.Op // the collective
	Root   int     // Broadcast's root
	Count  int     // n above: elements of float32 collectives, else bytes
	Device bool

	Send, Recv []byte // host ops

	SendPtr, RecvPtr     gpu.Ptr    // device ops
	SendBytes, RecvBytes int        // both kinds: the buffers' lengths in bytes
	Stream               gpu.Stream // device ops
}

// String describes op for errors and logs.
func (op Op) String() string {
	where := "host"
	if op.Device {
		where = fmt.Sprintf("device, stream %#x", uintptr(op.Stream))
	}
	group := ""
	if op.Group != GroupWorld {
		group = fmt.Sprintf(" of group %d", op.Group)
	}
	return fmt.Sprintf("op %d%s: %v of %d (%s; %d bytes in, %d out)", op.ID, group, op.Kind, op.Count, where, op.SendBytes, op.RecvBytes)
}

// Float32s returns b viewed as float32s (no copy): the element view of an
// AllReduce or ReduceScatter buffer. len(b) must be a multiple of 4.
func Float32s(b []byte) []float32 { return f32.Floats(b) }

// ErrClosed is matched (errors.Is) by Take and Complete after Close, and
// by the errors of collectives that Close ended.
var ErrClosed = comm.ErrClosed

// HostError is a collective the host reported as failed: its own
// communicator's error, as Complete received it.
type HostError struct {
	Rank int
	Op   Op
	Err  error
}

func (e *HostError) Error() string {
	return fmt.Sprintf("hosted: rank %d: the host failed %v: %v", e.Rank, e.Op, e.Err)
}

func (e *HostError) Unwrap() error { return e.Err }

// ProtocolError is a completion the transport cannot accept: an id that
// was never taken or is already complete, or a wrong length. Complete
// returns it, and that collective (an unknown id: every outstanding one)
// fails with it.
type ProtocolError struct {
	Rank   int
	ID     uint64
	Reason string
}

func (e *ProtocolError) Error() string {
	return fmt.Sprintf("hosted: rank %d: completion of op %d refused: %s", e.Rank, e.ID, e.Reason)
}

// post is an Op in the transport, with its caller waiting on done.
type post struct {
	op   Op
	g    *Transport // the group it was posted on
	done chan error // buffered: the completion's result
	once sync.Once  // the caller's first Wait
	err  error      // its result
}

// The group ids of Op.Group.
const (
	GroupWorld = 0 // the transport's own ranks
	GroupNode  = 1 // Split's node comm: the ranks of this rank's node
	GroupCross = 2 // Split's cross comm: the ranks of every node with this rank's local rank
)

// hub is what the groups of one rank's transport share: the op ids, the
// taken ops, the notification of Take, the topology and the groups of the
// current Split. Everything in it and in its groups is guarded by mu.
type hub struct {
	mu      sync.Mutex
	nextID  uint64
	taken   map[uint64]*post // taken, not completed (or abandoned by a closed group)
	changed chan struct{}    // closed and replaced on every post and on every Close
	groups  [3]*Transport    // GroupWorld, then the current Split's (nil before one)
	topo    comm.Topology    // zero: unknown
	launch  [3]func(Op)      // per group id: SetLauncher's fn, nil for Take

	// posting[g] orders group g's posts: held from a post's id to its
	// launch, so a launcher gets them in id order (taken before mu).
	posting [3]sync.Mutex
}

// Transport is one rank's end of a hosted group. Host returns its
// comm.Comm face, Device its comm.DeviceComm face; both post to the same
// queue, in order. Take and Complete are the host's side. All methods are
// safe for concurrent use.
//
// A transport given its topology (WithTopology, SetTopology) is also a
// comm.Topologist and a comm.Splitter (through Host): Split returns two
// comms, the node group and the cross-node group, whose posts carry
// Op.Group GroupNode and GroupCross. Each group has its own queue, its own
// collectives in flight and its own failures, so the three can run
// collectives at once; the host must carry out each group's posts in
// their order on a communicator of that group's ranks, independently of
// the other groups' (TakeGroup takes one group's; Take takes every
// group's, in the order they were posted). Op ids are unique across the
// groups, and Complete finds the op's group by its id.
type Transport struct {
	h          *hub
	group      int
	rank, size int
	timeout    time.Duration

	inFlight int // the most posts outstanding at once

	// Guarded by h.mu.
	queue   []*post // posted, not taken
	started []*post // posted, not yet waited for by their caller
	calling comm.Op // the blocking call in flight, 0 when none
	poison  error   // the first failure
	closed  bool    // Close was called
}

// Option configures a Transport.
type Option func(*Transport) error

// WithTimeout bounds the device face's Wait when its ctx has no deadline
// (default DefaultTimeout).
func WithTimeout(d time.Duration) Option {
	return func(t *Transport) error {
		if d <= 0 {
			return fmt.Errorf("hosted: WithTimeout(%v): want a positive duration", d)
		}
		t.timeout = d
		return nil
	}
}

// WithInFlight sets how many collectives each group may have posted and
// not yet complete at once (comm.Starter.InFlight; default
// DefaultInFlight): 1 makes every post wait for the previous one.
func WithInFlight(k int) Option {
	return func(t *Transport) error {
		if k < 1 || k > 1024 {
			return fmt.Errorf("hosted: WithInFlight(%d): want 1 to 1024", k)
		}
		t.inFlight = k
		return nil
	}
}

// WithTopology gives the transport this rank's place among the nodes of
// the job (see SetTopology).
func WithTopology(topo comm.Topology) Option {
	return func(t *Transport) error { return t.setTopologyLocked(topo) }
}

// DefaultTimeout is WithTimeout's default.
const DefaultTimeout = 60 * time.Second

// DefaultInFlight is WithInFlight's default.
const DefaultInFlight = 4

// New returns rank's end of a hosted group of size ranks.
func New(rank, size int, opts ...Option) (*Transport, error) {
	if size < 1 || size > 1<<16-1 || rank < 0 || rank >= size {
		return nil, fmt.Errorf("hosted: New(rank %d, size %d): want 1 ≤ size ≤ 65535 and 0 ≤ rank < size", rank, size)
	}
	h := &hub{taken: map[uint64]*post{}, changed: make(chan struct{})}
	t := &Transport{h: h, group: GroupWorld, rank: rank, size: size, timeout: DefaultTimeout, inFlight: DefaultInFlight}
	h.groups[GroupWorld] = t
	for _, o := range opts {
		if err := o(t); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// Rank returns this rank's index.
func (t *Transport) Rank() int { return t.rank }

// Size returns the number of ranks.
func (t *Transport) Size() int { return t.size }

// Group returns t's group id: GroupWorld for a transport of New.
func (t *Transport) Group() int { return t.group }

// SetTopology sets this rank's place among the nodes of the job: node
// topo.Node of topo.Nodes, local rank topo.LocalRank of topo.LocalSize,
// with topo.Nodes × topo.LocalSize = Size(); the zero Topology means
// unknown (then Topology returns it and Split fails). It is refused while
// a Split's comms are open, and on a group of a Split. Whether the ranks
// agree is not checked here (overlap's StrategyHier checks it).
func (t *Transport) SetTopology(topo comm.Topology) error {
	t.h.mu.Lock()
	defer t.h.mu.Unlock()
	for _, g := range t.h.groups[GroupNode:] {
		if g != nil && !g.closed {
			return fmt.Errorf("hosted: SetTopology on rank %d: a Split's comms are open", t.rank)
		}
	}
	return t.setTopologyLocked(topo)
}

func (t *Transport) setTopologyLocked(topo comm.Topology) error {
	switch {
	case t.group != GroupWorld:
		return fmt.Errorf("hosted: SetTopology on rank %d of group %d: only the world group has a topology", t.rank, t.group)
	case topo == comm.Topology{}:
	case topo.Nodes < 1 || topo.LocalSize < 1 || topo.Nodes*topo.LocalSize != t.size ||
		topo.Node < 0 || topo.Node >= topo.Nodes || topo.LocalRank < 0 || topo.LocalRank >= topo.LocalSize:
		return fmt.Errorf("hosted: rank %d of %d: topology node %d of %d, local rank %d of %d: want nodes × local size = %d, node and local rank within them",
			t.rank, t.size, topo.Node, topo.Nodes, topo.LocalRank, topo.LocalSize, t.size)
	}
	t.h.topo = topo
	return nil
}

// Topology returns this rank's place as SetTopology set it (the zero
// Topology when unknown). A Split's node comm reports one node holding its
// ranks, its cross comm one rank per node.
func (t *Transport) Topology() comm.Topology {
	t.h.mu.Lock()
	defer t.h.mu.Unlock()
	topo := t.h.topo
	switch t.group {
	case GroupNode:
		return comm.Topology{Node: 0, Nodes: 1, LocalRank: topo.LocalRank, LocalSize: topo.LocalSize}
	case GroupCross:
		return comm.Topology{Node: topo.Node, Nodes: topo.Nodes, LocalRank: 0, LocalSize: 1}
	}
	return topo
}

// Split returns the node and cross-node groups of t (comm.Splitter): new
// transports sharing t's host side, whose posts carry Op.Group GroupNode
// (ranks: the node's, rank LocalRank) and GroupCross (ranks: one per node,
// rank Node). It posts nothing (every rank calls it, as comm.Splitter
// says, but the host already has its groups). It fails without a topology,
// on a poisoned or closed transport, on a group of a Split, and while the
// previous Split's comms are open (one Split at a time: their group ids
// are fixed). Closing a split comm closes that group alone; closing t
// closes them all.
func (t *Transport) Split(ctx context.Context) (node, cross comm.Comm, err error) {
	if err := ctx.Err(); err != nil {
		return nil, nil, err
	}
	h := t.h
	h.mu.Lock()
	defer h.mu.Unlock()
	topo := h.topo
	switch {
	case t.group != GroupWorld:
		return nil, nil, fmt.Errorf("hosted: Split on rank %d of group %d: only the world group splits", t.rank, t.group)
	case t.closed:
		return nil, nil, fmt.Errorf("hosted: Split on rank %d: %w", t.rank, &comm.ClosedError{Rank: t.rank})
	case t.poison != nil:
		return nil, nil, &comm.PoisonedError{Op: comm.OpBarrier, Rank: t.rank, Cause: t.poison}
	case topo.Nodes == 0:
		return nil, nil, fmt.Errorf("hosted: Split on rank %d: the transport has no topology (WithTopology, SetTopology; gc_engine_config's node, nodes, local_rank, local_size)", t.rank)
	}
	for _, g := range h.groups[GroupNode:] {
		if g != nil && !g.closed {
			return nil, nil, fmt.Errorf("hosted: Split on rank %d: the previous Split's comms are open (close them first)", t.rank)
		}
	}
	n := &Transport{h: h, group: GroupNode, rank: topo.LocalRank, size: topo.LocalSize, timeout: t.timeout, inFlight: t.inFlight}
	c := &Transport{h: h, group: GroupCross, rank: topo.Node, size: topo.Nodes, timeout: t.timeout, inFlight: t.inFlight}
	h.groups[GroupNode], h.groups[GroupCross] = n, c
	h.notify()
	return hostComm{n}, hostComm{c}, nil
}

// notify wakes every Take waiting for a change. h.mu is held.
func (h *hub) notify() {
	close(h.changed)
	h.changed = make(chan struct{})
}

// Take returns the next post of every group (t must be the transport of
// New), the one posted first, waiting until there is one, ctx ends (its
// error) or the transport is closed (an error matching ErrClosed). Posts
// come out in the order they were made; Op.Group says which group's each
// is. On a group of a Split it is TakeGroup of that group.
func (t *Transport) Take(ctx context.Context) (Op, error) {
	if t.group != GroupWorld {
		return t.TakeGroup(ctx, t.group)
	}
	return t.take(ctx, -1)
}

// TakeGroup is Take of group's posts alone (GroupWorld, GroupNode,
// GroupCross): it waits while the group has none, also while no Split has
// made it or after a Split's comm was closed (a later Split makes it
// again); it returns an error matching ErrClosed only once the transport
// of New is closed.
func (t *Transport) TakeGroup(ctx context.Context, group int) (Op, error) {
	if group < GroupWorld || group > GroupCross {
		return Op{}, fmt.Errorf("hosted: TakeGroup on rank %d: group %d: want %d, %d or %d", t.rank, group, GroupWorld, GroupNode, GroupCross)
	}
	return t.take(ctx, group)
}

// take is Take (group -1: every group) and TakeGroup.
func (t *Transport) take(ctx context.Context, group int) (Op, error) {
	h := t.h
	for {
		h.mu.Lock()
		world := h.groups[GroupWorld]
		if world.closed {
			h.mu.Unlock()
			return Op{}, fmt.Errorf("hosted: Take on rank %d: %w", world.rank, &comm.ClosedError{Rank: world.rank})
		}
		var from *Transport
		for g, q := range h.groups {
			if q == nil || len(q.queue) == 0 || (group >= 0 && g != group) {
				continue
			}
			if from == nil || q.queue[0].op.ID < from.queue[0].op.ID {
				from = q
			}
		}
		if from != nil {
			p := from.queue[0]
			from.queue = from.queue[1:]
			h.taken[p.op.ID] = p
			h.mu.Unlock()
			return p.op, nil
		}
		wake := h.changed
		h.mu.Unlock()
		select {
		case <-wake:
		case <-ctx.Done():
			return Op{}, ctx.Err()
		}
	}
}

// SetLauncher has every later post of group (GroupWorld, GroupNode,
// GroupCross) handed to launch as it is made, instead of queued for Take:
// on the posting goroutine, one at a time, in the group's post order (the
// order Take would give). The op is taken when launch gets it, and is
// completed with Complete as a taken op is, from any goroutine, launch
// itself included (a collective that failed to start). launch must start
// the collective on the host's communicator and return without waiting
// for it (torch's async_op=True, an NCCL call on a stream): the engine's
// next post waits for it to return. It spares a host the thread that
// waits in Take and the wake-up of that thread at every post. nil goes
// back to Take for later posts. It may be set before the group exists
// (a Split's groups); posts already queued stay for Take.
func (t *Transport) SetLauncher(group int, launch func(Op)) error {
	if group < GroupWorld || group > GroupCross {
		return fmt.Errorf("hosted: SetLauncher on rank %d: group %d: want %d, %d or %d", t.rank, group, GroupWorld, GroupNode, GroupCross)
	}
	h := t.h
	h.posting[group].Lock()
	defer h.posting[group].Unlock()
	h.mu.Lock()
	defer h.mu.Unlock()
	h.launch[group] = launch
	return nil
}

// Complete ends the taken op id, of any group: hostErr nil with recvBytes
// the bytes the host wrote to the op's output (Op.RecvBytes; 0 for a
// barrier), or the host's error, which the caller's collective returns as
// a *HostError. Ops may complete in any order. A completion the transport
// cannot accept (an id not taken or already complete, a wrong length)
// returns a *ProtocolError and fails the op with it (a wrong length), or
// every outstanding op of every group (an id it does not know). A failure
// poisons the group(s): their other outstanding collectives fail with a
// *comm.PoisonedError. After Close, and for an op of a group closed since it was
// taken, it returns an error matching ErrClosed.
func (t *Transport) Complete(id uint64, recvBytes int, hostErr error) error {
	h := t.h
	h.mu.Lock()
	defer h.mu.Unlock()
	world := h.groups[GroupWorld]
	if world.closed {
		return fmt.Errorf("hosted: Complete(%d) on rank %d: %w", id, world.rank, &comm.ClosedError{Rank: world.rank})
	}
	p, ok := h.taken[id]
	if ok && p.g.closed {
		delete(h.taken, id)
		return fmt.Errorf("hosted: Complete(%d) on rank %d of group %d: %w", id, p.g.rank, p.g.group, &comm.ClosedError{Rank: p.g.rank})
	}
	var perr *ProtocolError
	switch {
	case !ok && id > 0 && id <= h.nextID:
		perr = &ProtocolError{Rank: world.rank, ID: id, Reason: "it is not taken (already complete, never taken, or abandoned)"}
	case !ok:
		perr = &ProtocolError{Rank: world.rank, ID: id, Reason: fmt.Sprintf("no such op (posted so far: 1 to %d)", h.nextID)}
	case hostErr == nil && recvBytes != p.op.RecvBytes:
		perr = &ProtocolError{Rank: p.g.rank, ID: id, Reason: fmt.Sprintf("the host wrote %d bytes, %v has %d", recvBytes, p.op.Kind, p.op.RecvBytes)}
	}
	if perr != nil {
		if ok {
			deliver(p, perr)
			p.g.failLocked(perr)
		} else {
			for _, g := range h.groups {
				if g != nil && !g.closed {
					g.failLocked(perr)
				}
			}
		}
		return perr
	}
	delete(h.taken, id)
	if hostErr != nil {
		herr := &HostError{Rank: p.g.rank, Op: p.op, Err: hostErr}
		deliver(p, herr)
		p.g.failLocked(herr)
		return nil
	}
	deliver(p, nil)
	return nil
}

// deliver hands p's caller its result, unless it already has one (a
// failure of the transport came first).
func deliver(p *post, err error) {
	select {
	case p.done <- err:
	default:
	}
}

// poisonLocked records the first failure. h.mu is held.
func (t *Transport) poisonLocked(err error) {
	if t.poison == nil {
		t.poison = err
	}
}

// failLocked poisons t with err: its outstanding collectives that have no
// result yet fail with a *comm.PoisonedError wrapping it, and its posts
// not yet taken leave the queue (taken ones stay in h.taken, their
// buffers reachable, until the host completes them or Close). h.mu is
// held.
func (t *Transport) failLocked(err error) {
	t.poisonLocked(err)
	for _, p := range t.started {
		deliver(p, &comm.PoisonedError{Op: p.op.Kind, Rank: t.rank, Cause: t.poison})
	}
	t.queue = nil
}

// Close ends the transport: posts not taken and collectives in flight fail
// with an error matching ErrClosed, Take and Complete return one from then
// on, and so does every later collective (a *comm.PoisonedError). Ops
// taken but not completed are abandoned: their buffers are the caller's
// again, and the host must not touch them. Closing the transport of New
// closes its Split's groups too; closing a group of a Split (its comm's
// Close) closes that group alone: Complete of its taken ops then returns
// an error matching ErrClosed. Closing twice returns nil.
func (t *Transport) Close() error {
	h := t.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if t.closed {
		return nil
	}
	if t.group == GroupWorld {
		for _, g := range h.groups[GroupNode:] {
			if g != nil {
				g.closeLocked()
			}
		}
		t.closeLocked()
		clear(h.taken)
	} else {
		t.closeLocked() // its taken ops stay in h.taken until completed: Complete says ErrClosed
	}
	h.notify()
	return nil
}

func (t *Transport) closeLocked() {
	if t.closed {
		return
	}
	t.closed = true
	t.failLocked(&comm.ClosedError{Rank: t.rank})
}

// collective is a blocking call: start, then wait.
func (t *Transport) collective(ctx context.Context, op Op) error {
	p, err := t.start(ctx, op, true)
	if err != nil {
		return err
	}
	err = p.wait(ctx)
	t.h.mu.Lock()
	t.calling = 0
	t.h.mu.Unlock()
	return err
}

// start posts op as the group's next collective and returns its post,
// whose wait ends it; blocking marks a blocking call in flight (the
// caller clears it).
func (t *Transport) start(ctx context.Context, op Op, blocking bool) (*post, error) {
	if err := ctx.Err(); err != nil {
		return nil, &comm.IncompleteError{Op: op.Kind, Rank: t.rank, Err: err}
	}
	h := t.h
	h.posting[t.group].Lock()
	defer h.posting[t.group].Unlock()
	h.mu.Lock()
	switch {
	case t.poison != nil:
		h.mu.Unlock()
		return nil, &comm.PoisonedError{Op: op.Kind, Rank: t.rank, Cause: t.poison}
	case t.calling != 0:
		h.mu.Unlock()
		return nil, &comm.BusyError{Op: op.Kind, Rank: t.rank, Pending: t.calling}
	case len(t.started) >= t.inFlight:
		h.mu.Unlock()
		return nil, &comm.BusyError{Op: op.Kind, Rank: t.rank, Started: t.inFlight}
	}
	if blocking {
		t.calling = op.Kind
	}
	h.nextID++
	op.ID = h.nextID
	op.Group = t.group
	p := &post{op: op, g: t, done: make(chan error, 1)}
	t.started = append(t.started, p)
	launch := h.launch[t.group]
	if launch == nil {
		t.queue = append(t.queue, p)
		h.notify()
		h.mu.Unlock()
		return p, nil
	}
	h.taken[op.ID] = p
	h.mu.Unlock()
	launch(op) // outside mu: it may Complete at once
	return p, nil
}

// request is start of a comm.Starter's collective.
func (t *Transport) request(ctx context.Context, op Op) (comm.Request, error) {
	p, err := t.start(ctx, op, false)
	if err != nil {
		return nil, err // not a nil *post in a non-nil interface
	}
	return p, nil
}

// wait waits, once, for p's completion, for ctx (which abandons p and
// poisons the group), or for a failure of the group, and releases p's
// place among the group's outstanding collectives.
func (p *post) wait(ctx context.Context) error {
	p.once.Do(func() {
		t := p.g
		var err error
		select {
		case err = <-p.done:
		case <-ctx.Done():
			select {
			case err = <-p.done: // completed as ctx ended: keep the result
			default:
				err = &comm.IncompleteError{Op: p.op.Kind, Rank: t.rank, Err: ctx.Err()}
			}
		}
		h := t.h
		h.mu.Lock()
		defer h.mu.Unlock()
		if i := slices.Index(t.started, p); i >= 0 {
			t.started = slices.Delete(t.started, i, i+1)
		}
		if err != nil {
			// Untaken, it leaves the queue; taken, it stays in h.taken
			// (so its buffers stay reachable) until the host completes
			// it or Close.
			if i := slices.Index(t.queue, p); i >= 0 {
				t.queue = slices.Delete(t.queue, i, i+1)
			}
			t.failLocked(err)
		}
		p.err = err
	})
	return p.err
}

// Wait implements comm.Request.
func (p *post) Wait(ctx context.Context) error { return p.wait(ctx) }

// Host returns the transport's comm.Comm face.
func (t *Transport) Host() comm.Comm { return hostComm{t} }

// Device returns the transport's comm.DeviceComm face.
func (t *Transport) Device() comm.DeviceComm { return deviceComm{t} }

// argError is the *comm.ArgumentError of a call with invalid arguments.
func (t *Transport) argError(op comm.Op, format string, args ...any) error {
	return &comm.ArgumentError{Op: op, Rank: t.rank, Reason: fmt.Sprintf(format, args...)}
}

// hostComm posts host collectives.
type hostComm struct{ t *Transport }

func (h hostComm) Rank() int { return h.t.rank }
func (h hostComm) Size() int { return h.t.size }

func (h hostComm) AllReduce(ctx context.Context, buf []float32) error {
	op, err := allReduceOp(buf)
	if err != nil {
		return err
	}
	return h.t.collective(ctx, op)
}

func (h hostComm) AllGather(ctx context.Context, dst, src []byte) error {
	op, err := h.t.allGatherOp(dst, src)
	if err != nil {
		return err
	}
	return h.t.collective(ctx, op)
}

func (h hostComm) ReduceScatter(ctx context.Context, dst, src []float32) error {
	op, err := h.t.reduceScatterOp(dst, src)
	if err != nil {
		return err
	}
	return h.t.collective(ctx, op)
}

func (h hostComm) AllToAll(ctx context.Context, dst, src []byte) error {
	op, err := h.t.allToAllOp(dst, src)
	if err != nil {
		return err
	}
	return h.t.collective(ctx, op)
}

func (h hostComm) Broadcast(ctx context.Context, buf []byte, root int) error {
	if root < 0 || root >= h.t.size {
		return h.t.argError(comm.OpBroadcast, "root %d, want 0 to %d", root, h.t.size-1)
	}
	return h.t.collective(ctx, Op{Kind: comm.OpBroadcast, Root: root, Count: len(buf), Send: buf, Recv: buf, SendBytes: len(buf), RecvBytes: len(buf)})
}

func (h hostComm) Barrier(ctx context.Context) error {
	return h.t.collective(ctx, Op{Kind: comm.OpBarrier})
}

// The host ops of the collectives that comm.Starter starts too, or their
// argument errors.

func allReduceOp(buf []float32) (Op, error) {
	b := f32.Bytes(buf)
	return Op{Kind: comm.OpAllReduce, Count: len(buf), Send: b, Recv: b, SendBytes: len(b), RecvBytes: len(b)}, nil
}

func (t *Transport) allGatherOp(dst, src []byte) (Op, error) {
	if len(dst) != t.size*len(src) {
		return Op{}, t.argError(comm.OpAllGather, "len(dst) = %d, want Size() × len(src) = %d × %d", len(dst), t.size, len(src))
	}
	return Op{Kind: comm.OpAllGather, Count: len(src), Send: src, Recv: dst, SendBytes: len(src), RecvBytes: len(dst)}, nil
}

func (t *Transport) reduceScatterOp(dst, src []float32) (Op, error) {
	if len(src) != t.size*len(dst) {
		return Op{}, t.argError(comm.OpReduceScatter, "len(src) = %d, want Size() × len(dst) = %d × %d", len(src), t.size, len(dst))
	}
	return Op{Kind: comm.OpReduceScatter, Count: len(dst), Send: f32.Bytes(src), Recv: f32.Bytes(dst), SendBytes: 4 * len(src), RecvBytes: 4 * len(dst)}, nil
}

func (t *Transport) allToAllOp(dst, src []byte) (Op, error) {
	if len(dst) != len(src) || len(src)%t.size != 0 {
		return Op{}, t.argError(comm.OpAllToAll, "len(src) = %d, len(dst) = %d: want equal lengths, a multiple of Size() = %d", len(src), len(dst), t.size)
	}
	return Op{Kind: comm.OpAllToAll, Count: len(src), Send: src, Recv: dst, SendBytes: len(src), RecvBytes: len(dst)}, nil
}

// Close closes the transport (both faces).
func (h hostComm) Close() error { return h.t.Close() }

// InFlight implements comm.Starter (WithInFlight).
func (h hostComm) InFlight() int { return h.t.inFlight }

// StartAllReduce implements comm.Starter.
func (h hostComm) StartAllReduce(ctx context.Context, buf []float32) (comm.Request, error) {
	op, err := allReduceOp(buf)
	if err != nil {
		return nil, err
	}
	return h.t.request(ctx, op)
}

// StartAllGather implements comm.Starter.
func (h hostComm) StartAllGather(ctx context.Context, dst, src []byte) (comm.Request, error) {
	op, err := h.t.allGatherOp(dst, src)
	if err != nil {
		return nil, err
	}
	return h.t.request(ctx, op)
}

// StartReduceScatter implements comm.Starter.
func (h hostComm) StartReduceScatter(ctx context.Context, dst, src []float32) (comm.Request, error) {
	op, err := h.t.reduceScatterOp(dst, src)
	if err != nil {
		return nil, err
	}
	return h.t.request(ctx, op)
}

// StartAllToAll implements comm.Starter.
func (h hostComm) StartAllToAll(ctx context.Context, dst, src []byte) (comm.Request, error) {
	op, err := h.t.allToAllOp(dst, src)
	if err != nil {
		return nil, err
	}
	return h.t.request(ctx, op)
}

// Topology implements comm.Topologist (see Transport.Topology).
func (h hostComm) Topology() comm.Topology { return h.t.Topology() }

// Split implements comm.Splitter (see Transport.Split).
func (h hostComm) Split(ctx context.Context) (node, cross comm.Comm, err error) {
	return h.t.Split(ctx)
}

// Device implements comm.DeviceHost: the transport's device face, whose
// posts carry the same group (a Split's comm's: its group's).
func (h hostComm) Device() comm.DeviceComm { return deviceComm{h.t} }

// deviceComm posts device collectives.
type deviceComm struct{ t *Transport }

func (d deviceComm) Rank() int { return d.t.rank }
func (d deviceComm) Size() int { return d.t.size }

func (d deviceComm) post(ctx context.Context, kind comm.Op, count int, send, recv gpu.Ptr, sendBytes, recvBytes, root int, s gpu.Stream) error {
	switch {
	case count < 0:
		return d.t.argError(kind, "negative length %d", count)
	case (sendBytes > 0 && send == 0) || (recvBytes > 0 && recv == 0):
		return d.t.argError(kind, "null device pointer for a non-empty buffer")
	}
	return d.t.collective(ctx, Op{Kind: kind, Root: root, Count: count, Device: true, SendPtr: send, RecvPtr: recv,
		SendBytes: sendBytes, RecvBytes: recvBytes, Stream: s})
}

func (d deviceComm) AllReduce(ctx context.Context, buf gpu.Ptr, n int, s gpu.Stream) error {
	return d.post(ctx, comm.OpAllReduce, n, buf, buf, 4*n, 4*n, 0, s)
}

func (d deviceComm) AllGather(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	return d.post(ctx, comm.OpAllGather, n, src, dst, n, d.t.size*n, 0, s)
}

func (d deviceComm) ReduceScatter(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	return d.post(ctx, comm.OpReduceScatter, n, src, dst, 4*d.t.size*n, 4*n, 0, s)
}

func (d deviceComm) AllToAll(ctx context.Context, dst, src gpu.Ptr, n int, s gpu.Stream) error {
	if n%d.t.size != 0 {
		return d.t.argError(comm.OpAllToAll, "n = %d is not a multiple of Size() = %d", n, d.t.size)
	}
	return d.post(ctx, comm.OpAllToAll, n, src, dst, n, n, 0, s)
}

func (d deviceComm) Broadcast(ctx context.Context, buf gpu.Ptr, n int, root int, s gpu.Stream) error {
	if root < 0 || root >= d.t.size {
		return d.t.argError(comm.OpBroadcast, "root %d, want 0 to %d", root, d.t.size-1)
	}
	return d.post(ctx, comm.OpBroadcast, n, buf, buf, n, n, root, s)
}

// Wait polls done (backing off from 20 µs to 1 ms) until it reports true,
// fails, or ctx — bounded by WithTimeout's duration when it has no
// deadline — ends; a timeout poisons the transport.
func (d deviceComm) Wait(ctx context.Context, done func() (bool, error)) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, d.t.timeout)
		defer cancel()
	}
	for pause := 20 * time.Microsecond; ; pause = min(2*pause, time.Millisecond) {
		ok, err := done()
		switch {
		case err != nil:
			return fmt.Errorf("hosted: Wait on rank %d: %w", d.t.rank, err)
		case ok:
			return nil
		}
		select {
		case <-ctx.Done():
			err := fmt.Errorf("hosted: Wait on rank %d: the device work did not finish: %w", d.t.rank, ctx.Err())
			d.t.h.mu.Lock()
			d.t.poisonLocked(err)
			d.t.h.mu.Unlock()
			return err
		case <-time.After(pause):
		}
	}
}

// Close closes the transport (both faces).
func (d deviceComm) Close() error { return d.t.Close() }

// Run carries out a host op on c, a comm.Comm of the same ranks (a Go
// host's communicator: comm/inproc, comm/mpi), and returns the bytes
// written to the op's output, for Complete. Device ops are refused.
func Run(ctx context.Context, op Op, c comm.Comm) (int, error) {
	if op.Device {
		return 0, errors.New("hosted: Run: a device op needs the host's device communicator (RunDevice)")
	}
	var err error
	switch op.Kind {
	case comm.OpAllReduce:
		err = c.AllReduce(ctx, Float32s(op.Recv))
	case comm.OpAllGather:
		err = c.AllGather(ctx, op.Recv, op.Send)
	case comm.OpReduceScatter:
		err = c.ReduceScatter(ctx, Float32s(op.Recv), Float32s(op.Send))
	case comm.OpAllToAll:
		err = c.AllToAll(ctx, op.Recv, op.Send)
	case comm.OpBroadcast:
		err = c.Broadcast(ctx, op.Recv, op.Root)
	case comm.OpBarrier:
		err = c.Barrier(ctx)
	default:
		err = fmt.Errorf("hosted: Run: unknown collective %v", op.Kind)
	}
	if err != nil {
		return 0, err
	}
	return op.RecvBytes, nil
}

// RunDevice enqueues a device op on dc (the host's device communicator,
// e.g. comm/ncclcomm) on the op's stream and returns the op's output length,
// for Complete. Host ops are refused.
func RunDevice(ctx context.Context, op Op, dc comm.DeviceComm) (int, error) {
	if !op.Device {
		return 0, errors.New("hosted: RunDevice: a host op needs the host's comm.Comm (Run)")
	}
	var err error
	switch op.Kind {
	case comm.OpAllReduce:
		err = dc.AllReduce(ctx, op.RecvPtr, op.Count, op.Stream)
	case comm.OpAllGather:
		err = dc.AllGather(ctx, op.RecvPtr, op.SendPtr, op.Count, op.Stream)
	case comm.OpReduceScatter:
		err = dc.ReduceScatter(ctx, op.RecvPtr, op.SendPtr, op.Count, op.Stream)
	case comm.OpAllToAll:
		err = dc.AllToAll(ctx, op.RecvPtr, op.SendPtr, op.Count, op.Stream)
	case comm.OpBroadcast:
		err = dc.Broadcast(ctx, op.RecvPtr, op.Count, op.Root, op.Stream)
	default:
		err = fmt.Errorf("hosted: RunDevice: no device %v", op.Kind)
	}
	if err != nil {
		return 0, err
	}
	return op.RecvBytes, nil
}

// Serve is a Go host's loop: it takes every post of t's own group (the
// world's, for the transport of New) and carries it out, host ops on c and
// device ops on dc (nil: device ops fail), until ctx ends or t is closed,
// and returns nil then (or the error Complete refused). A host of a
// transport that splits serves each group with ServeGroup as well.
func Serve(ctx context.Context, t *Transport, c comm.Comm, dc comm.DeviceComm) error {
	return ServeGroup(ctx, t, t.group, c, dc)
}

// ServeGroup is Serve of group's posts (TakeGroup), carried out on c and
// dc, communicators of that group's ranks: run one per group, each on its
// own goroutine, so that the groups' collectives run independently. When c
// is a comm.Starter, host ops it can start are started in Take's order and
// completed as they finish, up to c.InFlight() at once (several in flight);
// the others run one at a time, in that order.
func ServeGroup(ctx context.Context, t *Transport, group int, c comm.Comm, dc comm.DeviceComm) error {
	s := newServer(ctx, t, c, dc)
	defer s.wg.Wait()
	for {
		op, err := t.TakeGroup(ctx, group)
		if err != nil {
			return firstOf(s.refused)
		}
		select {
		case err := <-s.refused:
			return err
		default:
		}
		s.carry(op)
	}
}

// Launch is ServeGroup without a goroutine taking the posts: it sets
// group's launcher (SetLauncher) to carry out each post as ServeGroup
// would, on the posting goroutine: an op c can start is started there and
// completed when it finishes; any other (c not a comm.Starter, a device
// op on dc) runs to completion before the post returns. stop clears the
// launcher, waits for the ops launched to complete, and returns the first
// completion Complete refused (nil when none; closing t is not one).
func Launch(ctx context.Context, t *Transport, group int, c comm.Comm, dc comm.DeviceComm) (stop func() error, err error) {
	s := newServer(ctx, t, c, dc)
	if err := t.SetLauncher(group, s.carry); err != nil {
		return nil, err
	}
	return func() error {
		t.SetLauncher(group, nil) // group was valid above
		s.wg.Wait()
		return firstOf(s.refused)
	}, nil
}

// server carries out a group's posts for ServeGroup and Launch.
type server struct {
	ctx     context.Context
	t       *Transport
	c       comm.Comm
	dc      comm.DeviceComm
	starter comm.Starter  // c as a Starter, or nil
	slots   chan struct{} // one per op started on starter and not yet complete
	wg      sync.WaitGroup
	refused chan error // the first completion Complete refused
}

func newServer(ctx context.Context, t *Transport, c comm.Comm, dc comm.DeviceComm) *server {
	s := &server{ctx: ctx, t: t, c: c, dc: dc, refused: make(chan error, 1)}
	s.starter, _ = c.(comm.Starter)
	if s.starter != nil {
		s.slots = make(chan struct{}, s.starter.InFlight())
	}
	return s
}

// carry starts op and completes it when it finishes, or runs it and
// completes it.
func (s *server) carry(op Op) {
	if q, ok, err := startHostOp(s.ctx, op, s.starter, s.slots); ok {
		if err != nil {
			<-s.slots
			s.complete(op, 0, err)
			return
		}
		s.wg.Go(func() {
			defer func() { <-s.slots }()
			err := q.Wait(s.ctx)
			s.complete(op, op.RecvBytes, err)
		})
		return
	}
	var n int
	var runErr error
	switch {
	case !op.Device:
		n, runErr = Run(s.ctx, op, s.c)
	case s.dc == nil:
		runErr = errors.New("hosted: Serve: this host has no device communicator")
	default:
		n, runErr = RunDevice(s.ctx, op, s.dc)
	}
	s.complete(op, n, runErr)
}

// complete completes op, keeping the first error Complete returns other
// than ErrClosed.
func (s *server) complete(op Op, n int, runErr error) {
	if err := s.t.Complete(op.ID, n, runErr); err != nil && !errors.Is(err, ErrClosed) {
		select {
		case s.refused <- err:
		default:
		}
	}
}

// firstOf returns the error in ch, if any.
func firstOf(ch chan error) error {
	select {
	case err := <-ch:
		return err
	default:
		return nil
	}
}

// startHostOp starts op on s when s can (a host all-reduce, all-gather,
// reduce-scatter or all-to-all on a comm.Starter), after taking one of
// slots, and says whether it did (ok; err: the start's error, its slot
// still taken).
func startHostOp(ctx context.Context, op Op, s comm.Starter, slots chan struct{}) (q comm.Request, ok bool, err error) {
	if s == nil || op.Device {
		return nil, false, nil
	}
	switch op.Kind {
	case comm.OpAllReduce, comm.OpAllGather, comm.OpReduceScatter, comm.OpAllToAll:
	default:
		return nil, false, nil
	}
	slots <- struct{}{}
	switch op.Kind {
	case comm.OpAllReduce:
		q, err = s.StartAllReduce(ctx, Float32s(op.Recv))
	case comm.OpAllGather:
		q, err = s.StartAllGather(ctx, op.Recv, op.Send)
	case comm.OpReduceScatter:
		q, err = s.StartReduceScatter(ctx, Float32s(op.Recv), Float32s(op.Send))
	default:
		q, err = s.StartAllToAll(ctx, op.Recv, op.Send)
	}
	return q, true, err
}
