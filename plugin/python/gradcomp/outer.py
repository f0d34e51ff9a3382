"""Outer synchronization for low-communication training: DiLoCo, Streaming
DiLoCo and SparseLoCo, through gradcomp's outer loop (package outer's Loop,
the C ABI's gc_outer_*, ABI 2.11).

Each worker (a rank of ``group``) trains its own copy of the model with its
own inner optimizer and data, and calls :meth:`DiLoCo.step` after every
inner optimizer step; every ``sync_every`` inner steps the workers average
how far they moved from the global weights — the pseudo-gradient Δ =
θ_global − θ_local, float32 — through gradcomp's engine (any codec, with
error feedback), an outer optimizer applies the average to θ_global (the
same on every worker) and the local weights become α·θ_local + (1 − α)·
θ_global::

    import gradcomp.outer
    loop = gradcomp.outer.DiLoCo(model.parameters(), sync_every=100)
    for x, y in data:
        loss_fn(model(x), y).backward()
        opt.step()
        opt.zero_grad()
        report = loop.step()

The schedule (which fragment syncs when), the outer optimizer and the
checkpoint live in the library: this module hands it the tensors and
carries out its collectives on torch.distributed (a
:class:`gradcomp._host.TorchHost` on ``group``). See docs/PYTORCH.md,
"Outer synchronization (DiLoCo)", for the settings of each method and the
two-level recipe (DDP or FSDP2 inside a worker, the loop across workers).
"""

import collections
import ctypes
import logging

from . import _lib
from ._compressor import canonical_spec
from ._engine import engine_config, matrix_shape
from ._host import Hosted, TorchHost
from ._lib import Status
from ._outer_tensors import HostTensors

__all__ = ["DiLoCo", "Report", "STATE_FORMAT"]

_log = logging.getLogger("gradcomp")

#: on_nonfinite's values: what a sync whose average is not finite (NaN or
#: Inf in some worker's weights) does besides being skipped on every rank.
ON_NONFINITE = {"skip": _lib.OUTER_SKIP, "raise": _lib.OUTER_FAIL}

#: The "format" of :meth:`DiLoCo.state_dict`'s dict.
STATE_FORMAT = "gradcomp.outer/1"

Report = collections.namedtuple("Report", "step started finished skipped bytes_sent")
Report.__doc__ = (
    "What one DiLoCo.step did: step, the inner step it counted (1 for the first); started and finished, the "
    "fragments whose sync started and ended (applied or skipped) in it; skipped, those of finished that were "
    "skipped (a non-finite average), all ascending lists of fragment indices; bytes_sent, this rank's bytes on "
    "the wire for the finished syncs (0 for a sync that arrived before a save and ended after the load)")


def _int32(name, v):
    """``v`` as an int32 field (ValueError for a value C would wrap)."""
    v = int(v)
    if not -(1 << 31) <= v < 1 << 31:
        raise ValueError("gradcomp.outer: %s %d does not fit an int32" % (name, v))
    return v


