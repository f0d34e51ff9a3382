package overlap

import (
	"context"
	"time"

	"github.com/gradcomp/gradcomp/comm"
)

// Several collectives in flight (host backend).
//
// Over a comm.Starter the wire leaves each bucket's last collective in
// flight (a tail) and goes on to the next bucket's, so that several
// buckets are on the link at once, up to the Starter's InFlight(). The
// decode stream waits for a bucket's tail before it decodes. A bucket's
// earlier collectives (SRA's all-to-all, whose statuses decide whether its
// second round runs) are waited for on the wire as before.
//
// A tail's statuses may say the bucket goes dense (a rank's gradient was
// not finite or not representable): that dense all-reduce is a collective
// too, and every rank must make it at the same place in its sequence of
// collectives. The wire makes those at the end of the step, in bucket
// order (settleTails), after every bucket's own collectives, a place that
// does not depend on when the tails complete, nor on InFlight(), so ranks
// whose transports allow different numbers in flight still agree. A
// bucket whose statuses are all ok is decoded as soon as its tail
// completes.
//
// The engine across nodes of a sharded StrategyHier makes its collectives
// one at a time (Engine.starter nil): the node stages wait for each of its
// buckets before they hand it the next, so a path settled at the end of
// its step would never come.

// tail is a bucket's last collective, started and left in flight.
type tail struct {
	req    comm.Request
	ctx    context.Context // bounds its wait: the step's, and Config.Timeout
	cancel context.CancelFunc
	stage  string
	start  time.Time
	// statuses reads the statuses the collective carried (nil: none, the
	// bucket's path is settled).
	statuses func() ([]status, error)
	settled  *event // fires once the wire has settled a path the statuses left open
}

// startTail starts bucket r's last collective with start, leaving it in
// flight as r.tail, and returns true; without a comm.Starter it returns
// false and starts nothing (the caller makes the collective blocking).
// The volume is added to r's stats at once, the time when it completes.
func (e *Engine) startTail(st *step, r *run, stage string, volume [2]int64, statuses func() ([]status, error),
	start func(ctx context.Context, s comm.Starter) (comm.Request, error)) (bool, error) {
	s := e.starter
	if s == nil {
		return false, nil
	}
	e.makeRoom()
	ctx, cancel := context.WithTimeout(st.ctx, e.cfg.Timeout)
	tl := &tail{ctx: ctx, cancel: cancel, stage: stage, start: time.Now(), statuses: statuses, settled: newEvent()}
	r.stats.BytesSent += volume[0]
	r.stats.BytesInNode += volume[1]
	q, err := start(ctx, s)
	if err != nil {
		cancel()
		return true, &StepError{Step: st.num, Bucket: r.b.idx, Stage: stage, Err: err}
	}
	tl.req = q
	r.tail = tl
	e.inFlight = append(e.inFlight, tl)
	return true, nil
}

// makeRoom waits, on the wire, for the oldest tails until the wire can
// start one more collective on e.starter (a tail, or a blocking call,
// which takes a place too). Their results stay with their requests for
// the decode stream.
func (e *Engine) makeRoom() {
	for len(e.inFlight) > 0 && len(e.inFlight) >= e.starter.InFlight()-1 {
		tl := e.inFlight[0]
		e.inFlight = e.inFlight[1:]
		tl.req.Wait(tl.ctx)
	}
}

// waitTail waits, on the decode stream, for r's tail and adds its time to
// r's stats; an ok result leaves r.outcome compressed (all statuses ok)
// or as it was (no statuses), and otherwise waits until the wire settled
// the path. It returns false when the step failed.
func (e *Engine) waitTail(st *step, r *run) bool {
	tl := r.tail
	err := tl.req.Wait(tl.ctx)
	took := time.Since(tl.start)
	if err != nil {
		st.fail(&StepError{Step: st.num, Bucket: r.b.idx, Stage: tl.stage, Err: err})
		return false
	}
	if tl.statuses != nil {
		sts, err := tl.statuses()
		switch {
		case err != nil:
			st.fail(err)
			return false
		case allOK(sts):
			r.outcome = pathCompressed
			r.heldBack = maxHeldBack(sts)
		default:
			select { // the wire settles the path, adding to r's stats
			case <-tl.settled.fired():
			case <-st.failed:
				return false
			}
		}
	}
	r.stats.Exchange += took
	return st.failure() == nil
}

// settleTails runs on the wire at the end of the step: it waits for every
// bucket's tail, then, in bucket order, settles the path of each bucket
// whose statuses are not all ok (takePath: the dense all-reduce, made
// here, or skipped). It waits for every tail even after a failure, so
// that no collective is left in flight.
func (e *Engine) settleTails(st *step) {
	e.inFlight = e.inFlight[:0]
	errs := make([]error, len(st.runs))
	for i, r := range st.runs {
		if tl := r.tail; tl != nil {
			errs[i] = tl.req.Wait(tl.ctx)
		}
	}
	for i, r := range st.runs {
		tl := r.tail
		if tl == nil {
			continue
		}
		if errs[i] == nil && tl.statuses != nil && st.failure() == nil {
			if sts, err := tl.statuses(); err == nil && !allOK(sts) {
				e.takePath(st, r, sts)
			}
		}
		tl.cancel()
		tl.settled.fire()
	}
}
