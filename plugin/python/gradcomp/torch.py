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
  naming its own configuration and the first differing rank's.
* Compressed exchange: the flat float32 bucket is compressed with error
  feedback keyed by the bucket index (deferred: the residual is committed
  only once every rank's payload arrived), each rank's payload goes into a
  fixed-size slot (an 8-byte header, then gc_max_encoded_len bytes), the
  slots are all-gathered over the process group, each payload is decoded
  and added in rank order (so every rank gets bit-identical sums) and the
  sum is divided by the world size. The hook returns a completed future.
* NaN or Inf in a rank's bucket: that rank's compress fails and sets the
  slot's flag; when any rank's flag is set, every rank exchanges the bucket
  dense that step (error-feedback memory untouched: the deferred compress is
  discarded), or raises FloatingPointError with ``on_nonfinite="raise"``.
* Cost model (``cost_model="measure"``): for each bucket, the first
  ``probe_steps`` compressed steps are timed and compared with the last
  timed warm-up steps' dense exchanges; the ranks agree through an
  all-reduce (max) of both medians and the bucket keeps the faster path.
  A bucket that goes dense uses the default all-reduce from then on; the
  residual it held from the probe steps is dropped. ``cost_model="off"``
  always compresses.

Buckets of float16, bfloat16 or float64 gradients, or non-contiguous ones,
are staged through a float32 copy; other dtypes raise TypeError. CUDA
buckets raise NotImplementedError: they need libgradcomp_cuda.so, which is
not built yet (see :func:`_compressor_for`, where its path slots in).
"""

import collections
import hashlib
import statistics
import time
import warnings

import torch
import torch.distributed as dist

from . import _lib
from ._compressor import Compressor, abi_version, payload_len_raw

__all__ = ["State", "hook"]

#: Bytes before each payload in an all-gathered slot: byte 0 is the
#: non-finite flag, the rest pads the payload to 8 bytes.
SLOT_HEADER = 8
#: Bytes of readable configuration carried by the handshake.
HANDSHAKE_TEXT = 256
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
    ``cost_model``: "measure" (keep the faster path per bucket, measured) or
    "off" (always compress). ``probe_steps``: compressed steps timed per
    bucket before deciding. ``on_nonfinite``: "dense" or "raise".
    ``workers``: compressor threads (≤ 0: all CPUs). ``model``: the module
    DDP wraps (or the DDP model), optional: it names each bucket's
    parameters, so that a bucket whose element order differs from the one
    its error feedback was built with (DDP's first step after restoring a
    checkpoint, before DDP rebuilds its buckets) is permuted into that
    order; without it such a bucket is exchanged dense for that step, its
    error feedback untouched.
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
        #: Steps completed (incremented after the step's last bucket).
        self.iter = 0
        #: Bucket index -> [[parameter ordinal (-1 without model), elements], ...]
        #: in bucket order, as seen in the latest warm-up step.
        self.layout = {}
        self._ordinals = {id(p): i for i, p in enumerate(model.parameters())} if model is not None else {}
        #: Bucket index -> True (compress) or False (dense), once decided.
        self.decisions = {}
        #: Counters: buckets "compressed", "dense", "nonfinite" (went dense
        #: because of a NaN/Inf), and "bytes_sent" (slot bytes per rank).
        self.stats = collections.Counter()
        self._dense_times = collections.defaultdict(list)
        self._compressed_times = collections.defaultdict(list)
        self._handshake_done = False
        self._slots = {}  # bucket index -> (send slot, receive slots, elements)

    def group(self):
        """The process group the hook exchanges over."""
        return self.process_group if self.process_group is not None else dist.group.WORLD

    def state_dict(self):
        """The state to checkpoint: error-feedback memory (gc_state_save),
        step counter, bucket layout, decisions and probe timings. Resuming
        from it is bit-exact given the same inputs (and, where DDP's first
        step after the restore orders a bucket differently, a ``model``)."""
        return {
            "format": _STATE_FORMAT,
            "spec": self.spec,
            "iter": self.iter,
            "layout": {k: [list(p) for p in v] for k, v in self.layout.items()},
            "decisions": dict(self.decisions),
            "dense_times": {k: list(v) for k, v in self._dense_times.items()},
            "compressed_times": {k: list(v) for k, v in self._compressed_times.items()},
            "error_feedback": self.compressor.save_state(),
        }

    def load_state_dict(self, sd):
        """Restores a :meth:`state_dict`. ValueError when it is not one or was
        saved with another spec; the error-feedback memory is validated whole
        before anything changes."""
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
        self.decisions = {int(k): bool(v) for k, v in sd["decisions"].items()}
        self._dense_times = collections.defaultdict(list, {int(k): list(v) for k, v in sd["dense_times"].items()})
        self._compressed_times = collections.defaultdict(
            list, {int(k): list(v) for k, v in sd["compressed_times"].items()}
        )
        self._handshake_done = False

    def _describe(self):
        major, minor = abi_version()
        sizes = [sum(n for _, n in self.layout[i]) for i in sorted(self.layout)]
        return "abi=%d.%d spec=%s buckets=%s" % (major, minor, self.spec, sizes)

    def _handshake(self, group):
        """All ranks compare a hash of their configuration; a mismatch raises
        ValueError on every rank (each sees every rank's hash)."""
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
        self._handshake_done = True

    def _slot_buffers(self, index, n, world):
        slots = self._slots.get(index)
        if slots is None or slots[2] != n:
            send = torch.zeros(_slot_len(self.compressor.max_encoded_len(n)), dtype=torch.uint8)
            slots = (send, [torch.empty_like(send) for _ in range(world)], n)
            self._slots[index] = slots
        return slots[0], slots[1]

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
        compressed: the max over ranks of each path's median time."""
        dense = self._dense_times.get(index, [])[-self.probe_steps :]
        comp = self._compressed_times[index][-self.probe_steps :]
        t = torch.tensor(
            [statistics.median(dense) if dense else float("inf"), statistics.median(comp)], dtype=torch.float64
        )
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        self.decisions[index] = bool(t[1] < t[0])
        return self.decisions[index]


def _slot_len(max_encoded):
    return (SLOT_HEADER + max_encoded + 7) // 8 * 8


def _compressor_for(state, tensor):
    """The compressor for a bucket on tensor's device: the CPU library's for
    CPU tensors. CUDA buckets need libgradcomp_cuda.so (device pointers on
    torch's current stream), which is not built yet."""
    if tensor.device.type == "cpu":
        return state.compressor
    if tensor.device.type == "cuda":
        raise NotImplementedError(
            "gradcomp.torch: bucket on %s needs %s (device pointers and CUDA streams), which is not built yet; "
            "only %s (host memory) exists: train on the CPU or use torch's default hook"
            % (tensor.device, _lib.CUDA_LIB_NAME, _lib.CPU_LIB_NAME)
        )
    raise NotImplementedError("gradcomp.torch: buckets on %s are not supported (CPU only)" % tensor.device)


def hook(state, bucket):
    """The DDP communication hook: register it with
    ``ddp_model.register_comm_hook(state, gradcomp.torch.hook)``. Returns a
    future holding the bucket averaged over the process group (see the module
    documentation for warm-up, handshake, compression, NaN handling and the
    cost model)."""
    buf = bucket.buffer()
    compressor = _compressor_for(state, buf)
    if not buf.is_floating_point():
        raise TypeError("gradcomp.torch: bucket %d holds %s gradients; want a floating-point dtype" % (bucket.index(), buf.dtype))
    index = bucket.index()
    group = state.group()
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
            state.stats["layout_dense"] += 1
            return _dense(state, buf, index, group, timed=False)
        return _compressed(state, compressor, buf, index, group, order)
    finally:
        if bucket.is_last():
            state.iter += 1


def _dense(state, buf, index, group, timed):
    """torch's default exchange (all-reduce of bucket/world), timed from the
    hook's call to the collective's completion when ``timed``."""
    start = time.perf_counter()
    buf.div_(dist.get_world_size(group))
    state.stats["dense"] += 1
    fut = dist.all_reduce(buf, group=group, async_op=True).get_future()

    def done(f):
        if timed:
            state._dense_times[index].append(time.perf_counter() - start)
        return f.value()[0]

    return fut.then(done)


def _compressed(state, compressor, buf, index, group, order):
    """The compressed exchange of one bucket (synchronous), in the recorded
    element order (``order``: the bucket's slices in that order, or None
    when the bucket is in it); returns a completed future."""
    start = time.perf_counter()
    world = dist.get_world_size(group)
    if order:
        staged = torch.cat([buf[o : o + n] for o, n in order]).to(torch.float32)
    elif buf.dtype == torch.float32 and buf.is_contiguous():
        staged = buf
    else:
        staged = buf.to(torch.float32).contiguous()
    n = staged.numel()
    send, recv = state._slot_buffers(index, n, world)
    ef = state.error_feedback
    pending = False
    try:
        compressor.compress_raw(
            staged.data_ptr(), n, send.data_ptr() + SLOT_HEADER, send.numel() - SLOT_HEADER,
            bucket=index, step=state.iter, feedback=ef, defer=ef,
        )
        pending = ef
        send[0] = 0
    except _lib.NonFiniteError:
        send[0] = 1
    try:
        dist.all_gather(recv, send, group=group)
    except BaseException:
        if pending:
            compressor.settle(index, _lib.Settle.RETAIN)
        raise
    flagged = [r for r, slot in enumerate(recv) if int(slot[0]) != 0]
    if flagged:
        if pending:
            compressor.settle(index, _lib.Settle.DISCARD)
        state.stats["nonfinite"] += 1
        if state.on_nonfinite == "raise":
            raise FloatingPointError(
                "gradcomp.torch: bucket %d at step %d holds NaN or Inf on rank(s) %s" % (index, state.iter, flagged)
            )
        staged.div_(world)
        dist.all_reduce(staged, group=group)
    else:
        try:
            staged.zero_()
            for slot in recv:
                payload = slot.data_ptr() + SLOT_HEADER
                length = payload_len_raw(payload, slot.numel() - SLOT_HEADER)
                compressor.decompress_raw(payload, length, staged.data_ptr(), n, add=True)
        except BaseException:
            if pending:
                compressor.settle(index, _lib.Settle.RETAIN)
            raise
        staged.div_(world)
        if pending:
            compressor.settle(index, _lib.Settle.COMMIT)
        state.stats["compressed"] += 1
        state.stats["bytes_sent"] += send.numel()
    if order:
        at = 0
        for o, n in order:
            buf[o : o + n].copy_(staged[at : at + n])
            at += n
    elif staged is not buf:
        buf.copy_(staged)
    if state.decisions.get(index) is None and state.cost_model == "measure":
        state._compressed_times[index].append(time.perf_counter() - start)
    fut = torch.futures.Future()
    fut.set_result(buf)
    return fut
