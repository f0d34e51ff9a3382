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

import collections
import contextlib
import datetime
import functools
import logging
import math
import os
import queue
import socket
import threading
import time

import torch
import torch.distributed as dist

from . import _lib
from ._compressor import canonical_spec, has_cuda
from ._engine import Engine, format_schedule, matrix_shape

__all__ = ["State", "hier_layout", "hook"]

logger = logging.getLogger("gradcomp")

#: Steps exchanged with torch's all-reduce before the engine exists.
PLAIN_STEPS = 2
_FORMAT = "gradcomp.torch.State/3"
_FORMATS = ("gradcomp.torch.State/2", _FORMAT)  # /2 has no "params"
_STAGED_DTYPES = (torch.float16, torch.bfloat16, torch.float64)
_ON_NONFINITE = ("dense", "raise")
_DECISIONS = ("auto", "compressed", "dense")
_STRATEGIES = ("auto", "dense", "shared-index", "sparse-gather", "sra", "allgather", "hier")

#: The environment variable that places rank r on node r // k (tests of the
#: hierarchical exchange on one machine).
ENV_RANKS_PER_NODE = "GRADCOMP_RANKS_PER_NODE"


def _node_of(claims):
    """The node id of every rank from what each rank claimed (its
    GRADCOMP_RANKS_PER_NODE, torchrun's LOCAL_RANK and LOCAL_WORLD_SIZE,
    its host name), and how it was found. The same on every rank (every
    rank has every claim); ValueError when the claims disagree."""
    world = len(claims)

    def disagree(what, key):
        values = collections.OrderedDict()
        for r, c in enumerate(claims):
            values.setdefault(c[key], r)
        (a, ra), (b, rb) = list(values.items())[:2]
        return ValueError("gradcomp.torch.State(strategy='hier'): ranks disagree on %s: rank %d has %r, rank %d has %r"
                          % (what, ra, a, rb, b))

    ks = set(c["k"] for c in claims)
    if ks != {None}:
        if len(ks) > 1:
            raise disagree(ENV_RANKS_PER_NODE, "k")
        raw = ks.pop()
        try:
            k = int(raw)
        except ValueError:
            k = 0
        if k < 1:
            raise ValueError("gradcomp.torch.State(strategy='hier'): %s=%r: want a number of ranks ≥ 1"
                             % (ENV_RANKS_PER_NODE, raw))
        return [r // k for r in range(world)], "%s=%d" % (ENV_RANKS_PER_NODE, k)
    lws = set(c["local_world_size"] for c in claims)
    if None not in lws and all(c["local_rank"] is not None for c in claims):
        if len(lws) > 1:
            raise disagree("LOCAL_WORLD_SIZE (every node must hold the same number of ranks)", "local_world_size")
        size = int(lws.pop())
        if size < 1 or world % size:
            raise ValueError("gradcomp.torch.State(strategy='hier'): LOCAL_WORLD_SIZE=%d does not divide the %d ranks: "
                             "every node must hold the same number of ranks" % (size, world))
        for r, c in enumerate(claims):
            if int(c["local_rank"]) != r % size:
                raise ValueError("gradcomp.torch.State(strategy='hier'): rank %d has LOCAL_RANK=%s, LOCAL_WORLD_SIZE=%d: "
                                 "want torchrun's placement, rank r on node r // LOCAL_WORLD_SIZE (set %s otherwise)"
                                 % (r, c["local_rank"], size, ENV_RANKS_PER_NODE))
        return [r // size for r in range(world)], "LOCAL_WORLD_SIZE=%d" % size
    names = {}
    return [names.setdefault(c["host"], len(names)) for c in claims], "host names"


def _nodes(process_group):
    """The ranks of every node, in node order, and how they were found.
    Collective over the default group: every rank all-gathers its claim
    (GRADCOMP_RANKS_PER_NODE=k: rank r on node r // k; else torchrun's
    LOCAL_RANK and LOCAL_WORLD_SIZE; else socket.gethostname()).
    ValueError on every rank when the claims disagree, the nodes hold
    different numbers of ranks, or process_group is not every rank."""
    world = dist.get_world_size()
    if dist.get_world_size(process_group) != world:
        raise ValueError("gradcomp.torch.State(strategy='hier'): process_group holds %d of the job's %d ranks: the "
                         "hierarchical exchange runs over every rank" % (dist.get_world_size(process_group), world))
    env = os.environ
    claim = {"k": env.get(ENV_RANKS_PER_NODE) or None, "local_rank": env.get("LOCAL_RANK"),
             "local_world_size": env.get("LOCAL_WORLD_SIZE"), "host": socket.gethostname()}
    claims = [None] * world
    dist.all_gather_object(claims, claim)
    node_of, how = _node_of(claims)
    members = collections.OrderedDict()
    for r, n in enumerate(node_of):
        members.setdefault(n, []).append(r)
    nodes = list(members.values())
    sizes = [len(m) for m in nodes]
    if len(set(sizes)) > 1:
        raise ValueError("gradcomp.torch.State(strategy='hier'): the nodes (from %s) hold %s ranks: every node must "
                         "hold the same number (nodes: %s)" % (how, sizes, nodes))
    return nodes, how


def _groups_of(nodes, process_group, timeout):
    """This rank's place among ``nodes`` (_nodes's) and its groups:
    ((node, nodes, local_rank, local_size), node group, cross group). It
    makes every node's group and every local rank's cross-node group with
    dist.new_group, in the same order on every rank."""
    rank, local_size = dist.get_rank(), len(nodes[0])
    kw = dict(timeout=datetime.timedelta(seconds=timeout), backend=dist.get_backend(process_group))
    mine_node = mine_cross = None
    for n, m in enumerate(nodes):
        g = dist.new_group(ranks=m, **kw)
        if rank in m:
            mine_node, node, local_rank = g, n, m.index(rank)
    for l in range(local_size):
        g = dist.new_group(ranks=[m[l] for m in nodes], **kw)
        if l == local_rank:
            mine_cross = g
    return (node, len(nodes), local_rank, local_size), mine_node, mine_cross


def hier_layout(process_group=None, timeout=60.0):
    """This rank's place among the nodes and its groups for strategy
    "hier": ((node, nodes, local_rank, local_size), node group, cross
    group). Collective over the default group: every rank all-gathers its
    claim (GRADCOMP_RANKS_PER_NODE=k: rank r on node r // k; else torchrun's
    LOCAL_RANK and LOCAL_WORLD_SIZE; else socket.gethostname()), then makes
    every node's group and every local rank's cross-node group with
    dist.new_group, in the same order on every rank. ValueError on every
    rank when the claims disagree or the nodes hold different numbers of
    ranks."""
    nodes, _ = _nodes(process_group)
    return _groups_of(nodes, process_group, timeout)


def check_options(where, spec, decision, on_nonfinite, timeout, momentum, guard, momentum_masking, error_feedback):
    """Checks the engine options every front end's State takes (State's
    docstring says what each means): TypeError for a spec that is not a
    str, ValueError naming ``where`` and the option otherwise."""
    if not isinstance(spec, str):
        raise TypeError("%s: spec must be a str, got %s" % (where, type(spec).__name__))
    if decision not in _DECISIONS:
        raise ValueError("%s: decision=%r: want one of %s" % (where, decision, _DECISIONS))
    if on_nonfinite not in _ON_NONFINITE:
        raise ValueError("%s: on_nonfinite=%r: want one of %s" % (where, on_nonfinite, _ON_NONFINITE))
    if not (isinstance(timeout, (int, float)) and not isinstance(timeout, bool) and timeout > 0):
        raise ValueError("%s: timeout=%r: want seconds > 0" % (where, timeout))
    if not (isinstance(momentum, (int, float)) and not isinstance(momentum, bool) and 0 <= momentum < 1):
        raise ValueError("%s: momentum=%r: want a number in [0, 1)" % (where, momentum))
    if not (isinstance(guard, (int, float)) and not isinstance(guard, bool) and 0 <= guard < float("inf")):
        raise ValueError("%s: guard=%r: want a finite number ≥ 0 (0: off)" % (where, guard))
    if momentum_masking and not momentum:
        raise ValueError("%s: momentum_masking=True needs momentum > 0" % where)
    if guard and not error_feedback:
        raise ValueError("%s: guard=%r needs error_feedback=True: without it nothing is held back" % (where, guard))


def set_options(state, spec, strategy, decision, warmup_steps, error_feedback, on_nonfinite, timeout, workers,
                momentum, momentum_masking, schedule, guard):
    """Sets the engine options every front end's State keeps, checked
    (check_options), as attributes of ``state``: ``spec`` in its canonical
    form (the library's word on it: ValueError with its message),
    ``strategy``, ``decision``, ``warmup_steps``, ``error_feedback``,
    ``on_nonfinite``, ``timeout``, ``workers``, ``momentum`` (momentum
    correction's, 0: off), ``momentum_masking``, ``schedule`` (as
    gc_engine_config takes it, "" for none) and ``guard`` (0: off)."""
    state.spec = canonical_spec(spec)
    state.strategy, state.decision, state.warmup_steps = strategy, decision, warmup_steps
    state.error_feedback, state.on_nonfinite, state.timeout = bool(error_feedback), on_nonfinite, float(timeout)
    state.workers, state.momentum, state.momentum_masking = int(workers), float(momentum), bool(momentum_masking)
    state.schedule, state.guard = format_schedule(schedule), float(guard)


def _bucket_params(bucket):
    """A DDP bucket's parameters, in its order (None for a bucket that does
    not say: GradBucket.parameters() missing or empty)."""
    try:
        params = bucket.parameters()
    except AttributeError:
        return None
    return list(params) or None


def _signature(params, positions):
    """Parameters as [position, shape] pairs, position being the
    parameter's place among the State's first step's parameters (None when
    either is unknown)."""
    if params is None or positions is None:
        return None
    return [[positions.get(id(p), -1), list(p.shape)] for p in params]


def _signature_shapes(sig, sizes):
    """The engine buckets' shapes (matrix_shape) from a signature of the
    parameters in the engine's bucket order, cut at ``sizes``; None when
    there is none or a parameter straddles two buckets."""
    if not sig:
        return None
    out, left, i = [[] for _ in sizes], list(sizes), 0
    for _, shape in sig:
        n = 1
        for d in shape:
            n *= int(d)
        while i < len(sizes) and left[i] == 0 and n > 0:
            i += 1
        if i == len(sizes) or n > left[i]:
            return None
        out[i].append(matrix_shape(shape))
        left[i] -= n
    return out if not any(left) else None


def _valid_signature(sig, layout):
    """Whether sig is a list of [index, shape] pairs (ints) whose shapes
    hold sum(layout) elements."""
    if not isinstance(sig, list) or layout is None:
        return False
    total = 0
    for p in sig:
        if not (isinstance(p, list) and len(p) == 2 and isinstance(p[0], int) and isinstance(p[1], list)
                and all(isinstance(d, int) and d >= 0 for d in p[1])):
            return False
        n = 1
        for d in p[1]:
            n *= d
        total += n
    return total == sum(layout)


def _shapes(sig, limit=6):
    """A short text of a signature's shapes."""
    shown = ["x".join(map(str, shape)) or "scalar" for _, shape in sig[:limit]]
    return "[%s%s]" % (", ".join(shown), ", ..." if len(sig) > limit else "")


def _complete(out, f, buf, divide=1, then=None):
    """Completes the future ``out`` with ``buf`` (divided by ``divide``)
    once the collective of future ``f`` ended, or with its error; calls
    ``then()`` before, either way."""
    err = None
    try:
        f.wait()
        if divide != 1:
            buf.div_(divide)
    except Exception as e:
        err = e
    if then is not None:
        then()
    if err is not None:
        out.set_exception(err)
    else:
        out.set_result(buf)


class _Finisher:
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


def _delegate_done(eng, index, st):
    """Tells ``eng`` that DDP's all-reduce of its delegated bucket ``index``
    ended (its Wait waits for it), and step ``st`` when. An engine closed
    or failed meanwhile has no use for it."""
    st.ended = time.perf_counter()
    try:
        eng.delegate_done(index)
    except Exception as e:
        logger.debug("gradcomp: delegate_done(%d): %s", index, e)


def _split(st, stats, wire, done):
    """Where an engine step's time went, in milliseconds: "backward" from
    DDP's first bucket to its last (the step's buckets arriving, gradients
    still being computed), "encode" and "decode" the engine's compression
    and decompression summed over buckets, "wire" the collectives
    themselves as the host ran them, "handoff" the rest of the engine's
    exchange time (posting, queueing, copying: the engine's exchange
    minus the wire, at least 0), and "exposed" from the last bucket to the
    averages (what backward did not hide). Encode, wire, handoff and decode
    run on several threads at once and overlap backward and each other:
    they do not add up to the step."""
    buckets = stats.buckets
    exchange = sum(b.exchange_seconds for b in buckets)
    return {
        "backward": 1e3 * (st.last - st.first),
        "encode": 1e3 * sum(b.compress_seconds for b in buckets),
        "wire": 1e3 * wire,
        "handoff": 1e3 * max(0.0, exchange - wire),
        "decode": 1e3 * sum(b.decompress_seconds for b in buckets),
        "exposed": 1e3 * (done - st.last),
    }


def count_step(counts, s):
    """Adds the engine's step ``s`` (StepStats) to a State's counters:
    the step, its bytes, and its buckets compressed or dense, non-finite
    and guarded."""
    counts["engine_steps"] += 1
    counts["bytes_sent"] = s.bytes_sent
    counts["bytes_sent_total"] += s.bytes_sent
    for b in s.buckets:
        counts["compressed" if b.compressed else "dense"] += 1
        counts["nonfinite"] += int(b.nonfinite)
        counts["guarded"] += int(b.guarded)


def step_stats(eng):
    """The StepStats of ``eng``'s last waited step, or None where reading
    them fails (a closed engine, say): a step's bookkeeping goes on
    without them."""
    try:
        return eng.stats()
    except Exception:
        return None


def close_engine(state, who):
    """A State's close: destroys ``state._engine`` and its transport, and
    the State fails from then on (``who`` names it in the error)."""
    eng, state._engine = state._engine, None
    if eng is not None:
        state._broken = state._broken or _lib.ClosedError("gc_engine", _lib.Status.CLOSED,
                                                          "%s: the State was closed" % who)
        eng.close()


def table(head, rows):
    """A summary table: ``head``, then ``rows`` (the first the column
    names) in columns padded to their widest cell, the last column (the
    reason) left as it is."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    return "\n".join([head] + ["  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[-1] for r in rows])


def _ms(seconds):
    return "%.3f ms" % (seconds * 1e3) if seconds else "-"


class _Step:
    """One step of the hook: its futures and its first error."""

    def __init__(self, number, in_backward):
        self.number = number
        self.in_backward = in_backward
        self.mode = None  # "plain", "staged" or "direct", chosen at the step's first bucket
        self.started = False  # gc_engine_step was called
        self.buckets = {}  # staged and plain: bucket index -> (buffer, its parameters, future), until used
        self.launched = 0  # plain: buckets 0..launched-1 are on the wire
        self.unpermute = None  # staged: (DDP's concatenation, gather index, the engine's) to scatter back
        self.native = {}  # direct: delegated bucket index -> (bucket buffer, its future), until launched
        self.delegated = 0  # direct: the buckets delegated
        self.arrived = set()  # direct: the buckets come so far
        self.native_next = 0  # direct: buckets below it are come, the delegated ones launched
        self.pending = []  # (future, bucket buffer, staged float32 buffer)
        self.readied = set()
        self.error = None
        self.stream = None  # CUDA: the stream of the buckets
        self.plain_sent = 0  # a plain step's bytes (ring all-reduce accounting)
        self.plain_buckets = 0
        self.first = self.last = time.perf_counter()  # the step's first and latest bucket from DDP
        self.ended = None  # direct: when the latest of its delegated all-reduces ended
        self.wire0 = 0.0  # the host's wire seconds when the engine's step began

    def fail(self, e):
        if self.error is None:
            self.error = e


class State:
    """The hook's state: the engine (from step 2), the step counter and the
    bucket layout.

    ``spec``: a compressor spec such as "topk:0.01", "int8", "sign",
    "randomk:0.01" or "none" (ValueError with the library's message if it
    is not accepted). ``strategy``: "auto" (the codec's own: sparse-gather
    for top-k, shared-index for random-k, SRA for the quantizers; when
    torch.distributed is initialized as the State is made and its ranks
    span 2 nodes or more of 2 ranks or more, the engine times steps of
    that and of "hier" when it is created and keeps the faster, every rank
    alike: see docs/DESIGN.md, "Auto chooses by trial"; a checkpoint
    resumes in the strategy it was saved with), "dense",
    "shared-index", "sparse-gather", "sra", "allgather" or "hier": the
    hierarchical exchange (a reduce-scatter in each node, the codec across
    nodes on each rank's shard, an all-gather in the node; needs
    torch.distributed initialized when the State is made, which learns
    the nodes then and makes their groups, see :func:`hier_layout`:
    GRADCOMP_RANKS_PER_NODE=k places rank r on node r // k, else
    torchrun's LOCAL_WORLD_SIZE, else the host names). ``decision``:
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

    def __init__(self, spec, strategy="auto", decision="auto", warmup_steps=10, error_feedback=True,
                 on_nonfinite="dense", timeout=60.0, process_group=None, workers=0, overlap=True, model=None,
                 momentum=0.0, schedule=None, guard=0.0, momentum_masking=False, engine_group=None, node_spec=""):
        if not isinstance(warmup_steps, int) or isinstance(warmup_steps, bool) or warmup_steps < PLAIN_STEPS:
            raise ValueError(
                "gradcomp.torch.State: warmup_steps=%r: want an int ≥ %d (DDP builds its buckets in its first "
                "step; the hook learns them in the second)" % (warmup_steps, PLAIN_STEPS)
            )
        if strategy not in _STRATEGIES:
            raise ValueError("gradcomp.torch.State: strategy=%r: want one of %s" % (strategy, _STRATEGIES))
        check_options("gradcomp.torch.State", spec, decision, on_nonfinite, timeout, momentum, guard,
                      momentum_masking, error_feedback)
        if not isinstance(node_spec, str) or (node_spec and strategy not in ("hier", "auto")):
            raise ValueError("gradcomp.torch.State: node_spec=%r: want a str, with strategy \"hier\" or \"auto\" (the "
                             "codec of the hierarchical exchange's node stages), not strategy %r" % (node_spec, strategy))
        set_options(self, spec, strategy, decision, warmup_steps, error_feedback, on_nonfinite, timeout, workers,
                    momentum, momentum_masking, schedule, guard)
        self.process_group = process_group
        self.overlap = bool(overlap)
        #: The codec of "hier"'s node stages ("" for float32).
        self.node_spec = node_spec
        self._params = None
        if model is not None:
            self._params = sum(p.numel() for p in model.parameters() if p.requires_grad)
        self._engine_group_arg = engine_group
        #: strategy "hier": this rank's place (node, nodes, local_rank,
        #: local_size), else None.
        self.topology = None
        self._groups = None
        if strategy == "hier":
            if not dist.is_initialized():
                raise ValueError("gradcomp.torch.State(strategy='hier') needs torch.distributed initialized: it learns "
                                 "the nodes and makes their groups when it is made")
            self.topology, node, cross = hier_layout(process_group, self.timeout)
            self._groups = {_lib.Group.NODE: node, _lib.Group.CROSS: cross}
            logger.info("hierarchical exchange: node %d of %d, local rank %d of %d", *self.topology)
        elif strategy == "auto" and dist.is_initialized() and dist.get_world_size() > 2:
            self._auto_layout(process_group)
        #: Steps this State has seen (its hook's step count; restored by
        #: load_state_dict).
        self.iter = 0
        self._local = 0  # steps seen since this State was made: the plain steps are 0 and 1
        self._first = {}  # bucket index -> its parameters, in this State's first step (DDP's initial buckets)
        self._layout = {}  # bucket index -> (elements, parameters), as seen in plain step 1
        self._sizes = None  # the engine's bucket sizes
        self._params_sig = None  # the engine's buckets' parameters as _signature pairs (None: unknown)
        self._confirmed = False  # DDP's buckets are the engine's in this process (direct steps)
        self._warned_staged = False
        self._engine = None
        self._pending = None  # engine state bytes to load when the engine is created
        self._pending_reshape = False  # saved by a job of another shape: load it collectively across shapes
        self._pending_layout = None  # and the layout it records
        self._pending_params = None  # and the parameters of that layout
        self._broken = None  # the error that ended this State's engine
        self._cur = None
        self._decided = {}  # bucket -> (strategy, decided_compressed) last logged
        self._cautioned = False
        self._lock = threading.Lock()
        self._counts = collections.Counter()
        self._last_step = None
        self._last_split = None
        self._finisher = None  # the _Finisher of overlapped steps, made at the first
        self._deferred = None  # a step whose every bucket DDP's all-reduce carried, its bookkeeping not yet done
        self._settling = threading.Lock()  # held while a deferred step's bookkeeping is done

    def _settled(self):
        """Waits until the latest step's bookkeeping (its engine Wait, its
        statistics) is done: DDP's futures of a step whose buckets DDP's own
        all-reduce carried complete before it. The bookkeeping of a step
        whose every bucket it carried is done here, on the caller's thread
        (see :meth:`_launch_wait`)."""
        f = self._finisher
        if f is not None and not f.running_here():
            f.drain()
        with self._settling:
            st, self._deferred = self._deferred, None
            if st is not None and self._engine is not None:  # else the engine went, its step with it
                self._finish(st)

    def _begin(self, st, eng):
        """Starts the engine's step for ``st``, once the step before it is
        settled (whose engine Wait may have found the engine broken)."""
        self._settled()
        if self._broken is not None:
            raise self._broken
        eng.step()
        st.started, st.wire0 = True, eng.host.wire_seconds

    @property
    def last_step(self):
        """The engine's StepStats of the last waited step (None before)."""
        self._settled()
        return self._last_step

    @property
    def last_split(self):
        """Where the last waited step's time went (see :func:`_split`), None
        before."""
        self._settled()
        return self._last_split

    def _auto_layout(self, process_group):
        """strategy "auto": learns the nodes (as hier_layout, the same on
        every rank) and, on 2 nodes or more of 2 ranks or more, makes their
        groups and hands the engine the layout, so that it chooses between
        the flat and the hierarchical exchange by trial. A layout it cannot
        use (claims that disagree, unequal nodes, process_group not every
        rank) keeps the flat exchange, on every rank alike."""
        try:
            nodes, how = _nodes(process_group)
        except ValueError as e:
            logger.info("strategy auto: flat exchange (%s)", e)
            return
        if len(nodes) < 2 or len(nodes[0]) < 2:
            return
        self.topology, node, cross = _groups_of(nodes, process_group, self.timeout)
        self._groups = {_lib.Group.NODE: node, _lib.Group.CROSS: cross}
        logger.info("strategy auto on %d nodes × %d ranks (from %s): the engine times flat and hierarchical steps "
                    "and keeps the faster", len(nodes), len(nodes[0]), how)

    # ---- what a user reads

    @property
    def engine(self):
        """The gradcomp._engine.Engine (None before step 2), its latest step
        finished."""
        self._settled()
        return self._engine

    @property
    def stats(self):
        """Counters: "steps" (hook steps), "plain_steps" (torch's all-reduce),
        "engine_steps", bucket-steps "compressed", "dense", "nonfinite" and
        "guarded" (sent dense with their residual by the accuracy guard),
        "native" (the engine's dense bucket-steps that DDP's own all-reduce
        carried out, also counted in "dense"),
        "bytes_sent" (this rank's bytes on the wire in the last step: the
        engine's count, or for a plain step a ring all-reduce's 2(N−1)/N·4S)
        and "bytes_sent_total"."""
        self._settled()
        with self._lock:
            out = dict(self._counts)
        out["steps"] = self.iter
        for k in ("plain_steps", "engine_steps", "compressed", "dense", "nonfinite", "guarded", "native",
                  "bytes_sent", "bytes_sent_total"):
            out.setdefault(k, 0)
        return out

    def summary(self):
        """A readable table of the last step, per bucket: elements,
        strategy, compressed or dense (and the decision for the steps to
        come), bytes this rank sent, compress/exchange/decompress times and
        the engine's reason."""
        self._settled()
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
        return table(head, rows)

    def close(self):
        """Destroys the engine and its transport (the State then fails)."""
        self._settled()
        if self._finisher is not None:
            self._finisher.close()
            self._finisher = None
        close_engine(self, "gradcomp.torch")

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
            params = self._seen_params() if layout else None
        return {
            "format": _FORMAT,
            "spec": self.spec,
            "strategy": self.strategy,
            "error_feedback": self.error_feedback,
            "iter": self.iter,
            "layout": list(layout) if layout else None,
            "params": params,
            "engine": data,
        }

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
        if not isinstance(sd, dict) or sd.get("format") not in _FORMATS:
            raise ValueError("%s: not a %s state dict" % (where, _FORMAT))
        try:
            spec, strategy, ef = sd["spec"], sd["strategy"], sd["error_feedback"]
            it, layout, data = sd["iter"], sd["layout"], sd["engine"]
        except KeyError as e:
            raise ValueError("%s: the state dict lacks %s" % (where, e))
        params = sd.get("params")
        if spec != self.spec:
            raise ValueError("%s: state saved with spec %r, this State has %r" % (where, spec, self.spec))
        if strategy != self.strategy and self._engine is not None:
            raise ValueError("%s: state saved with strategy %r, this State's engine has %r (a state of another "
                             "strategy loads before the engine exists)" % (where, strategy, self.strategy))
        if bool(ef) != self.error_feedback:
            raise ValueError("%s: state saved with error_feedback=%r, this State has %r"
                             % (where, bool(ef), self.error_feedback))
        if not isinstance(it, int) or isinstance(it, bool) or it < 0:
            raise ValueError("%s: iter %r is not a step count" % (where, it))
        if layout is not None and not (isinstance(layout, list) and all(isinstance(n, int) and n > 0 for n in layout)):
            raise ValueError("%s: layout %r is not a list of bucket sizes" % (where, layout))
        if params is not None and not _valid_signature(params, layout):
            raise ValueError("%s: params %r is not a list of [index, shape] pairs for the layout %s"
                             % (where, params if len(repr(params)) < 200 else "(...)", layout))
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
        self._settled()
        if self._engine is not None:
            if data is None:
                raise ValueError("%s: the state holds no engine state (saved before step %d) but this State's engine "
                                 "exists" % (where, PLAIN_STEPS))
            self._engine.load_state(data)  # validated whole; ValueError and unchanged on a mismatch
        else:
            reshape = False
            if data is not None and dist.is_initialized():
                reshape = self._check_pending(where, data, layout, info)
            self._pending, self._pending_layout, self._pending_params = data, layout, params if layout else None
            self._pending_reshape = reshape
        self.iter = it

    def _check_pending(self, where, data, layout, info):
        """Checks engine state bytes against the engine this State will make
        (the engine's own word, as its load will give it) and returns
        whether they need the load across shapes: a state of another
        strategy, node layout or world size that is otherwise this State's
        (its spec, error feedback, momentum, schedule, guard, buckets) is
        loaded by every rank at once when the engine is made
        (Engine.load_state_reshaped); any other mismatch raises
        ValueError."""
        world = dist.get_world_size(self.process_group)
        try:
            Engine.check_state(data, layout, world, spec=self.spec, **self._settings(data))
            return False
        except ValueError as plain:
            shaped = dict(self._settings(), strategy=info.strategy, topology=Engine.state_layout(data), node_spec="")
            try:
                Engine.check_state(data, layout, info.world, spec=self.spec, **shaped)
            except ValueError:
                raise plain
            logger.info("%s: the state was saved by a job of another shape (%s); every rank loads it across "
                        "shapes when the engine is made", where, plain)
            return True

    def _seen_layout(self):
        """The bucket sizes of DDP's final buckets, from a plain step after
        this State's first, once it ended (else None)."""
        if self._local < PLAIN_STEPS or not self._layout or sorted(self._layout) != list(range(len(self._layout))):
            return None
        return [self._layout[i][0] for i in range(len(self._layout))]

    def _shapes(self, sizes, buckets=None):
        """PowerSGD's bucket shapes (spec powersgd): each DDP bucket's
        parameters as matrices (matrix_shape), when the engine's buckets
        are DDP's and DDP says which parameters each holds; else None
        (the engine then refuses powersgd, saying it needs them). Other
        specs: None. ``buckets``: DDP's buckets as {index: (elements,
        parameters)} (default: those of plain step 1)."""
        buckets = self._layout if buckets is None else buckets
        if self.spec.split(":")[0] != "powersgd" or not buckets:
            return None
        layout = [buckets.get(i) for i in range(len(sizes))]
        if len(buckets) != len(sizes) or any(b is None or b[1] is None for b in layout) or \
                [b[0] for b in layout] != list(sizes):
            return None
        return [[matrix_shape(p.shape) for p in b[1]] for b in layout]

    def _shapes_of(self, sizes, sig):
        """PowerSGD's bucket shapes from the parameters' signature in the
        engine's bucket order (a resumed State's checkpoint records it);
        None for other specs or without one."""
        if self.spec.split(":")[0] != "powersgd":
            return None
        return _signature_shapes(sig, sizes)

    def _seen_params(self):
        """The parameters of the buckets of _seen_layout, in bucket order,
        as _signature pairs (None when unknown)."""
        params = [self._layout[i][1] for i in range(len(self._layout))]
        if any(p is None for p in params):
            return None
        return _signature([p for ps in params for p in ps], self._positions())

    def _positions(self):
        """Each parameter's place (by id) in the concatenation of this
        State's first step's buckets, DDP's initial buckets, which are the
        same in every process for the same model and DDP arguments (None
        when unknown)."""
        n = len(self._first)
        if not n or sorted(self._first) != list(range(n)) or any(self._first[i] is None for i in range(n)):
            return None
        params = [p for i in range(n) for p in self._first[i]]
        return {id(p): k for k, p in enumerate(params)}

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
        st.last = time.perf_counter()
        try:
            return self._bucket(st, bucket, buf, index, last)
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

    def _bucket(self, st, bucket, buf, index, last):
        if self._broken is not None:
            raise self._broken
        self._check(buf)
        if self._local == 0:
            self._first[index] = _bucket_params(bucket)
        if st.mode is None:
            st.mode = self._mode(buf)
        if st.mode == "plain":
            return self._plain(st, bucket, buf, index, last)
        if st.mode == "staged":
            return self._staged(st, bucket, buf, index, last)
        eng = self._engine
        try:
            if not st.started:
                self._begin(st, eng)
            if not (0 <= index < eng.nbuckets) or buf.numel() != eng.sizes[index] or index in st.readied:
                raise ValueError(
                    "gradcomp.torch: step %d: bucket %d has %d elements, but the engine was made for the buckets %s "
                    "DDP built (each once per step); DDP never changes them after its first step: was the model "
                    "or its DDP wrapper replaced under this State?" % (st.number, index, buf.numel(), eng.sizes))
            if buf.device.type == "cpu" and buf.dtype == torch.float32 and eng.delegable(index):
                fut = self._native(st, eng, index, buf)
            else:
                fut = self._ready(st, eng, index, buf, self._stage(buf))
            self._launch_native(st, index)
            if last:
                self._launch_wait(st, eng)
            return fut
        except BaseException as e:
            self._abort(st, e)
            raise

    def _mode(self, buf):
        """How this step's buckets reach the engine: "plain" (torch's
        all-reduce, before the engine), "direct" (each bucket as DDP hands
        it over, once DDP's buckets are known to be the engine's), or
        "staged" (the whole step after its last bucket, mapped onto the
        engine's buckets: a State resumed in a new process, whose DDP may
        still rebuild its buckets)."""
        if self._engine is None and self.iter < PLAIN_STEPS:
            return "plain"
        if self._engine is None and self._pending_layout is None and self._seen_layout() is not None:
            self._create(self._seen_layout(), buf, self._seen_params())
            self._confirmed = True
        if self._engine is not None and self._confirmed:
            return "direct"
        return "staged"

    def _ready(self, st, eng, index, buf, staged):
        """Hands ``staged`` (float32, contiguous) to the engine as bucket
        ``index``; returns the future of ``buf``, which gets the average."""
        if staged.device.type == "cuda":  # UNTESTED: the device engine
            st.stream = torch.cuda.current_stream(staged.device)
            eng.ready_device(index, staged, st.stream.cuda_stream)
        else:
            eng.ready(index, staged)
        st.readied.add(index)
        fut = torch.futures.Future()
        st.pending.append((fut, buf, staged))
        return fut

    def _native(self, st, eng, index, buf):
        """A bucket the engine sends dense this step (warm-up, a dense
        decision, a verification trial's dense step): DDP's own exchange,
        as torch's default hook makes it (the bucket all-reduced in place
        on DDP's process group), then divided by the world size as the
        engine divides a dense sum; the engine takes it as exchanged
        (delegate) and is told when it ended (delegate_done, which its
        Wait and verification wait for). No copy, no hand-off to the
        engine's host thread, the error-feedback memory untouched as in any
        dense step, and DDP's future completes as soon as the all-reduce
        ends. The all-reduces go out in bucket order (once every lower
        bucket has come), the same on every rank whatever order DDP hands
        the buckets over in."""
        eng.delegate(index)
        st.readied.add(index)
        st.delegated += 1
        with self._lock:
            self._counts["native"] += 1
        out = torch.futures.Future()
        st.native[index] = (buf, out)
        return out

    def _launch_native(self, st, index):
        """Marks bucket ``index`` as come, then launches the delegated
        buckets whose lower buckets have all come, in order."""
        st.arrived.add(index)
        world = dist.get_world_size(self.process_group)
        while st.native_next in st.arrived:
            item = st.native.pop(st.native_next, None)
            st.native_next += 1
            if item is not None:
                buf, out = item
                done = functools.partial(_delegate_done, self._engine, st.native_next - 1, st)
                dist.all_reduce(buf, group=self.process_group, async_op=True).get_future().then(
                    lambda f, buf=buf, out=out, done=done: _complete(out, f, buf, world, done))

    def _launch_wait(self, st, eng):
        """After the step's last bucket: checks every bucket came, then
        waits for the engine on a thread (overlap) or here. A step whose
        every bucket went to DDP's all-reduce needs no thread: DDP's
        futures complete without the engine, whose Wait returns at once
        after them; its bookkeeping waits for the next step's start (or
        whatever reads the State first: :meth:`_settled`), which spares the
        step a thread's wake-up that competes with the optimizer for the
        GIL and, on a loaded host, for the cores."""
        if len(st.readied) != eng.nbuckets:
            missing = sorted(set(range(eng.nbuckets)) - st.readied)
            raise ValueError("gradcomp.torch: step %d ended without bucket(s) %s" % (st.number, missing))
        if st.stream is not None:
            eng.done(st.stream.cuda_stream)
        if self.overlap and not st.pending:
            with self._settling:
                self._deferred = st
        elif self.overlap:
            if self._finisher is None:
                self._finisher = _Finisher("gradcomp-wait")
            self._finisher.submit(self._finish, st)
        else:
            self._finish(st)

    def _staged(self, st, bucket, buf, index, last):
        """A staged step's bucket: kept, with a future, until the step's
        last; then the step's buckets, concatenated in index order, are
        cut at the engine's bucket sizes and exchanged as one engine step,
        and each DDP bucket gets its part of the averages back. The result
        is bit for bit that of a step whose DDP buckets are the engine's:
        the engine sees the same bucket contents."""
        if index in st.buckets:
            raise ValueError("gradcomp.torch: step %d: bucket %d came twice" % (st.number, index))
        fut = torch.futures.Future()
        st.buckets[index] = (buf, _bucket_params(bucket), fut)
        if not last:
            return fut
        n = len(st.buckets)
        if sorted(st.buckets) != list(range(n)):
            raise ValueError("gradcomp.torch: step %d ended with buckets %s, not 0..%d" % (st.number, sorted(st.buckets),
                                                                                      n - 1))
        bufs = [st.buckets[i][0] for i in range(n)]
        sizes = [b.numel() for b in bufs]
        params = [st.buckets[i][1] for i in range(n)]
        sig = None if None in params else _signature([p for ps in params for p in ps], self._positions())
        if self._engine is None:
            seen = {i: (b.numel(), ps) for i, (b, ps) in enumerate(zip(bufs, params))}
            if self._pending_layout is not None:
                self._create(self._pending_layout, buf, self._pending_params, seen)
            else:
                self._create(sizes, buf, sig, seen)
        eng = self._engine
        try:
            try:
                perm = self._line_up(st, sizes, sig)
            except ValueError as e:
                self._broken = e
                raise
            ddp_flat = torch.cat([b.reshape(-1).to(torch.float32) for b in bufs])
            flat = ddp_flat if perm is None else ddp_flat[perm]
            self._begin(st, eng)
            start = 0
            for i, m in enumerate(eng.sizes):
                self._ready(st, eng, i, flat, flat.narrow(0, start, m))
                start += m
            st.pending = []  # one future per DDP bucket, over its part of the averages
            st.unpermute = None if perm is None else (ddp_flat, perm, flat)
            start = 0
            for i, b in enumerate(bufs):
                st.pending.append((st.buckets[i][2], b, ddp_flat.narrow(0, start, b.numel())))
                start += b.numel()
            if self._local >= 1 and sizes == eng.sizes:
                self._confirmed = True  # DDP has rebuilt: its buckets are the engine's from now on
            elif self._local >= 1 and not self._warned_staged:
                self._warned_staged = True
                logger.warning("DDP's buckets %s differ from the engine's %s (from the checkpoint): every step is "
                               "exchanged whole after backward, without overlap", sizes, eng.sizes)
            self._launch_wait(st, eng)
            return fut
        except BaseException as e:
            self._abort(st, e)
            for b, _, f in st.buckets.values():
                if not f.done():
                    f.set_result(b)
            raise

    def _line_up(self, st, sizes, sig):
        """Where each element of the engine's buckets sits in DDP's buckets
        of this step: None when at the same place (the concatenations are
        equal), else a gather index (a LongTensor over DDP's concatenation).
        ValueError when they cannot line up (other totals, other
        parameters)."""
        eng = self._engine
        if sum(sizes) != sum(eng.sizes):
            raise ValueError("gradcomp.torch: step %d: DDP's buckets %s hold %d elements, the engine's %s (from the "
                             "checkpoint or step 1) %d: not the model this State was made for"
                             % (st.number, sizes, sum(sizes), eng.sizes, sum(eng.sizes)))
        want = self._params_sig
        if sig is None or want is None or sig == want:
            return None
        if sorted(sig) != sorted(want) or len({p for p, _ in sig}) != len(sig) or min(p for p, _ in sig) < 0:
            raise ValueError("gradcomp.torch: step %d: DDP's buckets hold the parameters %s, the engine's buckets "
                             "(from the checkpoint) %s: their gradients do not line up"
                             % (st.number, _shapes(sig), _shapes(want)))
        where, start = {}, 0
        for pos, shape in sig:
            n = math.prod(shape)
            where[pos] = (start, n)
            start += n
        return torch.cat([torch.arange(where[pos][0], where[pos][0] + where[pos][1]) for pos, _ in want])

    @staticmethod
    def _stage(buf):
        if buf.dtype == torch.float32 and buf.is_contiguous():
            return buf
        if buf.dtype not in _STAGED_DTYPES and buf.dtype != torch.float32:
            raise TypeError("gradcomp.torch: bucket holds %s gradients; want float32, float16, bfloat16 or float64"
                            % buf.dtype)
        return buf.to(torch.float32).contiguous()

    def _plain(self, st, bucket, buf, index, last):
        """torch's default exchange: an all-reduce of bucket/world, bucket i
        launched once buckets 0..i have come (so every rank issues them in
        one order, whatever order it got them in). The buckets of a plain
        step after this State's first are DDP's final ones (DDP rebuilds
        them once, after its first step): the engine's layout."""
        group = self.process_group
        world = dist.get_world_size(group)
        if index in st.buckets or index < st.launched:
            raise ValueError("gradcomp.torch: step %d: bucket %d came twice" % (st.number, index))
        if self._local >= 1:
            self._layout[index] = (buf.numel(), _bucket_params(bucket))
        fut = torch.futures.Future()
        st.buckets[index] = (buf, None, fut)
        while st.launched in st.buckets:
            b, _, out = st.buckets.pop(st.launched)
            st.launched += 1
            st.plain_sent += 2 * (world - 1) * 4 * b.numel() // world
            st.plain_buckets += 1
            b.div_(world)
            dist.all_reduce(b, group=group, async_op=True).get_future().then(
                lambda f, b=b, out=out: _complete(out, f, b))
        if last and st.buckets:
            missing = sorted(set(range(max(st.buckets))) - set(st.buckets) - set(range(st.launched)))
            for b, _, out in st.buckets.values():
                out.set_result(b)
            raise ValueError("gradcomp.torch: step %d ended without bucket(s) %s" % (st.number, missing))
        return fut

    def _settings(self, state=None):
        """The engine's settings, as Engine and Engine.check_state take them,
        for an engine that is to load ``state`` (engine state bytes, or
        None): strategy "auto" with the nodes known resumes in the strategy
        the state records (a state loads only into the shape that saved
        it), without a new trial."""
        strategy = self.strategy
        if state is not None and strategy == "auto" and self.topology is not None:
            strategy = Engine.state_info(state).strategy
        return dict(strategy=strategy, decision=self.decision, error_feedback=self.error_feedback,
                    fail_on_nonfinite=self.on_nonfinite == "raise", warmup=self.warmup_steps - PLAIN_STEPS,
                    timeout=self.timeout, workers=self.workers, momentum=self.momentum, schedule=self.schedule,
                    guard=self.guard, momentum_masking=self.momentum_masking, topology=self.topology,
                    node_spec=self.node_spec)

    def _engine_group(self):
        """The process group the engine's collectives run on: the State's
        ``engine_group``, else a new group of the DDP group's ranks with
        the State's timeout, made here (every rank of the job creates it,
        in the same order: DDP's group must hold every rank). Never DDP's
        own group: DDP issues collectives of its own on it (the used-
        parameter map of ``find_unused_parameters=True``) from the autograd
        thread while the host's thread runs the engine's, and gloo matches
        collectives by their order on a group."""
        if self._engine_group_arg is not None:
            return self._engine_group_arg
        group = self.process_group
        world = dist.get_world_size()
        if dist.get_world_size(group) != world:
            raise ValueError("gradcomp.torch.State: process_group holds %d of the job's %d ranks: pass engine_group=, "
                             "a group of the same ranks made with dist.new_group on every rank, for the engine's "
                             "collectives" % (dist.get_world_size(group), world))
        return dist.new_group(timeout=datetime.timedelta(seconds=self.timeout), backend=dist.get_backend(group))

    def _create(self, sizes, buf, params=None, buckets=None):
        """Creates the engine for the bucket ``sizes`` (on ``buf``'s device)
        and applies a loaded state: the handshake runs here, through the
        host thread. ``params``: the parameters in bucket order, where known
        (checked against DDP's in staged steps); ``buckets``: DDP's buckets
        of this step, for their shapes (see _shapes)."""
        try:
            device = -1 if buf.device.type == "cpu" else buf.device.index
            group = self._engine_group()
            eng = Engine(self.spec, sizes, process_group=group, device=device, groups=self._groups,
                         shapes=self._shapes(sizes, buckets) or self._shapes_of(sizes, params),
                         **self._settings(None if self._pending_reshape else self._pending))
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
        try:
            # Whether any rank holds a state of another shape: then every
            # rank loads across shapes, those without a state adding none.
            reshape = [None] * dist.get_world_size(group)
            dist.all_gather_object(reshape, bool(self._pending_reshape), group=group)
            if any(reshape):
                eng.load_state_reshaped(self._pending)
            elif self._pending is not None:
                eng.load_state(self._pending)
        except BaseException as e:
            eng.close()
            self._broken = e
            raise
        self._pending = self._pending_layout = self._pending_params = None
        self._pending_reshape = False
        self._engine, self._sizes, self._params_sig = eng, list(sizes), params
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
        """Waits for the engine's step, copies staged buckets back and
        completes the step's futures, then reads the step's statistics
        (DDP goes on with the averages meanwhile; whatever reads the
        statistics waits for them: :meth:`_settled`)."""
        eng = self._engine
        err = None
        try:
            eng.wait()
        except BaseException as e:
            err = e
        done = time.perf_counter()
        if not st.pending and st.ended is not None:
            done = st.ended  # every bucket was DDP's: the step ended with the last all-reduce
        if isinstance(err, _lib.NonFiniteError):
            err = _lib.NonFiniteError(err.function, err.status, "gradcomp.torch: hook step %d: %s (on_nonfinite="
                                      "'raise'; the State stays usable: skip this optimizer step)"
                                      % (st.number, err.message))
        if err is not None:
            st.fail(err)
            if not isinstance(err, _lib.NonFiniteError):
                self._broken = err  # GC_ERR_COMM: the engine is broken
        else:
            with torch.cuda.stream(st.stream) if st.stream is not None else contextlib.nullcontext():
                if st.unpermute is not None:
                    ddp_flat, perm, flat = st.unpermute
                    ddp_flat[perm] = flat
                for fut, buf, staged in st.pending:
                    if staged is not buf:
                        buf.copy_(staged)
        self._resolve(st, err)
        stats = step_stats(eng)
        if stats is not None:
            self._record(stats, st.number)
            self._last_split = _split(st, stats, eng.host.wire_seconds - st.wire0, done)

    @staticmethod
    def _resolve(st, err):
        pending, st.pending = st.pending, []
        pending += [(fut, buf, buf) for buf, fut in st.native.values()]  # delegated, never launched
        st.native = {}
        for fut, buf, staged in pending:
            if err is not None and not st.in_backward:
                fut.set_exception(err)
            else:
                fut.set_result(buf)

    def _record(self, s, hook_step):
        """Counts the step and logs decisions that are new or changed."""
        with self._lock:
            self._last_step = s
            count_step(self._counts, s)
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
