package nccl

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"math"
	"runtime"
	"slices"
	"sync"
	"time"
	"unsafe"
)

// DefaultTimeout is a communicator's timeout unless WithTimeout says
// otherwise: the longest one call (InitRank, Split, Run, Wait, Destroy) may
// run before the communicator is aborted.
const DefaultTimeout = 60 * time.Second

// DefaultAbortGrace is how long, unless WithAbortGrace says otherwise, a
// call waits after ncclCommAbort for the NCCL call it aborted to return.
const DefaultAbortGrace = 10 * time.Second

// spinYields is how many times a call's watcher yields, checking for the
// call's return, before it sleeps on timers.
const spinYields = 64

// pollEvery is how often a running NCCL call's communicators are asked for
// asynchronous errors.
const pollEvery = time.Millisecond

// Option configures a communicator (InitRank, Split).
type Option func(*commOptions) error

type commOptions struct {
	timeout, grace time.Duration
	device         int          // the CUDA device ordinal for InitRank; -1: the thread's current one
	bind           func() error // WithDeviceBinder's; nil: WithDevice binds through the CUDA driver
}

// WithTimeout sets the communicator's timeout (default DefaultTimeout,
// must be > 0). A call that runs longer, or whose ctx ends first, aborts
// the communicator and returns an *AbortError.
func WithTimeout(d time.Duration) Option {
	return func(o *commOptions) error {
		if d <= 0 {
			return fmt.Errorf("nccl: WithTimeout(%v): must be > 0", d)
		}
		o.timeout = d
		return nil
	}
}

// WithAbortGrace sets how long a call waits, after aborting, for the NCCL
// call to return (default DefaultAbortGrace, must be > 0). After that the
// call returns anyway and leaves the blocked thread behind, so no call
// waits longer than timeout + 2·grace in all (the abort itself is bounded
// by grace too).
func WithAbortGrace(d time.Duration) Option {
	return func(o *commOptions) error {
		if d <= 0 {
			return fmt.Errorf("nccl: WithAbortGrace(%v): must be > 0", d)
		}
		o.grace = d
		return nil
	}
}

// WithDevice makes InitRank create the communicator on CUDA device ordinal
// d (≥ 0, counted among the devices CUDA_VISIBLE_DEVICES leaves): the init
// thread makes d's primary context current (libcuda.so.1: cuInit,
// cuDeviceGet, cuDevicePrimaryCtxRetain, cuCtxSetCurrent) before
// ncclCommInitRank. A failure there is a *CUDAError and nothing reaches
// NCCL. Without WithDevice the device is the init thread's current one,
// which for a fresh thread is device 0. Split refuses it: a communicator
// split from another is on its parent's device.
func WithDevice(d int) Option {
	return func(o *commOptions) error {
		if d < 0 {
			return fmt.Errorf("nccl: WithDevice(%d): must be ≥ 0", d)
		}
		o.device, o.bind = d, nil
		return nil
	}
}

// WithDeviceBinder is WithDevice for a build whose devices are not CUDA's
// (a fake GPU in front of the mock NCCL, say): InitRank calls bind on the
// init thread, which is locked to its OS thread for the whole call, in
// place of the CUDA driver calls, then ncclCommInitRank on the same
// thread. bind makes device d (≥ 0, recorded as the communicator's
// device) current there however the build's devices do; its error,
// wrapped with the device and rank, ends InitRank before NCCL sees
// anything. bind must not be nil. Split refuses it, as it refuses
// WithDevice.
func WithDeviceBinder(d int, bind func() error) Option {
	return func(o *commOptions) error {
		switch {
		case d < 0:
			return fmt.Errorf("nccl: WithDeviceBinder(%d): must be ≥ 0", d)
		case bind == nil:
			return fmt.Errorf("nccl: WithDeviceBinder(%d): nil bind function", d)
		}
		o.device, o.bind = d, bind
		return nil
	}
}

