"""gradcomp's engine over a hosted transport, and a host that carries out
its collectives with torch.distributed.

:class:`Hosted` is one rank's end of a hosted transport (gc_hosted): the
engine POSTS each collective (an all-reduce of float32 in place, an
all-gather, an all-to-all, a broadcast, a barrier or a reduce-scatter, with
raw buffer addresses) in the same order on every rank, and the host takes
the posts and carries them out with its own communicator, then completes
them. Several posts per group (hosted.DefaultInFlight, 4) may be taken and
not yet complete at once; the host must launch them in Take's order and may
complete them in any order. :class:`TorchHost` is such a host: a daemon
thread per group takes each post (gc_hosted_take, blocking with the GIL
released) and launches it on a torch.distributed process group
(async_op=True) as it takes it, in Take's order, without waiting for it;
each collective is completed when its torch Work finishes (a callback on
the Work's future, on the backend's thread), so several run at once, as
torch's DDP runs its buckets' all-reduces. Any exception, at launch or
when the Work finishes, completes that op with an error, so nothing is
left hanging. :class:`Engine` is gradcomp's engine (overlap.Engine through
the C ABI 2.0: strategies, handshake, cost model, NaN handling,
checkpoints) over a Hosted transport served by a TorchHost.

One step::

    eng = Engine("int8", [1000, 37], decision="compressed")
    eng.step()
    eng.ready(0, grad0)   # float32, contiguous, CPU; owned by the engine
    eng.ready(1, grad1)
    eng.wait()            # grad0 and grad1 now hold the rank average
    eng.stats()           # StepStats: bytes sent, stage times, decisions

Host buffers are viewed without a copy (``torch.frombuffer`` over the op's
addresses). An all-gather of up to DIRECT_GATHER_BYTES on more than 2
ranks runs as an all-to-all (one round of messages instead of a ring's
size − 1). Other all-gathers and reduce-scatters use torch's whole-tensor forms
(``all_gather_into_tensor``, ``reduce_scatter_tensor``) where the group's
backend takes them for CPU tensors (gloo in torch 2.x), and the list
all-gather and an all-reduce of a copy where it refuses them (gloo in
torch 1.13; the copy out of the reduce-scatter's sum is made once its Work
has finished, before the completion). Device ops (gc_op.device == 1, from
libgradcomp_cuda.so's device engine) run the same collectives on
``torch.cuda.ExternalStream(op.stream)`` over tensors made from the device
pointers and are completed once enqueued, from the taking thread; that
path has NOT run on a GPU yet.
"""

import collections
import ctypes
import functools
import logging
import threading
import time

from . import _lib
from ._lib import Status

__all__ = ["BucketStats", "Engine", "Hosted", "StateInfo", "StepStats", "TorchHost"]

_log = logging.getLogger("gradcomp")

#: One bucket in the last waited step (gc_bucket_stats); times in seconds.
BucketStats = collections.namedtuple(
    "BucketStats",
    "bucket elements bytes_sent compressed nonfinite trial switched decided_compressed "
    "compress_seconds exchange_seconds decompress_seconds predicted_dense_seconds "
    "predicted_compressed_seconds measured_dense_seconds measured_compressed_seconds strategy reason "
    "guarded held_back",
)
BucketStats.__doc__ += (
    ": guarded is True when the accuracy guard sent the bucket dense with its residual this step; held_back is "
    "the guard's measure, the largest over the ranks of |e|/|g| after a compressed step (0 without the guard)")

#: The last waited step (gc_engine_stats): its number, this rank's bytes
#: on the wire, wall and exposed seconds, and one BucketStats per bucket.
StepStats = collections.namedtuple("StepStats", "step bytes_sent total_seconds exposed_seconds buckets")

#: What a saved engine state records (gc_engine_state_info).
StateInfo = collections.namedtuple("StateInfo", "spec strategy world rank next_step sizes")

#: Seconds TorchHost's thread waits in one gc_hosted_take before it looks
#: whether it was asked to stop.
TAKE_SECONDS = 0.2


