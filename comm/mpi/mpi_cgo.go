//go:build mpi && cgo

package mpi

/*
#include <mpi.h>

static int gc_initialized(int *flag) { return MPI_Initialized(flag); }
static int gc_init_thread(int *provided) { return MPI_Init_thread(NULL, NULL, MPI_THREAD_MULTIPLE, provided); }
static int gc_query_thread(int *provided) { return MPI_Query_thread(provided); }
static int gc_finalize(void) { return MPI_Finalize(); }

// gc_world sets MPI_ERRORS_RETURN on MPI_COMM_WORLD and makes a duplicate.
static int gc_world(MPI_Comm *out) {
	int rc = MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
	if (rc != MPI_SUCCESS) return rc;
	return MPI_Comm_dup(MPI_COMM_WORLD, out);
}
static int gc_errors_return(MPI_Comm c) { return MPI_Comm_set_errhandler(c, MPI_ERRORS_RETURN); }
static int gc_rank(MPI_Comm c, int *rank) { return MPI_Comm_rank(c, rank); }
static int gc_size(MPI_Comm c, int *size) { return MPI_Comm_size(c, size); }
static int gc_free(MPI_Comm *c) { return MPI_Comm_free(c); }
static int gc_abort(MPI_Comm c, int code) { return MPI_Abort(c, code); }
static int gc_test(MPI_Request *r, int *flag) { return MPI_Test(r, flag, MPI_STATUS_IGNORE); }
static int gc_error_string(int code, char *buf, int *len) { return MPI_Error_string(code, buf, len); }

// gc_node_leaders sets leaders[r] to the lowest rank of c that shares a node
// with rank r of c.
static int gc_node_leaders(MPI_Comm c, int rank, int *leaders) {
	MPI_Comm shared;
	int leader, rc = MPI_Comm_split_type(c, MPI_COMM_TYPE_SHARED, 0, MPI_INFO_NULL, &shared);
	if (rc != MPI_SUCCESS) return rc;
	rc = MPI_Allreduce(&rank, &leader, 1, MPI_INT, MPI_MIN, shared);
	int rc2 = MPI_Comm_free(&shared);
	if (rc != MPI_SUCCESS) return rc;
	if (rc2 != MPI_SUCCESS) return rc2;
	return MPI_Allgather(&leader, 1, MPI_INT, leaders, 1, MPI_INT, c);
}

static int gc_idup(MPI_Comm c, MPI_Comm *out, MPI_Request *r) { return MPI_Comm_idup(c, out, r); }
static int gc_split(MPI_Comm c, int color, int key, MPI_Comm *out) { return MPI_Comm_split(c, color, key, out); }
static int gc_iallreduce(float *buf, int n, MPI_Comm c, MPI_Request *r) {
	return MPI_Iallreduce(MPI_IN_PLACE, buf, n, MPI_FLOAT, MPI_SUM, c, r);
}
static int gc_iallgather(const void *src, int n, void *dst, MPI_Comm c, MPI_Request *r) {
	return MPI_Iallgather(src, n, MPI_BYTE, dst, n, MPI_BYTE, c, r);
}
static int gc_ireduce_scatter(const float *src, float *dst, int n, MPI_Comm c, MPI_Request *r) {
	return MPI_Ireduce_scatter_block(src, dst, n, MPI_FLOAT, MPI_SUM, c, r);
}
static int gc_ialltoall(const void *src, void *dst, int n, MPI_Comm c, MPI_Request *r) {
	return MPI_Ialltoall(src, n, MPI_BYTE, dst, n, MPI_BYTE, c, r);
}
static int gc_ibcast(void *buf, int n, int root, MPI_Comm c, MPI_Request *r) {
	return MPI_Ibcast(buf, n, MPI_BYTE, root, c, r);
}
static int gc_ibarrier(MPI_Comm c, MPI_Request *r) { return MPI_Ibarrier(c, r); }
*/
import "C"

import (
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/gradcomp/gradcomp/comm"
	"github.com/gradcomp/gradcomp/comm/internal/check"
)

// Polling: spinPolls tests with runtime.Gosched between them, then sleeps
// starting at minPoll and doubling up to maxPoll.
const (
	spinPolls = 64
	minPoll   = 10 * time.Microsecond
	maxPoll   = time.Millisecond
)

