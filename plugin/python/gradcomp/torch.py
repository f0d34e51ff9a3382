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
broadcast, barrier; see gradcomp._host).

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
* The engine's collectives run on a process group of their own
  (``engine_group``; by default one the State makes with
  ``dist.new_group`` when it creates the engine, over every rank, with the
  State's ``timeout``), never on DDP's: DDP issues collectives of its own
  there from the autograd thread (with ``find_unused_parameters=True``,
  the all-reduce of its used-parameter map), and gloo and NCCL match
  collectives by their order on a group. So models with unused parameters
  (found or not, the same on every rank or not), ``no_sync()``
  accumulation and buckets handed over in any order work, and a
  collective that cannot finish fails within ``timeout``. When DDP's
  process group is a subgroup, pass ``engine_group``, a group of the same
  ranks made with ``dist.new_group`` on every process.

What a user sees:

* One ``logging`` line (logger "gradcomp", level INFO) when the engine is
  created, and one per bucket for its first decision and for every change
  of it: bucket, elements, strategy, compressed or dense, the cost model's
  predicted and verification's measured times, and the engine's reason. A
  bucket with NaN/Inf logs a WARNING. A step's lines come with its
  statistics, once DDP has its averages: at the latest when the next step
  begins or the State is read.
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
(error-feedback memories, momentum, step number, spec, strategy, bucket
layout), the hook's step count and the parameters of the engine's
buckets in order (their shapes and places among DDP's initial buckets);
:meth:`State.load_state_dict` refuses, with ValueError and changing
nothing, a state of another spec, strategy or error-feedback setting, or
for another model (total elements against ``model``'s parameters, or the
bucket layout against the engine's).

Resume is bit-exact: a State restored in a new process (new process group,
model, optimizer and DDP restored from the same checkpoint) gives, after k
more steps, the parameters the uninterrupted run has after the same steps,
bit for bit, whether the checkpoint was taken inside the warm-up or after
it (tests/python/test_hook.py, 2 and 4 ranks). It creates its engine at its
first step and runs its first two steps "staged": DDP's buckets are then
its initial ones (DDP rebuilds them after its first step, in the order the
gradients became ready), so the hook keeps each bucket until the step's
last, gathers the gradients into the engine's bucket order (parameter by
parameter), runs one engine step and scatters the averages back. The
engine sees exactly the buckets of the uninterrupted run; only the
overlap of those two steps is lost. From the third step DDP's buckets
are the engine's and each goes to the engine as it comes. (Should DDP's
final buckets differ from the checkpoint's, every step stays staged, with
a warning.) Exactness needs the decision pinned (``decision="compressed"``
or ``"dense"``): the cost model decides from timings. A state saved
before the engine existed (hook steps 0 and 1) has no engine state; the
State runs the plain steps it has left, then creates its engine.

CUDA buckets need libgradcomp_cuda.so (loaded when torch sees a GPU) and a
NCCL group; that path has NOT run on a GPU yet.
"""


import datetime
import logging

import torch.distributed as dist

from . import _device, _lib
from ._ddp_buckets import signature_shapes, valid_signature
from ._ddp_hook import DDPHook
from ._engine import Engine
from ._state import ms
from ._topology import ENV_RANKS_PER_NODE  # noqa: F401 (gradcomp.torch.ENV_RANKS_PER_NODE)
from ._topology import find_nodes, hier_layout, make_groups

__all__ = ["State", "hier_layout", "hook"]

logger = logging.getLogger("gradcomp")

#: Steps exchanged with torch's all-reduce before the engine exists.
PLAIN_STEPS = 2


class State(DDPHook):
    """The hook's state: the engine (from step 2), the step counter and the
    bucket layout.

    ``spec``: a compressor spec such as "topk:0.01", "int8", "sign",
    "randomk:0.01" or "none" (ValueError with the library's message if it
    is not accepted). ``strategy``: "auto" (the codec's own: sparse-gather
    for top-k, shared-index for random-k, SRA for the quantizers; when
    the ranks span 2 nodes or more of 2 ranks or more, the engine times
    steps of that and of "hier" when it is created and keeps the faster,
    every rank alike: see docs/DESIGN.md, "Auto chooses by trial"; a checkpoint
    resumes in the strategy it was saved with), "dense",
    "shared-index", "sparse-gather", "sra", "allgather", "low-rank" (spec
    "powersgd:R"; :meth:`strategies` is the library's list) or "hier": the
    hierarchical exchange (a reduce-scatter in each node, the codec across
    nodes on each rank's shard, an all-gather in the node; the State
    learns the nodes and makes their groups, see :func:`hier_layout`:
    GRADCOMP_RANKS_PER_NODE=k places rank r on node r // k, else
    torchrun's LOCAL_WORLD_SIZE, else the host names). A State may be made
    before torch.distributed is initialized (as PyTorch Lightning's users
    make it): what needs the process group, the nodes of "hier" and
    "auto" included, is then learned at its first use, on every rank
    alike (its first bucket, or :meth:`load_state_dict` once
    torch.distributed is initialized); its arguments are checked at
    once. ``decision``:
    "auto" (the cost model, verified online), "compressed" or "dense"
    (pinned: reproducible). ``warmup_steps`` (≥ 2): steps exchanged dense
    before compression. ``error_feedback``: keep residuals. ``on_nonfinite``:
    "dense" (a bucket with NaN/Inf on any rank goes dense that step) or
    "raise" (FloatingPointError). ``timeout``: seconds per collective.
    ``process_group``: the group to exchange over (None: the default
    group). ``workers``: compressor threads, and the most threads the
    library runs (0: all CPUs; with several ranks per host, the cores of
    one rank, as torch.set_num_threads). ``overlap``:
    return from the hook while the exchange runs (True) or wait in the
    step's last bucket (False). ``model``: the module DDP wraps, optional,
    to refuse a checkpoint of another model in :meth:`load_state_dict`.
    ``momentum``: momentum correction (DGC), the momentum m in [0, 1) the
    optimizer would use, 0 for none: from the engine's first step every
    bucket becomes u = m·u + g before its exchange, and u is checkpointed
    with the error feedback; ``momentum_masking=True`` adds DGC's momentum
    factor masking (top-k and random-k zero u where they sent; off by
    default, it cost accuracy in this project's runs, see docs/ACCURACY.md). Pair
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
    ``engine_group``: the process group the engine's collectives run on
    (None: a new group over the ranks of ``process_group``, made when the
    engine is created; see the module documentation).
    ``node_spec``: the codec of "hier"'s node stages (strategy "hier", or
    "auto" when it keeps "hier"; CPU buckets): "" for float32, "bf16",
    "fp16" or "int8" (SDP4Bit's 8-bit inside a node), each stage quantized
    once without error feedback; the handshake compares it.
    ``guard``: the accuracy guard's threshold, 0 for none (needs
    ``error_feedback``; CPU or CUDA buckets): every rank measures, for each bucket
    it compresses, how much error feedback holds back against the
    gradient (|e|/|g|, ``BucketStats.held_back``); when the largest over
    the ranks passes ``guard``, the bucket's next compressed step goes
    dense with everything held back, emptying the memory. Each flush is
    logged (INFO), counted in ``stats["guarded"]``, and the last step's
    ``BucketStats.guarded`` and reason say so; the handshake compares it.
    """

    NAME, WHO, TAG = "gradcomp.torch.State", "gradcomp.torch", "gradcomp"
    PLAIN_STEPS = PLAIN_STEPS
    FORMATS = ("gradcomp.torch.State/2", "gradcomp.torch.State/3")  # /2 has no "params"
    WARMUP_WHY = "DDP builds its buckets in its first step; the hook learns them in the second"
    EXTRA_COUNTS = ("native",)
    LOG_STEP, STEP_ERROR = "hook step", "gradcomp.torch: hook step"
    SAVED_BEFORE = "before step %d" % PLAIN_STEPS

    def __init__(self, spec, strategy="auto", decision="auto", warmup_steps=10, error_feedback=True,
                 on_nonfinite="dense", timeout=60.0, process_group=None, workers=0, overlap=True, model=None,
                 momentum=0.0, schedule=None, guard=0.0, momentum_masking=False, engine_group=None, node_spec=""):
        super().__init__(process_group, overlap, spec=spec, strategy=strategy, decision=decision,
                         warmup_steps=warmup_steps, error_feedback=error_feedback, on_nonfinite=on_nonfinite,
                         timeout=timeout, workers=workers, momentum=momentum, schedule=schedule, guard=guard,
                         momentum_masking=momentum_masking)
        if not isinstance(node_spec, str) or (node_spec and strategy not in ("hier", "auto")):
            raise ValueError("gradcomp.torch.State: node_spec=%r: want a str, with strategy \"hier\" or \"auto\" (the "
                             "codec of the hierarchical exchange's node stages), not strategy %r" % (node_spec, strategy))
        #: The codec of "hier"'s node stages ("" for float32).
        self.node_spec = node_spec
        self._params = None
        if model is not None:
            self._params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self._engine_group_arg = engine_group
        #: strategy "hier" (or "auto" on nodes): this rank's place (node,
        #: nodes, local_rank, local_size), once known (see _place), else None.
        self.topology = None
        self._groups = None
        self._placed = False  # _place ran
        self._pending_reshape = False  # a loaded state saved by a job of another shape: load it across shapes
        self._cautioned = False
        if dist.is_initialized():
            self._place()

    def _place(self):
        """Learns what the State needs the process group for, once:
        for strategy "hier" this rank's node and the groups of the
        hierarchical exchange (:func:`hier_layout`), for "auto" on more
        than 2 ranks the same where the nodes allow a trial
        (:meth:`_auto_layout`). Collective over the default group. It runs
        when the State is made if torch.distributed is initialized then,
        else at the State's first use, on every rank alike: its first
        bucket, or :meth:`load_state_dict` once torch.distributed is
        initialized (a framework such as PyTorch Lightning initializes it
        after the user has made the State). An error (ranks that disagree
        on the nodes: ValueError on every rank) breaks the State."""
        self._placed = True
        try:
            if self.strategy == "hier":
                self.topology, node, cross = hier_layout(self.process_group, self.timeout)
                self._groups = {_lib.Group.NODE: node, _lib.Group.CROSS: cross}
                logger.info("hierarchical exchange: node %d of %d, local rank %d of %d", *self.topology)
            elif self.strategy == "auto" and dist.get_world_size() > 2:
                self._auto_layout(self.process_group)
        except BaseException as e:
            self._broken = e
            raise

    def _bucket(self, st, bucket, buf, index, last):
        """DDPHook's, after :meth:`_place` at the first bucket of a State
        made before torch.distributed was initialized."""
        if not self._placed:
            self._place()
        return super()._bucket(st, bucket, buf, index, last)

    def _auto_layout(self, process_group):
        """strategy "auto": learns the nodes (as hier_layout, the same on
        every rank) and, on 2 nodes or more of 2 ranks or more, makes their
        groups and hands the engine the layout, so that it chooses between
        the flat and the hierarchical exchange by trial. A layout it cannot
        use (claims that disagree, unequal nodes, process_group not every
        rank) keeps the flat exchange, on every rank alike."""
        try:
            nodes, how = find_nodes(process_group)
        except ValueError as e:
            logger.info("strategy auto: flat exchange (%s)", e)
            return
        if len(nodes) < 2 or len(nodes[0]) < 2:
            return
        self.topology, node, cross = make_groups(nodes, process_group, self.timeout)
        self._groups = {_lib.Group.NODE: node, _lib.Group.CROSS: cross}
        logger.info("strategy auto on %d nodes × %d ranks (from %s): the engine times flat and hierarchical steps "
                    "and keeps the faster", len(nodes), len(nodes[0]), how)

    # ---- what a user reads

    def _summary_rows(self, s):
        rows = [("bucket", "elements", "strategy", "sent", "by", "decided", "bytes", "compress", "exchange",
                 "decompress", "reason")]
        for b in s.buckets:
            rows.append((str(b.bucket), str(b.elements), b.strategy, "compressed" if b.compressed else "dense", b.origin,
                         "compressed" if b.decided_compressed else "dense", str(b.bytes_sent),
                         ms(b.compress_seconds), ms(b.exchange_seconds), ms(b.decompress_seconds), b.reason))
        return rows

    # ---- checkpoints

    def state_dict(self):
        """The state to checkpoint: the engine's state bytes
        (gc_engine_state_save; a state loaded and not yet applied, or None
        before the engine exists), the hook's step count, the bucket layout
        and the parameters of those buckets in order (shapes, and indices
        in ``model``'s parameters where the State has ``model``)."""
        self._settled()
        if self._engine is not None:
            data, layout, params = self._engine.save_state(), self._sizes, self._params_sig
        elif self._pending_layout is not None:
            data, layout, params = self._pending, self._pending_layout, self._pending_params
        else:
            data, layout = self._pending, self._seen_layout()
            params = self._seen.params() if layout else None
        return self._checkpoint(data, layout, params=params)

    def load_state_dict(self, sd):
        """Restores a :meth:`state_dict`. Everything is checked before
        anything changes: ValueError for a dict that is not one, a state of
        another spec, strategy or error-feedback setting, or of another
        model (its total elements against ``model``'s parameters; its
        bucket layout against the engine's, or the layout this State saw);
        the engine then validates its state whole (gc_engine_state_load).
        Before the engine exists the state is kept and applied when it is
        created, and the State's next steps are exact continuations (see
        the module documentation, "Checkpoints"). A state saved by a job
        of another strategy, node layout or world size (but this State's
        spec, error feedback, momentum, schedule, guard and buckets) is
        accepted then too: when the engine is made every rank loads across
        shapes (Engine.load_state_reshaped: the memories summed by what they
        add to the average and handed out again, not bit for bit; ranks
        without a state add none). Once the engine exists, only its own
        shape loads."""
        where = "gradcomp.torch.State.load_state_dict"
        ck = self._read_checkpoint(sd, where, other_strategy=self._engine is None)
        params, layout = sd.get("params"), ck.layout
        if params is not None and not valid_signature(params, sd["layout"]):
            raise ValueError("%s: params %r is not a list of [index, shape] pairs for the layout %s"
                             % (where, params if len(repr(params)) < 200 else "(...)", sd["layout"]))
        if layout is not None:
            total = sum(layout)
            if self._params is not None and total != self._params:
                raise ValueError("%s: the state is for a model of %d parameters (buckets %s); this State's model has %d"
                                 % (where, total, layout, self._params))
            mine = self._sizes or self._seen_layout()
            if mine is not None and list(mine) != layout:
                raise ValueError("%s: the state is for buckets %s (%d elements); this model's buckets are %s (%d)"
                                 % (where, layout, total, mine, sum(mine)))

        def keep():
            if dist.is_initialized() and not self._placed:
                self._place()
            reshape = ck.engine is not None and dist.is_initialized() and self._check_pending(where, ck)
            self._pending, self._pending_layout = ck.engine, layout
            self._pending_params = params if layout else None
            self._pending_reshape = reshape

        self._restore(where, ck, keep)

    def _strategy_refusal(self, where, strategy):
        return ("%s: state saved with strategy %r, this State's engine has %r (a state of another strategy loads "
                "before the engine exists)" % (where, strategy, self.strategy))

    def _check_pending(self, where, ck):
        """Checks Checkpoint ``ck``'s engine state against the engine this
        State will make (the engine's own word, as its load will give it)
        and returns whether it needs the load across shapes: a state of
        another strategy, node layout or world size that is otherwise this
        State's (its spec, error feedback, momentum, schedule, guard,
        buckets) is loaded by every rank at once when the engine is made
        (Engine.load_state_reshaped); any other mismatch raises
        ValueError."""
        world = dist.get_world_size(self.process_group)
        try:
            Engine.check_state(ck.engine, ck.layout, world, spec=self.spec, **self._settings(ck.engine))
            return False
        except ValueError as plain:
            shaped = dict(self._settings(), strategy=ck.info.strategy, topology=Engine.state_layout(ck.engine),
                          node_spec="")
            try:
                Engine.check_state(ck.engine, ck.layout, ck.info.world, spec=self.spec, **shaped)
            except ValueError:
                raise plain
            logger.info("%s: the state was saved by a job of another shape (%s); every rank loads it across "
                        "shapes when the engine is made", where, plain)
            return True

    def _shapes(self, sizes, params, buckets=None):
        """PowerSGD's bucket shapes (spec powersgd; None for other specs):
        from DDP's buckets (``buckets``: {index: (elements, parameters)},
        default those of plain step 1) where they are the engine's, else
        from the parameters' signature ``params`` in the engine's bucket
        order (a resumed State's checkpoint records it); None without
        either (the engine then refuses powersgd, saying it needs them)."""
        if self.spec.split(":")[0] != "powersgd":
            return None
        return self._seen.powersgd_shapes(sizes, buckets) or signature_shapes(params, sizes)

    # ---- the engine

    def _settings(self, state=None):
        """The engine's settings, as Engine and Engine.check_state take them,
        for an engine that is to load ``state`` (engine state bytes, or
        None): strategy "auto" with the nodes known resumes in the strategy
        the state records (a state loads only into the shape that saved
        it), without a new trial."""
        out = dict(super()._settings(), topology=self.topology, node_spec=self.node_spec)
        if state is not None and self.strategy == "auto" and self.topology is not None:
            out["strategy"] = Engine.state_info(state).strategy
        return out

    def _engine_group(self, own_nccl):
        """The process group of the engine: the State's ``engine_group``;
        else, for an engine on its own NCCL communicator (device buckets),
        DDP's group, whose ranks and store make it (the engine issues no
        collective on it); else a new group of the DDP group's ranks with
        the State's timeout, made here (every rank of the job creates it,
        in the same order: DDP's group must hold every rank). Never DDP's
        own group for the host engine: DDP issues collectives of its own on
        it (the used-parameter map of ``find_unused_parameters=True``) from
        the autograd thread while the host's thread runs the engine's, and
        gloo matches collectives by their order on a group. The host
        engine's collectives are on CPU tensors: where DDP's group is NCCL
        only (``init_process_group("nccl")``), which refuses them, the new
        group is gloo."""
        if self._engine_group_arg is not None:
            return self._engine_group_arg
        group = self.process_group
        if own_nccl:
            return group
        world = dist.get_world_size()
        if dist.get_world_size(group) != world:
            raise ValueError("gradcomp.torch.State: process_group holds %d of the job's %d ranks: pass engine_group=, "
                             "a group of the same ranks made with dist.new_group on every rank, for the engine's "
                             "collectives" % (dist.get_world_size(group), world))
        backend = dist.get_backend(group)
        if str(backend).lower() == "nccl":
            backend = "gloo"
        return dist.new_group(timeout=datetime.timedelta(seconds=self.timeout), backend=backend)

    def _rank(self):
        return "%d" % dist.get_rank(self.process_group)

    def _create(self, sizes, buf, params=None, buckets=None):
        """Creates the engine for the bucket ``sizes`` (on ``buf``'s device)
        and applies a loaded state: the handshake runs here, through the
        host thread. ``params``: the parameters in bucket order, where known
        (checked against DDP's in staged steps); ``buckets``: DDP's buckets
        of this step, for their shapes (see _shapes)."""
        def load(eng):
            # Whether any rank holds a state of another shape: then every
            # rank loads across shapes, those without a state adding none.
            reshape = [None] * dist.get_world_size(eng.group)
            dist.all_gather_object(reshape, bool(self._pending_reshape), group=eng.group)
            if any(reshape):
                eng.load_state_reshaped(self._pending)
            elif self._pending is not None:
                eng.load_state(self._pending)

        eng = self._new_engine(sizes, sizes, load, device=_device.ordinal(buf, dist.get_rank()), groups=self._groups,
                               shapes=self._shapes(sizes, params, buckets), **self._settings(None if self._pending_reshape else self._pending))
        self._pending_layout = self._pending_params = None
        self._pending_reshape = False
        self._sizes, self._params_sig = list(sizes), params
        logger.info("engine for %s (strategy %s, decision %s) on %d ranks, %d buckets %s, warm-up until "
                    "step %d", self.spec, self.strategy, self.decision, eng.world, len(sizes), sizes,
                    self.warmup_steps)

    def _log_step(self, s, hook_step):
        for b in s.buckets:
            if b.guarded:
                logger.info("hook step %d (engine step %d): bucket %d: accuracy guard: dense with the residual (a "
                            "flush, after a step held back more than %g·|g|)", hook_step, s.step, b.bucket,
                            b.guard_threshold)
            elif b.guard == "tripped":
                logger.info("hook step %d (engine step %d): bucket %d: accuracy guard tripped: held back %.3g·|g| > "
                            "%g; the next compressed step flushes", hook_step, s.step, b.bucket, b.held_back,
                            b.guard_threshold)
        super()._log_step(s, hook_step)

    def _log_decision(self, s, b, prev):
        if prev is None and b.caution != "none" and not self._cautioned:
            self._cautioned = True  # the engine's caution about the configuration, once per State
            logger.warning("%s: caution %s: %s", self.spec, b.caution, b.reason)
        logger.info(
            "bucket %d (%d elements): %s, %s%s; predicted dense %s, compressed %s; measured dense %s, "
            "compressed %s; %s", b.bucket, b.elements, b.strategy,
            "compressed" if b.decided_compressed else "dense",
            " (changed at engine step %d)" % s.step if prev is not None else "",
            ms(b.predicted_dense_seconds), ms(b.predicted_compressed_seconds),
            ms(b.measured_dense_seconds), ms(b.measured_compressed_seconds), b.reason)


def hook(state, bucket):
    """The DDP communication hook: ``ddp_model.register_comm_hook(state,
    gradcomp.torch.hook)``. Returns a future holding the bucket averaged
    over the process group (see the module documentation)."""
    return state._hook(bucket)
