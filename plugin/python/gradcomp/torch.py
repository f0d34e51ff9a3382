"""A DDP communication hook that runs gradcomp's engine.

Usage::

    import logging, gradcomp.torch
    logging.basicConfig(level=logging.INFO)      # to see the decisions
    state = gradcomp.torch.State("topk:0.01", warmup_steps=10, model=model)
    ddp_model.register_comm_hook(state, gradcomp.torch.hook)
    ...
    print(state.summary())                       # per bucket: what was sent, how, why

The hook is thin: compression with error feedback, the exchange strategy
(dense all-reduce, shared-index for random-k, SRA for int8/int4/int2/sign/
fp16/bf16, sparse-gather for top-k), the handshake, the cost model and its
online verification, NaN handling and checkpoints are gradcomp's engine
(the C ABI's gc_engine, the same overlap.Engine Go callers use). The
engine posts its collectives, in the same order on every rank, and a
thread of this package carries them out on the DDP process group with
torch.distributed (gloo: all_reduce, all_gather, all_to_all_single,
broadcast, barrier; see gradcomp._engine).

Steps:

* Steps 0 and 1 of a State are torch's default exchange (an all-reduce of
  bucket/world): DDP builds its final buckets during its first step, and
  the hook learns that layout in the second.
* At the first bucket of step 2 the State creates the engine for that
  layout. Its handshake compares spec, strategy, decision, error feedback,
  on_nonfinite, warm-up and the bucket layout across ranks: a rank that
  differs gets ValueError on every rank (at once, not after a timeout).
  The engine's own warm-up is ``warmup_steps - 2`` steps (every bucket
  dense), so the first ``warmup_steps`` steps of training are dense.
* From then on, per step: gc_engine_step at the step's first bucket,
  gc_engine_ready for each bucket (buckets that are not contiguous float32
  go through a float32 copy), and a future that is completed once the
  engine's gc_engine_wait returned; the wait runs on a thread once the
  step's last bucket was handed over, so backward is never blocked
  (``overlap=False`` waits in the last bucket's hook instead).

What a user sees:

* One ``logging`` line (logger "gradcomp", level INFO) when the engine is
  created, and one per bucket for its first decision and for every change
  of it: bucket, elements, strategy, compressed or dense, the cost model's
  predicted and verification's measured times, and the engine's reason. A
  bucket with NaN/Inf logs a WARNING.
* :meth:`State.summary` returns a table of the last step: per bucket,
  elements, strategy, compressed or dense, bytes this rank sent, stage
  times and reason. :attr:`State.stats` holds counters and the last step's
  bytes sent by this rank; :attr:`State.last_step` the engine's StepStats.
* Reproducible runs: the cost model decides from timings, so runs on a
  loaded and an idle machine can compress different buckets. Pin it with
  ``decision="compressed"`` (every bucket compressed after warm-up) or
  ``decision="dense"`` (never); ``decision="auto"`` is the cost model.

Errors reach the user from ``loss.backward()`` with their own type (the
hook hands DDP the bucket and raises from an autograd callback that runs
after DDP has finished the step; an exception inside a hook or set on its
future reaches the user as RuntimeError in torch 1.13): ValueError when the
ranks' configurations differ, FloatingPointError (gradcomp.NonFiniteError)
naming the buckets and ranks when a gradient holds NaN/Inf and
``on_nonfinite="raise"`` (the State stays usable: skip the optimizer step),
gradcomp.CommError when a collective failed or timed out (the State is
broken; a dead peer is seen at once, a stalled one after ``timeout``
seconds, but the collective torch is running then cannot be cancelled and
holds the host thread until the process group's own timeout: give the
group a timeout near the State's). Called outside backward (directly, on fake buckets), the hook
raises its errors itself, and an error of the exchange is set on the
futures.

Checkpoints: :meth:`State.state_dict` holds the engine's state
(error-feedback memories, step number, spec, strategy, bucket layout) and
the hook's step count; :meth:`State.load_state_dict` refuses, with
ValueError and changing nothing, a state of another spec or strategy, or
for another model (total elements against ``model``'s parameters, or the
bucket layout against the engine's). A State restored before its engine
exists (a new process) applies the state when it creates the engine:
like any new State it exchanges its first two steps dense (DDP rebuilds
its buckets), then continues from the saved error feedback and step.

CUDA buckets need libgradcomp_cuda.so (loaded when torch sees a GPU) and a
NCCL group; that path has NOT run on a GPU yet.
"""