// proc is the process-wide MPI state.
var proc struct {
	mu        sync.Mutex
	inited    bool        // Init ran in this process
	ownMPI    bool        // Init called MPI_Init_thread, so Close of its Comm finalizes
	finalized atomic.Bool // MPI_Finalize ran: no more MPI calls
	leaked    []*request  // requests never completed, kept pinned until exit
}

// serial is set by Init when MPI provided only MPI_THREAD_SERIALIZED; every
// MPI call then holds mpiMu.
var (
	serial bool
	mpiMu  sync.Mutex
)

// mpi runs one MPI call f, serialized when serial is set.
func mpi(f func() C.int) C.int {
	if serial {
		mpiMu.Lock()
		defer mpiMu.Unlock()
	}
	return f()
}

func threadLevel() string {
	if serial {
		return "MPI_THREAD_SERIALIZED (calls serialized by a process-wide mutex)"
	}
	return "MPI_THREAD_MULTIPLE"
}

// mainThread runs functions on one locked OS thread: MPI's main thread,
// which must call both MPI_Init_thread and MPI_Finalize.
var mainThread struct {
	once  sync.Once
	calls chan func()
}

func onMainThread(f func()) {
	mainThread.once.Do(func() {
		mainThread.calls = make(chan func())
		go func() {
			runtime.LockOSThread()
			for f := range mainThread.calls {
				f()
			}
		}()
	})
	done := make(chan struct{})
	mainThread.calls <- func() { f(); close(done) }
	<-done
}

// handle is a communicator and the state of its rank.
type handle struct {
	comm  C.MPI_Comm
	world bool // made by Init
	guard check.Guard

	mu          sync.Mutex
	failed      error         // first failure (Close's *comm.ClosedError included); nil while usable
	failedCh    chan struct{} // closed at the first failure
	closed      bool          // Close ran
	outstanding []*request    // issued, not yet settled
	abandoned   []*request    // settled by a failure before MPI completed them, as far as this rank saw
}

func newHandle() *handle { return &handle{failedCh: make(chan struct{})} }

// request is one non-blocking MPI call this rank issued (a collective, or
// the header exchange of the argument check) and the pins of its buffers.
// Its waiter tests it until it is settled: complete (err nil), or failed.
// A request settled by a failure before its waiter saw it complete is
// abandoned: MPI may still use its buffers, and only Close's drain tests
// it again.
type request struct {
	op  comm.Op
	mu  sync.Mutex // held while testing req or unpinning: one MPI_Test of a request at a time
	req C.MPI_Request
	pin runtime.Pinner

	settled bool  // under handle.mu
	err     error // the result, once settled; under handle.mu
}

// issuer makes one non-blocking MPI call whose request is r.req, pinning
// the Go memory it passes with r.pin, and returns the MPI function's name
// and its return code.
type issuer func(r *request) (fn string, rc C.int)

// pin pins s's backing array for r and returns its address, nil when s is
// empty.
func pin[T any](r *request, s []T) unsafe.Pointer {
	if len(s) == 0 {
		return nil
	}
	p := &s[0]
	r.pin.Pin(p)
	return unsafe.Pointer(p)
}

// mpiError returns the *Error for code returned by fn during op.
func mpiError(op, fn string, rank int, code C.int) *Error {
	buf := make([]byte, C.MPI_MAX_ERROR_STRING)
	var n C.int
	msg := "unknown error"
	if mpi(func() C.int { return C.gc_error_string(code, (*C.char)(unsafe.Pointer(&buf[0])), &n) }) == C.MPI_SUCCESS {
		msg = string(buf[:n])
	}
	return &Error{Op: op, Func: fn, Rank: rank, Code: int(code), Msg: msg}
}

