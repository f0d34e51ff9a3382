"""The DDP communication hook's machinery under gradcomp.torch.State
(:class:`DDPHook`): how each step's buckets reach the engine and come
back. A step is "plain" (torch's all-reduce, before the engine exists),
"direct" (each bucket handed to the engine as DDP hands it over, or, when
the engine sends it dense, to DDP's own all-reduce) or "staged" (a
resumed State's first steps: the whole step after its last bucket, mapped
onto the engine's buckets). The engine's Wait runs on a thread (the
Finisher) or in the last bucket's hook; errors reach the caller of
backward through an autograd callback. gradcomp.torch's module
documentation tells the whole story."""

import functools
import logging
import threading
import time

import torch
import torch.distributed as dist

from . import _device, _lib
from ._compressor import has_cuda
from ._ddp_buckets import BucketsSeen, bucket_params, line_up
from ._ddp_step import DDPStep, complete, delegate_done, split
from ._state import EngineState

__all__ = ["DDPHook"]

logger = logging.getLogger("gradcomp")

_STAGED_DTYPES = (torch.float16, torch.bfloat16, torch.float64)


class DDPHook(EngineState):
    """An EngineState that DDP's buckets reach through :meth:`_hook`
    (process group ``process_group``; ``overlap``: wait for the engine on
    a thread); ``options``: EngineState's. A subclass makes the engine
    (:meth:`_create`)."""

    def __init__(self, process_group, overlap, **options):
        super().__init__(**options)
        self.process_group = process_group
        self.overlap = bool(overlap)
        self._local = 0  # steps seen since this State was made: the plain steps are 0 and 1
        self._seen = BucketsSeen()  # DDP's buckets: initial (step 0), final (plain step 1)
        self._sizes = None  # the engine's bucket sizes
        self._params_sig = None  # the engine's buckets' parameters as a signature (None: unknown)
        self._pending_layout = None  # a loaded state's bucket sizes, until the engine is made
        self._pending_params = None  # and the parameters of that layout
        self._confirmed = False  # DDP's buckets are the engine's in this process (direct steps)
        self._warned_staged = False
        self._last_split = None
        self._deferred = None  # a step whose every bucket DDP's all-reduce carried, its bookkeeping not yet done
        self._settling = threading.Lock()  # held while a deferred step's bookkeeping is done

    def _create(self, sizes, buf, params=None, buckets=None):
        """Creates the engine for the bucket ``sizes`` (on ``buf``'s device)
        and applies a loaded state (a subclass's); ``params``: the
        parameters in bucket order as a signature, where known;
        ``buckets``: DDP's buckets of this step, {index: (elements,
        parameters)}."""
        raise NotImplementedError

    def _settled(self):
        """Waits until the latest step's bookkeeping (its engine Wait, its
        statistics) is done: DDP's futures of a step whose buckets DDP's own
        all-reduce carried complete before it. The bookkeeping of a step
        whose every bucket it carried is done here, on the caller's thread
        (see :meth:`_launch_wait`)."""
        super()._settled()
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
        st.started, st.wire0 = True, eng.wire_seconds

    @property
    def last_split(self):
        """Where the last waited step's time went (see
        :func:`gradcomp._ddp_step.split`), None before."""
        self._settled()
        return self._last_split

    def _seen_layout(self):
        """The bucket sizes of DDP's final buckets, from a plain step after
        this State's first, once it ended (else None)."""
        return self._seen.sizes() if self._local >= self.PLAIN_STEPS else None

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
            self._cur = DDPStep(self.iter, False)
            self._cur.in_backward = self._queue_end_of_backward(self._cur)
        st = self._cur
        st.last = time.perf_counter()
        try:
            return self._bucket(st, bucket, buf, index, last)
        except BaseException as e:
            st.fail(e)
            if not st.in_backward:
                raise
            fut = _device.future(buf)
            fut.set_result(buf)  # DDP takes the bucket as it is; the callback raises after it
            return fut
        finally:
            if last:
                self._cur = None
                self.iter += 1
                self._local += 1
                if st.plain_buckets:
                    self._count_plain(st.plain_buckets, st.plain_sent)

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
        eng = self._engine
        if eng is not None and _device.ordinal(buf, dist.get_rank()) != eng.device:
            where = "host memory" if eng.device < 0 else "device %d" % eng.device
            raise ValueError("gradcomp.torch: a bucket on %s, but this State's engine runs on %s: one State serves "
                             "one model on one device (make a State per model)" % (
                                 _device.describe(buf, dist.get_rank()), where))

    def _bucket(self, st, bucket, buf, index, last):
        if self._broken is not None:
            raise self._broken
        self._check(buf)
        if self._local == 0:
            self._seen.first[index] = bucket_params(bucket)
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
            if buf.dtype == torch.float32 and eng.delegable(index):
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
        if self._engine is None and self.iter < self.PLAIN_STEPS:
            return "plain"
        if self._engine is None and self._pending_layout is None and self._seen_layout() is not None:
            self._create(self._seen_layout(), buf, self._seen.params())
            self._confirmed = True
        if self._engine is not None and self._confirmed:
            return "direct"
        return "staged"

    def _ready(self, st, eng, index, buf, staged):
        """Hands ``staged`` (float32, contiguous) to the engine as bucket
        ``index``; returns the future of ``buf``, which gets the average."""
        if eng.device >= 0:
            st.stream = _device.stream(staged)
            eng.ready_device(index, staged, st.stream)
        else:
            eng.ready(index, staged)
        st.readied.add(index)
        fut = _device.future(buf)
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
        out = _device.future(buf)
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
                done = functools.partial(delegate_done, self._engine, st.native_next - 1, st)
                dist.all_reduce(buf, group=self.process_group, async_op=True).get_future().then(
                    lambda f, buf=buf, out=out, done=done: complete(out, f, buf, world, done))

    def _launch_wait(self, st, eng):
        """After the step's last bucket: checks every bucket came, then
        waits for the engine on a thread (overlap) or here. A step whose
        every bucket went to DDP's all-reduce needs no thread: DDP's
        futures complete without the engine, whose Wait returns at once
        after them; its bookkeeping waits for the next step's start (or
        whatever reads the State first: :meth:`_settled`), which spares the
        step a thread's wake-up that competes with the optimizer for the
        GIL and, on a loaded host, for the cores. A device engine's Wait
        always runs on the finisher: on a GPU it would block the autograd
        thread until the device has passed the step."""
        if len(st.readied) != eng.nbuckets:
            missing = sorted(set(range(eng.nbuckets)) - st.readied)
            raise ValueError("gradcomp.torch: step %d ended without bucket(s) %s" % (st.number, missing))
        through_engine = bool(st.pending)
        if st.stream is not None:
            eng.done(st.stream)
            if not _lib.fake_device() and self.on_nonfinite != "raise":
                # On a GPU the averages are ordered on the stream: DDP's
                # futures complete now, without a host wait; the engine's
                # Wait (statistics, errors) runs on the finisher. Under
                # on_nonfinite="raise" the step's outcome must be known
                # before the optimizer: the finisher completes them after
                # the Wait (DDP's host waits for them), and the
                # end-of-backward callback raises a NaN/Inf.
                self._copy_back(st)
                self._resolve(st, None)
        if self.overlap and not through_engine and eng.device < 0:
            with self._settling:
                self._deferred = st
        elif self.overlap:
            self._finish_later(self._finish, st)
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
        fut = _device.future(buf)
        st.buckets[index] = (buf, bucket_params(bucket), fut)
        if not last:
            return fut
        n = len(st.buckets)
        if sorted(st.buckets) != list(range(n)):
            raise ValueError("gradcomp.torch: step %d ended with buckets %s, not 0..%d" % (st.number, sorted(st.buckets),
                                                                                      n - 1))
        bufs = [st.buckets[i][0] for i in range(n)]
        sizes = [b.numel() for b in bufs]
        params = [st.buckets[i][1] for i in range(n)]
        sig = None if None in params else self._seen.signature([p for ps in params for p in ps])
        if self._engine is None:
            seen = {i: (b.numel(), ps) for i, (b, ps) in enumerate(zip(bufs, params))}
            if self._pending_layout is not None:
                self._create(self._pending_layout, buf, self._pending_params, seen)
            else:
                self._create(sizes, buf, sig, seen)
        eng = self._engine
        try:
            try:
                perm = line_up(st.number, sizes, eng.sizes, sig, self._params_sig)
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
            self._seen.final[index] = (buf.numel(), bucket_params(bucket))
        fut = _device.future(buf)
        st.buckets[index] = (buf, None, fut)
        while st.launched in st.buckets:
            b, _, out = st.buckets.pop(st.launched)
            st.launched += 1
            st.plain_sent += 2 * (world - 1) * 4 * b.numel() // world
            st.plain_buckets += 1
            b.div_(world)
            dist.all_reduce(b, group=group, async_op=True).get_future().then(
                lambda f, b=b, out=out: complete(out, f, b))
        if last and st.buckets:
            missing = sorted(set(range(max(st.buckets))) - set(st.buckets) - set(range(st.launched)))
            for b, _, out in st.buckets.values():
                out.set_result(b)
            raise ValueError("gradcomp.torch: step %d ended without bucket(s) %s" % (st.number, missing))
        return fut

    def _abort(self, st, e):
        """The step cannot go on (a bucket refused, a wait that failed
        before it began): the engine is destroyed (its step abandoned,
        error feedback keeping e + g) and the step's futures completed."""
        if self._engine is not None and st.started:
            self._drop_engine(e)
            st.fail(e)
            self._resolve(st, e)

    def _finish(self, st):
        """Waits for the engine's step, copies staged buckets back and
        completes the step's futures, then reads the step's statistics
        (DDP goes on with the averages meanwhile; whatever reads the
        statistics waits for them: :meth:`_settled`)."""
        eng = self._engine
        err = self._wait(eng, st)
        done = time.perf_counter()
        if not st.pending and st.ended is not None:
            done = st.ended  # every bucket was DDP's: the step ended with the last all-reduce
        if err is None:
            self._copy_back(st)
        self._resolve(st, err)
        stats = self._record(eng, st.number)
        if stats is not None:
            self._last_split = split(st, stats, eng.wire_seconds - st.wire0, done)

    @staticmethod
    def _copy_back(st):
        """Puts the averages of staged (float32 copies) and permuted
        buckets back into DDP's buckets (on a GPU, on the current stream,
        after the engine's done event)."""
        if st.unpermute is not None:
            ddp_flat, perm, flat = st.unpermute
            ddp_flat[perm] = flat
        for fut, buf, staged in st.pending:
            if staged is not buf:
                buf.copy_(staged)

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