import collections
import logging
import threading

import torch
import torch.distributed as dist

from . import _lib
from ._compressor import Compressor, has_cuda
from ._engine import Engine, format_schedule

__all__ = ["State", "hook"]

logger = logging.getLogger("gradcomp")

#: Steps exchanged with torch's all-reduce before the engine exists.
PLAIN_STEPS = 2
_FORMAT = "gradcomp.torch.State/2"
_STAGED_DTYPES = (torch.float16, torch.bfloat16, torch.float64)
_ON_NONFINITE = ("dense", "raise")
_DECISIONS = ("auto", "compressed", "dense")
_STRATEGIES = ("auto", "dense", "shared-index", "sparse-gather", "sra", "allgather")


def _ms(seconds):
    return "%.3f ms" % (seconds * 1e3) if seconds else "-"


class _Step:
    """One step of the hook: its futures and its first error."""

    def __init__(self, number, in_backward):
        self.number = number
        self.in_backward = in_backward
        self.started = False  # gc_engine_step was called
        self.pending = []  # (future, bucket buffer, staged float32 buffer)
        self.readied = set()
        self.error = None
        self.stream = None  # CUDA: the stream of the buckets
        self.plain_sent = 0  # a plain step's bytes (ring all-reduce accounting)
        self.plain_buckets = 0

    def fail(self, e):
        if self.error is None:
            self.error = e