func initWorld(cfg config) (*Comm, error) {
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if proc.inited {
		return nil, fmt.Errorf("comm/mpi: Init called twice in one process; use Dup for more communicators")
	}
	var err error
	onMainThread(func() {
		var flag, provided C.int
		if rc := C.gc_initialized(&flag); rc != C.MPI_SUCCESS {
			err = mpiError("Init", "MPI_Initialized", -1, rc)
			return
		}
		if flag == 0 {
			if rc := C.gc_init_thread(&provided); rc != C.MPI_SUCCESS {
				err = mpiError("Init", "MPI_Init_thread", -1, rc)
				return
			}
			proc.ownMPI = true
		} else if rc := C.gc_query_thread(&provided); rc != C.MPI_SUCCESS {
			err = mpiError("Init", "MPI_Query_thread", -1, rc)
			return
		}
		switch {
		case provided >= C.MPI_THREAD_MULTIPLE:
		case provided == C.MPI_THREAD_SERIALIZED:
			serial = true
		default:
			err = fmt.Errorf("comm/mpi: Init: MPI provides thread level %d, below MPI_THREAD_SERIALIZED (%d): goroutines cannot call it safely",
				provided, C.MPI_THREAD_SERIALIZED)
		}
	})
	if err != nil {
		return nil, err
	}
	proc.inited = true
	c := &Comm{cfg: cfg, h: newHandle()}
	c.h.world = true
	if rc := mpi(func() C.int { return C.gc_world(&c.h.comm) }); rc != C.MPI_SUCCESS {
		return nil, mpiError("Init", "MPI_Comm_dup", -1, rc)
	}
	if err := c.setRankSize("Init", -1); err != nil {
		return nil, discard(c.h, "Init", -1, err)
	}
	if err := c.setTopology(); err != nil {
		return nil, discard(c.h, "Init", c.rank, err)
	}
	return c, nil
}

// discard frees h's communicator, made by a call (op, on rank) that then
// failed with err, and returns err, joined with the free's failure if
// MPI_Comm_free fails too. (It takes h, not &h.comm, so that cgo's pointer
// check looks at the field only, not at h's Go pointers.)
func discard(h *handle, op string, rank int, err error) error {
	if rc := mpi(func() C.int { return C.gc_free(&h.comm) }); rc != C.MPI_SUCCESS {
		return errors.Join(err, mpiError(op, "MPI_Comm_free", rank, rc))
	}
	return err
}

// setTopology finds the node of every rank of c, from RanksPerNodeEnv or
// MPI_COMM_TYPE_SHARED, and sets c.topo. Every rank sees the same node
// list, so a refusal is the same on every rank.
func (c *Comm) setTopology() error {
	nodeOf := make([]int, c.size)
	if v := os.Getenv(RanksPerNodeEnv); v != "" {
		k, err := strconv.Atoi(v)
		if err != nil || k < 1 || c.size%k != 0 {
			return fmt.Errorf("comm/mpi: Init on rank %d: %s=%q: want a positive integer dividing the world size %d", c.rank, RanksPerNodeEnv, v, c.size)
		}
		for r := range nodeOf {
			nodeOf[r] = r / k
		}
	} else {
		leaders := make([]C.int, c.size)
		if rc := mpi(func() C.int { return C.gc_node_leaders(c.h.comm, C.int(c.rank), &leaders[0]) }); rc != C.MPI_SUCCESS {
			return mpiError("Init", "MPI_Comm_split_type", c.rank, rc)
		}
		for r, l := range leaders {
			nodeOf[r] = int(l)
		}
	}
	topo, err := comm.NodeTopologies(nodeOf)
	if err != nil {
		return fmt.Errorf("comm/mpi: Init on rank %d: %w", c.rank, err)
	}
	c.topo = topo[c.rank]
	return nil
}

// setRankSize sets MPI_ERRORS_RETURN on c's communicator, made by op on
// rank (of the communicator op was called on; -1 when unknown), and reads
// c's rank and size.
func (c *Comm) setRankSize(op string, rank int) error {
	var r, size C.int
	for _, f := range []struct {
		name string
		call func() C.int
	}{
		{"MPI_Comm_set_errhandler", func() C.int { return C.gc_errors_return(c.h.comm) }},
		{"MPI_Comm_rank", func() C.int { return C.gc_rank(c.h.comm, &r) }},
		{"MPI_Comm_size", func() C.int { return C.gc_size(c.h.comm, &size) }},
	} {
		if rc := mpi(f.call); rc != C.MPI_SUCCESS {
			return mpiError(op, f.name, rank, rc)
		}
	}
	c.rank, c.size = int(r), int(size)
	return nil
}