// Comm is one rank's NCCL communicator (an ncclComm_t).
//
// # Streams
//
// Run enqueues work on the ops' CUDA streams and returns once it is
// enqueued; it never synchronizes a stream or the host with the GPU. The
// work completes later, in stream order. To wait for it on the host, record
// a CUDA event after the ops and call Wait with a probe that queries the
// event (cuEventQuery): Wait polls the probe and the communicator's
// asynchronous errors until completion, the deadline or an error.
//
// # Concurrency and failure
//
// NCCL communicators are not thread-safe: Run, Wait, Split and Destroy on
// one Comm take turns (a call waits for the previous one, or for its ctx).
// Abort and AsyncError may be called at any time, from any goroutine.
//
// Every call runs the NCCL function on its own locked OS thread while the
// calling goroutine watches it: when the communicator's timeout passes or
// ctx ends first, or ncclCommGetAsyncError reports an error, the
// communicator is aborted (ncclCommAbort, which makes a blocked NCCL call
// return) and the call returns an *AbortError; it never hangs (see
// WithAbortGrace). An aborted or destroyed Comm returns a *DestroyedError
// from every later call. An NCCL function that returns an error without an
// asynchronous error (an invalid argument, say) leaves the Comm usable.
type Comm struct {
	lib        *Library
	h          uintptr // the ncclComm_t; not touched once gone is set
	rank, size int
	o          commOptions
	turn       chan struct{} // holds a token while Run, Wait, Split or Destroy runs

	mu    sync.Mutex // guards the fields below, and every use of h outside a turn
	gone  bool       // h was aborted or destroyed
	ended bool       // the Comm is unusable
	cause error      // why it ended; nil after Destroy
}

// InitRank creates rank's end of a communicator of nranks ranks
// (ncclCommInitRank); every rank calls it with the same id, nranks and
// options, at about the same time, and it returns once all have joined.
// The GPU is the one WithDevice (or WithDeviceBinder) names, else device
// 0 (InitRank runs ncclCommInitRank on a thread of its own, whose current
// device is the CUDA default).
//
// When the timeout passes or ctx ends before every rank has joined, the
// communicator is aborted if NCCL has created it yet and InitRank returns
// an *AbortError.
func (l *Library) InitRank(ctx context.Context, nranks int, id UniqueID, rank int, opts ...Option) (*Comm, error) {
	o := commOptions{timeout: DefaultTimeout, grace: DefaultAbortGrace, device: -1}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	bad := func(format string, args ...any) error {
		return &ArgumentError{Func: fnCommInitRank.String(), Reason: fmt.Sprintf(format, args...)}
	}
	switch {
	case nranks < 1:
		return nil, bad("nranks = %d, want ≥ 1", nranks)
	case rank < 0 || rank >= nranks:
		return nil, bad("rank %d out of range [0, %d)", rank, nranks)
	case id.IsZero():
		return nil, bad("zero UniqueID (get one from GetUniqueID on one rank and hand it to every rank)")
	}
	slot := newCommSlot()
	in := new(UniqueID)
	*in = id
	var mu sync.Mutex // orders the watchdog's use of the new handle against its abort
	aborted := false
	w := watch{
		fn: fnCommInitRank, rank: rank, o: o,
		poll: func() error {
			mu.Lock()
			defer mu.Unlock()
			if h := slot.load(); h != 0 && !aborted {
				return l.asyncError(h, rank)
			}
			return nil
		},
		abort: func(error) (bool, error) {
			mu.Lock()
			h := slot.load()
			aborted = h != 0
			mu.Unlock()
			if h == 0 {
				return false, nil
			}
			return true, l.abort(h, rank, o.grace)
		},
	}
	returned, err := l.supervise(ctx, w, func() error {
		switch {
		case o.bind != nil:
			if err := o.bind(); err != nil {
				return fmt.Errorf("nccl: %v on rank %d: binding device %d: %w", fnCommInitRank, rank, o.device, err)
			}
		case o.device >= 0:
			if err := bindDevice(o.device); err != nil {
				return err
			}
		}
		r := ccall(l.fns[fnCommInitRank], fnCommInitRank, &[7]uintptr{uintptr(nranks), uintptr(rank)}, slot.ptr(), unsafe.Pointer(in))
		if r != ResultSuccess {
			return l.errorf(fnCommInitRank, rank, r, slot.load())
		}
		return nil
	})
	if !returned {
		return nil, err // the slot stays allocated: the blocked call may still write it
	}
	h := slot.load()
	slot.free()
	if err != nil {
		return nil, err
	}
	return &Comm{lib: l, h: h, rank: rank, size: nranks, o: o, turn: make(chan struct{}, 1)}, nil
}