class Hosted:
    """Rank ``rank``'s end of a hosted transport of ``size`` ranks
    (gc_hosted_create). :meth:`take` (or :meth:`set_launcher`) and
    :meth:`complete` are what a host calls; :meth:`close` destroys it (takes then raise ClosedError)."""

    def __init__(self, rank, size):
        h = ctypes.c_uint64()
        _lib.call("gc_hosted_create", int(rank), int(size), ctypes.byref(h))
        self.handle = h.value
        self.rank, self.size = int(rank), int(size)
        self._lock = threading.Lock()
        self._launchers = {}  # group -> the LAUNCH_FN the library holds

    def take(self, timeout, group=None):
        """The next post as an :class:`_lib.Op`, or None when nothing was
        posted within ``timeout`` seconds. ClosedError once closed. Blocks
        with the GIL released. ``group`` (a :class:`_lib.Group`, ABI 2.4):
        that group's posts alone (gc_hosted_take_group); None: every
        group's (gc_hosted_take)."""
        op = _lib.Op()
        if group is None:
            name, args = "gc_hosted_take", (self.handle, float(timeout), ctypes.byref(op))
        else:
            name, args = "gc_hosted_take_group", (self.handle, int(group), float(timeout), ctypes.byref(op))
        status = _lib.function(name)(*args)
        if status == Status.OK:
            return op
        if status == Status.TIMEOUT:
            return None
        raise _lib.error(name, status, _lib.last_error())

    def can_launch(self):
        """Whether the library has gc_hosted_set_launcher (ABI 2.7)."""
        return _lib.has("gc_hosted_set_launcher")

    def set_launcher(self, group, launch):
        """Has every later post of ``group`` (a :class:`_lib.Group`) handed
        to ``launch(op)`` as the engine makes it, instead of queued for
        :meth:`take` (gc_hosted_set_launcher, ABI 2.7): on the engine's
        thread that posts it, one at a time, in the group's post order.
        ``launch`` must start the collective and return without waiting
        for it, then complete it with :meth:`complete`; an exception it
        raises completes the op with GC_ERR_COMM. None goes back to
        :meth:`take`; once that returns, ``launch`` is not called again."""
        cb = None
        if launch is not None:
            def trampoline(_ctx, p):
                op = _lib.Op.from_buffer_copy(p.contents)
                try:
                    launch(op)
                except BaseException as e:
                    try:
                        self.complete(op.id, Status.COMM, "gradcomp: launching op %d on rank %d raised %s: %s"
                                      % (op.id, self.rank, type(e).__name__, e))
                    except Exception:
                        pass  # the transport is gone: the op was abandoned

            cb = _lib.LAUNCH_FN(trampoline)
        _lib.call("gc_hosted_set_launcher", self.handle, int(group), cb, None)
        # The library calls cb until the next set_launcher of the group
        # returns: keep it alive until then.
        self._launchers[int(group)] = cb

    def complete(self, op_id, status=Status.OK, message=None, recv_bytes=0):
        """Completes the taken op ``op_id``: GC_OK with the bytes written to
        its output, or an error status with a message."""
        msg = message.encode("utf-8", "replace")[:1000] if message else None
        _lib.call("gc_hosted_complete", self.handle, int(op_id), int(status), msg, int(recv_bytes))

    def close(self):
        """Destroys the transport (gc_hosted_destroy). Idempotent."""
        with self._lock:
            h, self.handle = self.handle, 0
        if h:
            _lib.call("gc_hosted_destroy", h)


def _global_rank(group, group_rank):
    """The default group's rank of ``group``'s rank ``group_rank``
    (torch.distributed's broadcast wants the global one)."""
    import torch.distributed as dist

    if group is None or group is dist.group.WORLD:
        return group_rank
    get = getattr(dist, "get_global_rank", None) or dist.distributed_c10d._get_global_rank
    return get(group, group_rank)


def _host_tensor(addr, nbytes, dtype):
    """A tensor of ``dtype`` over ``nbytes`` bytes of host memory at
    ``addr``, without a copy (an empty one for 0 bytes)."""
    import torch

    if nbytes == 0:
        return torch.empty(0, dtype=dtype)
    if not addr:
        raise ValueError("null address for %d bytes" % nbytes)
    return torch.frombuffer((ctypes.c_uint8 * nbytes).from_address(addr), dtype=dtype)