func (c *Comm) dup(ctx context.Context, cfg config) (*Comm, error) {
	nc := &Comm{topo: c.topo, cfg: cfg, h: newHandle()}
	err := c.collective(ctx, check.Call{Op: comm.OpDup}, func(r *request) (string, C.int) {
		r.pin.Pin(nc)
		return "MPI_Comm_idup", C.gc_idup(c.h.comm, &nc.h.comm, &r.req)
	})
	if err != nil {
		return nil, err
	}
	if err := nc.setRankSize("Dup", c.rank); err != nil {
		return nil, discard(nc.h, "Dup", c.rank, err)
	}
	return nc, nil
}

// split makes Split's node and cross-node communicators: under c's guard
// (one call in flight, as a Dup), a Barrier on c that honours ctx, then
// two MPI_Comm_split calls, which block until every rank makes them.
func (c *Comm) split(ctx context.Context) (node, cross *Comm, err error) {
	if err := c.h.guard.Enter(comm.OpDup, c.rank); err != nil {
		return nil, nil, fmt.Errorf("comm/mpi: Split on rank %d: %w", c.rank, err)
	}
	defer c.h.guard.Exit()
	barrier := func(r *request) (string, C.int) { return "MPI_Ibarrier", C.gc_ibarrier(c.h.comm, &r.req) }
	if err := c.entered(ctx, check.Barrier(), barrier); err != nil {
		return nil, nil, fmt.Errorf("comm/mpi: Split on rank %d: %w", c.rank, err)
	}
	t := c.topo
	if node, err = c.splitBy(t.Node, c.rank, comm.Topology{Nodes: 1, LocalRank: t.LocalRank, LocalSize: t.LocalSize}); err != nil {
		return nil, nil, err
	}
	if cross, err = c.splitBy(t.LocalRank, t.Node, comm.Topology{Node: t.Node, Nodes: t.Nodes, LocalSize: 1}); err != nil {
		return nil, nil, errors.Join(err, node.Close())
	}
	return node, cross, nil
}

// splitBy returns the communicator of MPI_Comm_split(c, color, key) with
// topology topo and c's options. A failure of MPI_Comm_split leaves c out
// of step with the ranks it succeeded on, so it poisons c.
func (c *Comm) splitBy(color, key int, topo comm.Topology) (*Comm, error) {
	nc := &Comm{topo: topo, cfg: c.cfg, h: newHandle()}
	if rc := mpi(func() C.int { return C.gc_split(c.h.comm, C.int(color), C.int(key), &nc.h.comm) }); rc != C.MPI_SUCCESS {
		err := mpiError("Split", "MPI_Comm_split", c.rank, rc)
		c.fail(err, nil)
		return nil, err
	}
	if err := nc.setRankSize("Split", c.rank); err != nil {
		return nil, discard(nc.h, "Split", c.rank, err)
	}
	return nc, nil
}

// issuer returns the issuer of collective op with a's buffers.
func (c *Comm) issuer(op comm.Op, a args) issuer {
	return func(r *request) (string, C.int) {
		switch op {
		case comm.OpAllReduce:
			return "MPI_Iallreduce", C.gc_iallreduce((*C.float)(pin(r, a.f32)), C.int(len(a.f32)), c.h.comm, &r.req)
		case comm.OpAllGather:
			return "MPI_Iallgather", C.gc_iallgather(pin(r, a.bsrc), C.int(len(a.bsrc)), pin(r, a.b), c.h.comm, &r.req)
		case comm.OpReduceScatter:
			return "MPI_Ireduce_scatter_block", C.gc_ireduce_scatter((*C.float)(pin(r, a.f32src)), (*C.float)(pin(r, a.f32)),
				C.int(len(a.f32)), c.h.comm, &r.req)
		case comm.OpAllToAll:
			return "MPI_Ialltoall", C.gc_ialltoall(pin(r, a.bsrc), pin(r, a.b), C.int(len(a.bsrc)/c.size), c.h.comm, &r.req)
		case comm.OpBroadcast:
			return "MPI_Ibcast", C.gc_ibcast(pin(r, a.b), C.int(len(a.b)), C.int(a.root), c.h.comm, &r.req)
		}
		return "MPI_Ibarrier", C.gc_ibarrier(c.h.comm, &r.req)
	}
}

