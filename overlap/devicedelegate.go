package overlap

// Delegable reports whether the caller may exchange bucket i of the step
// in flight itself (Delegate), by Engine.Delegable's rules: the bucket
// goes dense this step in a way a plain all-reduce of the average
// reproduces (not compressed, not flushed by the accuracy guard, no
// Config.Momentum, no FailOnNonFinite, not StrategyHier). On the device
// also not in a step that verification (DecideAuto) measures: it times a
// bucket's dense path by events on the engine's streams, which a
// delegated bucket never reaches; outside its windows (and in warm-up)
// the rules are Engine's. False without a step, for an unknown bucket,
// for one already ready and after Wait began. Every rank gets the same
// answer.
func (e *DeviceEngine) Delegable(i int) bool { return e.delegableNow(i) }

// Delegate takes bucket i of the step in flight as exchanged by the
// caller, in place of Ready: the caller all-reduces the bucket's gradient
// in device memory itself, into the rank average, on its own stream with
// its own communicator (a framework's native collective on its own
// buffer). The engine enqueues nothing for it — no kernel, no collective,
// no wait for the caller's stream — so the step's done event (Done, Wait)
// does not cover it: the caller orders its own all-reduce before its
// optimizer. The engine leaves the bucket's error-feedback memory as a
// dense step does (untouched) and reports it in the step's statistics
// (BucketStats.Delegated, an all-reduce's BytesSent, no stage times). The
// later buckets' collectives go out in bucket order as ever, a delegated
// bucket counting as launched. Every rank must delegate the same buckets:
// Delegable gives every rank the same answer. A bucket that is not
// Delegable returns a *UsageError (ErrNotDelegable) and takes nothing, as
// do the cases Ready refuses; after a launch failed, the bucket is taken
// and the step's *StepError returned, as by Ready.
func (e *DeviceEngine) Delegate(i int) error { return e.delegate(i, (*step).failure) }

// DelegateDone accepts Engine.DelegateDone's call on the device, where
// nothing waits for it (Wait does not: the caller's all-reduce is on its
// own stream), so it is optional; it checks what Engine's does: a bucket
// not delegated in the step in flight, or reported twice, is a
// *UsageError.
func (e *DeviceEngine) DelegateDone(i int) error { return e.delegateDone(i) }
