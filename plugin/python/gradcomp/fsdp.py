"""FSDP2 (torch 2.x ``fully_shard``) with gradcomp's engine across replicas:
HSDP whose cross-replica exchange is compressed with error feedback.

Usage::

    from torch.distributed.fsdp import fully_shard
    from gradcomp.fsdp import FSDPState, init_mesh, register

    mesh = init_mesh(replicas=2, shards=4)           # 8 ranks: rank r is replica r // 4, shard r % 4
    for layer in model.layers:
        fully_shard(layer, mesh=mesh["shard"])       # FSDP inside a shard group (a node) only
    fully_shard(model, mesh=mesh["shard"])
    state = register(model, FSDPState("int8", replicate_group=mesh["replicate"], warmup_steps=10))
    ...
    print(state.summary())
    torch.save({"gradcomp": state.state_dict(), ...}, path)

What it does: the model is sharded with FSDP2 inside each shard group only,
so FSDP's reduce-scatter leaves on every rank its shard of the gradient
averaged over its shard group. :func:`register` sets
:meth:`FSDPModule.set_all_reduce_hook` on every FSDP module of the model;
the hook averages that shard across the replicate group (the ranks holding
the same shard: the same place in their shard groups) through gradcomp's
engine: HSDP's semantics, with the cross-replica traffic compressed with
error feedback, exchanged by the engine's strategy and cost model.

When torch calls the hook (torch 2.15's
``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``,
``foreach_reduce``, called by ``FSDPParamGroup.post_backward``): once per
FSDP module (param group) that has gradients to reduce, per backward,
right after the module's reduce-scatter; on the CPU on the thread that runs
backward (on CUDA inside FSDP's all-reduce stream, or the ``stream`` given
to set_all_reduce_hook). Modules whose post-backward did not run during
backward (those whose inputs need no gradient: in the tests' MLP the root
and the first layer) reduce in FSDP's end-of-backward callback, so their
hooks fire there, last. No hook fires in a backward under
``set_requires_gradient_sync(False)``. The hook gets the reduce output
already averaged over the shard group for float32 and bfloat16 reduce
dtypes (FSDP reduce-scatters with ReduceOp.AVG; for other dtypes it divides
after the hook), and torch uses the tensor as soon as the hook returns: it
views it as the parameters' sharded gradients (``.grad``, no copy when the
gradient dtype is the reduce dtype), or casts it, and adds it to an
existing ``.grad``. With native HSDP (a 2-D mesh) torch's own all-reduce
has run before the hook, which therefore cannot replace it:
:func:`register` refuses such modules.

How the hook meets that: every FSDP module's reduce output is one engine
bucket, in the order the hooks fire (deterministic, the same on every
rank). The first backward of a State (``PLAIN_STEPS``) is exchanged with a
plain ``dist.all_reduce`` of output/replicas over the replicate group; it
learns the buckets' sizes and modules. At the first hook of the next
backward the State creates the engine for them (its handshake compares
spec, strategy, decision, error feedback, on_nonfinite, warm-up, momentum,
schedule, guard and the bucket sizes: a rank that differs gets ValueError
on every rank). From then on, per backward: gc_engine_step at the first
hook, each module's reduce output handed to the engine as its hook fires
(on the CPU a float32 copy: FSDP keeps using the tensor), and at the last module's
hook the State waits for the engine and writes every module's average back
into its reduce output in place, where FSDP's sharded gradients look: the
earlier modules' ``.grad`` are views of it, the last module's FSDP reads
after the hook returns. So the engine compresses and exchanges the early
modules' shards while backward computes the later ones, and when backward
returns every ``.grad`` holds the average over all ranks.

CUDA (the device branch; tested without a GPU in the fake-device test
mode, :mod:`gradcomp._device`, tests/python/test_fsdp_device.py): the
engine is the device engine on its own NCCL communicator over the
replicate group's ranks (bootstrapped through torch.distributed's store:
no hosted transport, no Python thread, no torch collective on the
replicate group after it). The hook runs on FSDP's all-reduce stream
(the current stream); each module's reduce output goes to the engine in
place (``ready_device`` on that stream; a bfloat16 one as a float32 copy
made on the stream), and the last module's hook makes the stream wait for
the engine's step (``done``) and copies staged averages back on it: FSDP's
later work is ordered after the averages on the GPU, and the hooks never
wait on the host. The engine's Wait (statistics, errors) runs on a
finisher thread, waited for at the next backward's first hook (or by
whatever reads the State: stats, summary, state_dict, close). An error it
finds breaks the State (CommError) and fails the next backward; under
``on_nonfinite="raise"`` the end-of-backward callback waits for it (a host
wait, only then) so that the NonFiniteError fails this backward. In the
fake-device test mode nothing orders torch's CPU work after the fake
device's streams, so there (only) the last hook waits for the finisher
before FSDP reads the outputs.

Once the engine's handshake on the replicate group is done, each rank
tells its FSDP shard group whether it succeeded (one all_gather_object,
once per engine): a setting that differs in one replicate group fails its
ranks with the handshake's ConfigError, and every other rank with a
ConfigError naming them, in the same backward, rather than leaving them
to wait in FSDP's next all-gather for ranks that stopped.

PowerSGD (spec "powersgd:R"): a module's reduce output is each trainable
parameter's padded shard in turn (FSDP2 shards on dim 0), each a matrix of
its own, ceil(d0/S) rows by the rest (a bias one row): the State gives
the engine those shapes, from FSDP's param group (_shard_shapes), and the
engine exchanges each bucket low-rank across the replicas.

Limits, each refused with ValueError or NotImplementedError naming it:

* CPU tensors (gloo, or any backend that takes CPU tensors: the host
  engine) or CUDA tensors (NCCL, with libgradcomp_cuda.so: the device
  engine, below), every parameter of the model on one device (the
  State's engine's; another is refused naming both).
* No gradient accumulation into an existing ``.grad`` across backward
  passes: a module's gradients are final only at the last module's hook,
  after FSDP has assigned the earlier ones. Zero the gradients with
  ``set_to_none=True`` (``optimizer.zero_grad()``'s default) and accumulate
  microbatches with ``model.set_requires_gradient_sync(False)`` (FSDP keeps
  the unsharded gradients and neither reduce-scatters nor calls the hook
  until the last microbatch).
* The reduce dtype must be float32 or bfloat16 (FSDP divides others after
  the hook), and for every module but the last the parameters' gradient
  dtype (FSDP's gradients must be views of its reduce output). In torch
  2.15 ``MixedPrecisionPolicy(param_dtype=torch.bfloat16)`` with float32
  parameters reduces in float32 and passes; a bfloat16 ``reduce_dtype``
  with float32 parameters (earlier torch's default under that policy) is
  refused.
  ``set_force_sum_reduction_for_comms(True)`` (FSDP divides after the
  hook) and post-accumulate-grad hooks (optimizer in backward: they would
  read the gradient before its average exists) are refused.
* Every backward must reduce the same modules with the same sizes: a model
  with parameters unused in some steps needs
  ``set_reduce_scatter_unused_params(True)``.

``set_gradient_divide_factor`` acts inside the shard group only; the hook
always averages over the replicate group.

Errors reach the caller of ``loss.backward()`` with their own type, raised
from an autograd callback that runs after FSDP has finished its backward
(the hooks themselves never raise into FSDP): ValueError when the ranks'
configurations differ or the modules do not match the engine's buckets,
FloatingPointError (gradcomp.NonFiniteError) under
``on_nonfinite="raise"`` (the State stays usable: skip the optimizer step;
the gradients then hold unaveraged values), gradcomp.CommError when a
collective failed or timed out (the State is broken).

Checkpoints: :meth:`FSDPState.state_dict` holds the engine's state
(error-feedback memories, momentum, step, spec, strategy, bucket sizes),
the step count and the buckets' module names; :meth:`FSDPState.load_state_dict`
refuses, with ValueError and changing nothing, a state of another spec,
strategy or error-feedback setting or of another model (other module
names, or bucket sizes that differ from the shard sizes of this model's
modules or from the buckets this State has seen). A State loaded before its
engine exists creates it at its next backward, with the checkpoint's
buckets, without a plain step; with the decision pinned the steps after a
resume are bit for bit those of the uninterrupted run
(tests/python/test_fsdp.py).
"""