class _CudaBuffer:
    """A device buffer exposed through ``__cuda_array_interface__`` (for
    torch.as_tensor, which then shares the memory)."""

    def __init__(self, addr, nbytes, typestr):
        itemsize = int(typestr[-1])
        self.__cuda_array_interface__ = {
            "shape": (nbytes // itemsize,),
            "typestr": typestr,
            "data": (int(addr), False),
            "version": 2,
            "strides": None,
        }


def _device_tensor(addr, nbytes, dtype):
    """UNTESTED (no GPU here): a CUDA tensor over device memory at addr."""
    import torch

    if nbytes == 0:
        return torch.empty(0, dtype=dtype, device="cuda")
    typestr = {torch.float32: "<f4", torch.uint8: "|u1"}[dtype]
    return torch.as_tensor(_CudaBuffer(addr, nbytes, typestr))


def _group_name(group):
    try:
        return _lib.Group(group).name.lower()
    except ValueError:
        return "group %d" % group


def _kind_name(kind):
    try:
        return _lib.OpKind(kind).name
    except ValueError:
        return "kind %d" % kind


def check_op(op, size):
    """Checks op's lengths against the header's contract for its kind and
    returns the kind (ValueError naming what is wrong)."""
    try:
        kind = _lib.OpKind(op.kind)
    except ValueError:
        raise ValueError("unknown collective kind %d" % op.kind)
    n = op.count
    want = {
        _lib.OpKind.ALLREDUCE: (4 * n, 4 * n, True),
        _lib.OpKind.ALLGATHER: (n, size * n, False),
        _lib.OpKind.REDUCESCATTER: (4 * size * n, 4 * n, False),
        _lib.OpKind.ALLTOALL: (n, n, False),
        _lib.OpKind.BROADCAST: (n, n, True),
        _lib.OpKind.BARRIER: (0, 0, False),
    }[kind]
    if (op.send_bytes, op.recv_bytes) != want[:2]:
        raise ValueError(
            "%s of count %d: send_bytes %d, recv_bytes %d; want %d and %d"
            % (kind.name, n, op.send_bytes, op.recv_bytes, want[0], want[1])
        )
    if want[2] and op.send != op.recv:
        raise ValueError("%s is in place but send != recv" % kind.name)
    if kind == _lib.OpKind.ALLTOALL and n % size:
        raise ValueError("ALLTOALL of %d bytes is not a multiple of %d ranks" % (n, size))
    if kind == _lib.OpKind.BROADCAST and not 0 <= op.root < size:
        raise ValueError("BROADCAST root %d outside 0..%d" % (op.root, size - 1))
    return kind


#: (backend name, form) -> whether the backend took that form of a
#: collective for CPU tensors: "whole", the whole-tensor all-gather and
#: reduce-scatter; "alltoall", the all-to-all a direct all-gather runs as.
#: A pair not in it is tried first.
_TENSOR_FORMS = {}

#: A host all-gather whose output (the group's size × one rank's part) is
#: at most this many bytes runs DIRECT, on a group of more than 2 ranks: an
#: all-to-all of the part repeated once for each rank, every rank sending
#: its part to every other at once, where a ring all-gather passes parts on
#: in size − 1 steps, one after another. Each rank sends the same bytes
#: ((size − 1) × the part) either way; direct waits for one round of
#: messages where the ring waits for size − 1, which is what a small
#: all-gather's time is made of (gloo, 4 ranks on 2 cores: 16 bytes 4.8 ms
#: as a ring, 3.4 direct; 8 ranks, 30 KB: 13.6 against 6.3; at 16 MB of
#: output the two cost the same). The price is a copy of the part, size
#: times over: at most this many bytes per all-gather in flight.
DIRECT_GATHER_BYTES = 4 << 20


def _refused(e):
    """Whether ``e`` is a backend refusing a collective it does not
    implement: raised by the call itself, before anything is sent, and on
    every rank alike (torch 1.13's gloo: "no support for _allgather_base",
    "does not support _reduce_scatter_base")."""
    msg = str(e)
    return isinstance(e, (RuntimeError, NotImplementedError)) and (
        "no support for" in msg or "does not support" in msg)


def _whole_or_fallback(group, whole, fallback, form="whole"):
    """Launches ``whole()`` (a collective in the given ``form``,
    async_op=True; returns its Work) where the group's backend takes it,
    else ``fallback()``; remembers the answer per backend and form.
    Returns (work, after): the Work to wait for and what is left to do
    once it has finished (None: nothing; the fallback returns its own
    pair).

    They cost the same on torch 2.15's gloo, whose whole-tensor forms run the
    fallback's algorithm inside (the all-gather gathers into a flat
    temporary and copies out; the reduce-scatter all-reduces a clone, so it
    sends an all-reduce's bytes); a backend that implements them natively
    saves the copies."""
    import torch.distributed as dist

    key = (str(dist.get_backend(group)), form)
    if _TENSOR_FORMS.get(key, True):
        try:
            work = whole()
        except Exception as e:
            if not _refused(e):
                raise
            _log.debug("gradcomp: backend %s refuses %s collectives (%s): falling back", key[0], form, e)
            _TENSOR_FORMS[key] = False
        else:
            _TENSOR_FORMS[key] = True
            return work, None
    return fallback()


def launch_op(op, group, rank, size):
    """Launches one posted collective on the torch.distributed ``group``
    (None: the default group), in which this process is ``rank`` of
    ``size``, with async_op=True, and returns (work, finish) at once:
    ``work`` is the torch Work to wait for (None: nothing is left to wait
    for), ``finish()``, to be called once it has finished without error,
    does what is left (the reduce-scatter fallback's copy out of its
    all-reduced copy) and returns the bytes written to the output
    (op.recv_bytes). The buffers belong to the collective until then.
    Device ops are enqueued on op.stream before it returns (work None;
    UNTESTED). ValueError for an op that breaks the header's contract;
    whatever torch raises at launch."""
    kind = check_op(op, size)
    if op.count == 0 and kind != _lib.OpKind.BARRIER:
        return None, lambda: 0  # the same empty op on every rank: nothing to carry
    if op.device:
        written = _run_device_op(op, kind, group, rank, size)
        return None, lambda: written
    import torch
    import torch.distributed as dist

    K = _lib.OpKind
    n = op.count
    written = op.recv_bytes
    keep = ()  # the tensors the collective uses, alive until finish
    after = None
    if kind == K.ALLREDUCE:
        buf = _host_tensor(op.recv, op.recv_bytes, torch.float32)
        keep = (buf,)
        work = dist.all_reduce(buf, group=group, async_op=True)
    elif kind == K.ALLGATHER:
        send = _host_tensor(op.send, op.send_bytes, torch.uint8)
        recv = _host_tensor(op.recv, op.recv_bytes, torch.uint8)
        keep = (send, recv)
        # The list form writes the gathered chunks into views of recv
        # inside the Work (gloo copies them out before it finishes).
        ring = lambda: _whole_or_fallback(
            group,
            lambda: dist.all_gather_into_tensor(recv, send, group=group, async_op=True),
            lambda: (dist.all_gather(list(recv.view(size, n).unbind(0)), send, group=group, async_op=True), None))
        if size > 2 and op.recv_bytes <= DIRECT_GATHER_BYTES:
            parts = send.repeat(size)  # part j goes to rank j
            keep += (parts,)
            work, after = _whole_or_fallback(
                group, lambda: dist.all_to_all_single(recv, parts, group=group, async_op=True), ring, form="alltoall")
        else:
            work, after = ring()
    elif kind == K.REDUCESCATTER:
        send = _host_tensor(op.send, op.send_bytes, torch.float32)
        recv = _host_tensor(op.recv, op.recv_bytes, torch.float32)
        keep = (send, recv)

        def all_reduce_a_copy():  # keeps our chunk of the sum, once it is summed; send stays as it was
            total = send.clone()
            return (dist.all_reduce(total, group=group, async_op=True),
                    lambda: recv.copy_(total[rank * n : (rank + 1) * n]))

        work, after = _whole_or_fallback(
            group, lambda: dist.reduce_scatter_tensor(recv, send, group=group, async_op=True), all_reduce_a_copy)
    elif kind == K.ALLTOALL:
        send = _host_tensor(op.send, op.send_bytes, torch.uint8)
        recv = _host_tensor(op.recv, op.recv_bytes, torch.uint8)
        keep = (send, recv)
        work = dist.all_to_all_single(recv, send, group=group, async_op=True)
    elif kind == K.BROADCAST:
        buf = _host_tensor(op.recv, op.recv_bytes, torch.uint8)
        keep = (buf,)
        work = dist.broadcast(buf, _global_rank(group, op.root), group=group, async_op=True)
    else:  # BARRIER
        work = dist.barrier(group=group, async_op=True)

    def finish(keep=keep):
        if after is not None:
            after()
        return written

    return work, finish


def run_op(op, group, rank, size):
    """Carries out one posted collective on the torch.distributed ``group``
    (None: the default group), in which this process is ``rank`` of
    ``size``, and returns the bytes written to the output (op.recv_bytes):
    :func:`launch_op`, then waits for it. Host ops complete before it
    returns; device ops are enqueued on op.stream (UNTESTED)."""
    work, finish = launch_op(op, group, rank, size)
    if work is not None:
        work.wait()
    return finish()


def _run_device_op(op, kind, group, rank, size):
    """UNTESTED (no GPU here): one collective over device memory, enqueued
    on op.stream through torch.cuda.ExternalStream (NCCL orders its stream
    after the current one and work.wait() makes the current one wait for
    it, without blocking the host)."""
    import torch
    import torch.distributed as dist

    K = _lib.OpKind
    stream = torch.cuda.ExternalStream(op.stream) if op.stream else torch.cuda.default_stream()
    all_gather = getattr(dist, "all_gather_into_tensor", None) or dist._all_gather_base
    reduce_scatter = getattr(dist, "reduce_scatter_tensor", None) or dist._reduce_scatter_base
    with torch.cuda.stream(stream):
        if kind == K.ALLREDUCE:
            work = dist.all_reduce(_device_tensor(op.recv, op.recv_bytes, torch.float32), group=group, async_op=True)
        elif kind == K.ALLGATHER:
            work = all_gather(_device_tensor(op.recv, op.recv_bytes, torch.uint8),
                              _device_tensor(op.send, op.send_bytes, torch.uint8), group=group, async_op=True)
        elif kind == K.REDUCESCATTER:
            work = reduce_scatter(_device_tensor(op.recv, op.recv_bytes, torch.float32),
                                  _device_tensor(op.send, op.send_bytes, torch.float32), group=group, async_op=True)
        elif kind == K.ALLTOALL:
            work = dist.all_to_all_single(_device_tensor(op.recv, op.recv_bytes, torch.uint8),
                                          _device_tensor(op.send, op.send_bytes, torch.uint8), group=group,
                                          async_op=True)
        elif kind == K.BROADCAST:
            work = dist.broadcast(_device_tensor(op.recv, op.recv_bytes, torch.uint8), _global_rank(group, op.root),
                                  group=group, async_op=True)
        else:  # BARRIER: a one-element all-reduce on the stream
            work = dist.all_reduce(torch.zeros(1, device="cuda"), group=group, async_op=True)
        work.wait()  # NCCL: the stream waits for the collective; the host does not
    return op.recv_bytes


def _future(work):
    """``work``'s torch.futures.Future, or None for a Work without one (a
    backend that does not implement get_future)."""
    get = getattr(work, "get_future", None)
    if get is None:
        return None
    try:
        return get()
    except (RuntimeError, NotImplementedError) as e:
        _log.debug("gradcomp: %s has no future (%s): waiting for it on the host's thread", type(work).__name__, e)
        return None


class _Flight:
    """One taken post, from its launch to its completion."""

    __slots__ = ("op", "finish", "done")

    def __init__(self, op):
        self.op = op
        self.finish = None  # launch_op's: after the Work, the bytes written
        self.done = False  # completed (or being completed): exactly once


class TorchHost:
    """Carries out a Hosted transport's posts on a torch.distributed process
    group, several at once, as the transport allows (up to
    hosted.DefaultInFlight per group posted and not yet complete).

    A daemon thread takes the posts (gc_hosted_take, GIL released) and
    LAUNCHES each on the process group as it takes it (:func:`launch_op`:
    async_op=True), so they start in Take's order, the same on every rank,
    and it goes on to take the next one without waiting. With ``launch``
    (and a library of ABI 2.7) there is no such thread: the hosted
    transport hands each post to :meth:`_launch` on the engine's thread
    that makes it (gc_hosted_set_launcher), in the same order, which spares
    every collective the wake-up of a taking thread (``launched`` says
    which way it runs). Each collective
    is COMPLETED (gc_hosted_complete) when its torch Work finishes: a
    callback on the Work's future (``work.get_future().then``), which runs
    on the backend's own thread (gloo's worker threads) as soon as that
    collective is done, so several collectives are in flight at once and
    complete in whatever order the backend finishes them. What the
    fallbacks leave to do (the reduce-scatter's copy out of its all-reduced
    copy) runs in that callback, before the completion. A backend whose
    Work has no future is waited for on the taking thread, one collective
    at a time. Device ops (op.device) are enqueued on their stream and
    completed at once, from the taking thread (NCCL: the stream waits for
    the collective, the host does not).

    An exception launching a collective, or the Work's error when it
    finishes (a dead peer, a timeout of the group), completes that op with
    GC_ERR_COMM and a message naming the collective, the op, the rank and
    the exception (the engine's step then fails with GC_ERR_COMM on this
    rank); every op taken is completed exactly once, so nothing is left
    hanging. The thread ends when the transport is closed or :meth:`stop`
    is called; :meth:`stop` also waits for the collectives in flight.

    ``groups`` (strategy "hier"): {_lib.Group.NODE: node_pg,
    _lib.Group.CROSS: cross_pg}, this rank's node group and cross-node
    group. Each group then has a thread of its own taking that group's
    posts (gc_hosted_take_group) and launching them, in that group's
    order, on its process group, so the node and cross-node collectives
    the engine runs at once run at once here too (one thread taking every
    post in turn would deadlock: ranks of different nodes see them
    interleaved differently).

    Counters (thread-safe; read them as they are): ``ops`` counts the
    collectives carried out successfully, by kind name, ``ops_by_group``
    by group name; each is counted just before its completion, so a step's
    are in once the engine's wait has returned. ``wire_seconds`` is the
    wall time during which at least one of this host's collectives was in
    flight (from the launch of one while none was to the end of the last
    one, its Work finished and any copy out done), over every group: the
    union of the collectives' intervals, not their sum, so concurrent
    collectives count once and it never exceeds the elapsed time.
    ``max_in_flight`` is the most collectives it had in flight at once.
    ``error`` is the last exception an op raised (for diagnosis)."""

    def __init__(self, hosted, group=None, name="gradcomp-host", groups=None, launch=False):
        self.hosted = hosted
        self.group = group
        self.ops = collections.Counter()
        self.ops_by_group = collections.Counter()
        self.max_in_flight = 0
        self.error = None  # the last exception an op raised (for diagnosis)
        self._stop = threading.Event()
        # Guards the counters, the flights and the wire clock; notified
        # whenever a flight ends (stop waits on it).
        self._count = threading.Condition(threading.Lock())
        self._flights = set()  # taken, not yet completed
        self._busy = 0  # collectives in flight
        self._busy_since = 0.0  # perf_counter when _busy last left 0
        self._wire = 0.0  # wire seconds of the intervals that ended
        if groups:
            import torch.distributed as dist

            lanes = [(_lib.Group.WORLD, group, hosted.rank, hosted.size)]
            for gid in (_lib.Group.NODE, _lib.Group.CROSS):
                pg = groups[gid]
                lanes.append((gid, pg, dist.get_rank(pg), dist.get_world_size(pg)))
        else:
            lanes = [(None, group, hosted.rank, hosted.size)]
        #: Whether the engine's threads launch the posts (set_launcher)
        #: rather than threads of this host taking them.
        self.launched = bool(launch) and getattr(hosted, "can_launch", lambda: False)()
        self._threads = []
        self._lanes = []  # the groups given a launcher
        if self.launched:
            for gid, pg, rank, size in lanes:
                gid = _lib.Group.WORLD if gid is None else gid
                hosted.set_launcher(gid, functools.partial(self._launch, group=pg, rank=rank, size=size))
                self._lanes.append(gid)
            return
        self._threads = [threading.Thread(target=self._loop, args=lane, daemon=True,
                                          name=name if lane[0] is None else "%s-%s" % (name, lane[0].name.lower()))
                         for lane in lanes]
        for t in self._threads:
            t.start()

    @property
    def wire_seconds(self):
        """Seconds during which at least one of the host's collectives was
        in flight (see the class docstring), the current stretch included."""
        with self._count:
            w = self._wire
            if self._busy:
                w += time.perf_counter() - self._busy_since
            return w

    @property
    def in_flight(self):
        """The collectives launched and not yet completed, now."""
        with self._count:
            return len(self._flights)

    def _loop(self, gid, group, rank, size):
        h = self.hosted
        while not self._stop.is_set():
            try:
                op = h.take(TAKE_SECONDS, gid)
            except _lib.ClosedError:
                return
            except Exception as e:  # a handle error: the transport is gone
                self.error = e
                return
            if op is None:
                continue
            self._launch(op, group, rank, size)

    def _launch(self, op, group, rank, size):
        """Launches the taken ``op`` and arranges its completion; never
        raises (any exception completes the op with GC_ERR_COMM)."""
        f = _Flight(op)
        with self._count:
            self._flights.add(f)
            if self._busy == 0:
                self._busy_since = time.perf_counter()
            self._busy += 1
            self.max_in_flight = max(self.max_in_flight, self._busy)
        try:
            work, f.finish = launch_op(op, group, rank, size)
            fut = None if work is None else _future(work)
        except BaseException as e:
            self._end(f, error=e, when="launching it")
            return
        if fut is None:  # nothing left to wait for, or a Work without a future: wait here
            self._finished(f, work)
            return
        try:
            fut.then(functools.partial(self._finished, f))
        except BaseException as e:  # no callback: wait for it here instead
            _log.debug("gradcomp: op %d: Future.then failed (%s): waiting for it on the host's thread", op.id, e)
            self._finished(f, work)

    def _finished(self, f, waitable):
        """Ends ``f`` once its collective has finished: ``waitable`` (its
        Work or the Work's future, whose wait raises the collective's
        error; None: nothing to wait for), then what launch_op left to do,
        then the completion. It is the future's callback, on the
        backend's thread: it never raises."""
        try:
            if waitable is not None:
                waitable.wait()
            written = f.finish()
        except BaseException as e:
            self._end(f, error=e, when="as it ran")
        else:
            self._end(f, written=written)

    def _end(self, f, written=0, error=None, when=""):
        """Completes ``f``'s op, once: GC_OK with ``written``, or
        GC_ERR_COMM with a message saying what failed."""
        now = time.perf_counter()
        op = f.op
        with self._count:
            if f.done:
                return
            f.done = True
            self._busy -= 1
            if self._busy == 0:
                self._wire += now - self._busy_since
            if error is None:
                self.ops[_kind_name(op.kind)] += 1
                self.ops_by_group[_group_name(op.group)] += 1
        h = self.hosted
        try:
            if error is not None:
                self.error = error
                msg = "gradcomp: the host's %s (op %d%s) failed on rank %d %s: %s: %s" % (
                    _kind_name(op.kind), op.id, "" if not op.group else ", group %s" % _group_name(op.group),
                    h.rank, when, type(error).__name__, error)
                try:
                    h.complete(op.id, Status.COMM, msg, 0)
                except Exception as e2:
                    _log.debug("gradcomp: completing failed op %d: %s", op.id, e2)
            else:
                try:
                    h.complete(op.id, Status.OK, None, written)
                except _lib.ClosedError:
                    pass  # the transport went first: its ops were abandoned
                except Exception as e:  # GC_ERR_STATE: the engine already gave up on it
                    self.error = e
                    _log.debug("gradcomp: completing op %d: %s", op.id, e)
        finally:
            with self._count:
                self._flights.discard(f)
                self._count.notify_all()

    def stop(self, timeout=None):
        """Asks the threads to stop taking posts (or clears the launchers:
        later posts wait for a take) and waits up to ``timeout``
        seconds (None: for as long as it takes) for them to end and for the
        collectives in flight to finish and be completed; returns whether
        all of that happened."""
        self._stop.set()
        lanes, self._lanes = self._lanes, []
        for gid in lanes:
            try:
                self.hosted.set_launcher(gid, None)
            except Exception as e:  # the transport is gone: nothing is posted any more
                _log.debug("gradcomp: clearing the launcher of group %s: %s", _group_name(gid), e)
        deadline = None if timeout is None else time.monotonic() + timeout
        left = lambda: None if deadline is None else max(0.0, deadline - time.monotonic())
        for t in self._threads:
            t.join(left())
        with self._count:
            self._count.wait_for(lambda: not self._flights, left())
            idle = not self._flights
        return idle and not any(t.is_alive() for t in self._threads)


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
                  topology=None, node_spec="", shapes=None):
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
    cfg = _lib.EngineConfig()
    cfg.size = ctypes.sizeof(_lib.EngineConfig)
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

    ``strategy``: "auto", "dense", "shared-index", "sparse-gather", "sra",
    "allgather", "hier" (ABI 2.4: needs ``topology`` and ``groups``),
    "low-rank" (ABI 2.7: spec "powersgd:R").
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
    host buckets, else the CUDA device of the buckets (libgradcomp_cuda.so).
    ``schedule``: a compression warm-up after ``warmup``, as a list of
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
    compressed step. Spec, strategy, decision, error feedback,
    fail_on_nonfinite, warmup, momentum and its masking, schedule, guard and
    the sizes must
    be equal on every rank: the handshake (run here, through the host,
    blocking) raises ConfigError (a ValueError) on every rank otherwise.
    """

    def __init__(self, spec, sizes, *, process_group=None, strategy="auto", decision="auto", error_feedback=True,
                 fail_on_nonfinite=False, warmup=0, timeout=60.0, workers=0, device=-1, momentum=0.0, schedule="",
                 guard=0.0, momentum_masking=False, topology=None, groups=None, node_spec="", shapes=None):
        import torch.distributed as dist

        cfg = engine_config(spec, strategy=strategy, decision=decision, error_feedback=error_feedback,
                            fail_on_nonfinite=fail_on_nonfinite, warmup=warmup, timeout=timeout, workers=workers,
                            device=device, momentum=momentum, schedule=schedule, guard=guard,
                            momentum_masking=momentum_masking, topology=topology, node_spec=node_spec,
                            shapes=shapes)
        if groups is not None and not all(g in groups for g in (_lib.Group.NODE, _lib.Group.CROSS)):
            raise ValueError("gradcomp: groups=%r: want {Group.NODE: process group, Group.CROSS: process group}"
                             % (groups,))
        self.sizes = [int(n) for n in sizes]
        self.spec = spec
        self.timeout = float(timeout)
        self.group = process_group
        rank, size = dist.get_rank(process_group), dist.get_world_size(process_group)
        self.hosted = Hosted(rank, size)
        # Host buckets: the engine's threads launch each post on the process
        # group as they make it. Device engines keep a taking thread.
        self.host = TorchHost(self.hosted, process_group, groups=groups, launch=device < 0)
        arr = (ctypes.c_uint64 * max(len(self.sizes), 1))(*self.sizes)
        e = ctypes.c_uint64()
        try:
            _lib.call("gc_engine_create", self.hosted.handle, ctypes.byref(cfg), arr, len(self.sizes), ctypes.byref(e))
        except BaseException:
            self._close_transport()
            raise
        self.handle = e.value
        self.rank, self.world = rank, size
        #: The accuracy guard's threshold (0: off; held_back is then 0).
        self.guard = float(guard)

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
        """UNTESTED: the device engine's ready (a CUDA float32 tensor, a raw
        CUstream)."""
        _lib.call("gc_engine_ready_device", self._h(), int(bucket), grad.data_ptr(), grad.numel(), int(stream))

    def done(self, stream):
        """UNTESTED: makes the CUstream ``stream`` wait for the step's end."""
        _lib.call("gc_engine_done", self._h(), int(stream))

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
        held = ctypes.c_double()
        for i in range(len(self.sizes)):
            b = _lib.BucketStatsC()
            _lib.call("gc_engine_stats", h, i, ctypes.byref(b), ctypes.byref(step), ctypes.byref(sent),
                      ctypes.byref(total), ctypes.byref(exposed))
            if self.guard:  # ABI 2.2; 0 without the guard
                _lib.call("gc_engine_held_back", h, i, ctypes.byref(held))
            buckets.append(BucketStats(
                i, b.elements, b.bytes_sent, bool(b.compressed), bool(b.nonfinite), bool(b.trial), bool(b.switched),
                bool(b.decided_compressed), b.compress_seconds, b.exchange_seconds, b.decompress_seconds,
                b.predicted_dense_seconds, b.predicted_compressed_seconds, b.measured_dense_seconds,
                b.measured_compressed_seconds, b.strategy.decode("utf-8", "replace"),
                b.reason.decode("utf-8", "replace"), bool(b.guarded), held.value,
            ))
        if not buckets:
            _lib.call("gc_engine_stats", h, 0, None, ctypes.byref(step), ctypes.byref(sent), ctypes.byref(total),
                      ctypes.byref(exposed))
        return StepStats(step.value, sent.value, total.value, exposed.value, buckets)

    def save_state(self):
        """The engine's state as bytes (gc_engine_state_save)."""
        h = self._h()
        size = ctypes.c_size_t()
        _lib.call("gc_engine_state_size", h, ctypes.byref(size))
        while True:
            buf = ctypes.create_string_buffer(max(size.value, 1))
            written = ctypes.c_size_t()
            try:
                _lib.call("gc_engine_state_save", h, buf, size.value, ctypes.byref(written))
            except _lib.InvalidArgumentError as e:
                if e.status == Status.SIZE and written.value > size.value:
                    size.value = written.value
                    continue
                raise
            return buf.raw[: written.value]

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
        # and torch cannot cancel them.
        self.host.stop(timeout=self.timeout)
        self.hosted.close()
        self.host.stop(timeout=1.0)

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