// run is a blocking collective: the start of call, then its wait.
func (c *Comm) run(ctx context.Context, call check.Call, a args) error {
	return c.collective(ctx, call, c.issuer(call.Op, a))
}

// start is a comm.Starter's start of call: it takes one of the guard's
// InFlight places, which the request's first Wait gives back.
func (c *Comm) start(ctx context.Context, call check.Call, a args) (comm.Request, error) {
	if err := c.h.guard.Start(call.Op, c.rank, InFlight); err != nil {
		return nil, err
	}
	r, err := c.begin(ctx, call, c.issuer(call.Op, a))
	if err != nil {
		c.h.guard.Finish()
		return nil, err
	}
	return &started{c: c, r: r}, nil
}

// started is the comm.Request of a started collective.
type started struct {
	c    *Comm
	r    *request
	once sync.Once
	err  error // the first Wait's result
}

// Wait implements comm.Request: it polls the collective as a blocking call
// does, once; later Waits return the first one's result.
func (s *started) Wait(ctx context.Context) error {
	s.once.Do(func() {
		s.err = s.c.wait(ctx, s.r)
		s.c.h.guard.Finish()
	})
	return s.err
}

// collective runs one blocking call on c: the guard, then entered.
func (c *Comm) collective(ctx context.Context, call check.Call, issue issuer) error {
	if err := c.h.guard.Enter(call.Op, c.rank); err != nil {
		return err
	}
	defer c.h.guard.Exit()
	return c.entered(ctx, call, issue)
}

// entered is a blocking call's work once the caller holds c's guard: the
// start (begin) and the wait.
func (c *Comm) entered(ctx context.Context, call check.Call, issue issuer) error {
	r, err := c.begin(ctx, call, issue)
	if err != nil {
		return err
	}
	return c.wait(ctx, r)
}

// begin starts call on c, blocking or started: it fails at once on a
// closed or failed c, runs the argument check when it is on (waiting for
// the header exchange, bounded by ctx), and issues the collective.
func (c *Comm) begin(ctx context.Context, call check.Call, issue issuer) (*request, error) {
	if err := c.usable(call.Op); err != nil {
		return nil, err
	}
	if c.cfg.argCheck {
		if err := c.agree(ctx, call); err != nil {
			return nil, err
		}
	} else if call.Err != nil {
		return nil, call.Err
	}
	return c.issue(call.Op, issue)
}

// issue makes the non-blocking MPI call of op with f and returns its
// request, outstanding, unless c is closed or failed. It holds c's lock,
// so that Close, which fails every outstanding request under it, sees the
// request or keeps it from being issued. A failure of the call poisons c.
func (c *Comm) issue(op comm.Op, f issuer) (*request, error) {
	h := c.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if err := c.usableLocked(op); err != nil {
		return nil, err
	}
	r := &request{op: op}
	var fn string
	if rc := mpi(func() C.int { var rc C.int; fn, rc = f(r); return rc }); rc != C.MPI_SUCCESS {
		r.pin.Unpin()
		err := mpiError(op.String(), fn, c.rank, rc)
		c.failLocked(err, nil)
		return nil, err
	}
	h.outstanding = append(h.outstanding, r)
	return r, nil
}

// header layout: op, length, root, valid (int64 little-endian), then the
// reason of an invalid call, truncated to fit.
const (
	headerLen = 128
	reasonAt  = 32
)

