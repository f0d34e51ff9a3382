"""A DDP communication hook that compresses gradient buckets with gradcomp.

Usage, in the style of torch's PowerSGD hook::

    import gradcomp.torch
    state = gradcomp.torch.State("topk:0.01", warmup_steps=10)
    ddp_model.register_comm_hook(state, gradcomp.torch.hook)

What one step of :func:`hook` does for a bucket:

* Warm-up (the first ``warmup_steps`` steps): torch's default exchange, an
  asynchronous all-reduce of bucket/world, timed (from step 1 on: DDP
  rebuilds its buckets after step 0).
* The first step after warm-up starts with a handshake: every rank
  all-gathers a SHA-256 of (ABI version, canonical spec, bucket sizes) and a
  readable description of them; on a mismatch every rank raises ValueError
  naming its own configuration and the first differing rank's. With
  ``cost_model="measure"`` the handshake also makes the cost model's first
  guess per bucket (see below).
* Compressed exchange: the flat float32 bucket is compressed on the hook's
  thread with error feedback keyed by the bucket index (deferred: the
  residual is committed only once every rank's payload arrived), each
  rank's payload goes into a fixed-size slot (an 8-byte header, then
  gc_max_encoded_len bytes), and the slots are all-gathered asynchronously
  over the process group. The hook returns at once, so backward goes on
  computing while the exchange runs; when the all-gather completes, a
  callback decodes each payload and adds it in rank order (so every rank
  gets bit-identical sums), divides by the world size and completes the
  returned future. ``overlap=False`` waits for all of that inside the hook
  instead (the same results, bit for bit).
* NaN or Inf in a rank's bucket: that rank's compress fails and sets the
  slot's flag; when any rank's flag is set, every rank discards the
  deferred compress (error-feedback memory untouched) and exchanges the
  bucket dense that step, or completes its future with FloatingPointError
  under ``on_nonfinite="raise"``. Collectives must be issued in the same
  order on every rank, and the callbacks run in any order, so the dense
  fallbacks of a step are issued once the step's last bucket has been
  handed to the hook, in bucket order (see :class:`_StepExchanges`).
* Cost model (``cost_model="measure"``): at the handshake, the ranks agree
  on a link bandwidth from the warm-up's dense exchanges (per bucket, the
  fastest rank's median time; bandwidth = all-reduce bytes sent per rank
  over all buckets / the sum of those times) and ask the library's cost
  model (gc_decide, overlap.Predict, strategy "allgather") per bucket: a
  bucket every rank's model predicts at least 20% faster compressed is
  compressed, the others go dense at once (the model's compute is timed on
  an idle host, so a loaded one only makes compression slower). A
  compressed bucket's first ``probe_steps`` compressed steps are then timed
  (hook call to completed future, as the dense exchanges were) and
  compared with its warm-up dense median; the ranks agree through an
  all-reduce (max) of both and the bucket keeps the faster path. A bucket
  that goes dense uses the default all-reduce from then on; the residual
  it held from the probe steps is dropped. ``cost_model="off"`` always
  compresses.

Buckets of float16, bfloat16 or float64 gradients, or non-contiguous ones,
are staged through a float32 copy; other dtypes raise TypeError. CUDA
buckets are compressed and decoded in device memory on torch's current
stream through libgradcomp_cuda.so (loaded instead of libgradcomp.so when
torch sees a GPU) and all-gathered with ``all_gather_into_tensor`` (NCCL);
without that library they raise NotImplementedError naming it. The CUDA
path has not run on a GPU yet (scripts/gpu-check's plugin-py step runs it).

The futures of one step must complete before the next step's hooks run, as
DDP guarantees (it waits for every bucket's future at the end of backward).
"""

import collections
import hashlib
import math
import statistics
import threading
import time
import warnings

import torch
import torch.distributed as dist

from . import _lib
from ._compressor import Compressor, abi_version, has_cuda, payload_len_raw

__all__ = ["State", "hook"]

