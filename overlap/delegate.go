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
// hierarchical one). False without a step, for an unknown bucket, for one
// already ready and after Wait began. Every rank gets the same answer.
func (e *Engine) Delegable(i int) bool { return e.delegableNow(i) }

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
func (e *Engine) Delegate(i int) error { return e.delegate(i, nil) }

// DelegateDone tells the engine that the caller's all-reduce of bucket i,
// which it Delegated this step, has ended. It may be called from any
// goroutine, before or after Wait began. A bucket not delegated in the
// step in flight, or reported twice, is a *UsageError.
func (e *Engine) DelegateDone(i int) error { return e.delegateDone(i) }

// delegableNow is Delegable on either engine.
func (c *core) delegableNow(i int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.cur
	return st != nil && i >= 0 && i < len(st.runs) && !st.ready[i] && !st.waiting && c.undelegable(st, st.runs[i]) == ""
}

// undelegable returns why run r of st may not be delegated (Delegable's
// rules, which give every rank the same answer), or "". c.mu is held.
func (c *core) undelegable(st *step, r *run) string {
	switch {
	case r.compressed:
		return "the bucket is compressed this step"
	case r.flush:
		return "the accuracy guard flushes the bucket's residual this step"
	case c.cfg.Momentum != 0:
		return "momentum correction (Config.Momentum) adds the velocity"
	case c.cfg.FailOnNonFinite:
		return "FailOnNonFinite checks the average"
	case c.strategy == StrategyHier:
		return "StrategyHier's dense path is the hierarchical one"
	case c.timesOnStreams && c.measured(st):
		return "verification times this step's dense path on the device"
	}
	return ""
}

// delegate is Delegate on either engine: Ready's protocol (core.ready),
// refusing a bucket that is not delegable, with the run marked delegated,
// dense, and its statistics set. refuse, if not nil, returns why the
// backend takes no bucket into st (the device: the step's failure, past
// which it launches nothing); Delegate returns it with the bucket taken,
// as Ready does.
func (c *core) delegate(i int, refuse func(st *step) error) error {
	call := fmt.Sprintf("Delegate(%d)", i)
	return c.ready(call, i, func(*bucket) error {
		st := c.cur
		if why := c.undelegable(st, st.runs[i]); why != "" {
			return &UsageError{Call: call, Err: ErrNotDelegable, Detail: fmt.Sprintf("step %d: %s", st.num, why)}
		}
		return nil
	}, func(st *step, r *run) error {
		r.delegated = true
		r.handedBack = newEvent()
		r.outcome = pathDense
		r.stats.Delegated = true
		r.stats.BytesSent = allReduceVolume(c.size, 4*r.b.n)
		r.stats.Reason += "; all-reduced by the caller (Delegate)"
		if refuse != nil {
			return refuse(st)
		}
		return nil
	})
}

// delegateDone is DelegateDone on either engine: it records the end of
// the caller's all-reduce of delegated bucket i and fires its handedBack.
func (c *core) delegateDone(i int) error {
	call := fmt.Sprintf("DelegateDone(%d)", i)
	c.mu.Lock()
	defer c.mu.Unlock()
	st := c.cur
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
