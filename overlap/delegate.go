package overlap

import (
	"fmt"
	"time"
)

// Delegable reports whether the caller may exchange bucket i of the step
// in flight itself (Delegate): the bucket goes dense this step (the
// decision, DecideDense, warm-up, a verification trial's dense path, a
// codec that is none) in a way a plain all-reduce of the average
// reproduces. That excludes buckets compressed or flushed by the accuracy
// guard, Config.Momentum (the engine adds the velocity), FailOnNonFinite
// (the engine checks the average) and StrategyHier (its dense path is the
// hierarchical one). False without a step, for an unknown bucket and for
// one already ready. Every rank gets the same answer.
func (e *Engine) Delegable(i int) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.cur
	if st == nil || i < 0 || i >= len(st.runs) || st.ready[i] {
		return false
	}
	return e.delegable(st.runs[i])
}

func (e *Engine) delegable(r *run) bool {
	return !r.compressed && !r.flush && e.cfg.Momentum == 0 && !e.cfg.FailOnNonFinite && e.strategy != StrategyHier
}

// Delegate takes bucket i of the step in flight as exchanged by the
// caller, in place of Ready: the caller all-reduces the bucket's gradient
// itself, with its own communicator (a framework's native collective, on
// its own buffer, without a copy), into the rank average, and calls
// DelegateDone(i) when that has ended. The engine makes no collective for
// it, leaves its error-feedback memory as a dense step does (untouched),
// and reports it in the step's statistics (BucketStats.Delegated); Wait
// waits for DelegateDone, up to Config.Timeout after the step's last
// bucket was handed over (then the step fails with a *StepError), and
// verification times the bucket from Delegate to DelegateDone. Every rank
// must delegate the same buckets: Delegable gives every rank the same
// answer. A bucket that is not Delegable returns a *UsageError
// (ErrNotDelegable) and takes nothing, as do the cases Ready refuses.
func (e *Engine) Delegate(i int) error {
	call := fmt.Sprintf("Delegate(%d)", i)
	return e.ready(call, i, func(b *bucket) error {
		if st := e.cur; !e.delegable(st.runs[i]) {
			return &UsageError{Call: call, Err: ErrNotDelegable, Detail: fmt.Sprintf("step %d", st.num)}
		}
		return nil
	}, func(st *step, r *run) error {
		r.delegated = true
		r.handedBack = newEvent()
		r.outcome = pathDense
		r.stats.Delegated = true
		r.stats.BytesSent = allReduceVolume(e.size, 4*r.b.n)
		r.stats.Reason += "; all-reduced by the caller (Delegate)"
		return nil
	})
}

// DelegateDone tells the engine that the caller's all-reduce of bucket i,
// which it Delegated this step, has ended. It may be called from any
// goroutine, before or after Wait began. A bucket not delegated in the
// step in flight, or reported twice, is a *UsageError.
func (e *Engine) DelegateDone(i int) error {
	call := fmt.Sprintf("DelegateDone(%d)", i)
	e.mu.Lock()
	defer e.mu.Unlock()
	st := e.cur
	switch {
	case st == nil:
		return &UsageError{Call: call, Err: ErrNoStep, Detail: "no step in flight"}
	case i < 0 || i >= len(st.runs):
		return &UsageError{Call: call, Err: ErrUnknownBucket, Detail: fmt.Sprintf("the engine has buckets 0 to %d", len(st.runs)-1)}
	}
	r := st.runs[i]
	switch {
	case !r.delegated:
		return &UsageError{Call: call, Err: ErrNotDelegated, Detail: fmt.Sprintf("step %d", st.num)}
	case !r.doneAt.IsZero():
		return &UsageError{Call: call, Err: ErrAlreadyReady, Detail: fmt.Sprintf("reported twice in step %d", st.num)}
	}
	r.doneAt = time.Now()
	r.handedBack.fire()
	return nil
}

// awaitDelegated runs on the decode stream after the step's last bucket
// was launched: it waits for the step's delegated buckets' DelegateDone,
// for a failure, or for Config.Timeout.
func (e *Engine) awaitDelegated(st *step) {
	limit := time.NewTimer(e.cfg.Timeout)
	defer limit.Stop()
	for _, r := range st.runs {
		if !r.delegated {
			continue
		}
		select {
		case <-r.handedBack.fired():
		case <-st.failed:
			return
		case <-limit.C:
			st.fail(&StepError{Step: st.num, Bucket: r.b.idx, Stage: "delegated all-reduce",
				Err: fmt.Errorf("DelegateDone(%d) was not called within %v of the step's last bucket", r.b.idx, e.cfg.Timeout)})
			return
		}
	}
}