// NoColor is the color (NCCL_SPLIT_NOCOLOR) with which a rank takes part in
// a Split without joining any of the new communicators.
const NoColor = -1

// Split makes this rank's end of a new communicator of the ranks of c
// that pass the same color (ncclCommSplit, NCCL ≥ 2.18). It is collective
// over every rank of c: all call it, in the same order relative to their
// other calls on c, and it returns once all have. The new communicator's
// ranks are ordered by key, ties by their rank in c; its Rank and Size are
// those NCCL reports (ncclCommUserRank, ncclCommCount). A rank that passes
// NoColor joins none and gets a nil *Comm and a nil error. color must be
// ≥ 0 or NoColor, key ≥ 0, and both fit a C int (*ArgumentError
// otherwise, before NCCL sees them).
//
// The new Comm is on c's device (WithDevice is refused) and has c's
// timeout and abort grace unless opts say otherwise (WithTimeout,
// WithAbortGrace); NCCL gives it its default configuration (a NULL
// ncclConfig_t). It is independent of c afterwards: destroying or aborting
// either leaves the other usable.
//
// Split takes c's turn, and runs under the new communicator's timeout,
// ctx and c's asynchronous errors, as InitRank does: the exchange of colors
// and keys runs over c, so when the timeout passes or ctx ends before every
// rank has called Split (or c reports an asynchronous error), c is aborted,
// and so is the new communicator if NCCL has made it yet, and Split
// returns an *AbortError naming ncclCommSplit and c's rank; c is ended
// then. An NCCL failure is an *Error and leaves c usable. A library
// without ncclCommSplit (NCCL < 2.18, which Open loads) fails here with an
// *UnsupportedError naming the function and the library's version.
func (c *Comm) Split(ctx context.Context, color, key int, opts ...Option) (*Comm, error) {
	const f = fnCommSplit
	o := commOptions{timeout: c.o.timeout, grace: c.o.grace, device: -1}
	for _, opt := range opts {
		if err := opt(&o); err != nil {
			return nil, err
		}
	}
	bad := func(format string, args ...any) error {
		return &ArgumentError{Func: f.String(), Reason: fmt.Sprintf("rank %d: ", c.rank) + fmt.Sprintf(format, args...)}
	}
	switch {
	case o.device >= 0 && o.bind != nil:
		return nil, bad("WithDeviceBinder(%d): the new communicator is on the parent's device", o.device)
	case o.device >= 0:
		return nil, bad("WithDevice(%d): the new communicator is on the parent's device", o.device)
	case color < NoColor:
		return nil, bad("color = %d, want ≥ 0, or NoColor (%d) to join no group", color, NoColor)
	case key < 0:
		return nil, bad("key = %d, want ≥ 0", key)
	case color > math.MaxInt32 || key > math.MaxInt32:
		return nil, bad("color = %d, key = %d: each must fit a C int (≤ %d)", color, key, math.MaxInt32)
	case c.lib.fns[f] == 0:
		return nil, c.lib.unsupported(f, c.rank)
	}
	o.device, o.bind = c.o.device, nil
	if err := c.take(ctx, f.String()); err != nil {
		return nil, err
	}
	defer c.release()
	l := c.lib
	slot := newCommSlot()
	var mu sync.Mutex // orders the watchdog's use of the new handle against its abort
	aborted := false
	w := watch{
		fn: f, rank: c.rank, o: o,
		poll: func() error {
			if err := c.pollAsync(); err != nil {
				return err
			}
			mu.Lock()
			defer mu.Unlock()
			if h := slot.load(); h != 0 && !aborted {
				return l.asyncError(h, c.rank)
			}
			return nil
		},
		abort: func(cause error) (bool, error) {
			mu.Lock()
			h := slot.load()
			aborted = true
			mu.Unlock()
			errs := []error{c.abort(cause)}
			if h != 0 {
				errs = append(errs, l.abort(h, c.rank, o.grace))
			}
			return true, errors.Join(errs...)
		},
	}
	var rank, size int32
	returned, err := l.supervise(ctx, w, func() error {
		a := &[7]uintptr{c.h, uintptr(int64(color)), uintptr(int64(key))}
		if r := ccall(l.fns[f], f, a, slot.ptr(), nil); r != ResultSuccess {
			return l.errorf(f, c.rank, r, c.h)
		}
		h := slot.load()
		switch {
		case h == 0 && color == NoColor:
			return nil
		case h == 0:
			return fmt.Errorf("nccl: %v on rank %d: NCCL returned success but no communicator for color %d", f, c.rank, color)
		}
		for _, q := range []struct {
			fn  fnID
			out *int32
		}{{fnCommUserRank, &rank}, {fnCommCount, &size}} {
			if r := ccall(l.fns[q.fn], q.fn, &[7]uintptr{h}, unsafe.Pointer(q.out), nil); r != ResultSuccess {
				err := l.errorf(q.fn, c.rank, r, h)
				ccall(l.fns[fnCommAbort], fnCommAbort, &[7]uintptr{h}, nil, nil)
				return err
			}
		}
		if size < 1 || rank < 0 || rank >= size {
			ccall(l.fns[fnCommAbort], fnCommAbort, &[7]uintptr{h}, nil, nil)
			return fmt.Errorf("nccl: %v on rank %d: NCCL reports rank %d of %d for the new communicator", f, c.rank, rank, size)
		}
		return nil
	})
	if !returned {
		return nil, err // the slot stays allocated: the blocked call may still write it
	}
	h := slot.load()
	slot.free()
	switch {
	case err != nil:
		return nil, err
	case h == 0:
		return nil, nil
	}
	return &Comm{lib: l, h: h, rank: int(rank), size: int(size), o: o, turn: make(chan struct{}, 1)}, nil
}