import functools
import logging

import torch
import torch.distributed as dist

try:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor
except Exception as e:  # torch 1.x: no FSDP2 (1.13's fsdp package even fails on Python 3.11 with a ValueError)
    raise ImportError("gradcomp.fsdp needs torch 2.x with FSDP2 (torch.distributed.fsdp.fully_shard); this torch is "
                      "%s: %s: %s" % (torch.__version__, type(e).__name__, e)) from e
if not hasattr(FSDPModule, "set_all_reduce_hook"):
    raise ImportError("gradcomp.fsdp needs FSDPModule.set_all_reduce_hook, which this torch (%s) lacks"
                      % torch.__version__)

from ._engine import Engine
from ._fsdp_hook import FSDPHook, _managed, _shard_size
from ._state import ms

__all__ = ["FSDPState", "init_mesh", "register"]

logger = logging.getLogger("gradcomp")

#: Backward passes exchanged with a plain all-reduce before the engine
#: exists (the State learns the buckets in it).
PLAIN_STEPS = 1


def init_mesh(replicas, shards, device_type="cpu"):
    """A 2-D DeviceMesh of ``replicas`` × ``shards`` ranks named
    ("replicate", "shard") over every rank of the job (collective):
    rank r is replica r // shards, shard r % shards. Shard the model with
    ``fully_shard(module, mesh=mesh["shard"])`` (consecutive ranks: a node
    under torchrun when ``shards`` is LOCAL_WORLD_SIZE) and give
    ``mesh["replicate"]`` to :class:`FSDPState`."""
    from torch.distributed.device_mesh import init_device_mesh

    world = dist.get_world_size()
    if not (isinstance(replicas, int) and isinstance(shards, int) and replicas >= 1 and shards >= 1
            and replicas * shards == world):
        raise ValueError("gradcomp.fsdp.init_mesh: %r replicas × %r shards is not the job's %d ranks"
                         % (replicas, shards, world))
    return init_device_mesh(device_type, (replicas, shards), mesh_dim_names=("replicate", "shard"))