class State:
    """The hook's state: the engine (from step 2), the step counter and the
    bucket layout.

    ``spec``: a compressor spec such as "topk:0.01", "int8", "sign",
    "randomk:0.01" or "none" (ValueError with the library's message if it
    is not accepted). ``strategy``: "auto" (the codec's own: sparse-gather
    for top-k, shared-index for random-k, SRA for the quantizers), "dense",
    "shared-index", "sparse-gather", "sra" or "allgather". ``decision``:
    "auto" (the cost model, verified online), "compressed" or "dense"
    (pinned: reproducible). ``warmup_steps`` (≥ 2): steps exchanged dense
    before compression. ``error_feedback``: keep residuals. ``on_nonfinite``:
    "dense" (a bucket with NaN/Inf on any rank goes dense that step) or
    "raise" (FloatingPointError). ``timeout``: seconds per collective.
    ``process_group``: the group to exchange over (None: the default
    group). ``workers``: compressor threads (0: all CPUs). ``overlap``:
    return from the hook while the exchange runs (True) or wait in the
    step's last bucket (False). ``model``: the module DDP wraps, optional,
    to refuse a checkpoint of another model in :meth:`load_state_dict`.
    ``momentum``: momentum correction (DGC), the momentum m in [0, 1) the
    optimizer would use, 0 for none: from the engine's first step every
    bucket becomes u = m·u + g before its exchange, and u is checkpointed
    with the error feedback; ``momentum_masking=True`` adds DGC's momentum
    factor masking (top-k and random-k zero u where they sent; off by
    default, it cost accuracy in this project's runs, see the README). Pair
    it with an optimizer WITHOUT momentum, e.g. ``SGD(params, lr,
    momentum=0)`` with ``State(..., momentum=0.9)`` instead of
    ``SGD(params, lr, momentum=0.9)``. (Steps 0 and 1, before the engine
    exists, are plain all-reduces without momentum.)
    ``schedule``: a compression warm-up (DGC's sparsity ramp; int8 → int4
    → int2): a list of (steps, spec) phases run after ``warmup_steps``,
    then ``spec``; every phase keeps ``spec``'s strategy; with
    ``decision="auto"`` the cost model decides for ``spec`` and
    verifies after the last phase; the handshake compares it and
    a checkpoint resumes it where it was. E.g. ``State("topk:0.004",
    decision="compressed", schedule=[(100, "topk:0.25"), (100, "topk:0.0625"),
    (100, "topk:0.016")])``.
    ``guard``: the accuracy guard's threshold, 0 for none (needs
    ``error_feedback``; CPU or CUDA buckets): every rank measures, for each bucket
    it compresses, how much error feedback holds back against the
    gradient (|e|/|g|, ``BucketStats.held_back``); when the largest over
    the ranks passes ``guard``, the bucket's next compressed step goes
    dense with everything held back, emptying the memory. Each flush is
    logged (INFO), counted in ``stats["guarded"]``, and the last step's
    ``BucketStats.guarded`` and reason say so; the handshake compares it.
    """

    def __init__(self, spec, strategy="auto", decision="auto", warmup_steps=10, error_feedback=True,
                 on_nonfinite="dense", timeout=60.0, process_group=None, workers=0, overlap=True, model=None,
                 momentum=0.0, schedule=None, guard=0.0, momentum_masking=False):
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < PLAIN_STEPS:
            raise ValueError(
                "gradcomp.torch.State: warmup_steps=%r: want an int ≥ %d (DDP builds its buckets in its first "
                "step; the hook learns them in the second)" % (warmup_steps, PLAIN_STEPS)
            )
        if decision not in _DECISIONS:
            raise ValueError("gradcomp.torch.State: decision=%r: want one of %s" % (decision, _DECISIONS))
        if strategy not in _STRATEGIES:
            raise ValueError("gradcomp.torch.State: strategy=%r: want one of %s" % (strategy, _STRATEGIES))
        if on_nonfinite not in _ON_NONFINITE:
            raise ValueError("gradcomp.torch.State: on_nonfinite=%r: want one of %s" % (on_nonfinite, _ON_NONFINITE))
        if not (isinstance(timeout, (int, float)) and timeout > 0):
            raise ValueError("gradcomp.torch.State: timeout=%r: want seconds > 0" % (timeout,))
        if not isinstance(spec, str):
            raise TypeError("gradcomp.torch.State: spec must be a str, got %s" % type(spec).__name__)
        if not (isinstance(momentum, (int, float)) and not isinstance(momentum, bool) and 0 <= momentum < 1):
            raise ValueError("gradcomp.torch.State: momentum=%r: want a number in [0, 1)" % (momentum,))
        if not (isinstance(guard, (int, float)) and not isinstance(guard, bool) and 0 <= guard < float("inf")):
            raise ValueError("gradcomp.torch.State: guard=%r: want a finite number ≥ 0 (0: off)" % (guard,))
        if momentum_masking and not momentum:
            raise ValueError("gradcomp.torch.State: momentum_masking=True needs momentum > 0")
        if guard and not error_feedback:
            raise ValueError("gradcomp.torch.State: guard=%r needs error_feedback=True: without it nothing is "
                             "held back" % (guard,))
        with Compressor(spec, 1) as c:  # the library's word on the spec, and its canonical form
            #: The canonical spec.
            self.spec = c.spec
        self.strategy = strategy
        self.decision = decision
        self.warmup_steps = warmup_steps
        self.error_feedback = bool(error_feedback)
        self.on_nonfinite = on_nonfinite
        self.timeout = float(timeout)
        self.process_group = process_group
        self.workers = int(workers)
        self.overlap = bool(overlap)
        #: Momentum correction's momentum (0: off).
        self.momentum = float(momentum)
        #: DGC's momentum factor masking (with momentum).
        self.momentum_masking = bool(momentum_masking)
        #: The compression warm-up, as gc_engine_config takes it ("" for none).
        self.schedule = format_schedule(schedule)
        #: The accuracy guard's threshold (0: off).
        self.guard = float(guard)
        self._params = None
        if model is not None:
            self._params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        #: Steps this State has seen (its hook's step count; restored by
        #: load_state_dict).
        self.iter = 0
        self._local = 0  # steps seen since this State was made: the plain steps are 0 and 1
        self._layout = {}  # bucket index -> elements, as seen in plain step 1
        self._sizes = None  # the engine's bucket sizes
        self._engine = None
        self._pending = None  # engine state bytes to load when the engine is created
        self._pending_layout = None  # and the layout it records
        self._broken = None  # the error that ended this State's engine
        self._cur = None
        self._decided = {}  # bucket -> (strategy, decided_compressed) last logged
        self._cautioned = False
        self._lock = threading.Lock()
        self._counts = collections.Counter()
        #: The engine's StepStats of the last waited step (None before).
        self.last_step = None

    # ---- what a user reads

    @property
    def engine(self):
        """The gradcomp._engine.Engine (None before step 2)."""
        return self._engine

    @property
    def stats(self):
        """Counters: "steps" (hook steps), "plain_steps" (torch's all-reduce),
        "engine_steps", bucket-steps "compressed", "dense", "nonfinite" and
        "guarded" (sent dense with their residual by the accuracy guard),
        "bytes_sent" (this rank's bytes on the wire in the last step: the
        engine's count, or for a plain step a ring all-reduce's 2(N−1)/N·4S)
        and "bytes_sent_total"."""
        with self._lock:
            out = dict(self._counts)
        out["steps"] = self.iter
        for k in ("plain_steps", "engine_steps", "compressed", "dense", "nonfinite", "guarded", "bytes_sent",
                  "bytes_sent_total"):
            out.setdefault(k, 0)
        return out

    def summary(self):
        """A readable table of the last step, per bucket: elements,
        strategy, compressed or dense (and the decision for the steps to
        come), bytes this rank sent, compress/exchange/decompress times and
        the engine's reason."""
        if self._broken is not None:
            return "gradcomp: %s: the engine failed: %s" % (self.spec, self._broken)
        s = self.last_step
        if s is None:
            return ("gradcomp: %s: no engine step yet (%d steps seen; the engine starts at step %d, compression "
                    "after warm-up, at step %d)" % (self.spec, self.iter, PLAIN_STEPS, self.warmup_steps))
        head = "gradcomp: spec %s, %d ranks, step %d: %d bytes sent by this rank, %.3f ms (%.3f ms exposed)" % (
            self.spec, self._engine.world if self._engine else 0, s.step, s.bytes_sent, s.total_seconds * 1e3,
            s.exposed_seconds * 1e3)
        rows = [("bucket", "elements", "strategy", "sent", "decided", "bytes", "compress", "exchange",
                 "decompress", "reason")]
        for b in s.buckets:
            rows.append((str(b.bucket), str(b.elements), b.strategy, "compressed" if b.compressed else "dense",
                         "compressed" if b.decided_compressed else "dense", str(b.bytes_sent),
                         _ms(b.compress_seconds), _ms(b.exchange_seconds), _ms(b.decompress_seconds), b.reason))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
        lines = [head]
        for r in rows:
            lines.append("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1])
        return "\n".join(lines)

    def close(self):
        """Destroys the engine and its transport (the State then fails)."""
        eng, self._engine = self._engine, None
        if eng is not None:
            self._broken = self._broken or _lib.ClosedError("gc_engine", _lib.Status.CLOSED,
                                                            "gradcomp.torch: the State was closed")
            eng.close()

    # ---- checkpoints

    def state_dict(self):
        """The state to checkpoint: the engine's state bytes
        (gc_engine_state_save; a state loaded and not yet applied, or None
        before the engine exists), the hook's step count and the bucket
        layout."""
        if self._engine is not None:
            data = self._engine.save_state()
        else:
            data = self._pending
        layout = self._sizes or self._pending_layout or self._seen_layout()
        return {
            "format": _FORMAT,
            "spec": self.spec,
            "strategy": self.strategy,
            "error_feedback": self.error_feedback,
            "iter": self.iter,
            "layout": list(layout) if layout else None,
            "engine": data,
        }

    def load_state_dict(self, sd):
        """Restores a :meth:`state_dict`. Everything is checked before
        anything changes: ValueError for a dict that is not one, a state of
        another spec or error-feedback setting, or of another
        model (its total elements against ``model``'s parameters; its
        bucket layout against the engine's, or the layout this State saw);
        the engine then validates its state whole (gc_engine_state_load).
        Before the engine exists the state is kept and applied when it is
        created."""
        where = "gradcomp.torch.State.load_state_dict"
        if not isinstance(sd, dict) or sd.get("format") != _FORMAT:
            raise ValueError("%s: not a %s state dict" % (where, _FORMAT))
        try:
            spec, strategy, ef = sd["spec"], sd["strategy"], sd["error_feedback"]
            it, layout, data = sd["iter"], sd["layout"], sd["engine"]
        except KeyError as e:
            raise ValueError("%s: the state dict lacks %s" % (where, e))
        if spec != self.spec:
            raise ValueError("%s: state saved with spec %r, this State has %r" % (where, spec, self.spec))
        if bool(ef) != self.error_feedback:
            raise ValueError("%s: state saved with error_feedback=%r, this State has %r"
                             % (where, bool(ef), self.error_feedback))
        if not isinstance(it, int) or isinstance(it, bool) or it < 0:
            raise ValueError("%s: iter %r is not a step count" % (where, it))
        if layout is not None and not (isinstance(layout, list) and all(isinstance(n, int) and n > 0 for n in layout)):
            raise ValueError("%s: layout %r is not a list of bucket sizes" % (where, layout))
        if data is not None:
            if not isinstance(data, (bytes, bytearray)):
                raise ValueError("%s: engine state is %s, not bytes" % (where, type(data).__name__))
            data = bytes(data)
            info = Engine.state_info(data)  # ValueError when it is not one
            if info.spec != self.spec:
                raise ValueError("%s: the engine state is for spec %r, this State has %r" % (where, info.spec, self.spec))
            if layout is not None and list(info.sizes) != layout:
                raise ValueError("%s: the engine state's buckets %s differ from the dict's layout %s"
                                 % (where, info.sizes, layout))
            layout = list(info.sizes)
        if layout is not None:
            total = sum(layout)
            if self._params is not None and total != self._params:
                raise ValueError("%s: the state is for a model of %d parameters (buckets %s); this State's model has %d"
                                 % (where, total, layout, self._params))
            mine = self._sizes or self._seen_layout()
            if mine is not None and list(mine) != layout:
                raise ValueError("%s: the state is for buckets %s (%d elements); this model's buckets are %s (%d)"
                                 % (where, layout, total, mine, sum(mine)))
        if self._engine is not None:
            if data is None:
                raise ValueError("%s: the state holds no engine state (saved before step %d) but this State's engine "
                                 "exists" % (where, PLAIN_STEPS))
            self._engine.load_state(data)  # validated whole; ValueError and unchanged on a mismatch
        else:
            self._pending, self._pending_layout = data, layout
        self.iter = it

    def _seen_layout(self):
        """The bucket sizes plain step 1 saw, once it ended (else None)."""
        if self._local < PLAIN_STEPS or not self._layout:
            return None
        return [self._layout.get(i, 0) for i in range(max(self._layout) + 1)]

    # ---- the hook

    def _queue_end_of_backward(self, st):
        """Queues, when called during backward, a callback that runs after
        DDP has finished the step (DDP queues its own when the last bucket
        is ready: a callback queued by ours comes after it) and raises the
        step's error there, where autograd lets its type through. Returns
        whether it was queued (False outside backward)."""
        engine = torch.autograd.Variable._execution_engine

        def after_ddp():
            if st.error is not None:
                raise st.error

        try:
            engine.queue_callback(lambda: engine.queue_callback(after_ddp))
        except RuntimeError:  # "Final callbacks can only be installed during backward pass"
            return False
        return True

    def _hook(self, bucket):
        buf = bucket.buffer()
        index = bucket.index()
        last = bucket.is_last()
        if self._cur is None:
            self._cur = _Step(self.iter, False)
            self._cur.in_backward = self._queue_end_of_backward(self._cur)
        st = self._cur
        try:
            return self._bucket(st, buf, index, last)
        except BaseException as e:
            st.fail(e)
            if not st.in_backward:
                raise
            fut = torch.futures.Future()
            fut.set_result(buf)  # DDP takes the bucket as it is; the callback raises after it
            return fut
        finally:
            if last:
                self._cur = None
                self.iter += 1
                self._local += 1
                if st.plain_buckets:
                    with self._lock:
                        self._counts["plain_steps"] += 1
                        self._counts["dense"] += st.plain_buckets
                        self._counts["bytes_sent"] = st.plain_sent
                        self._counts["bytes_sent_total"] += st.plain_sent

    def _check(self, buf):
        dev = buf.device.type
        if dev == "cuda":
            if not has_cuda():
                raise NotImplementedError(
                    "gradcomp.torch: bucket on %s needs %s (device pointers and CUDA streams), but the loaded "
                    "library is %s (host memory): build it with `make plugin` on a machine with nvidia-cuda-toolkit"
                    % (buf.device, _lib.CUDA_LIB_NAME, _lib.CPU_LIB_NAME))
        elif dev != "cpu":
            raise NotImplementedError("gradcomp.torch: buckets on %s are not supported (CPU and CUDA only)" % buf.device)
        if not buf.is_floating_point():
            raise TypeError("gradcomp.torch: bucket holds %s gradients; want a floating-point dtype" % buf.dtype)

    def _bucket(self, st, buf, index, last):
        if self._broken is not None:
            raise self._broken
        self._check(buf)
        if self._engine is None and self._local < PLAIN_STEPS:
            return self._plain(st, buf, index)
        if self._engine is None:
            self._create(buf)
        eng = self._engine
        try:
            if not st.started:
                eng.step()
                st.started = True
            if not (0 <= index < eng.nbuckets) or buf.numel() != eng.sizes[index] or index in st.readied:
                raise ValueError(
                    "gradcomp.torch: step %d: bucket %d has %d elements, but the engine was made for the buckets %s "
                    "DDP built (each once per step); DDP never changes them after its first step: was the model "
                    "or its DDP wrapper replaced under this State?" % (st.number, index, buf.numel(), eng.sizes))
            staged = self._stage(buf)
            if buf.device.type == "cuda":  # UNTESTED: the device engine
                st.stream = torch.cuda.current_stream(buf.device)
                eng.ready_device(index, staged, st.stream.cuda_stream)
            else:
                eng.ready(index, staged)
            st.readied.add(index)
            fut = torch.futures.Future()
            st.pending.append((fut, buf, staged))
            if last:
                if len(st.readied) != eng.nbuckets:
                    missing = sorted(set(range(eng.nbuckets)) - st.readied)
                    raise ValueError("gradcomp.torch: step %d ended without bucket(s) %s" % (st.number, missing))
                if st.stream is not None:
                    eng.done(st.stream.cuda_stream)
                if self.overlap:
                    threading.Thread(target=self._finish, args=(st,), name="gradcomp-wait", daemon=True).start()
                else:
                    self._finish(st)
            return fut
        except BaseException as e:
            self._abort(st, e)
            raise

    @staticmethod
    def _stage(buf):
        if buf.dtype == torch.float32 and buf.is_contiguous():
            return buf
        if buf.dtype not in _STAGED_DTYPES and buf.dtype != torch.float32:
            raise TypeError("gradcomp.torch: bucket holds %s gradients; want float32, float16, bfloat16 or float64"
                            % buf.dtype)
        return buf.to(torch.float32).contiguous()

    def _plain(self, st, buf, index):
        """torch's default exchange: an all-reduce of bucket/world."""
        group = self.process_group
        world = dist.get_world_size(group)
        if self._local == 1:
            self._layout[index] = buf.numel()
        st.plain_sent += 2 * (world - 1) * 4 * buf.numel() // world
        st.plain_buckets += 1
        buf.div_(world)
        fut = dist.all_reduce(buf, group=group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    def _create(self, buf):
        """Creates the engine for the layout seen in step 1 (and applies a
        loaded state): the handshake runs here, through the host thread."""
        n = len(self._layout)
        sizes = [self._layout.get(i) for i in range(n)]
        try:
            if not n or None in sizes:
                raise ValueError("gradcomp.torch: step 1 saw buckets %s, not 0..%d" % (sorted(self._layout), n - 1))
            device = -1 if buf.device.type == "cpu" else buf.device.index
            eng = Engine(self.spec, sizes, process_group=self.process_group, strategy=self.strategy,
                         decision=self.decision, error_feedback=self.error_feedback,
                         fail_on_nonfinite=self.on_nonfinite == "raise", warmup=self.warmup_steps - PLAIN_STEPS,
                         timeout=self.timeout, workers=self.workers, device=device, momentum=self.momentum,
                         schedule=self.schedule, guard=self.guard, momentum_masking=self.momentum_masking)
        except _lib.ConfigError as e:
            e = _lib.ConfigError(e.function, e.status, "%s; this rank (%d) has State(%r, strategy=%r, decision=%r, "
                                 "warmup_steps=%d (the engine's warm-up is warmup_steps - %d), error_feedback=%r, "
                                 "on_nonfinite=%r, momentum=%r, schedule=%r) and buckets %s" % (
                                     e.message, dist.get_rank(self.process_group), self.spec, self.strategy,
                                     self.decision, self.warmup_steps, PLAIN_STEPS, self.error_feedback,
                                     self.on_nonfinite, self.momentum, self.schedule, sizes))
            self._broken = e
            raise e
        except BaseException as e:
            self._broken = e
            raise
        if self._pending is not None:
            try:
                eng.load_state(self._pending)
            except BaseException as e:
                eng.close()
                self._broken = e
                raise
            self._pending = self._pending_layout = None
        self._engine, self._sizes = eng, sizes
        logger.info("engine for %s (strategy %s, decision %s) on %d ranks, %d buckets %s, warm-up until "
                    "step %d", self.spec, self.strategy, self.decision, eng.world, len(sizes), sizes,
                    self.warmup_steps)

    def _abort(self, st, e):
        """The step cannot go on (a bucket refused, a wait that failed
        before it began): the engine is destroyed (its step abandoned,
        error feedback keeping e + g) and the step's futures completed."""
        eng = self._engine
        if eng is not None and st.started:
            self._broken = e
            self._engine = None
            try:
                eng.close()
            except Exception as e2:
                logger.debug("gradcomp: closing the engine after %s: %s", e, e2)
            st.fail(e)
            self._resolve(st, e)

    def _finish(self, st):
        """Waits for the engine's step, reads its statistics, copies staged
        buckets back and completes the step's futures."""
        eng = self._engine
        err = None
        try:
            eng.wait()
        except BaseException as e:
            err = e
        try:
            stats = eng.stats()
        except Exception:
            stats = None
        if stats is not None:
            self._record(stats, st.number)
        if isinstance(err, _lib.NonFiniteError):
            err = _lib.NonFiniteError(err.function, err.status, "gradcomp.torch: hook step %d: %s (on_nonfinite="
                                      "'raise'; the State stays usable: skip this optimizer step)"
                                      % (st.number, err.message))
        if err is not None:
            st.fail(err)
            if not isinstance(err, _lib.NonFiniteError):
                self._broken = err  # GC_ERR_COMM: the engine is broken
        else:
            for fut, buf, staged in st.pending:
                if staged is not buf:
                    if st.stream is not None:
                        with torch.cuda.stream(st.stream):
                            buf.copy_(staged)
                    else:
                        buf.copy_(staged)
        self._resolve(st, err)

    @staticmethod
    def _resolve(st, err):
        pending, st.pending = st.pending, []
        for fut, buf, staged in pending:
            if err is not None and not st.in_backward:
                fut.set_exception(err)
            else:
                fut.set_result(buf)

    def _record(self, s, hook_step):
        """Counts the step and logs decisions that are new or changed."""
        with self._lock:
            self.last_step = s
            c = self._counts
            c["engine_steps"] += 1
            c["bytes_sent"] = s.bytes_sent
            c["bytes_sent_total"] += s.bytes_sent
            for b in s.buckets:
                c["compressed" if b.compressed else "dense"] += 1
                c["nonfinite"] += int(b.nonfinite)
                c["guarded"] += int(b.guarded)
        for b in s.buckets:
            if b.guarded:
                logger.info("hook step %d (engine step %d): bucket %d: %s", hook_step, s.step, b.bucket,
                            b.reason[b.reason.index("accuracy guard:"):])
        bad = [b.bucket for b in s.buckets if b.nonfinite]
        if bad:
            logger.warning("hook step %d (engine step %d): NaN/Inf in bucket(s) %s (%s)", hook_step, s.step, bad,
                           "raised" if self.on_nonfinite == "raise" else "sent dense")
        for b in s.buckets:
            key = (b.strategy, b.decided_compressed)
            prev = self._decided.get(b.bucket)
            if prev == key and not b.switched:
                continue
            self._decided[b.bucket] = key
            if prev is None and "caution:" in b.reason and not self._cautioned:
                self._cautioned = True  # the engine's caution about the configuration, once per State
                logger.warning("%s: %s", self.spec, b.reason[b.reason.index("caution:"):].split(";")[0])
            logger.info(
                "bucket %d (%d elements): %s, %s%s; predicted dense %s, compressed %s; measured dense %s, "
                "compressed %s; %s", b.bucket, b.elements, b.strategy,
                "compressed" if b.decided_compressed else "dense",
                " (changed at engine step %d)" % s.step if prev is not None else "",
                _ms(b.predicted_dense_seconds), _ms(b.predicted_compressed_seconds),
                _ms(b.measured_dense_seconds), _ms(b.measured_compressed_seconds), b.reason)


def hook(state, bucket):
    """The DDP communication hook: ``ddp_model.register_comm_hook(state,
    gradcomp.torch.hook)``. Returns a future holding the bucket averaged
    over the process group (see the module documentation)."""
    return state._hook(bucket)