// Library returns the library the communicator was made with.
func (c *Comm) Library() *Library { return c.lib }

// Rank returns this rank's index in [0, Size()). It never blocks.
func (c *Comm) Rank() int { return c.rank }

// Size returns the number of ranks. It never blocks.
func (c *Comm) Size() int { return c.size }

// Run enqueues ops on their streams: one op alone, several as one NCCL
// group (ncclGroupStart, the ops, ncclGroupEnd, on one OS thread), which is
// how sends and receives that depend on each other must be issued. It
// returns once NCCL has accepted the work; see the Comm documentation for
// streams and failure. Every op is checked first (*ArgumentError, nothing
// enqueued); an NCCL failure is an *Error naming the function.
func (c *Comm) Run(ctx context.Context, ops ...Op) error {
	calls := make([]Call, len(ops))
	for i, o := range ops {
		calls[i] = Call{c, o}
	}
	return c.lib.Group(ctx, calls...)
}

// Call is one op on one communicator, for Library.Group.
type Call struct {
	Comm *Comm
	Op   Op
}

// Group enqueues calls, possibly on several communicators of this library
// (one process driving several GPUs), as one NCCL group on one OS thread.
// It takes a turn on every communicator involved, uses the shortest of
// their timeouts, and on a timeout, an ended ctx or an asynchronous error
// aborts them all. Otherwise it behaves as Comm.Run.
func (l *Library) Group(ctx context.Context, calls ...Call) error {
	if len(calls) == 0 {
		return &ArgumentError{Func: "ncclGroupStart", Reason: "no ops to enqueue"}
	}
	var comms []*Comm
	for i, cl := range calls {
		switch {
		case cl.Comm == nil:
			return &ArgumentError{Func: "ncclGroupStart", Reason: fmt.Sprintf("call %d has a nil Comm", i)}
		case cl.Comm.lib != l:
			return &ArgumentError{Func: "ncclGroupStart", Reason: fmt.Sprintf("call %d's Comm belongs to another Library", i)}
		}
		if err := cl.Op.check(cl.Comm.rank, cl.Comm.size); err != nil {
			return err
		}
		if !slices.Contains(comms, cl.Comm) {
			comms = append(comms, cl.Comm)
		}
	}
	// Take turns in one global order, so two Groups over the same Comms
	// cannot each hold one and wait for the other.
	slices.SortFunc(comms, func(a, b *Comm) int {
		return cmp.Compare(uintptr(unsafe.Pointer(a)), uintptr(unsafe.Pointer(b)))
	})
	first := calls[0].Op.fn
	if len(calls) > 1 {
		first = fnGroupEnd
	}
	o := comms[0].o
	for _, c := range comms {
		if err := c.take(ctx, first.String()); err != nil {
			return err
		}
		defer c.release()
		o.timeout = min(o.timeout, c.o.timeout)
		o.grace = max(o.grace, c.o.grace)
	}
	w := watch{fn: first, rank: calls[0].Comm.rank, o: o,
		poll: func() error {
			for _, c := range comms {
				if err := c.pollAsync(); err != nil {
					return err
				}
			}
			return nil
		},
		abort: func(cause error) (bool, error) {
			var errs []error
			for _, c := range comms {
				errs = append(errs, c.abort(cause))
			}
			return true, errors.Join(errs...)
		},
	}
	_, err := l.supervise(ctx, w, func() error {
		if len(calls) == 1 {
			return l.enqueue(calls[0])
		}
		if r := ccall(l.fns[fnGroupStart], fnGroupStart, &[7]uintptr{}, nil, nil); r != ResultSuccess {
			return l.errorf(fnGroupStart, calls[0].Comm.rank, r, 0)
		}
		var first error
		for _, cl := range calls {
			if err := l.enqueue(cl); err != nil && first == nil {
				first = err
			}
		}
		if r := ccall(l.fns[fnGroupEnd], fnGroupEnd, &[7]uintptr{}, nil, nil); r != ResultSuccess && first == nil {
			first = l.errorf(fnGroupEnd, calls[0].Comm.rank, r, 0)
		}
		return first
	})
	return err
}