def register(model, state):
    """Registers ``state``'s hook on every FSDP module of ``model`` (an
    nn.Module whose FSDP modules are found by ``named_modules``, named by
    their qualified names; or a list of FSDP modules, named by their
    positions) with ``set_all_reduce_hook``; returns ``state``. ValueError
    for a module sharded on a 2-D mesh (native HSDP: torch all-reduces
    across replicas itself, before the hook) or when there is no FSDP
    module, or for parameters on two devices or on another device than
    the State's engine (naming both); NotImplementedError for parameters
    neither on the CPU nor on a CUDA device (or on CUDA without
    libgradcomp_cuda.so)."""
    if isinstance(model, torch.nn.Module):
        mods = [(name, m) for name, m in model.named_modules() if isinstance(m, FSDPModule)]
    else:
        mods = [(str(i), m) for i, m in enumerate(model)]
        for name, m in mods:
            if not isinstance(m, FSDPModule):
                raise TypeError("gradcomp.fsdp.register: item %s is a %s, not an FSDP module (fully_shard it)"
                                % (name, type(m).__name__))
    if not mods:
        raise ValueError("gradcomp.fsdp.register: no FSDP module (fully_shard(module, mesh=mesh['shard']) first)")
    for name, m in mods:
        for p in _managed(m):
            if isinstance(p, DTensor) and p.device_mesh.ndim != 1:
                raise ValueError("gradcomp.fsdp.register: module %r is sharded on a %d-D mesh (native HSDP): torch "
                                 "all-reduces across replicas itself and calls the hook after; shard with "
                                 "fully_shard(module, mesh=mesh['shard']) and give mesh['replicate'] to the State"
                                 % (name, p.device_mesh.ndim))
    state._attach(mods)
    for name, m in mods:
        m.set_all_reduce_hook(functools.partial(state._hook, name))
    return state