class DiLoCo:
    """One worker's outer loop over ``params`` (an iterable of float32
    tensors, e.g. ``model.parameters()``: CPU or CUDA; an FSDP2 DTensor
    stands for its local shard), collective over ``group`` (the
    torch.distributed group of the workers, one rank each; None: the
    default group). Creating it runs the handshake (settings that differ
    between ranks raise ConfigError on every rank, naming the field and
    both values) and copies rank 0's params into every rank's: they become
    the global weights.

    The tensors must stay the same storage while the loop lives (update
    them in place, as optimizers do). A contiguous CPU tensor is read and
    written by the library in place; any other (CUDA, non-contiguous,
    DTensor) through a host mirror, copied for the fragments a step reads
    before it and back for those it wrote after it (the library says
    which: ``gc_outer_due``).

    The schedule: ``sync_every`` = H inner steps between two syncs of a
    fragment; ``fragments`` = F contiguous groups of tensors balanced by
    elements, or ``fragment_of`` each tensor's fragment (then ``fragments``
    1 means as many as it names); fragment f starts at the steps s ≥
    ⌊(f+1)·H/F⌋ with (s − ⌊(f+1)·H/F⌋) mod H = 0, its exchange overlapping
    ``delay`` = τ inner steps (τ·F < H) before its average is applied;
    ``alpha`` = α in [0, 1) keeps that much of the local weights then.
    ``optimizer``: "nesterov" (DiLoCo's: torch's SGD(nesterov=True), ``lr``
    None: 0.7, ``momentum`` None: 0.9), "sgd" (SparseLoCo's, θ ← θ −
    lr·Δ̄; give ``lr``) or "none" (θ ← θ − Δ̄, the average of the local
    weights) — the library's names (``gradcomp.names(Names.OUTER_OPTIMIZER)``).

    The exchange: ``spec`` the codec of the pseudo-gradients (README's
    codec table; "none": a dense fp32 average), ``error_feedback`` (None:
    on when ``spec`` compresses), ``feedback_decay`` β of decayed error
    feedback (0: none), ``strategy`` and ``decision`` as
    :class:`gradcomp.Engine` takes them (``gradcomp.names``), ``timeout``
    seconds per collective, ``bucket_elements`` the largest engine bucket
    (None: 4 Mi float32s). SparseLoCo: ``spec="topk:0.02:chunk=4096:bits=2",
    feedback_decay=0.9, optimizer="sgd", lr=1``.

    ``on_nonfinite``: a sync whose average is not finite is skipped on
    every rank (the fragment's global weights, momentum, local weights and
    error-feedback memory stay as they were) and reported in
    ``Report.skipped``; "skip" logs a warning naming the fragment, "raise"
    makes :meth:`step` raise NonFiniteError (the loop stays usable).

    Errors are the package's: ConfigError (a ValueError) for a setting
    the library refuses or ranks disagree on, on every rank; CommError (a
    collective failed or timed out: the loop is broken, BrokenError
    afterwards; build a new one and resume from a checkpoint);
    NonFiniteError; TypeError or ValueError for Python arguments the
    library never sees.

    ``fragments`` and ``fragment_of`` after creation are the library's
    layout (the number of fragments, each tensor's); ``rank`` and
    ``world`` this worker's place in ``group``; ``tensors`` the
    :class:`gradcomp._outer_tensors.HostTensors` it hands the library
    (``tensors.mirrored``: some tensor goes through a host mirror).
    """

    def __init__(self, params, sync_every, *, fragments=1, fragment_of=None, delay=0, alpha=0.0,
                 optimizer="nesterov", lr=None, momentum=None, spec="none", error_feedback=None,
                 feedback_decay=0.0, strategy="auto", decision="auto", on_nonfinite="skip",
                 group=None, timeout=60.0, bucket_elements=None):
        import torch.distributed as dist

        self.handle = 0
        if not _lib.has("gc_outer_create"):
            raise ValueError("gradcomp.outer: the outer loop needs libgradcomp ABI 2.11; %s is older" % _lib.path())
        if on_nonfinite not in ON_NONFINITE:
            raise ValueError("gradcomp.outer: on_nonfinite %r: want one of %s" % (on_nonfinite, ", ".join(ON_NONFINITE)))
        kinds = _lib.names(_lib.Names.OUTER_OPTIMIZER)
        if optimizer not in kinds:
            raise ValueError("gradcomp.outer: optimizer %r: want one of %s" % (optimizer, ", ".join(kinds)))
        self.tensors = HostTensors(params)
        n = len(self.tensors)
        canonical = canonical_spec(spec)
        if error_feedback is None:
            error_feedback = canonical != "none"
        shapes = None
        if canonical.startswith("powersgd:"):
            shapes = [matrix_shape(s) for s in self.tensors.shapes()]
        ecfg = engine_config(spec, strategy=strategy, decision=decision, error_feedback=error_feedback,
                             timeout=timeout, feedback_decay=feedback_decay)
        ocfg = _lib.OuterConfig(
            size=ctypes.sizeof(_lib.OuterConfig), sync_every=_int32("sync_every", sync_every),
            fragments=0 if fragment_of is not None and fragments == 1 else _int32("fragments", fragments),
            delay=_int32("delay", delay), alpha=float(alpha), optimizer=kinds.index(optimizer),
            on_nonfinite=ON_NONFINITE[on_nonfinite], lr=float(lr or 0.0), momentum=float(momentum or 0.0),
            bucket_elements=int(bucket_elements or 0))
        keep = []  # the arrays ocfg points to, alive through the create
        if fragment_of is not None:
            of = [_int32("fragment_of[%d]" % i, f) for i, f in enumerate(fragment_of)]
            if len(of) != n:
                raise ValueError("gradcomp.outer: fragment_of has %d entries for %d tensors" % (len(of), n))
            keep.append((ctypes.c_int32 * max(n, 1))(*of))
            ocfg.fragment_of = ctypes.cast(keep[-1], ctypes.POINTER(ctypes.c_int32))
        if shapes is not None:
            keep.append((ctypes.c_uint64 * max(2 * n, 1))(*[v for shape in shapes for v in shape]))
            ocfg.shapes = ctypes.cast(keep[-1], ctypes.POINTER(ctypes.c_uint64))
        self.group = group
        self.rank, self.world = dist.get_rank(group), dist.get_world_size(group)
        if self.rank < 0:
            raise ValueError("gradcomp.outer: this process (rank %d) is not in group" % dist.get_rank())
        self.timeout = float(timeout)
        self._hosted = Hosted(self.rank, self.world)
        self._host = TorchHost(self._hosted, group, launch=True)
        addrs, sizes, self._bufs = self.tensors.addresses()
        h = ctypes.c_uint64()
        try:
            self.tensors.to_host(range(n))
            _lib.call("gc_outer_create", self._hosted.handle, ctypes.byref(ocfg), ctypes.byref(ecfg), addrs, sizes, n,
                      ctypes.byref(h))
        except BaseException:
            self._host.close(self.timeout)
            raise
        self.handle = h.value
        self.tensors.to_device(range(n))
        of, nf = (ctypes.c_int32 * max(n, 1))(), ctypes.c_size_t()
        _lib.call("gc_outer_layout", self.handle, of, n, ctypes.byref(nf))
        #: The number of fragments, F.
        self.fragments = nf.value
        #: Each tensor's fragment, as the library laid them out.
        self.fragment_of = [of[i] for i in range(n)]
        self._members = [[i for i in range(n) if self.fragment_of[i] == f] for f in range(self.fragments)]
        self._lists = [(ctypes.c_int32 * max(self.fragments, 1))() for _ in range(3)]

    def _h(self):
        if not self.handle:
            raise _lib.ClosedError("gc_outer", Status.CLOSED, "gradcomp.outer: the loop is closed")
        return self.handle

    def _tensors_of(self, fragments):
        return [i for f in sorted(set(fragments)) for i in self._members[f]]

    def _due(self):
        """The fragments the next step starts and finishes (gc_outer_due)."""
        starts, finishes = self._lists[0], self._lists[1]
        ns, nf = ctypes.c_size_t(), ctypes.c_size_t()
        _lib.call("gc_outer_due", self._h(), starts, finishes, self.fragments, ctypes.byref(ns), ctypes.byref(nf))
        return list(starts[: ns.value]), list(finishes[: nf.value])

    def step(self):
        """Counts one inner step and does the schedule's work at it
        (gc_outer_step): finishes the syncs due (waiting for their
        exchange), then starts those due. Call it on every rank after each
        inner optimizer step. Returns its :class:`Report`. Blocks while an
        exchange it finishes is on the wire; between two calls the
        exchanges in flight run on the host's threads."""
        h = self._h()
        if self.tensors.mirrored:
            starts, finishes = self._due()
            self.tensors.to_host(self._tensors_of(starts + finishes))
        arrays = [ctypes.cast(a, ctypes.POINTER(ctypes.c_int32)) for a in self._lists]
        rep = _lib.OuterReport(size=ctypes.sizeof(_lib.OuterReport), capacity=self.fragments, started=arrays[0],
                               finished=arrays[1], skipped=arrays[2])
        status = _lib.function("gc_outer_step")(h, ctypes.byref(rep))
        started, finished, skipped = (list(a[:k]) for a, k in zip(self._lists, (rep.nstarted, rep.nfinished,
                                                                                  rep.nskipped)))
        report = Report(rep.step, started, finished, skipped, rep.bytes_sent)
        if self.tensors.mirrored:  # what it applied, also when it failed after applying it
            self.tensors.to_device(self._tensors_of([f for f in finished if f not in skipped]))
        if status == Status.OK:
            for f in skipped:
                _log.warning("gradcomp.outer: inner step %d: fragment %d's sync skipped on every rank: its averaged "
                             "pseudo-gradient is not finite (NaN or Inf in some worker's weights); its global weights, "
                             "momentum and local weights are as they were", report.step, f)
        _lib.check("gc_outer_step", status)
        return report

    def global_params(self):
        """θ_global, the global weights, as new CPU tensors of each
        tensor's (local) shape (gc_outer_global): to evaluate or export
        the global model."""
        import torch

        h, out = self._h(), []
        for i, shape in enumerate(self.tensors.shapes()):
            t = torch.empty(shape, dtype=torch.float32)
            _lib.call("gc_outer_global", h, i, t.data_ptr() or None, t.numel())
            out.append(t)
        return out

    def state_dict(self):
        """This rank's state to checkpoint: the library's (its
        configuration, the inner step, θ_global, the outer momentum, the
        syncs in flight with their arrived averages, the engines' error
        feedback; gc_outer_state_save) with this rank's place. Call it on
        every rank at the same inner step; a sync in flight is waited for
        first. The params and the inner optimizer are the caller's to
        checkpoint."""
        data = _lib.saved_state(self._h(), "gc_outer_state_size", "gc_outer_state_save")
        return {"format": STATE_FORMAT, "world": self.world, "rank": self.rank, "state": data}

    def load_state_dict(self, sd):
        """Restores a :meth:`state_dict`, on every rank at once
        (collective; into a loop with no sync in flight, e.g. a new one):
        each rank passes the dict its rank saved, or None where the saved
        job had no such rank. On the saved number of workers the resumed
        run is bit for bit the uninterrupted one; on another (or with a
        None) θ_global comes from the lowest rank with a state and the
        error-feedback memories are summed and handed out again. A dict
        that is not one, a damaged state or one of another configuration
        (tensors, fragments, H, F, τ, α, optimizer, codec: the message
        names the field and both values) raise ValueError on every rank
        and change nothing. Restore the params (and the inner optimizer)
        of the same step yourself."""
        h = self._h()
        data, bad = None, None
        if sd is not None:
            if isinstance(sd, dict) and sd.get("format") == STATE_FORMAT and isinstance(sd.get("state"),
                                                                                          (bytes, bytearray)):
                data = bytes(sd["state"])
            else:
                # Still take part, with what no rank accepts, so that every
                # rank fails at once instead of waiting for this one.
                bad = "gradcomp.outer.DiLoCo.load_state_dict: not a state_dict of format %s" % STATE_FORMAT
                data = bad.encode()
        try:
            _lib.call("gc_outer_state_load", h, data, 0 if data is None else len(data))
        except _lib.LibraryError as e:
            if e.status == Status.CORRUPT:
                raise ValueError(bad or str(e)) from e
            raise

    def close(self):
        """Destroys the loop (an exchange in flight is abandoned), then the
        host and its transport. Idempotent."""
        h, self.handle = self.handle, 0
        if not h:
            return
        try:
            _lib.call("gc_outer_destroy", h)
        finally:
            self._host.close(self.timeout)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
