"""The base of the torch hooks' States: :class:`EngineState`, which
gradcomp.torch.State (DDP) and gradcomp.fsdp.FSDPState (FSDP2) derive from.

It keeps what a hook's State is whatever the hook: its options, checked
and in canonical form; the engine's life (made for a bucket layout, a
checkpoint loaded into it, dropped when a step cannot go on, closed) and
the error that broke it; the step count, the statistics and the log lines
of the engine's decisions; the part of a checkpoint every State has
(format, spec, strategy, error feedback, step count, bucket sizes, engine
state). A front end adds what its hook needs: how its buckets reach the
engine, when a step ends, what else a checkpoint records.

Which engine a State runs is chosen in one place,
:meth:`EngineState._new_engine`: for host buckets the host engine over a
hosted transport (:class:`gradcomp._engine.Engine`, whose collectives a
thread carries out with torch.distributed); for device buckets (CUDA, or
the fake-device test mode: :mod:`gradcomp._device`) the device engine on
its own NCCL communicator, bootstrapped through torch.distributed's store,
with no torch collective and no Python thread on a bucket's path.
"""

import collections
import logging
import queue
import threading

from . import _lib
from ._compressor import canonical_spec
from ._engine import Engine, format_schedule

logger = logging.getLogger("gradcomp")

#: What a bucket with NaN/Inf does: sent dense that step, or raised.
ON_NONFINITE = ("dense", "raise")


def ms(seconds):
    """Seconds as a summary's or a log line's milliseconds ("-" for none)."""
    return "%.3f ms" % (seconds * 1e3) if seconds else "-"


def table(head, rows):
    """A summary table: ``head``, then ``rows`` (the first the column
    names) in columns padded to their widest cell, the last column (the
    reason) left as it is."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join([head] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows])


def _real(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


class Step:
    """One step of a hook: its number, whether the engine's step began,
    its first error and a plain step's bytes."""

    def __init__(self, number):
        self.number = number
        self.started = False  # gc_engine_step was called
        self.error = None
        self.plain_sent = 0  # a plain step's bytes (ring all-reduce accounting)

    def fail(self, e):
        """Keeps ``e`` unless the step failed already."""
        if self.error is None:
            self.error = e


class Finisher:
    """A daemon thread that runs the functions submitted to it, one at a
    time, in order: the State's step finisher. One thread for every step,
    where a thread started per step would cost DDP's autograd thread up to
    milliseconds on a loaded host (Thread.start waits until the new thread
    runs)."""

    def __init__(self, name):
        self._jobs = queue.Queue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn, *args):
        """Queues ``fn(*args)``; returns at once."""
        self._jobs.put((fn, args))

    def drain(self):
        """Waits until every submitted function has returned."""
        self._jobs.join()

    def running_here(self):
        """Whether the caller is the finisher's thread."""
        return threading.current_thread() is self._thread

    def close(self):
        """Runs what was submitted, then ends the thread."""
        self._jobs.put(None)
        self._thread.join()

    def _run(self):
        while True:
            job = self._jobs.get()
            try:
                if job is None:
                    return
                job[0](*job[1])
            except Exception:  # a finisher records its own failures; this is a bug
                logger.exception("gradcomp: the step finisher failed")
            finally:
                job = None  # not held while waiting for the next: a State dropped unclosed can go
                self._jobs.task_done()


#: A checkpoint as :meth:`EngineState._read_checkpoint` found it valid.
Checkpoint = collections.namedtuple("Checkpoint", "iter layout engine info")