class FSDPState(FSDPHook):
    """gradcomp's engine across the replicas of an FSDP2 model sharded
    within shard groups (see the module documentation).

    ``spec``: a compressor spec ("int8", "topk:0.01", "none", ...).
    ``replicate_group``: the process group of the ranks that hold the same
    shard (a ProcessGroup, or a 1-D DeviceMesh such as
    ``init_mesh(...)["replicate"]``). ``strategy``: one of the library's
    strategies but "hier" (:meth:`strategies`: "auto", "dense", "sra",
    ...). ``decision``:
    "auto" (the cost model, verified online), "compressed" or "dense"
    (pinned: reproducible). ``warmup_steps`` (≥ 1): backward passes
    exchanged dense (the first, plain, included). ``error_feedback``,
    ``on_nonfinite`` ("dense" or "raise"), ``timeout`` (seconds per
    collective), ``workers`` (compressor threads, 0: all CPUs),
    ``momentum``, ``momentum_masking``, ``schedule`` and ``guard`` are
    gradcomp.torch.State's. ``engine_group``: the process group the
    engine's collectives run on (None: ``replicate_group``; nothing else
    may run collectives on it during backward).
    """

    NAME, WHO, TAG, PEERS = "gradcomp.fsdp.FSDPState", "gradcomp.fsdp", "gradcomp.fsdp", "replicas"
    PLAIN_STEPS = PLAIN_STEPS
    EXCLUDED_STRATEGIES = ("hier",)
    STRATEGY_NOTE = " (the shard groups are FSDP's: no 'hier')"
    FORMATS = ("gradcomp.fsdp.FSDPState/1",)
    WARMUP_WHY = "the first backward learns the buckets"
    LOG_STEP = STEP_ERROR = "gradcomp.fsdp: step"
    SAVED_BEFORE = "in the plain step"

    def __init__(self, spec, replicate_group, strategy="auto", decision="auto", warmup_steps=10,
                 error_feedback=True, on_nonfinite="dense", timeout=60.0, workers=0, momentum=0.0, schedule=None,
                 guard=0.0, momentum_masking=False, engine_group=None):
        group = self._group(replicate_group, "replicate_group")
        super().__init__(group, group if engine_group is None else self._group(engine_group, "engine_group"),
                         spec=spec, strategy=strategy, decision=decision, warmup_steps=warmup_steps,
                         error_feedback=error_feedback, on_nonfinite=on_nonfinite, timeout=timeout, workers=workers,
                         momentum=momentum, schedule=schedule, guard=guard, momentum_masking=momentum_masking)

    @staticmethod
    def _group(g, what):
        if g is None:
            raise ValueError("gradcomp.fsdp.FSDPState: %s is required (e.g. init_mesh(...)['replicate'])" % what)
        if hasattr(g, "get_group") and hasattr(g, "ndim"):  # a DeviceMesh
            if g.ndim != 1:
                raise ValueError("gradcomp.fsdp.FSDPState: %s is a %d-D DeviceMesh; want its 'replicate' dimension "
                                 "(mesh['replicate'])" % (what, g.ndim))
            return g.get_group()
        return g

    # ---- what a user reads

    @property
    def buckets(self):
        """The engine's buckets as (module name, elements) pairs in hook
        order (None before they are known)."""
        return None if self._sizes is None else list(zip(self._names, self._sizes))

    def _summary_rows(self, s):
        rows = [("bucket", "module", "elements", "strategy", "sent", "by", "bytes", "compress", "exchange", "reason")]
        for b in s.buckets:
            rows.append((str(b.bucket), self._names[b.bucket] or "(root)", str(b.elements), b.strategy,
                         "compressed" if b.compressed else "dense", b.origin, str(b.bytes_sent), ms(b.compress_seconds),
                         ms(b.exchange_seconds), b.reason))
        return rows

    # ---- checkpoints

    def state_dict(self):
        """The engine's state bytes (None before the engine exists, unless
        a loaded one waits), the step count, and the buckets: module names
        and sizes in hook order."""
        data = self._engine.save_state() if self._engine is not None else self._pending
        return self._checkpoint(data, self._sizes, modules=None if self._names is None else list(self._names))

    def load_state_dict(self, sd):
        """Restores a :meth:`state_dict`, checked whole before anything
        changes (ValueError naming what differs: format, spec, strategy,
        error feedback, the modules, their sizes, the engine's settings)."""
        where = "gradcomp.fsdp.FSDPState.load_state_dict"
        ck = self._read_checkpoint(sd, where)
        if "modules" not in sd:
            raise ValueError("%s: the state dict lacks 'modules'" % where)
        names, layout = sd["modules"], sd["layout"]
        if (names is None) != (layout is None):
            raise ValueError("%s: modules and layout must both be given or both be None" % where)
        if layout is not None:
            if not (isinstance(names, list) and len(names) == len(layout) and all(isinstance(n, str) for n in names)
                    and len(set(names)) == len(names)):
                raise ValueError("%s: modules %r are not %d distinct module names" % (where, names, len(layout)))
            self._check_model(names, layout, where)
        elif ck.engine is not None:
            raise ValueError("%s: an engine state without its modules" % where)

        def keep():
            if ck.engine is not None and dist.is_initialized():
                Engine.check_state(ck.engine, layout, dist.get_world_size(self.engine_group), spec=self.spec,
                                   **self._settings())
            self._pending = ck.engine
            if layout is not None:
                self._names, self._sizes = list(names), list(layout)

        self._restore(where, ck, keep)

    def _check_model(self, names, layout, where):
        """ValueError when a checkpoint's buckets are not this model's."""
        if self._sizes is not None and (self._names != names or self._sizes != layout):
            raise ValueError("%s: the state is for the buckets %s; this State's are %s: not the same model"
                             % (where, list(zip(names, layout)), self.buckets))
        if self._modules is None:
            return
        mine = {name: params for name, _, params in self._modules if any(p.requires_grad for p in params)}
        if sorted(names) != sorted(mine):
            raise ValueError("%s: the state is for the FSDP modules %s; this model's (with trainable parameters) are "
                             "%s: not the same model"
                             % (where, names, sorted(mine)))
        for name, n in zip(names, layout):
            sizes = [_shard_size(p) for p in mine[name] if p.requires_grad]
            if None not in sizes and sum(sizes) != n:
                raise ValueError("%s: the state's bucket for module %r holds %d elements; this model's shard of it "
                                 "holds %d: not the same model (or not the same sharding)"
                                 % (where, name, n, sum(sizes)))

    def _which(self, buckets):
        return "module(s) %s" % [self._names[i] for i in buckets]

    def _log_decision(self, s, b, prev):
        logger.info("gradcomp.fsdp: module %r (%d elements): %s, %s; predicted dense %s, compressed %s; %s",
                    self._names[b.bucket], b.elements, b.strategy,
                    "compressed" if b.decided_compressed else "dense", ms(b.predicted_dense_seconds),
                    ms(b.predicted_compressed_seconds), b.reason)
