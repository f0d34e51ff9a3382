"""gradcomp's engine over a hosted transport whose collectives a
:class:`gradcomp._host.TorchHost` carries out with torch.distributed.

:class:`Engine` is gradcomp's engine (overlap.Engine through the C ABI
2.0: strategies, handshake, cost model, NaN handling, checkpoints) over
a Hosted transport served by a TorchHost.

One step::

    eng = Engine("int8", [1000, 37], decision="compressed")
    eng.step()
    eng.ready(0, grad0)   # float32, contiguous, CPU; owned by the engine
    eng.ready(1, grad1)
    eng.wait()            # grad0 and grad1 now hold the rank average
    eng.stats()           # StepStats: bytes sent, stage times, decisions
"""

import collections
import ctypes

from . import _lib, _nccl
from ._host import Hosted, TorchHost
from ._lib import Status

__all__ = ["BucketStats", "Engine", "StateInfo", "StepStats"]

#: One bucket in the last waited step (gc_bucket_stats); times in seconds.
BucketStats = collections.namedtuple(
    "BucketStats",
    "bucket elements bytes_sent compressed nonfinite trial switched decided_compressed "
    "compress_seconds exchange_seconds decompress_seconds predicted_dense_seconds "
    "predicted_compressed_seconds measured_dense_seconds measured_compressed_seconds strategy reason "
    "guarded held_back origin caution guard guard_threshold",
)
BucketStats.__doc__ += (
    ": guarded is True when the accuracy guard sent the bucket dense with its residual this step; held_back is "
    "the guard's measure, the largest over the ranks of |e|/|g| after a compressed step (0 without the guard). "
    "The verdicts (gc_bucket_verdict, ABI 2.10), as the library's names (gradcomp.names): origin, what chose the "
    "path this step (\"pinned\", \"cost-model\", \"verification\", \"warm-up\", \"trial\", \"guard\", "
    "\"fallback\", ...); caution, a warning about the configuration (\"none\" without one); guard, the accuracy "
    "guard's state after the step (\"off\", \"clear\", \"tripped\": held_back passed guard_threshold and the next "
    "compressed step flushes, \"pending\"); guard_threshold, the guard's (0: off). reason says the same for "
    "people: read these, not it")

#: The last waited step (gc_engine_stats): its number, this rank's bytes
#: on the wire, wall and exposed seconds, and one BucketStats per bucket.
StepStats = collections.namedtuple("StepStats", "step bytes_sent total_seconds exposed_seconds buckets")

#: What a saved engine state records (gc_engine_state_info).
StateInfo = collections.namedtuple("StateInfo", "spec strategy world rank next_step sizes")


def format_schedule(schedule):
    """A schedule as gc_engine_config.schedule takes it: "" for none, a
    str as it is, or a list of (steps, spec) pairs as "STEPS@SPEC,..."
    (TypeError or ValueError for anything else)."""
    if schedule is None or isinstance(schedule, str):
        return schedule or ""
    parts = []
    for phase in schedule:
        try:
            steps, spec = phase
        except (TypeError, ValueError):
            raise TypeError("gradcomp: schedule phase %r is not a (steps, spec) pair" % (phase,))
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1 or not isinstance(spec, str):
            raise ValueError("gradcomp: schedule phase %r: want (steps ≥ 1, spec str)" % (phase,))
        parts.append("%d@%s" % (steps, spec))
    return ",".join(parts)