// enqueue makes the NCCL call of cl (on the current, locked thread).
func (l *Library) enqueue(cl Call) error {
	h := cl.Comm.h
	if r := ccall(l.fns[cl.Op.fn], cl.Op.fn, cl.Op.args(h), nil, nil); r != ResultSuccess {
		return l.errorf(cl.Op.fn, cl.Comm.rank, r, h)
	}
	return nil
}

// Wait blocks until done reports true, polling it and the communicator's
// asynchronous errors: first 64 times with runtime.Gosched between polls,
// then sleeping from 10 µs doubling up to 1 ms. done is typically a query
// of a CUDA event recorded after the work (true: complete; an error ends
// Wait with that error, wrapped, and leaves the Comm usable). When NCCL
// reports an asynchronous error, or the timeout passes or ctx ends first,
// Wait aborts the communicator and returns an *AbortError.
func (c *Comm) Wait(ctx context.Context, done func() (bool, error)) error {
	const name = "Wait"
	if err := c.take(ctx, name); err != nil {
		return err
	}
	defer c.release()
	start := time.Now()
	deadline := start.Add(c.o.timeout)
	sleep := 10 * time.Microsecond
	for i := 0; ; i++ {
		ok, err := done()
		if err != nil {
			return fmt.Errorf("nccl: Wait on rank %d: completion probe: %w", c.rank, err)
		}
		var cause error
		switch aerr := c.pollAsync(); {
		case aerr != nil:
			cause = aerr
		case ok:
			return nil
		case ctx.Err() != nil:
			cause = ctx.Err()
		case !time.Now().Before(deadline):
			cause = timeoutCause(c.o.timeout)
		}
		if cause != nil {
			return &AbortError{Func: name, Rank: c.rank, Cause: cause, Waited: time.Since(start),
				Aborted: true, AbortErr: c.abort(cause), Returned: true}
		}
		if i < 64 {
			runtime.Gosched()
			continue
		}
		t := time.NewTimer(min(sleep, time.Until(deadline)))
		select {
		case <-ctx.Done():
		case <-t.C:
		}
		t.Stop()
		sleep = min(2*sleep, time.Millisecond)
	}
}

