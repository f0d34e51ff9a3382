"""A hosted transport and a host that carries out its collectives with
torch.distributed.

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
left hanging.

Host buffers are viewed without a copy (``torch.frombuffer`` over the op's
addresses). An all-gather of up to DIRECT_GATHER_BYTES on more than 2
ranks runs as an all-to-all (one round of messages instead of a ring's
size − 1). Other all-gathers and reduce-scatters use torch's whole-tensor forms
(``all_gather_into_tensor``, ``reduce_scatter_tensor``) where the group's
backend takes them for CPU tensors (gloo in torch 2.x), and the list
all-gather and an all-reduce of a copy where it refuses them (gloo in
torch 1.13; the copy out of the reduce-scatter's sum is made once its Work
has finished, before the completion). The host carries host ops only: a
device engine runs its collectives on its own NCCL communicator
(:mod:`gradcomp._nccl`), and a device op reaching this host fails.
"""

import collections
import ctypes
import functools
import logging
import threading
import time

from . import _lib
from ._lib import Status

__all__ = ["Hosted", "TorchHost"]

_log = logging.getLogger("gradcomp")

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
    ValueError for an op that breaks the header's contract or is a device
    op (device engines carry their own collectives); whatever torch raises
    at launch."""
    kind = check_op(op, size)
    if op.count == 0 and kind != _lib.OpKind.BARRIER:
        return None, lambda: 0  # the same empty op on every rank: nothing to carry
    if op.device:
        raise ValueError("op %d: a device op (gc_op.device = 1): the Python host carries host ops only; a device "
                         "engine runs on its own NCCL communicator (gradcomp.Engine(device=...))" % op.id)
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
    :func:`launch_op`, then waits for it."""
    work, finish = launch_op(op, group, rank, size)
    if work is not None:
        work.wait()
    return finish()


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
    at a time.

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

    def close(self, timeout):
        """Ends the host and then its transport, after the library's
        handle that posts on it is destroyed: waits up to ``timeout``
        seconds for the collectives in flight to finish and be completed
        (their buffers stay valid until then, and torch cannot cancel
        them), destroys the transport, then waits a second more for the
        threads to see it."""
        self.stop(timeout=timeout)
        self.hosted.close()
        self.stop(timeout=1.0)