// agree exchanges c's call with every rank and returns the error all ranks
// report for the set (nil when they agree), or the failure of the exchange.
func (c *Comm) agree(ctx context.Context, call check.Call) error {
	mine := make([]byte, headerLen)
	valid := int64(1)
	if call.Err != nil {
		valid = 0
		reason := call.Err.Error()
		if a, ok := call.Err.(*comm.ArgumentError); ok {
			reason = a.Reason
		}
		copy(mine[reasonAt:], reason)
	}
	for i, v := range []int64{int64(call.Op), int64(call.Len), int64(call.Root), valid} {
		binary.LittleEndian.PutUint64(mine[8*i:], uint64(v))
	}
	all := make([]byte, headerLen*c.size)
	r, err := c.issue(call.Op, func(r *request) (string, C.int) {
		return "MPI_Iallgather (argument check)", C.gc_iallgather(pin(r, mine), headerLen, pin(r, all), c.h.comm, &r.req)
	})
	if err != nil {
		return err
	}
	if err := c.wait(ctx, r); err != nil {
		return err
	}
	if call.Err != nil {
		return call.Err
	}
	calls := make([]check.Call, c.size)
	for q := range calls {
		h := all[q*headerLen : (q+1)*headerLen]
		word := func(i int) int64 { return int64(binary.LittleEndian.Uint64(h[8*i:])) }
		calls[q] = check.Call{Op: comm.Op(word(0)), Len: int(word(1)), Root: int(word(2))}
		if word(3) == 0 {
			reason := strings.ToValidUTF8(strings.TrimRight(string(h[reasonAt:]), "\x00"), "…")
			calls[q].Err = &comm.ArgumentError{Op: calls[q].Op, Rank: q, Reason: reason}
		}
	}
	return check.Agree(calls)
}

// wait polls r until it is settled or ctx ends; then it abandons r and
// poisons c. A failure elsewhere on c (another request, Close) settles r
// and wakes wait at once.
func (c *Comm) wait(ctx context.Context, r *request) error {
	timer := time.NewTimer(time.Hour)
	defer timer.Stop()
	delay := minPoll
	for i := 0; ; i++ {
		if done, err := c.poll(r); done {
			return err
		}
		if ctx.Err() != nil { // tested once more after ctx ended: it did not complete
			return c.fail(&comm.IncompleteError{Op: r.op, Rank: c.rank, Err: ctx.Err()}, r)
		}
		if i < spinPolls {
			runtime.Gosched()
			continue
		}
		timer.Reset(delay)
		delay = min(2*delay, maxPoll)
		select {
		case <-ctx.Done():
		case <-c.h.failedCh:
		case <-timer.C:
		}
	}
}

// poll returns r's result and true once r is settled: it tests r
// (MPI_Test) unless a failure settled it already. Completion unpins r's
// buffers; an MPI error poisons c.
func (c *Comm) poll(r *request) (bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if settled, err := c.result(r); settled {
		return true, err
	}
	if proc.finalized.Load() { // MPI_Finalize ran (the world was closed first): no more MPI calls
		c.fail(&comm.ClosedError{Rank: c.rank}, nil)
		return c.result(r)
	}
	var flag C.int
	if rc := mpi(func() C.int { return C.gc_test(&r.req, &flag) }); rc != C.MPI_SUCCESS {
		return true, c.fail(mpiError(r.op.String(), "MPI_Test", c.rank, rc), r)
	}
	if flag == 0 {
		return false, nil
	}
	r.pin.Unpin()
	return true, c.complete(r)
}

// result returns whether r is settled and its result.
func (c *Comm) result(r *request) (bool, error) {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	return r.settled, r.err
}

// complete settles r, which MPI completed, with nil, unless a failure
// settled it first: then r stays abandoned and keeps that failure.
func (c *Comm) complete(r *request) error {
	h := c.h
	h.mu.Lock()
	defer h.mu.Unlock()
	if r.settled {
		return r.err
	}
	r.settled = true
	h.outstanding = slices.DeleteFunc(h.outstanding, func(q *request) bool { return q == r })
	return nil
}

// fail poisons c (see failLocked) and returns r's result.
func (c *Comm) fail(cause error, r *request) error {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	return c.failLocked(cause, r)
}

// failLocked poisons c with cause unless it failed already, settles r
// (when not nil and not settled yet) with cause and every other
// outstanding request with a *comm.PoisonedError wrapping the first
// failure, keeps them all as abandoned, and returns r's result (nil for a
// nil r). c.h.mu is held.
func (c *Comm) failLocked(cause error, r *request) error {
	h := c.h
	if h.failed == nil {
		h.failed = cause
		close(h.failedCh)
	}
	if r != nil && !r.settled {
		r.settled, r.err = true, cause
	}
	for _, q := range h.outstanding {
		if !q.settled {
			q.settled, q.err = true, &comm.PoisonedError{Op: q.op, Rank: c.rank, Cause: h.failed}
		}
	}
	h.abandoned = append(h.abandoned, h.outstanding...)
	h.outstanding = nil
	if r == nil {
		return nil
	}
	return r.err
}