// AsyncError returns the communicator's asynchronous error
// (ncclCommGetAsyncError) as an *Error, nil when there is none, or a
// *DestroyedError once the Comm has ended. It does not abort anything and may
// be called at any time.
func (c *Comm) AsyncError() error {
	c.mu.Lock()
	ended, cause := c.ended, c.cause
	c.mu.Unlock()
	if ended {
		return &DestroyedError{Func: fnCommGetAsyncError.String(), Rank: c.rank, Cause: cause}
	}
	return c.pollAsync()
}

// Abort aborts the communicator (ncclCommAbort): NCCL calls blocked on it
// return, its pending work is dropped, and every later call on the Comm
// returns a *DestroyedError. It may be called from any goroutine while another
// call is in flight, which is its purpose. Aborting an ended Comm does
// nothing and returns nil. ncclCommAbort's own failure, or its not
// returning within the abort grace, is the error.
func (c *Comm) Abort() error {
	return c.abort(errors.New("nccl: aborted by Comm.Abort"))
}

// Destroy frees the communicator (ncclCommDestroy), which waits for the
// work already enqueued on it to finish: Wait for that work first. When
// ncclCommDestroy has not returned within the timeout (or ctx ends first),
// Destroy returns an *AbortError with Aborted false and leaves the call
// running on its thread: aborting a communicator that is being destroyed
// is not safe. Either way the Comm has ended. Destroying an ended Comm
// returns nil.
func (c *Comm) Destroy(ctx context.Context) error {
	c.mu.Lock()
	ended := c.ended
	c.mu.Unlock()
	if ended {
		return nil
	}
	if err := c.take(ctx, fnCommDestroy.String()); err != nil {
		return err
	}
	defer c.release()
	c.mu.Lock()
	if c.ended { // an Abort came in while this call waited for its turn
		c.mu.Unlock()
		return nil
	}
	c.ended, c.gone = true, true
	c.mu.Unlock()
	// Neither polled nor aborted while ncclCommDestroy frees it: either
	// could touch freed memory.
	w := watch{fn: fnCommDestroy, rank: c.rank, o: c.o,
		poll:  func() error { return nil },
		abort: func(error) (bool, error) { return false, nil },
	}
	_, err := c.lib.supervise(ctx, w, func() error {
		if r := ccall(c.lib.fns[fnCommDestroy], fnCommDestroy, &[7]uintptr{c.h}, nil, nil); r != ResultSuccess {
			return c.lib.errorf(fnCommDestroy, c.rank, r, 0)
		}
		return nil
	})
	return err
}

// take waits for the Comm's turn (or ctx) for the call name, and fails
// when the Comm has ended.
func (c *Comm) take(ctx context.Context, name string) error {
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("nccl: %s on rank %d: waiting for the communicator's previous call: %w", name, c.rank, ctx.Err())
	}
	c.mu.Lock()
	ended, cause := c.ended, c.cause
	c.mu.Unlock()
	if ended {
		<-c.turn
		return &DestroyedError{Func: name, Rank: c.rank, Cause: cause}
	}
	return nil
}

func (c *Comm) release() { <-c.turn }

// abort ends the Comm with cause (unless it has ended already) and calls
// ncclCommAbort once, unless the handle is already gone.
func (c *Comm) abort(cause error) error {
	c.mu.Lock()
	if !c.ended {
		c.ended, c.cause = true, cause
	}
	if c.gone {
		c.mu.Unlock()
		return nil
	}
	c.gone = true
	c.mu.Unlock()
	return c.lib.abort(c.h, c.rank, c.o.grace)
}

// pollAsync returns the communicator's asynchronous error, nil when there
// is none or the handle is gone.
func (c *Comm) pollAsync() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.gone {
		return nil
	}
	return c.lib.asyncError(c.h, c.rank)
}