#: Bytes of the non-finite flag word in an all-gathered slot: before the
#: payload on the host (byte 0 the flag, the rest padding), after it on a
#: CUDA device (the slot's last 8 bytes), so that device payloads start at
#: the slots' starts as gc_decompress_slots_device reads them.
SLOT_HEADER = 8
#: Bytes of readable configuration carried by the handshake.
HANDSHAKE_TEXT = 256
#: The exchange the hook does, in gc_decide's names.
STRATEGY = "allgather"
_STATE_FORMAT = "gradcomp.torch.State/1"
_STAGED_DTYPES = (torch.float16, torch.bfloat16, torch.float64)
_COST_MODELS = ("measure", "off")
_ON_NONFINITE = ("dense", "raise")


class State:
    """The hook's state: the compressor, its error-feedback memory, the step
    counter and the per-bucket decisions.

    ``spec``: a compressor spec such as "topk:0.01", "int8" or "sign" (a
    spec the library rejects raises ValueError with its message).
    ``warmup_steps`` (≥ 2): steps exchanged dense before compression starts;
    DDP rebuilds its buckets after the first step, and error feedback is
    keyed by bucket index. ``process_group``: the group to exchange over
    (None: the default group). ``error_feedback``: keep a residual per bucket.
    ``cost_model``: "measure" (the cost model's guess, then keep the faster
    path per bucket, measured) or "off" (always compress). ``probe_steps``:
    compressed steps timed per bucket before deciding. ``on_nonfinite``:
    "dense" or "raise". ``overlap``: return from the hook while the exchange
    runs (True) or only once it completed (False). ``workers``: compressor
    threads (≤ 0: all CPUs). ``model``: the module DDP wraps (or the DDP
    model), optional: it names each bucket's parameters, so that a bucket
    whose element order differs from the one its error feedback was built
    with (DDP's first step after restoring a checkpoint, before DDP rebuilds
    its buckets) is permuted into that order; without it such a bucket is
    exchanged dense for that step, its error feedback untouched.
    """

    def __init__(
        self,
        spec,
        *,
        warmup_steps=10,
        process_group=None,
        error_feedback=True,
        cost_model="measure",
        probe_steps=3,
        on_nonfinite="dense",
        overlap=True,
        workers=0,
        model=None,
    ):
        if not isinstance(warmup_steps, int) or warmup_steps < 2:
            raise ValueError(
                "gradcomp.torch.State: warmup_steps=%r: want an int ≥ 2 "
                "(DDP rebuilds its buckets after the first step)" % (warmup_steps,)
            )
        if not isinstance(probe_steps, int) or probe_steps < 1:
            raise ValueError("gradcomp.torch.State: probe_steps=%r: want an int ≥ 1" % (probe_steps,))
        if cost_model not in _COST_MODELS:
            raise ValueError("gradcomp.torch.State: cost_model=%r: want one of %s" % (cost_model, _COST_MODELS))
        if on_nonfinite not in _ON_NONFINITE:
            raise ValueError("gradcomp.torch.State: on_nonfinite=%r: want one of %s" % (on_nonfinite, _ON_NONFINITE))
        self.compressor = Compressor(spec, workers)
        #: The canonical spec.
        self.spec = self.compressor.spec
        self.warmup_steps = warmup_steps
        self.process_group = process_group
        self.error_feedback = bool(error_feedback)
        self.cost_model = cost_model
        self.probe_steps = probe_steps
        self.on_nonfinite = on_nonfinite
        self.overlap = bool(overlap)
        #: Steps completed (incremented after the step's last bucket).
        self.iter = 0
        #: Bucket index -> [[parameter ordinal (-1 without model), elements], ...]
        #: in bucket order, as seen in the latest warm-up step.
        self.layout = {}
        self._ordinals = {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}
        #: Link bandwidth in bytes/s the ranks agreed on at the handshake
        #: (cost_model="measure"; inf on one rank), None before.
        self.bandwidth = None
        #: Bucket index -> the cost model's agreed guess (True: compress).
        self.guesses = {}
        #: Bucket index -> True (compress) or False (dense), once decided.
        self.decisions = {}
        #: Bucket index -> (dense, compressed) seconds the ranks agreed on
        #: when the probe steps decided (the max over ranks of the medians).
        self.probed = {}
        #: Counters: buckets "compressed", "dense", "nonfinite" (went dense
        #: because of a NaN/Inf), "layout_dense" (dense because the layout
        #: differed), and "bytes_sent" (slot bytes per rank).
        self.stats = collections.Counter()
        self._stats_lock = threading.Lock()
        self._dense_times = collections.defaultdict(list)
        self._compressed_times = collections.defaultdict(list)
        self._handshake_done = False
        self._slots = {}  # bucket index -> _HostSlots or _DeviceSlots
        self._step = _StepExchanges()

    def group(self):
        """The process group the hook exchanges over."""
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def state_dict(self):
        """The state to checkpoint: error-feedback memory (gc_state_save),
        step counter, bucket layout, guesses, decisions and probe timings.
        Resuming from it is bit-exact given the same inputs (and, where DDP's
        first step after the restore orders a bucket differently, a
        ``model``); a checkpoint taken before the handshake lets the resumed
        run make the cost model's guesses anew, on this host's timings."""
        return {
            "format": _STATE_FORMAT,
            "spec": self.spec,
            "iter": self.iter,
            "layout": {k: [list(p) for p in v] for k, v in self.layout.items()},
            "bandwidth": self.bandwidth,
            "guesses": dict(self.guesses),
            "decisions": dict(self.decisions),
            "probed": {k: list(v) for k, v in self.probed.items()},
            "dense_times": {k: list(v) for k, v in self._dense_times.items()},
            "compressed_times": {k: list(v) for k, v in self._compressed_times.items()},
            "error_feedback": self.compressor.save_state(),
        }

    def load_state_dict(self, sd):
        """Restores a :meth:`state_dict`. ValueError when it is not one or was
        saved with another spec; the error-feedback memory is validated whole
        before anything changes. (A state saved before guesses existed has
        none: its buckets get them at the next handshake.)"""
        if not isinstance(sd, dict) or sd.get("format") != _STATE_FORMAT:
            raise ValueError("gradcomp.torch.State.load_state_dict: not a %s state dict" % _STATE_FORMAT)
        if sd["spec"] != self.spec:
            raise ValueError(
                "gradcomp.torch.State.load_state_dict: state saved with spec %r, this State has %r"
                % (sd["spec"], self.spec)
            )
        self.compressor.load_state(sd["error_feedback"])
        self.iter = int(sd["iter"])
        self.layout = {int(k): [[int(o), int(n)] for o, n in v] for k, v in sd["layout"].items()}
        self.bandwidth = sd.get("bandwidth")
        self.guesses = {int(k): bool(v) for k, v in sd.get("guesses", {}).items()}
        self.decisions = {int(k): bool(v) for k, v in sd["decisions"].items()}
        self.probed = {int(k): tuple(v) for k, v in sd.get("probed", {}).items()}
        self._dense_times = collections.defaultdict(list, {int(k): list(v) for k, v in sd["dense_times"].items()})
        self._compressed_times = collections.defaultdict(
            list, {int(k): list(v) for k, v in sd["compressed_times"].items()}
        )
        self._handshake_done = False

    def _count(self, key, n=1):
        """Adds n to stats[key] (callbacks run on the process group's threads)."""
        with self._stats_lock:
            self.stats[key] += n

    def _describe(self):
        major, minor = abi_version()
        sizes = [sum(n for _, n in self.layout[i]) for i in sorted(self.layout)]
        return "abi=%d.%d spec=%s buckets=%s" % (major, minor, self.spec, sizes)

    def _handshake(self, group):
        """All ranks compare a hash of their configuration; a mismatch raises
        ValueError on every rank (each sees every rank's hash). Then, with
        cost_model="measure", the cost model's guesses."""
        text = self._describe()
        mine = torch.zeros(32 + HANDSHAKE_TEXT, dtype=torch.uint8)
        mine[:32] = torch.tensor(list(hashlib.sha256(text.encode("utf-8")).digest()), dtype=torch.uint8)
        raw = text.encode("utf-8")[:HANDSHAKE_TEXT]
        mine[32 : 32 + len(raw)] = torch.tensor(list(raw), dtype=torch.uint8)
        world = dist.get_world_size(group)
        everyone = [torch.empty_like(mine) for _ in range(world)]
        dist.all_gather(everyone, mine, group=group)
        for rank, theirs in enumerate(everyone):
            if not torch.equal(theirs[:32], mine[:32]):
                other = bytes(theirs[32:].tolist()).rstrip(b"\0").decode("utf-8", "replace")
                raise ValueError(
                    "gradcomp.torch: configuration mismatch between ranks: rank %d has %s; rank %d has %s"
                    % (dist.get_rank(group), text, rank, other)
                )
        if self.cost_model == "measure":
            self._guess(group, world)
        self._handshake_done = True

    def _dense_median(self, index):
        """The median of bucket index's timed dense warm-up exchanges (inf
        when none was timed)."""
        times = self._dense_times.get(index)
        return statistics.median(times) if times else math.inf

    def _guess(self, group, world):
        """The cost model's first guess for each bucket that has neither a
        guess nor a decision (a restored state keeps its own): the ranks
        agree on the link (per bucket the fastest rank's median warm-up
        time: a rank that reached the collective early also timed its wait
        for the others), each asks gc_decide, and a bucket is compressed
        only when every rank's model says so; the others are decided dense.
        No bucket timed in the warm-up: no guesses (every bucket probes)."""
        todo = [i for i in sorted(self.layout) if i not in self.guesses and i not in self.decisions]
        if not todo:
            return
        sizes = [sum(n for _, n in self.layout[i]) for i in todo]
        times = torch.tensor([self._dense_median(i) for i in todo], dtype=torch.float64)
        dist.all_reduce(times, op=dist.ReduceOp.MIN, group=group)
        timed = [(n, float(t)) for n, t in zip(sizes, times) if math.isfinite(float(t)) and float(t) > 0]
        if not timed:
            return
        sent = sum(_all_reduce_bytes(world, n) for n, _ in timed)
        self.bandwidth = sent / sum(t for _, t in timed) if sent > 0 else math.inf
        votes = torch.tensor(
            [int(self.compressor.decide(n, world, self.bandwidth, strategy=STRATEGY).compress) for n in sizes],
            dtype=torch.int32,
        )
        dist.all_reduce(votes, op=dist.ReduceOp.MIN, group=group)
        for i, v in zip(todo, votes.tolist()):
            self.guesses[i] = bool(v)
            if not v:
                self.decisions[i] = False

    def _slot_buffers(self, index, staged, world):
        """The bucket's all-gather buffers for staged (float32, on its
        device), made on first use and when its length or device changes."""
        slots = self._slots.get(index)
        n, device = staged.numel(), staged.device
        if slots is None or slots.n != n or slots.device != device:
            kind = _DeviceSlots if device.type == "cuda" else _HostSlots
            slots = kind(n, _slot_len(self.compressor.max_encoded_len(n)), world, device)
            self._slots[index] = slots
        return slots

    def _signature(self, bucket):
        """The bucket's parameters in bucket order: [[ordinal, elements], ...]."""
        return [[self._ordinals.get(id(p), -1), p.numel()] for p in bucket.parameters()]

    def _reorder(self, index, signature):
        """None when the bucket is in its recorded order; else the
        [(offset, elements), ...] slices of the bucket that, concatenated,
        give the recorded order; False when no such permutation is known
        (no model, or other parameters)."""
        want = self.layout.get(index)
        if signature == want:
            return None
        if want is None or any(o < 0 for o, _ in signature) or sorted(signature) != sorted(want):
            return False
        offsets, at = {}, 0
        for o, n in signature:
            offsets[o] = at
            at += n
        return [(offsets[o], n) for o, n in want]

    def _decide(self, index, group):
        """Agrees, once per bucket after its probe steps, whether it stays
        compressed: the max over ranks of each path's median time (dense:
        the warm-up's exchanges; compressed: the probe steps')."""
        comp = self._compressed_times[index][-self.probe_steps :]
        t = torch.tensor([self._dense_median(index), statistics.median(comp)], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        self.probed[index] = (float(t[0]), float(t[1]))
        self.decisions[index] = bool(t[1] < t[0])
        return self.decisions[index]


def _all_reduce_bytes(world, n):
    """Bytes one rank sends in a ring all-reduce of n float32 (what
    overlap.Predict's link model charges a dense exchange)."""
    return 2 * (world - 1) * 4 * n // world


def _slot_len(max_encoded):
    return (SLOT_HEADER + max_encoded + 7) // 8 * 8


class _HostSlots:
    """A bucket's all-gather buffers in host memory: world slots of
    slot_len bytes, each the flag word then the payload, gathered into a
    list of tensors (gloo)."""

    def __init__(self, n, slot_len, world, device):
        self.n, self.device = n, device
        self.send = torch.zeros(slot_len, dtype=torch.uint8)
        self.recv = [torch.empty_like(self.send) for _ in range(world)]

    def compress(self, compressor, staged, **kw):
        compressor.compress_raw(
            staged.data_ptr(), self.n, self.send.data_ptr() + SLOT_HEADER, self.send.numel() - SLOT_HEADER, **kw
        )

    def set_flag(self, value):
        self.send[0] = value

    def gather(self, group):
        return dist.all_gather(self.recv, self.send, group=group, async_op=True)

    def flags(self):
        return [int(slot[0]) for slot in self.recv]

    def decode(self, compressor, staged):
        """staged = the sum of the gathered payloads, in rank order."""
        staged.zero_()
        for slot in self.recv:
            payload = slot.data_ptr() + SLOT_HEADER
            length = payload_len_raw(payload, slot.numel() - SLOT_HEADER)
            compressor.decompress_raw(payload, length, staged.data_ptr(), self.n, add=True)


class _DeviceSlots:
    """A bucket's all-gather buffers on a CUDA device: world slots of
    slot_len bytes in one tensor (``all_gather_into_tensor``), each the
    payload then the flag word; compress and decode run on torch's current
    stream."""

    def __init__(self, n, slot_len, world, device):
        self.n, self.device, self.world = n, device, world
        self.send = torch.zeros(slot_len, dtype=torch.uint8, device=device)
        self.recv = torch.empty(world * slot_len, dtype=torch.uint8, device=device)

    def _stream(self):
        return torch.cuda.current_stream(self.device).cuda_stream

    def compress(self, compressor, staged, **kw):
        compressor.compress_device(
            staged.data_ptr(), self.n, self.send.data_ptr(), self.send.numel() - SLOT_HEADER, self._stream(), **kw
        )

    def set_flag(self, value):
        self.send[-SLOT_HEADER] = value

    def gather(self, group):
        return dist.all_gather_into_tensor(self.recv, self.send, group=group, async_op=True)

    def flags(self):
        slot = self.send.numel()
        return self.recv.view(self.world, slot)[:, slot - SLOT_HEADER].tolist()

    def decode(self, compressor, staged):
        """staged = the sum of the gathered payloads, in rank order."""
        compressor.decompress_slots_device(
            self.recv.data_ptr(), self.send.numel(), self.world, staged.data_ptr(), self.n, self._stream()
        )


# Outcomes of an exchange's all-gather.
_DONE = "done"  # decoded, failed, or refused (on_nonfinite="raise"): nothing more to issue
_FALLBACK = "fallback"  # a rank's bucket held NaN/Inf: a dense all-reduce is to be issued


class _StepExchanges:
    """The compressed exchanges one step launched, in launch order, and
    when their dense fallbacks may be issued.

    Every rank must issue its collectives on the group in the same order.
    The hook's thread issues the handshake, the decisions' all-reduces, the
    all-gathers and the dense all-reduces, in bucket order; the all-gathers'
    callbacks run on the group's threads in any order. So a fallback is
    issued only once the step is closed (its last bucket handed to the
    hook: the hook's thread issues nothing more until the step's futures
    have completed) and every exchange launched before it knows its
    outcome, which makes the fallbacks' order the launch order on every
    rank. ``release(force=True)`` is for a hook that waits for its own
    exchange (overlap=False): every earlier exchange has completed then.
    """

    def __init__(self):
        self._lock = threading.Lock()
        # Exchanges that may still have a fallback to issue, in launch
        # order; one leaves once it has (no reference cycle outlives the
        # step: the cyclic collector may run on a process group's thread).
        self._exchanges = collections.deque()
        self._closed = False

    def add(self, ex):
        """Records an exchange whose all-gather was just launched."""
        with self._lock:
            self._exchanges.append(ex)

    def close(self):
        """The step's last bucket was handed to the hook."""
        with self._lock:
            self._closed = True
            self._release()

    def release(self, force=False):
        """Issues the fallbacks that may go now (called when an exchange's
        outcome became known)."""
        with self._lock:
            self._release(force)

    def _release(self, force=False):
        if not (self._closed or force):
            return
        while self._exchanges:
            ex = self._exchanges[0]
            if ex.outcome is None:
                return
            if ex.outcome is _FALLBACK:
                ex.issue_dense()
            self._exchanges.popleft()


class _Exchange:
    """One bucket's compressed exchange after its all-gather was launched:
    the callbacks that finish it and ``result``, the future the hook
    returned."""

    def __init__(self, state, step, compressor, buf, staged, order, slots, world, index, pending, start):
        self.state = state
        self.step = step
        self.compressor = compressor
        self.buf = buf
        self.staged = staged
        self.order = order
        self.slots = slots
        self.world = world
        self.index = index
        self.pending = pending  # a deferred compress awaits its settle
        self.start = start
        self.iter = state.iter
        #: None until the all-gather completed, then _DONE or _FALLBACK.
        self.outcome = None
        self.result = torch.futures.Future()

    def _settle(self, mode):
        if self.pending:
            self.pending = False
            self.compressor.settle(self.index, mode)

    def gathered(self, fut):
        """The all-gather's callback: decode and complete, or mark the
        bucket for a dense fallback (NaN/Inf on some rank), or fail."""
        try:
            try:
                fut.value()
            except BaseException:
                self._settle(_lib.Settle.RETAIN)
                raise
            flagged = [r for r, flag in enumerate(self.slots.flags()) if flag != 0]
            if flagged:
                self._settle(_lib.Settle.DISCARD)
                self.state._count("nonfinite")
                if self.state.on_nonfinite == "raise":
                    raise FloatingPointError(
                        "gradcomp.torch: bucket %d at step %d holds NaN or Inf on rank(s) %s"
                        % (self.index, self.iter, flagged)
                    )
                self.outcome = _FALLBACK
            else:
                self._decode()
                self.outcome = _DONE
        except BaseException as e:
            self.outcome = _DONE
            self.result.set_exception(e)
        self.step.release()

    def _decode(self):
        staged = self.staged
        try:
            self.slots.decode(self.compressor, staged)
        except BaseException:
            self._settle(_lib.Settle.RETAIN)
            raise
        staged.div_(self.world)
        self._settle(_lib.Settle.COMMIT)
        state = self.state
        state._count("compressed")
        state._count("bytes_sent", self.slots.send.numel())
        self._finish()
        if state.decisions.get(self.index) is None and state.cost_model == "measure":
            state._compressed_times[self.index].append(time.perf_counter() - self.start)

    def issue_dense(self):
        """Launches the dense fallback (the bucket's own values: nothing was
        committed to error feedback); called in launch order (see
        _StepExchanges)."""
        try:
            self.staged.div_(self.world)
            fut = dist.all_reduce(self.staged, group=self.state.group(), async_op=True).get_future()
        except BaseException as e:
            self.result.set_exception(e)
            return
        fut.then(self._dense_done)

    def _dense_done(self, fut):
        try:
            fut.value()
            self._finish()
        except BaseException as e:
            self.result.set_exception(e)

    def _finish(self):
        """Copies the averaged bucket back into DDP's buffer where it was
        staged, and completes the hook's future with it."""
        if self.order:
            at = 0
            for o, n in self.order:
                self.buf[o : o + n].copy_(self.staged[at : at + n])
                at += n
        elif self.staged is not self.buf:
            self.buf.copy_(self.staged)
        self.result.set_result(self.buf)


def _compressor_for(state, tensor):
    """The compressor for a bucket on tensor's device: state's, whose
    library serves host memory, and device memory too when it is
    libgradcomp_cuda.so."""
    if tensor.device.type == "cpu":
        return state.compressor
    if tensor.device.type == "cuda":
        if not has_cuda():
            raise NotImplementedError(
                "gradcomp.torch: bucket on %s needs %s (device pointers and CUDA streams), but the loaded library "
                "is %s (host memory): build it with `make plugin` on a machine with nvidia-cuda-toolkit, and let "
                "the package find it (GRADCOMP_LIB or next to the package)" % (tensor.device, _lib.CUDA_LIB_NAME, _lib.CPU_LIB_NAME)
            )
        return state.compressor
    raise NotImplementedError("gradcomp.torch: buckets on %s are not supported (CPU and CUDA only)" % tensor.device)


def hook(state, bucket):
    """The DDP communication hook: register it with
    ``ddp_model.register_comm_hook(state, gradcomp.torch.hook)``. Returns a
    future holding the bucket averaged over the process group, completed
    once the exchange is (see the module documentation for warm-up,
    handshake, compression, overlap, NaN handling and the cost model)."""
    buf = bucket.buffer()
    compressor = _compressor_for(state, buf)
    if not buf.is_floating_point():
        raise TypeError("gradcomp.torch: bucket %d holds %s gradients; want a floating-point dtype" % (bucket.index(), buf.dtype))
    index = bucket.index()
    group = state.group()
    step = state._step
    try:
        if state.iter < state.warmup_steps:
            state.layout[index] = state._signature(bucket)
            return _dense(state, buf, index, group, timed=state.iter >= 1)
        if not state._handshake_done:
            state._handshake(group)
        decided = state.decisions.get(index)
        if decided is None and state.cost_model == "measure" and len(state._compressed_times[index]) >= state.probe_steps:
            decided = state._decide(index, group)
        if decided is False:
            return _dense(state, buf, index, group, timed=False)
        order = state._reorder(index, state._signature(bucket))
        if order is False:
            # Every rank sees the same layout (DDP builds it identically), so
            # every rank takes this path for this bucket.
            warnings.warn(
                "gradcomp.torch: bucket %d's parameters differ from the recorded layout (DDP's first step after "
                "a restore?); exchanging it dense this step, error feedback untouched. Pass model= to State to "
                "follow reordered buckets." % index
            )
            state._count("layout_dense")
            return _dense(state, buf, index, group, timed=False)
        return _compressed(state, step, compressor, buf, index, group, order)
    finally:
        if bucket.is_last():
            state.iter += 1
            state._step = _StepExchanges()
            step.close()


def _dense(state, buf, index, group, timed):
    """torch's default exchange (all-reduce of bucket/world), timed from the
    hook's call to the collective's completion when ``timed``."""
    start = time.perf_counter()
    buf.div_(dist.get_world_size(group))
    state._count("dense")
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()

    def done(f):
        if timed:
            state._dense_times[index].append(time.perf_counter() - start)
        return f.value()[0]

    return fut.then(done)


def _compressed(state, step, compressor, buf, index, group, order):
    """Compresses one bucket, in the recorded element order (``order``: the
    bucket's slices in that order, or None when the bucket is in it), and
    launches the all-gather of the slots; returns the future the
    exchange's callbacks complete (completed already when not
    ``state.overlap``)."""
    start = time.perf_counter()
    world = dist.get_world_size(group)
    if order:
        staged = torch.cat([buf[o : o + n] for o, n in order]).to(torch.float32)
    elif buf.dtype == torch.float32 and buf.is_contiguous():
        staged = buf
    else:
        staged = buf.to(torch.float32).contiguous()
    slots = state._slot_buffers(index, staged, world)
    ef = state.error_feedback
    pending = False
    try:
        slots.compress(compressor, staged, bucket=index, step=state.iter, feedback=ef, defer=ef)
        pending = ef
        slots.set_flag(0)
    except _lib.NonFiniteError:
        slots.set_flag(1)
    ex = _Exchange(state, step, compressor, buf, staged, order, slots, world, index, pending, start)
    try:
        gather = slots.gather(group).get_future()
    except BaseException:
        ex._settle(_lib.Settle.RETAIN)
        raise
    step.add(ex)
    done = gather.then(ex.gathered)
    if not state.overlap:
        done.wait()
        step.release(force=True)
        ex.result.then(_ignore).wait()  # completed, with its value or its error
    return ex.result


def _ignore(fut):
    """A callback that leaves fut's value or error to whoever waits for it."""