def engine_config(spec, *, strategy="auto", decision="auto", error_feedback=True, fail_on_nonfinite=False, warmup=0,
                  timeout=60.0, workers=0, device=-1, momentum=0.0, schedule="", guard=0.0, momentum_masking=False,
                  topology=None, node_spec="", shapes=None, feedback_decay=0.0):
    """A gc_engine_config of :class:`Engine`'s settings (its docstring
    says what each means); ValueError for settings this library's ABI
    lacks. The library checks the names (spec, strategy, decision) when
    it reads the config: InvalidArgumentError (a ValueError) with its
    message."""
    if shapes is not None and _lib.lib().gc_abi_version() & 0xFFFF < 7:
        raise ValueError("gradcomp: shapes (spec powersgd) need libgradcomp ABI 2.7; %s is older" % _lib.path())
    if (topology is not None or strategy == "hier") and _lib.lib().gc_abi_version() & 0xFFFF < 4:
        raise ValueError("gradcomp: strategy hier and topology need libgradcomp ABI 2.4; %s is older" % _lib.path())
    if node_spec and _lib.lib().gc_abi_version() & 0xFFFF < 5:
        raise ValueError("gradcomp: node_spec needs libgradcomp ABI 2.5; %s is older" % _lib.path())
    if (guard or momentum_masking) and not _lib.has("gc_engine_held_back"):
        raise ValueError("gradcomp: guard and momentum_masking need libgradcomp ABI 2.2; %s is older" % _lib.path())
    minor = _lib.lib().gc_abi_version() & 0xFFFF
    if feedback_decay and minor < 11:
        raise ValueError("gradcomp: feedback_decay needs libgradcomp ABI 2.11; %s is older" % _lib.path())
    cfg = _lib.EngineConfig()
    cfg.size = _lib.EngineConfig.size_for(minor)
    cfg.feedback_decay = float(feedback_decay)
    cfg.error_feedback = 1 if error_feedback else 0
    cfg.spec = _lib.cstring("spec", spec)
    cfg.strategy = _lib.cstring("strategy", strategy)
    cfg.decision = _lib.cstring("decision", decision)
    cfg.fail_on_nonfinite = 1 if fail_on_nonfinite else 0
    cfg.warmup = int(warmup)
    cfg.timeout_seconds = float(timeout)
    cfg.workers = int(workers)
    cfg.device = int(device)
    cfg.momentum = float(momentum)
    cfg.schedule = _lib.cstring("schedule", format_schedule(schedule))
    cfg.guard = float(guard)
    cfg.momentum_masking = 1 if momentum_masking else 0
    if topology is not None:
        cfg.node, cfg.nodes, cfg.local_rank, cfg.local_size = (int(v) for v in topology)
    cfg.node_spec = _lib.cstring("node_spec", node_spec) if node_spec else None
    if shapes is not None:
        counts = [len(b) for b in shapes]
        pairs = [int(v) for b in shapes for shape in b for v in shape]
        if any(len(shape) != 2 for b in shapes for shape in b):
            raise ValueError("gradcomp: shapes=%r: want, per bucket, (rows, cols) pairs" % (shapes,))
        # Kept on cfg: the library reads them while the engine is made.
        cfg._counts = (ctypes.c_uint64 * max(len(counts), 1))(*counts)
        cfg._pairs = (ctypes.c_uint64 * max(len(pairs), 1))(*pairs)
        cfg.tensor_counts = ctypes.cast(cfg._counts, ctypes.POINTER(ctypes.c_uint64))
        cfg.shapes = ctypes.cast(cfg._pairs, ctypes.POINTER(ctypes.c_uint64))
    return cfg


def matrix_shape(shape):
    """A tensor shape as PowerSGD views it, (rows, cols): a scalar or 1-D
    tensor is one row, a tensor of more dimensions its first against the
    product of the rest (a convolution weight out × in·kh·kw), as torch's
    PowerSGD hook does."""
    dims = [int(d) for d in shape]
    if len(dims) <= 1:
        return (1, dims[0] if dims else 1)
    cols = 1
    for d in dims[1:]:
        cols *= d
    return (dims[0], cols)