class EngineState:
    """What every hook's State keeps (see the module documentation).

    A front end sets the class attributes below: ``NAME`` (its qualified
    class name) and ``WHO`` (its module) for messages, ``PLAIN_STEPS``
    (steps exchanged before the engine exists), ``EXCLUDED_STRATEGIES``
    (the library's strategies it does not take), ``FORMATS`` (the checkpoint formats it reads, its own last),
    and the texts its messages use; and it overrides the methods that say
    "a front end's".
    """

    NAME = WHO = None
    PLAIN_STEPS = 1
    EXCLUDED_STRATEGIES = ()
    FORMATS = ()
    #: Why warmup_steps must be at least PLAIN_STEPS.
    WARMUP_WHY = ""
    #: What a strategy outside strategies() is told besides the list.
    STRATEGY_NOTE = ""
    #: Counters besides the common ones (stats).
    EXTRA_COUNTS = ()
    #: How summary() starts and names the ranks of the engine.
    TAG, PEERS = "gradcomp", "ranks"
    #: How a log line, and an error, name a hook step.
    LOG_STEP = STEP_ERROR = "step"
    #: When a checkpoint without an engine state was saved.
    SAVED_BEFORE = ""

    @classmethod
    def strategies(cls):
        """The strategies this front end takes: the library's
        (``gradcomp.names(Names.STRATEGY)``) but EXCLUDED_STRATEGIES."""
        return tuple(s for s in _lib.names(_lib.Names.STRATEGY) if s not in cls.EXCLUDED_STRATEGIES)

    def __init__(self, spec, strategy, decision, warmup_steps, error_feedback, on_nonfinite, timeout, workers,
                 momentum, schedule, guard, momentum_masking):
        where = self.NAME
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < self.PLAIN_STEPS:
            raise ValueError("%s: warmup_steps=%r: want an int ≥ %d (%s)"
                             % (where, warmup_steps, self.PLAIN_STEPS, self.WARMUP_WHY))
        if strategy not in self.strategies():
            raise ValueError("%s: strategy=%r: want one of %s%s" % (where, strategy, self.strategies(),
                                                                     self.STRATEGY_NOTE))
        if not isinstance(spec, str):
            raise TypeError("%s: spec must be a str, got %s" % (where, type(spec).__name__))
        if decision not in _lib.names(_lib.Names.DECISION):
            raise ValueError("%s: decision=%r: want one of %s" % (where, decision, _lib.names(_lib.Names.DECISION)))
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError("%s: on_nonfinite=%r: want one of %s" % (where, on_nonfinite, ON_NONFINITE))
        if not (_real(timeout) and timeout > 0):
            raise ValueError("%s: timeout=%r: want seconds > 0" % (where, timeout))
        if not (_real(momentum) and 0 <= momentum < 1):
            raise ValueError("%s: momentum=%r: want a number in [0, 1)" % (where, momentum))
        if not (_real(guard) and 0 <= guard < float("inf")):
            raise ValueError("%s: guard=%r: want a finite number ≥ 0 (0: off)" % (where, guard))
        if momentum_masking and not momentum:
            raise ValueError("%s: momentum_masking=True needs momentum > 0" % where)
        if guard and not error_feedback:
            raise ValueError("%s: guard=%r needs error_feedback=True: without it nothing is held back" % (where, guard))
        #: The compressor spec in its canonical form (the library's word on it).
        self.spec = canonical_spec(spec)
        self.strategy, self.decision, self.warmup_steps = strategy, decision, warmup_steps
        self.error_feedback, self.on_nonfinite, self.timeout = bool(error_feedback), on_nonfinite, float(timeout)
        self.workers, self.momentum, self.momentum_masking = int(workers), float(momentum), bool(momentum_masking)
        #: The compression warm-up as gc_engine_config takes it ("" for none).
        self.schedule = format_schedule(schedule)
        self.guard = float(guard)
        #: Steps this State has seen (restored by load_state_dict).
        self.iter = 0
        self._engine = None
        self._pending = None  # engine state bytes to load when the engine is created
        self._broken = None  # the error that ended this State's engine
        self._cur = None  # the step under way
        self._lock = threading.Lock()
        self._counts = collections.Counter()
        self._last_step = None
        self._decided = {}  # bucket -> (strategy, decided_compressed) last logged
        self._finisher = None  # the Finisher of steps finished off the hook's thread, made at the first

    def _finish_later(self, fn, *args):
        """Runs ``fn(*args)`` on the State's Finisher (made on first use),
        after the steps submitted before it."""
        if self._finisher is None:
            self._finisher = Finisher("gradcomp-%s-wait" % self.WHO.rsplit(".", 1)[-1])
        self._finisher.submit(fn, *args)

    def _settled(self):
        """Waits until the latest step's bookkeeping is done: what was
        submitted to the Finisher (unless called from it). A front end
        that finishes steps elsewhere too waits for those as well."""
        f = self._finisher
        if f is not None and not f.running_here():
            f.drain()

    # ---- what a user reads

    @property
    def engine(self):
        """The gradcomp._engine.Engine (None before it exists), its latest
        step finished."""
        self._settled()
        return self._engine

    @property
    def last_step(self):
        """The engine's StepStats of the last waited step (None before)."""
        self._settled()
        return self._last_step

    @property
    def stats(self):
        """Counters: "steps" (hook steps), "plain_steps" (steps exchanged
        before the engine exists), "engine_steps", bucket-steps
        "compressed", "dense", "nonfinite" and "guarded" (sent dense with
        their residual by the accuracy guard), "bytes_sent" (this rank's
        bytes on the wire in the last step: the engine's count, or for a
        plain step a ring all-reduce's 2(N−1)/N·4S) and "bytes_sent_total";
        gradcomp.torch.State adds "native" (the engine's dense bucket-steps
        that DDP's own all-reduce carried out, also counted in "dense")."""
        self._settled()
        with self._lock:
            out = dict(self._counts)
        out["steps"] = self.iter
        for k in ("plain_steps", "engine_steps", "compressed", "dense", "nonfinite", "guarded") + \
                self.EXTRA_COUNTS + ("bytes_sent", "bytes_sent_total"):
            out.setdefault(k, 0)
        return out

    def summary(self):
        """A readable table of the last engine step, per bucket: what it
        holds, strategy, compressed or dense, bytes this rank sent, stage
        times and the engine's reason."""
        self._settled()
        if self._broken is not None:
            return "%s: %s: the engine failed: %s" % (self.TAG, self.spec, self._broken)
        s = self._last_step
        if s is None:
            return ("%s: %s: no engine step yet (%d steps seen; the engine starts at step %d, compression "
                    "after warm-up, at step %d)" % (self.TAG, self.spec, self.iter, self.PLAIN_STEPS,
                                                     self.warmup_steps))
        head = "%s: spec %s, %d %s, step %d: %d bytes sent by this rank, %.3f ms (%.3f ms exposed)" % (
            self.TAG, self.spec, self._engine.world if self._engine else 0, self.PEERS, s.step, s.bytes_sent,
            s.total_seconds * 1e3, s.exposed_seconds * 1e3)
        return table(head, self._summary_rows(s))

    def _summary_rows(self, s):
        """A front end's summary rows of StepStats ``s``, the column names
        first."""
        raise NotImplementedError

    def close(self):
        """Destroys the engine and its transport (the State then fails),
        once the steps submitted to the Finisher are done."""
        self._settled()
        if self._finisher is not None:
            self._finisher.close()
            self._finisher = None
        eng, self._engine = self._engine, None
        if eng is not None:
            self._broken = self._broken or _lib.ClosedError("gc_engine", _lib.Status.CLOSED,
                                                            "%s: the State was closed" % self.WHO)
            eng.close()

    # ---- the engine

    def _settings(self):
        """The engine's settings, as Engine and Engine.check_state take
        them (a front end adds its own)."""
        return dict(strategy=self.strategy, decision=self.decision, error_feedback=self.error_feedback,
                    fail_on_nonfinite=self.on_nonfinite == "raise", warmup=self.warmup_steps - self.PLAIN_STEPS,
                    timeout=self.timeout, workers=self.workers, momentum=self.momentum, schedule=self.schedule,
                    guard=self.guard, momentum_masking=self.momentum_masking)

    def _engine_group(self, own_nccl):
        """A front end's process group for the engine: the group whose
        collectives carry the host engine's (``own_nccl`` False), or whose
        ranks and store make the device engine's own NCCL communicator."""
        raise NotImplementedError

    def _rank(self):
        """How a front end names this rank in a ConfigError."""
        raise NotImplementedError

    def _new_engine(self, sizes, buckets, load, **kw):
        """Makes this State's engine for the bucket ``sizes`` over
        :meth:`_engine_group` (its handshake runs here), then
        ``load(engine)`` (a checkpoint's state); ``kw``: Engine's keywords.
        The one place that chooses the engine's backend: for host buckets
        (``device`` -1) the host engine over the hosted transport, whose
        collectives TorchHost runs on ``_engine_group()``; for device
        buckets the device engine on its own NCCL communicator, whose
        unique id ``_engine_group()``'s rank 0 spreads through the store. Any failure breaks the State and is raised; a
        ConfigError (the ranks' configurations differ) says this rank's
        settings and ``buckets``."""
        try:
            own = kw.get("device", -1) >= 0
            eng = Engine(self.spec, sizes, process_group=self._engine_group(own), **kw)
        except _lib.ConfigError as e:
            e = _lib.ConfigError(e.function, e.status, "%s; this rank (%s) has %s(%r, strategy=%r, decision=%r, "
                                 "warmup_steps=%d (the engine's warm-up is warmup_steps - %d), error_feedback=%r, "
                                 "on_nonfinite=%r, momentum=%r, schedule=%r) and buckets %s" % (
                                     e.message, self._rank(), type(self).__name__, self.spec, self.strategy,
                                     self.decision, self.warmup_steps, self.PLAIN_STEPS, self.error_feedback,
                                     self.on_nonfinite, self.momentum, self.schedule, buckets))
            self._broken = e
            raise e
        except BaseException as e:
            self._broken = e
            raise
        try:
            load(eng)
        except BaseException as e:
            eng.close()
            self._broken = e
            raise
        self._pending = None
        self._engine = eng
        return eng

    def _drop_engine(self, e):
        """A step that cannot go on after gc_engine_step (``e`` says why):
        the engine is destroyed, its step abandoned (error feedback keeping
        e + g), and the State broken."""
        eng, self._engine = self._engine, None
        self._broken = e
        try:
            eng.close()
        except Exception as e2:
            logger.debug("%s: closing the engine after %s: %s", self.WHO, e, e2)

    def _wait(self, eng, st):
        """Waits for the engine's step of hook step ``st``; returns its
        error (None), also kept on ``st``. A NaN/Inf under
        on_nonfinite="raise" leaves the State usable; any other error
        breaks it (GC_ERR_COMM)."""
        try:
            eng.wait()
            return None
        except BaseException as e:
            err = e
        if isinstance(err, _lib.NonFiniteError):
            err = _lib.NonFiniteError(err.function, err.status, "%s %d: %s (on_nonfinite='raise'; the State stays "
                                      "usable: skip this optimizer step)" % (self.STEP_ERROR, st.number, err.message))
        else:
            self._broken = err
        st.fail(err)
        return err

    # ---- statistics and the log

    def _count_plain(self, buckets, sent):
        """Counts a plain step of ``buckets`` buckets and ``sent`` bytes."""
        with self._lock:
            self._counts["plain_steps"] += 1
            self._counts["dense"] += buckets
            self._counts["bytes_sent"] = sent
            self._counts["bytes_sent_total"] += sent

    def _record(self, eng, hook_step):
        """Counts ``eng``'s last waited step (hook step ``hook_step``) and
        logs what is new in it. Where its statistics cannot be read (a
        closed engine, say), the step's bookkeeping goes on without them;
        returns them (or None)."""
        try:
            s = eng.stats()
        except Exception:
            return None
        with self._lock:
            self._last_step = s
            c = self._counts
            c["engine_steps"] += 1
            c["bytes_sent"] = s.bytes_sent
            c["bytes_sent_total"] += s.bytes_sent
            for b in s.buckets:
                c["compressed" if b.compressed else "dense"] += 1
                c["nonfinite"] += int(b.nonfinite)
                c["guarded"] += int(b.guarded)
        self._log_step(s, hook_step)
        return s

    def _log_step(self, s, hook_step):
        """Logs buckets with NaN/Inf (WARNING) and decisions that are new
        or changed (INFO, one line a bucket: :meth:`_log_decision`)."""
        bad = [b.bucket for b in s.buckets if b.nonfinite]
        if bad:
            if self.on_nonfinite == "raise":
                what = "raised"
            elif self._engine is not None and self._engine.device >= 0:
                what = "NaN on every rank: the device engine keeps no copy of the gradient to send dense"
            else:
                what = "sent dense"
            logger.warning("%s %d (engine step %d): NaN/Inf in %s (%s)", self.LOG_STEP, hook_step, s.step,
                           self._which(bad), what)
        for b in s.buckets:
            key = (b.strategy, b.decided_compressed)
            prev = self._decided.get(b.bucket)
            if prev == key and not b.switched:
                continue
            self._decided[b.bucket] = key
            self._log_decision(s, b, prev)

    def _which(self, buckets):
        """How a log line names the engine's ``buckets``."""
        return "bucket(s) %s" % buckets

    def _log_decision(self, s, b, prev):
        """A front end's log line for bucket ``b``'s decision (``prev``:
        the last logged, None for its first)."""
        raise NotImplementedError

    # ---- checkpoints

    def _checkpoint(self, data, layout, **more):
        """The state dict of engine state bytes ``data`` for the bucket
        sizes ``layout``, with a front end's ``more``."""
        sd = {
            "format": self.FORMATS[-1],
            "spec": self.spec,
            "strategy": self.strategy,
            "error_feedback": self.error_feedback,
            "iter": self.iter,
            "layout": list(layout) if layout else None,
            "engine": data,
        }
        sd.update(more)
        return sd

    def _read_checkpoint(self, sd, where, other_strategy=False):
        """Checks what every State's state dict holds and returns it as a
        Checkpoint (the layout, where the dict has none, the engine
        state's); ValueError naming what is wrong. ``other_strategy``: a
        state of another strategy is accepted (loaded across shapes)."""
        if not isinstance(sd, dict) or sd.get("format") not in self.FORMATS:
            raise ValueError("%s: not a %s state dict" % (where, self.FORMATS[-1]))
        try:
            spec, strategy, ef = sd["spec"], sd["strategy"], sd["error_feedback"]
            it, layout, data = sd["iter"], sd["layout"], sd["engine"]
        except KeyError as e:
            raise ValueError("%s: the state dict lacks %s" % (where, e))
        if spec != self.spec:
            raise ValueError("%s: state saved with spec %r, this State has %r" % (where, spec, self.spec))
        if strategy != self.strategy and not other_strategy:
            raise ValueError(self._strategy_refusal(where, strategy))
        if bool(ef) != self.error_feedback:
            raise ValueError("%s: state saved with error_feedback=%r, this State has %r"
                             % (where, bool(ef), self.error_feedback))
        if not isinstance(it, int) or isinstance(it, bool) or it < 0:
            raise ValueError("%s: iter %r is not a step count" % (where, it))
        if layout is not None and not (isinstance(layout, list) and all(
                isinstance(n, int) and not isinstance(n, bool) and n > 0 for n in layout)):
            raise ValueError("%s: layout %r is not a list of bucket sizes" % (where, layout))
        info = None
        if data is not None:
            if not isinstance(data, (bytes, bytearray)):
                raise ValueError("%s: engine state is %s, not bytes" % (where, type(data).__name__))
            data = bytes(data)
            info = Engine.state_info(data)  # ValueError when it is not one
            if info.spec != self.spec:
                raise ValueError("%s: the engine state is for spec %r, this State has %r"
                                 % (where, info.spec, self.spec))
            if layout is not None and list(info.sizes) != layout:
                raise ValueError("%s: the engine state's buckets %s differ from the dict's layout %s"
                                 % (where, info.sizes, layout))
            layout = list(info.sizes)
        return Checkpoint(it, layout, data, info)

    def _strategy_refusal(self, where, strategy):
        """The message that refuses a state of another strategy."""
        return "%s: state saved with strategy %r, this State has %r" % (where, strategy, self.strategy)

    def _restore(self, where, ck, keep):
        """Applies Checkpoint ``ck``, checked whole: into the engine where it
        exists (validated whole by the library: ValueError and unchanged on
        a mismatch), else ``keep()`` keeps it for the engine to come. Then
        the step count."""
        self._settled()
        if self._engine is not None:
            if ck.engine is None:
                raise ValueError("%s: the state holds no engine state (saved %s) but this State's engine exists"
                                 % (where, self.SAVED_BEFORE))
            self._engine.load_state(ck.engine)
        else:
            keep()
        self.iter = ck.iter