// asyncError calls ncclCommGetAsyncError on h. ncclInProgress (a
// non-blocking communicator still working) is not an error.
func (l *Library) asyncError(h uintptr, rank int) error {
	return lockedCall(func() error {
		res := new(int32)
		if r := ccall(l.fns[fnCommGetAsyncError], fnCommGetAsyncError, &[7]uintptr{h}, unsafe.Pointer(res), nil); r != ResultSuccess {
			return l.errorf(fnCommGetAsyncError, rank, r, h)
		}
		if r := Result(*res); r != ResultSuccess && r != ResultInProgress {
			return l.errorf(fnCommGetAsyncError, rank, r, h)
		}
		return nil
	})
}

// abort calls ncclCommAbort(h) on its own thread and waits for it up to
// grace.
func (l *Library) abort(h uintptr, rank int, grace time.Duration) error {
	done := make(chan error, 1)
	go func() {
		done <- lockedCall(func() error {
			if r := ccall(l.fns[fnCommAbort], fnCommAbort, &[7]uintptr{h}, nil, nil); r != ResultSuccess {
				return l.errorf(fnCommAbort, rank, r, 0)
			}
			return nil
		})
	}()
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
		return fmt.Errorf("nccl: ncclCommAbort on rank %d had not returned after %v", rank, grace)
	}
}

// watch says how supervise watches one NCCL call.
type watch struct {
	fn    fnID
	rank  int
	o     commOptions
	poll  func() error                    // the asynchronous error of the communicators involved
	abort func(cause error) (bool, error) // aborts them for cause; false when nothing was aborted
}

func timeoutCause(d time.Duration) error {
	return fmt.Errorf("no completion within the communicator's timeout of %v: %w", d, context.DeadlineExceeded)
}

// supervise runs call on its own locked OS thread and returns its error,
// unless the timeout passes, ctx ends or poll reports an error first (or
// right after call succeeds): then it aborts through w.abort, waits up to
// the grace for call to return, and returns an *AbortError. returned says
// whether call has returned (false: it is still blocked in NCCL).
func (l *Library) supervise(ctx context.Context, w watch, call func() error) (returned bool, err error) {
	start := time.Now()
	done := make(chan error, 1)
	go func() { done <- lockedCall(call) }()
	returned, err, cause := await(ctx, w, done)
	if cause == nil {
		return returned, err
	}
	ae := &AbortError{Func: w.fn.String(), Rank: w.rank, Cause: cause, Waited: time.Since(start)}
	ae.Aborted, ae.AbortErr = w.abort(cause)
	if !returned {
		t := time.NewTimer(w.o.grace)
		defer t.Stop()
		select {
		case <-done:
			returned = true
		case <-t.C:
		}
	}
	ae.Returned = returned
	return returned, ae
}

// await waits for the call's error on done and returns it (returned
// true), or the cause to abort for: an asynchronous error (also right after
// a successful return), the timeout, or ctx's end.
func await(ctx context.Context, w watch, done <-chan error) (returned bool, err, cause error) {
	// Most calls only enqueue work and return within microseconds: yield
	// to them a few times before sleeping on timers, whose wake-up costs
	// more than the call (BenchmarkRun: about 8 µs per Run without this,
	// 2–4 µs with it).
	for range spinYields {
		select {
		case err := <-done:
			if err != nil {
				return true, err, nil
			}
			return true, nil, w.poll()
		default:
			runtime.Gosched()
		}
	}
	deadline := time.NewTimer(w.o.timeout)
	defer deadline.Stop()
	tick := time.NewTicker(pollEvery)
	defer tick.Stop()
	for {
		select {
		case err := <-done:
			if err != nil {
				return true, err, nil
			}
			return true, nil, w.poll()
		case <-ctx.Done():
			return false, nil, ctx.Err()
		case <-deadline.C:
			return false, nil, timeoutCause(w.o.timeout)
		case <-tick.C:
			if cause := w.poll(); cause != nil {
				return false, nil, cause
			}
		}
	}
}