class Engine:
    """gradcomp's engine (gc_engine) for buckets of ``sizes`` float32
    elements, exchanging over ``process_group`` (None: torch.distributed's
    default group) through a Hosted transport and a TorchHost.

    ``strategy``: one of the library's strategies,
    ``gradcomp.names(Names.STRATEGY)``: "auto", "dense", "sra", ...;
    "hier" needs ``topology`` and ``groups``, "low-rank" spec
    "powersgd:R".
    ``shapes`` (ABI 2.7): per bucket, its tensors as (rows, cols) in the
    order they lie in it (:func:`matrix_shape` of each tensor's shape);
    spec powersgd needs them, other specs ignore them.
    ``topology``: this rank's place among the nodes, (node, nodes,
    local_rank, local_size) (None: unknown). ``node_spec`` (ABI 2.5):
    "bf16", "fp16" or "int8" codes the node stages of "hier" (host
    buckets; "" for float32). ``groups``: {Group.NODE:
    process group of this rank's node, Group.CROSS: process group of the
    ranks with this rank's local rank, one per node}, the groups the "hier"
    engine's posts name (each served by a thread of its own). ``decision``: "auto" (the cost model, verified online),
    "compressed" or "dense" (pinned). ``fail_on_nonfinite``: a NaN/Inf makes
    :meth:`wait` raise NonFiniteError (a FloatingPointError) instead of
    sending the bucket dense. ``warmup``: engine steps below it exchange
    every bucket dense. ``timeout``: seconds per collective. ``device``: -1
    host buckets (the engine over a hosted transport, its collectives
    carried out by a TorchHost on ``process_group``), else the CUDA device
    of the buckets (libgradcomp_cuda.so; in the fake-device test mode a
    fake device): the device engine on its own NCCL communicator (ABI
    2.9), made from a unique id that ``process_group``'s rank 0 spreads
    through torch.distributed's store (:mod:`gradcomp._nccl`), whatever the
    group's backend; every collective of its buckets and of its agreement
    runs on it: no hosted transport, no Python thread, no torch collective
    after the bootstrap (``groups`` then plays no part). ``schedule``: a compression warm-up after ``warmup``, as a list of
    (steps, spec) phases or the C ABI's "STEPS@SPEC,..." string, then
    ``spec`` (same strategy; with decision "auto" the cost model decides
    for ``spec``; host or device buckets). ``momentum``: momentum correction
    (host or device buckets), the optimizer's
    momentum in [0, 1): each bucket becomes u = m·u + g before its exchange
    (run the optimizer without momentum); 0 is off. ``momentum_masking``:
    DGC's momentum factor masking (top-k and random-k zero u where they
    sent). ``guard``: the accuracy
    guard's threshold (0: off; needs error feedback; host or device
    buckets): a
    bucket whose error feedback holds back more than ``guard`` times its
    gradient's norm on some rank goes dense with its residual on its next
    compressed step. ``feedback_decay`` (ABI 2.11): β of decayed error
    feedback (SparseLoCo's e ← β·e + g), in (0, 1] with error feedback; 0
    means none. Spec, strategy, decision, error feedback,
    fail_on_nonfinite, warmup, momentum and its masking, schedule, guard and
    the sizes must
    be equal on every rank: the handshake (run here, through the host,
    blocking) raises ConfigError (a ValueError) on every rank otherwise.
    """

    def __init__(self, spec, sizes, *, process_group=None, strategy="auto", decision="auto", error_feedback=True,
                 fail_on_nonfinite=False, warmup=0, timeout=60.0, workers=0, device=-1, momentum=0.0, schedule="",
                 guard=0.0, momentum_masking=False, topology=None, groups=None, node_spec="", shapes=None,
                 feedback_decay=0.0):
        import torch.distributed as dist

        cfg = engine_config(spec, strategy=strategy, decision=decision, error_feedback=error_feedback,
                            fail_on_nonfinite=fail_on_nonfinite, warmup=warmup, timeout=timeout, workers=workers,
                            device=device, momentum=momentum, schedule=schedule, guard=guard,
                            momentum_masking=momentum_masking, topology=topology, node_spec=node_spec,
                            shapes=shapes, feedback_decay=feedback_decay)
        if groups is not None and not all(g in groups for g in (_lib.Group.NODE, _lib.Group.CROSS)):
            raise ValueError("gradcomp: groups=%r: want {Group.NODE: process group, Group.CROSS: process group}"
                             % (groups,))
        self.sizes = [int(n) for n in sizes]
        self.spec = spec
        self.timeout = float(timeout)
        self.group = process_group
        rank, size = dist.get_rank(process_group), dist.get_world_size(process_group)
        self.rank, self.world = rank, size
        #: The buckets' device ordinal (-1: host memory).
        self.device = int(device)
        if device >= 0:
            self.hosted = self.host = None
            uid = _nccl.unique_id(process_group, rank, self.timeout)
            arr = (ctypes.c_uint64 * max(len(self.sizes), 1))(*self.sizes)
            e = ctypes.c_uint64()
            _lib.call("gc_engine_create_nccl", uid, rank, size, ctypes.byref(cfg), arr, len(self.sizes),
                      ctypes.byref(e))
            self.handle = e.value
            return
        self.hosted = Hosted(rank, size)
        # Host buckets: the engine's threads launch each post on the process
        # group as they make it.
        self.host = TorchHost(self.hosted, process_group, groups=groups, launch=True)
        arr = (ctypes.c_uint64 * max(len(self.sizes), 1))(*self.sizes)
        e = ctypes.c_uint64()
        try:
            _lib.call("gc_engine_create", self.hosted.handle, ctypes.byref(cfg), arr, len(self.sizes), ctypes.byref(e))
        except BaseException:
            self._close_transport()
            raise
        self.handle = e.value

    @property
    def nbuckets(self):
        return len(self.sizes)

    def _h(self):
        if not self.handle:
            raise _lib.ClosedError("gc_engine", Status.CLOSED, "gradcomp: the engine is closed")
        return self.handle

    def step(self):
        """Starts a step (gc_engine_step)."""
        _lib.call("gc_engine_step", self._h())

    def ready(self, bucket, grad):
        """Hands bucket ``bucket``'s gradient to the engine: a contiguous
        float32 CPU tensor of the bucket's size (or an (address, n) pair).
        The engine owns it until :meth:`wait` returns, which leaves the
        rank average in it."""
        if isinstance(grad, tuple):
            addr, n = grad
        else:
            addr, n = grad.data_ptr(), grad.numel()
        _lib.call("gc_engine_ready", self._h(), int(bucket), addr or None, int(n))

    def delegable(self, bucket):
        """Whether this step's bucket ``bucket`` may be all-reduced by the
        caller itself (:meth:`delegate`): it goes dense this step in a way a
        plain all-reduce of the average reproduces (gc_engine_delegable).
        Every rank gets the same answer."""
        out = ctypes.c_int()
        _lib.call("gc_engine_delegable", self._h(), int(bucket), ctypes.byref(out))
        return bool(out.value)

    def delegate(self, bucket):
        """Takes bucket ``bucket`` as exchanged by the caller, in place of
        :meth:`ready`: the caller all-reduces it into the average with its
        own collective (gc_engine_delegate) and then calls
        :meth:`delegate_done`, which :meth:`wait` waits for; StateError
        when it is not :meth:`delegable`."""
        _lib.call("gc_engine_delegate", self._h(), int(bucket))

    def delegate_done(self, bucket):
        """The caller's all-reduce of delegated bucket ``bucket`` has ended
        (gc_engine_delegate_done); from any thread."""
        _lib.call("gc_engine_delegate_done", self._h(), int(bucket))

    def ready_device(self, bucket, grad, stream):
        """The device engine's ready: ``grad`` (a contiguous float32 tensor
        on the engine's device; in the fake-device test mode a CPU tensor)
        is bucket ``bucket``'s gradient once the work enqueued on the raw
        stream ``stream`` so far has run; the engine exchanges it in place
        on its own streams. Enqueues only: no host wait."""
        _lib.call("gc_engine_ready_device", self._h(), int(bucket), grad.data_ptr(), grad.numel(), int(stream))

    def done(self, stream):
        """Makes the raw stream ``stream`` wait for the step's end (the
        averages in the buckets): work enqueued on it afterwards sees them.
        Enqueues only: no host wait."""
        _lib.call("gc_engine_done", self._h(), int(stream))

    @property
    def wire_seconds(self):
        """Seconds the host has spent carrying out the engine's collectives
        (0 for an engine on its own NCCL communicator: the host carries
        none)."""
        return 0.0 if self.host is None else self.host.wire_seconds

    def wait(self, timeout=0.0):
        """Blocks (GIL released) until the step has ended. NonFiniteError
        (fail_on_nonfinite), CommError (the engine is broken), ..."""
        _lib.call("gc_engine_wait", self._h(), float(timeout))

    def stats(self):
        """The :class:`StepStats` of the last waited step."""
        h = self._h()
        step, sent = ctypes.c_uint64(), ctypes.c_uint64()
        total, exposed = ctypes.c_double(), ctypes.c_double()
        buckets = []
        origins, cautions, guards = (_lib.names(n) for n in (_lib.Names.ORIGIN, _lib.Names.CAUTION, _lib.Names.GUARD))
        for i in range(len(self.sizes)):
            b = _lib.BucketStatsC()
            _lib.call("gc_engine_stats", h, i, ctypes.byref(b), ctypes.byref(step), ctypes.byref(sent),
                      ctypes.byref(total), ctypes.byref(exposed))
            v = _lib.BucketVerdictC(size=ctypes.sizeof(_lib.BucketVerdictC))
            _lib.call("gc_engine_verdict", h, i, ctypes.byref(v))
            buckets.append(BucketStats(
                i, b.elements, b.bytes_sent, bool(b.compressed), bool(b.nonfinite), bool(b.trial), bool(b.switched),
                bool(b.decided_compressed), b.compress_seconds, b.exchange_seconds, b.decompress_seconds,
                b.predicted_dense_seconds, b.predicted_compressed_seconds, b.measured_dense_seconds,
                b.measured_compressed_seconds, b.strategy.decode("utf-8", "replace"),
                b.reason.decode("utf-8", "replace"), bool(b.guarded), v.held_back, origins[v.origin],
                cautions[v.caution], guards[v.guard], v.guard_threshold,
            ))
        if not buckets:
            _lib.call("gc_engine_stats", h, 0, None, ctypes.byref(step), ctypes.byref(sent), ctypes.byref(total),
                      ctypes.byref(exposed))
        return StepStats(step.value, sent.value, total.value, exposed.value, buckets)

    def save_state(self):
        """The engine's state as bytes (gc_engine_state_save)."""
        return _lib.saved_state(self._h(), "gc_engine_state_size", "gc_engine_state_save")

    def load_state(self, data):
        """Replaces the engine's state with a saved one, validated whole
        first: a state of another spec, strategy, error feedback or bucket
        layout raises ValueError and changes nothing."""
        data = bytes(data)
        try:
            _lib.call("gc_engine_state_load", self._h(), data, len(data))
        except _lib.LibraryError as e:
            if e.status == Status.CORRUPT:
                raise ValueError(str(e)) from e
            raise

    def load_state_reshaped(self, data):
        """Loads a state saved by an engine of another strategy, node layout
        or world size (gc_engine_state_load_reshaped, ABI 2.5). COLLECTIVE:
        every rank calls it, with the state its rank saved or None where the
        old job had no such rank. Each old rank's memories and velocities
        are summed by what they add to the average and handed out to this
        engine's ranks; the states must agree on the step. A state of
        another spec, error feedback, momentum, schedule, guard or bucket
        sizes raises ValueError on every rank and changes nothing."""
        if not _lib.has("gc_engine_state_load_reshaped"):
            raise ValueError("gradcomp: load_state_reshaped needs libgradcomp ABI 2.5; %s is older" % _lib.path())
        data = b"" if data is None else bytes(data)
        try:
            _lib.call("gc_engine_state_load_reshaped", self._h(), data if data else None, len(data))
        except _lib.LibraryError as e:
            if e.status == Status.CORRUPT:
                raise ValueError(str(e)) from e
            raise

    @staticmethod
    def state_layout(data):
        """The node layout a saved state records, as ``topology`` takes it:
        (node, nodes, local_rank, local_size), or None for a flat one (ABI
        2.5; ValueError when it is not a valid engine state)."""
        data = bytes(data)
        out = [ctypes.c_int() for _ in range(4)]
        try:
            _lib.call("gc_engine_state_layout", data, len(data), *(ctypes.byref(v) for v in out))
        except _lib.LibraryError as e:
            if e.status in (Status.CORRUPT, Status.MISMATCH):
                raise ValueError("gradcomp: not a valid engine state: %s" % e) from e
            raise
        node, nodes, local_rank, local_size = (v.value for v in out)
        return (node, nodes, local_rank, local_size) if nodes else None

    @staticmethod
    def check_state(data, sizes, world, **settings):
        """Checks a saved state against an engine of ``settings``
        (:class:`Engine`'s keywords, spec included) for buckets of ``sizes``
        on ``world`` ranks, without one (gc_engine_state_check): ValueError
        naming the setting and both values where :meth:`load_state` would
        refuse it."""
        data = bytes(data)
        cfg = engine_config(**settings)
        sizes = [int(n) for n in sizes]
        arr = (ctypes.c_uint64 * max(len(sizes), 1))(*sizes)
        try:
            _lib.call("gc_engine_state_check", data, len(data), ctypes.byref(cfg), arr, len(sizes), int(world))
        except _lib.LibraryError as e:
            if e.status == Status.CORRUPT:
                raise ValueError(str(e)) from e
            raise

    @staticmethod
    def state_info(data):
        """The :class:`StateInfo` a saved state records (ValueError when it
        is not a valid engine state)."""
        data = bytes(data)
        spec = ctypes.create_string_buffer(256)
        strategy = ctypes.create_string_buffer(64)
        world, rank = ctypes.c_int(), ctypes.c_int()
        nxt, nb = ctypes.c_uint64(), ctypes.c_size_t()
        args = (data, len(data), spec, len(spec), strategy, len(strategy), ctypes.byref(world), ctypes.byref(rank),
                ctypes.byref(nxt), ctypes.byref(nb))
        try:
            _lib.call("gc_engine_state_info", *args, None, 0)
            sizes = (ctypes.c_uint64 * max(nb.value, 1))()
            _lib.call("gc_engine_state_info", *args, sizes, nb.value)
        except _lib.LibraryError as e:
            if e.status in (Status.CORRUPT, Status.MISMATCH):
                raise ValueError("gradcomp: not a valid engine state: %s" % e) from e
            raise
        return StateInfo(spec.value.decode("utf-8", "replace"), strategy.value.decode("utf-8", "replace"),
                         world.value, rank.value, nxt.value, [int(sizes[i]) for i in range(nb.value)])

    def _close_transport(self):
        # The host's collectives in flight (if any) finish and are completed
        # before the transport goes: their buffers stay valid until then,
        # and torch cannot cancel them. An engine on its own NCCL
        # communicator has no transport: destroying it destroyed its comms.
        if self.hosted is None:
            return
        self.host.close(self.timeout)

    def close(self):
        """Destroys the engine (a step in flight is abandoned, error feedback
        keeping e + g), then the transport and the host's threads.
        Idempotent."""
        h, self.handle = getattr(self, "handle", 0), 0
        if not h:
            return
        try:
            _lib.call("gc_engine_destroy", h)
        finally:
            self._close_transport()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