// usable returns the *comm.PoisonedError for a call of op on a closed or
// failed c, else nil.
func (c *Comm) usable(op comm.Op) error {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	return c.usableLocked(op)
}

// usableLocked is usable with c.h.mu held.
func (c *Comm) usableLocked(op comm.Op) error {
	switch {
	case c.h.closed || proc.finalized.Load():
		return &comm.PoisonedError{Op: op, Rank: c.rank, Cause: &comm.ClosedError{Rank: c.rank}}
	case c.h.failed != nil:
		return &comm.PoisonedError{Op: op, Rank: c.rank, Cause: c.h.failed}
	}
	return nil
}

func (c *Comm) close() error {
	h := c.h
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		return nil
	}
	h.closed = true
	// Every outstanding request, started or of a call in flight, fails and
	// is abandoned; nothing more is issued.
	c.failLocked(&comm.ClosedError{Rank: c.rank}, nil)
	h.mu.Unlock()
	<-h.guard.Idle() // a call in flight has seen the failure and returned

	if proc.finalized.Load() {
		c.leak() // MPI_Finalize released every communicator
		return nil
	}
	if pending := c.drain(); pending > 0 {
		c.leak()
		return fmt.Errorf("comm/mpi: Close on rank %d: %d abandoned collective(s) still pending after %v (first failure: %v); the communicator was not freed and MPI not finalized: end the job with Abort",
			c.rank, pending, c.cfg.drain, c.firstFailure())
	}
	proc.mu.Lock()
	defer proc.mu.Unlock()
	if rc := mpi(func() C.int { return C.gc_free(&h.comm) }); rc != C.MPI_SUCCESS {
		return mpiError("Close", "MPI_Comm_free", c.rank, rc)
	}
	if !h.world || !proc.ownMPI {
		return nil
	}
	var rc C.int
	onMainThread(func() { rc = mpi(func() C.int { return C.gc_finalize() }) })
	proc.finalized.Store(true)
	if rc != C.MPI_SUCCESS {
		return mpiError("Close", "MPI_Finalize", c.rank, rc)
	}
	return nil
}

// firstFailure returns the failure that poisoned c.
func (c *Comm) firstFailure() error {
	c.h.mu.Lock()
	defer c.h.mu.Unlock()
	return c.h.failed
}

// leak keeps c's abandoned requests, and the buffers they pin, for the rest
// of the process: MPI may still write into them.
func (c *Comm) leak() {
	c.h.mu.Lock()
	abandoned := c.h.abandoned
	c.h.abandoned = nil
	c.h.mu.Unlock()
	proc.mu.Lock()
	defer proc.mu.Unlock()
	proc.leaked = append(proc.leaked, abandoned...)
}

// drain polls the abandoned requests for up to the drain timeout, releases
// the completed ones, and returns how many remain. It runs after Close
// failed every outstanding request, so none is added meanwhile; a waiter
// still testing one finishes its test first (request.mu).
func (c *Comm) drain() int {
	deadline := time.Now().Add(c.cfg.drain)
	h := c.h
	for {
		h.mu.Lock()
		abandoned := h.abandoned
		h.mu.Unlock()
		var left []*request
		for _, r := range abandoned {
			if !drained(r) {
				left = append(left, r)
			}
		}
		h.mu.Lock()
		h.abandoned = left
		h.mu.Unlock()
		if len(left) == 0 || time.Now().After(deadline) {
			return len(left)
		}
		time.Sleep(maxPoll)
	}
}

// drained tests the abandoned request r once and unpins it if MPI
// completed it (at once for one its waiter saw complete: MPI_Test of
// MPI_REQUEST_NULL).
func drained(r *request) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	var flag C.int
	if rc := mpi(func() C.int { return C.gc_test(&r.req, &flag) }); rc != C.MPI_SUCCESS || flag == 0 {
		return false
	}
	r.pin.Unpin()
	return true
}

func (c *Comm) abort(code int) {
	fmt.Fprintf(os.Stderr, "comm/mpi: rank %d of %d aborts the job with code %d\n", c.rank, c.size, code)
	mpi(func() C.int { return C.gc_abort(c.h.comm, C.int(code)) })
	os.Exit(code) // MPI_Abort returned: should not happen
}
