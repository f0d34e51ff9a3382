"""The FSDP2 hook's machinery under gradcomp.fsdp.FSDPState
(:class:`FSDPHook`): what torch's FSDP2 state says about a module (the
parameters it manages, its shards), and how each backward's reduce outputs
reach the engine and come back: a plain step (an all-reduce over the
replicate group, before the engine exists), then engine steps whose
buckets are the FSDP modules' reduce outputs in hook order. Errors reach
the caller of backward through an autograd callback. Reduce outputs in
host memory go to the host engine, those on a device (CUDA, or the
fake-device test mode: :mod:`gradcomp._device`) in place to the device
engine on its own NCCL communicator, whose Wait runs on a finisher
thread. gradcomp.fsdp's module documentation tells the whole story."""

import logging
import math

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor, Shard

from . import _device, _lib
from ._compressor import has_cuda
from ._engine import matrix_shape
from ._state import EngineState, Step

__all__ = ["FSDPHook"]

logger = logging.getLogger("gradcomp")

_REDUCE_DTYPES = (torch.float32, torch.bfloat16)

def _managed(module):
    """The parameters an FSDP module manages: those of its subtree outside
    nested FSDP modules."""
    out, seen, stack = [], set(), [module]
    while stack:
        m = stack.pop()
        for p in m.parameters(recurse=False):
            if id(p) not in seen:
                seen.add(id(p))
                out.append(p)
        stack.extend(c for c in reversed(list(m.children())) if not isinstance(c, FSDPModule))
    return out


def _shard_size(p):
    """The elements of ``p``'s padded shard in FSDP's reduce output (dim 0
    split in ceil(d0/S) rows), or None when not sharded on dim 0 of a
    1-D mesh."""
    if not isinstance(p, DTensor) or p.device_mesh.ndim != 1 or tuple(p.placements) != (Shard(0),):
        return None
    shape = tuple(p.shape) or (1,)
    return math.ceil(shape[0] / p.device_mesh.size()) * math.prod(shape[1:])


def _param_groups(module):
    """The FSDP param groups of ``module`` (torch's private state; [] where
    this torch does not have it)."""
    try:
        state = module._get_fsdp_state()
    except Exception:
        return []
    groups = getattr(state, "_fsdp_param_groups", None)
    if groups is None:
        group = getattr(state, "_fsdp_param_group", None)
        groups = [group] if group is not None else []
    return list(groups)


def _shard_shapes(module):
    """The matrices PowerSGD sees in ``module``'s reduce output: each
    trainable parameter's padded shard (its ceil(d0/S) rows of dim 0 and
    the rest, matrix_shape: a 1-D one as one row), in the order FSDP packs
    them (its param group's reduce-scatter order where this torch has it,
    else the group's parameter order). None where the module has not one
    param group, or this torch's does not say (torch's private state)."""
    groups = _param_groups(module)
    params = getattr(groups[0], "fsdp_params", None) if len(groups) == 1 else None
    if params is None:
        return None
    order = getattr(groups[0], "_reduce_scatter_param_indices", None) or range(len(params))
    shapes = []
    for i in order:
        size = getattr(params[i], "padded_sharded_param_size", None)
        param = getattr(params[i], "sharded_param", None)
        if size is None or param is None:
            return None
        if param.requires_grad:
            shapes.append(matrix_shape(size))
    return shapes


def _local(t):
    return t.to_local() if isinstance(t, DTensor) else t


def _same_storage(a, b):
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class _Step(Step):
    """One backward pass: its buckets so far and its first error."""

    def __init__(self, number, plain):
        super().__init__(number)
        self.plain = plain
        self.names = []  # the modules whose hook fired, in order
        self.sizes = []
        self.dtypes = []  # plain steps: the reduce dtypes
        self.pending = []  # engine steps: (reduce output, float32 buffer handed to the engine)
        self.stream = None  # device engine: the raw stream of the step's reduce outputs
        self.done = False  # the engine has every bucket: the step ends without the hooks


class FSDPHook(EngineState):
    """An EngineState that FSDP's reduce outputs reach through
    :meth:`_hook` (averaged over ``replicate_group``; the engine's
    collectives on ``engine_group``); ``options``: EngineState's."""

    def __init__(self, replicate_group, engine_group, **options):
        super().__init__(**options)
        self.replicate_group, self.engine_group = replicate_group, engine_group
        self._modules = None  # [(name, module, managed parameters)], from register
        self._names = None  # the engine's buckets: module names, in hook order
        self._sizes = None  # and their sizes
        self._checked = False  # the replicate group was checked against FSDP's shard groups
        self._place = None  # the model's device: (type, engine ordinal, as messages name it), from register

    def _shapes(self):
        """PowerSGD's bucket shapes (spec powersgd): each module's padded
        parameter shards as matrices (_shard_shapes), in hook order; None
        for other specs. ValueError when they do not add up to the
        module's reduce output (parameters FSDP did not reduce: unused
        ones need set_reduce_scatter_unused_params(True))."""
        if self.spec.split(":")[0] != "powersgd":
            return None
        mods = {name: m for name, m, _ in self._modules or ()}
        out = []
        for name, size in zip(self._names, self._sizes):
            shapes = _shard_shapes(mods[name]) if name in mods else None
            if shapes is None or sum(r * c for r, c in shapes) != size:
                raise ValueError("gradcomp.fsdp: spec %s: module %r's reduce output holds %d elements, but its "
                                 "trainable parameters' shards are %s: PowerSGD needs each as a matrix (unused "
                                 "parameters: set_reduce_scatter_unused_params(True))" % (self.spec, name, size, shapes))
            out.append(shapes)
        return out

    # ---- the hook

    def _attach(self, mods):
        """Takes the FSDP modules ``mods``, [(name, module)], whose parameters
        must lie on one device the engine takes (see :meth:`_place_of`)."""
        modules = [(name, m, _managed(m)) for name, m in mods]
        place = None
        for name, _, params in modules:
            for p in params:
                here = self._place_of(p, "gradcomp.fsdp.register: module %r holds parameters" % name)
                if place is not None and here[:2] != place[:2]:
                    raise ValueError("gradcomp.fsdp.register: module %r holds parameters on %s and on %s: one State "
                                     "serves one model on one device" % (name, place[2], here[2]))
                place = place or here
        eng = self._engine
        if place is not None and eng is not None and place[1] != eng.device:
            raise ValueError("gradcomp.fsdp.register: the model is on %s, but this State's engine runs on %s: one "
                             "State serves one model on one device" % (place[2], self._engine_place()))
        self._modules, self._place = modules, place

    @staticmethod
    def _place_of(t, what):
        """``t``'s device as (type, engine ordinal, name): host memory, a
        CUDA device (with libgradcomp_cuda.so), or in the fake-device test
        mode a CPU tensor's fake device; NotImplementedError (``what`` on
        it) for others."""
        if t.device.type not in ("cpu", "cuda"):
            raise NotImplementedError("%s on %s: CPU and CUDA only" % (what, t.device))
        if t.is_cuda and not has_cuda():
            raise NotImplementedError("%s on %s, which needs %s (device pointers and CUDA streams), but the loaded "
                                      "library is %s: build it with `make plugin` on a machine with "
                                      "nvidia-cuda-toolkit" % (what, t.device, _lib.CUDA_LIB_NAME, _lib.CPU_LIB_NAME))
        rank = dist.get_rank() if dist.is_initialized() else 0
        return t.device.type, _device.ordinal(t, rank), _device.describe(t, rank)

    def _engine_place(self):
        return "host memory" if self._engine.device < 0 else "device %d" % self._engine.device

    def _check_place(self, name, out):
        """``out`` must be on the model's device (and the engine's)."""
        here = self._place_of(out, "gradcomp.fsdp: module %r's reduce output is" % name)
        if self._place is not None and here[:2] != self._place[:2]:
            raise ValueError("gradcomp.fsdp: module %r's reduce output is on %s, but the model's parameters are on "
                             "%s: one State serves one model on one device" % (name, here[2], self._place[2]))
        if self._engine is not None and here[1] != self._engine.device:
            raise ValueError("gradcomp.fsdp: module %r's reduce output is on %s, but this State's engine runs on %s: "
                             "one State serves one model on one device" % (name, here[2], self._engine_place()))

    def _params_of(self, name):
        for n, _, params in self._modules or ():
            if n == name:
                return params
        return []

    def _begin(self):
        """A new step, and a callback that ends it after FSDP's own
        end-of-backward callback (queued at the root's pre-backward: ours,
        queued from a hook, comes after it). The device engine's step
        before it is waited for first (on a GPU it has long ended)."""
        self._settled()
        st = _Step(self.iter, self._engine is None and self._sizes is None)
        engine = torch.autograd.Variable._execution_engine
        try:
            engine.queue_callback(lambda: self._end(st))
        except RuntimeError as e:  # "Final callbacks can only be installed during backward pass"
            raise RuntimeError("gradcomp.fsdp: the hook runs inside FSDP's backward only (%s)" % e) from e
        self._cur = st
        return st

    def _hook(self, name, out):
        st = self._cur or self._begin()
        if st.error is not None:
            return  # raised at the end of backward
        try:
            if self._broken is not None:
                raise self._broken
            self._check_place(name, out)
            if not self._checked:
                self._check_groups(name)
            if st.plain:
                self._plain(st, name, out)
            else:
                self._bucket(st, name, out)
        except BaseException as e:
            st.fail(e)
            self._abort(st, e)

    def _check_groups(self, name):
        """Collective over the replicate group: every rank of it must sit at
        the same place of an FSDP shard group of the same size (else they
        would average different shards)."""
        params = [p for p in self._params_of(name) if isinstance(p, DTensor)]
        mine = (params[0].device_mesh.get_local_rank(), params[0].device_mesh.size()) if params else None
        world = dist.get_world_size(self.replicate_group)
        theirs = [None] * world
        dist.all_gather_object(theirs, mine, group=self.replicate_group)
        if len(set(theirs)) != 1:
            raise ValueError("gradcomp.fsdp: the replicate group's ranks sit at (place, size) %s of their FSDP shard "
                             "groups: a replicate group must join the ranks at one place of shard groups of one size "
                             "(init_mesh(...)['replicate'] with fully_shard(..., mesh=mesh['shard']))" % theirs)
        self._checked = True

    def _plain(self, st, name, out):
        """The plain step: out/R all-reduced over the replicate group; the
        State learns the bucket."""
        if name in st.names:
            raise ValueError("gradcomp.fsdp: step %d: the hook of module %r fired twice in one backward"
                             % (st.number, name))
        if out.dtype not in _REDUCE_DTYPES:
            raise NotImplementedError("gradcomp.fsdp: module %r reduces in %s; want float32 or bfloat16 (FSDP divides "
                                      "other dtypes after the hook)" % (name, out.dtype))
        st.names.append(name)
        st.sizes.append(out.numel())
        st.dtypes.append(out.dtype)
        world = dist.get_world_size(self.replicate_group)
        out.div_(world)
        dist.all_reduce(out, group=self.replicate_group)
        st.plain_sent += 2 * (world - 1) * 4 * out.numel() // world

    def _bucket(self, st, name, out):
        i = len(st.names)
        if i == 0:
            if self._engine is None:
                self._create(out)
            self._check_fresh(st)
            self._engine.step()
            st.started = True
        eng = self._engine
        if i >= eng.nbuckets or self._names[i] != name or self._sizes[i] != out.numel():
            raise ValueError("gradcomp.fsdp: step %d: hook %d is module %r with %d elements; the engine's buckets "
                             "are %s (from the first step or the checkpoint), in hook order: not the same model, or "
                             "its modules reduce in another order or other sizes (unused parameters: "
                             "set_reduce_scatter_unused_params(True))"
                             % (st.number, i, name, out.numel(), self.buckets))
        if i > 0:
            self._check_views(st, i - 1)
        last = i == eng.nbuckets - 1
        if out.dtype not in _REDUCE_DTYPES:
            raise NotImplementedError("gradcomp.fsdp: module %r reduces in %s; want float32 or bfloat16" % (name,
                                                                                                        out.dtype))
        if not last:
            self._check_dtype(name, out.dtype)
        if out.dtype == torch.float32 and out.is_contiguous() and (last or eng.device >= 0):
            staged = out  # in place: the host engine's last (waited for below, before FSDP reads it), or a device's
        else:
            staged = out.detach().to(torch.float32, copy=True).contiguous()  # on a GPU, on the hook's stream
        st.names.append(name)
        st.sizes.append(out.numel())
        if eng.device >= 0:
            st.stream = _device.stream(staged)
            eng.ready_device(i, staged, st.stream)
        else:
            eng.ready(i, staged)
        st.pending.append((out, staged))
        if last:
            self._finish(st)

    def _check_dtype(self, name, dtype):
        """A module but the last must reduce in its gradients' dtype."""
        for p in self._params_of(name):
            grad_dtype = getattr(p, "grad_dtype", None) or p.dtype  # torch 2.15 parameters have grad_dtype
            if p.requires_grad and grad_dtype != dtype:
                raise NotImplementedError(
                    "gradcomp.fsdp: module %r reduces in %s but its parameters' gradients are %s: FSDP would cast "
                    "its reduce output into new gradients before the engine's average exists (only the last module "
                    "may)" % (name, dtype, grad_dtype))

    def _check_fresh(self, st):
        """Before an engine step: no gradient may be there already (FSDP
        would accumulate the early modules' unaveraged outputs into it),
        and no post-accumulate-grad hook may read them."""
        for name, _, params in self._modules or ():
            for p in params:
                if p.grad is not None:
                    raise ValueError(
                        "gradcomp.fsdp: step %d: a parameter of module %r already holds a gradient: accumulating "
                        "into .grad across backward passes is not supported (zero with set_to_none=True; accumulate "
                        "microbatches with set_requires_gradient_sync(False))" % (st.number, name))
                if getattr(p, "_post_accumulate_grad_hooks", None):
                    raise NotImplementedError("gradcomp.fsdp: a parameter of module %r has a post-accumulate-grad "
                                              "hook: it would read the gradient before its average exists" % name)
        for name, m, _ in self._modules or ():
            if any(getattr(g, "force_sum_reduction_for_comms", False) for g in _param_groups(m)):
                raise NotImplementedError("gradcomp.fsdp: module %r has set_force_sum_reduction_for_comms(True): FSDP "
                                          "would divide its reduce output after the hook" % name)

    def _check_views(self, st, i):
        """Module i's gradients, as FSDP has just set them, must be views of
        its reduce output (where the average will be written)."""
        out = st.pending[i][0]
        for p in self._params_of(st.names[i]):
            if p.grad is not None and not _same_storage(_local(p.grad), out):
                raise NotImplementedError(
                    "gradcomp.fsdp: step %d: FSDP copied module %r's reduce output into its gradients (a cast, an "
                    "offload or accumulation): the engine's average could not reach them" % (st.number, st.names[i]))

    def _engine_group(self, own_nccl):
        return self.engine_group

    def _rank(self):
        return "%d of the replicate group" % dist.get_rank(self.engine_group)

    def _create(self, out):
        """Makes the engine (on ``out``'s device), then tells the ranks of
        this rank's FSDP shard group whether it could (:meth:`_agree`)."""
        if self._sizes is None:
            raise ValueError("gradcomp.fsdp: no buckets known (the first step learns them)")

        def load(eng):
            if self._pending is not None:
                eng.load_state(self._pending)

        try:
            eng = self._new_engine(self._sizes, self.buckets, load, shapes=self._shapes(),
                                   device=_device.ordinal(out, dist.get_rank()), **self._settings())
        except Exception as e:
            self._agree(e)
            raise
        self._agree(None)
        logger.info("gradcomp.fsdp: engine for %s (strategy %s, decision %s) across %d replicas, %d buckets %s, "
                    "warm-up until step %d", self.spec, self.strategy, self.decision, eng.world, len(self._sizes),
                    self.buckets, self.warmup_steps)

    def _shard_group(self):
        """The process group of this rank's FSDP shard group (None without
        sharded parameters)."""
        for _, _, params in self._modules or ():
            for p in params:
                if isinstance(p, DTensor) and p.device_mesh.ndim == 1:
                    return p.device_mesh.get_group()
        return None

    def _agree(self, failed):
        """Collective over this rank's FSDP shard group, once the engine's
        handshake on the replicate group is done (``failed``: its error,
        raised by the caller): where it failed on a rank of the shard group
        (another replicate group: a setting that differs there), this
        rank's engine is dropped and ConfigError raised, so that every rank
        of the job fails this step rather than wait in FSDP's collectives
        for ranks that stopped."""
        group = self._shard_group()
        if group is None:
            return
        mine = None if failed is None else "%s: %s" % (type(failed).__name__, failed)
        theirs = [None] * dist.get_world_size(group)
        dist.all_gather_object(theirs, mine, group=group)
        bad = ["rank %d of the shard group: %s" % (r, m) for r, m in enumerate(theirs) if m is not None]
        if failed is None and bad:
            e = _lib.ConfigError("gc_engine_create", _lib.Status.CONFIG, "gradcomp.fsdp: the engine could not be "
                                 "made on other replicate groups (%s); this rank's engine (rank %s) was made and is "
                                 "dropped: every rank's settings must be equal" % ("; ".join(bad), self._rank()))
            self._drop_engine(e)
            raise e

    def _finish(self, st):
        """At the last module's hook. Host engine: waits for it and writes
        every module's average into its reduce output. Device engine: the
        hook's stream waits for the engine's step (eng.done: FSDP's later
        work sees the averages; staged outputs get theirs on the stream
        after it), and the engine's Wait runs on the finisher; in the
        fake-device test mode this hook waits for it (nothing orders
        FSDP's CPU work after the fake device's streams)."""
        st.done = True
        eng = self._engine
        if eng.device < 0:
            self._settle(eng, st)
            return
        eng.done(st.stream)
        if not _lib.fake_device():
            self._copy_back(st)
        self._finish_later(self._settle, eng, st)
        if _lib.fake_device():
            self._settled()

    def _settle(self, eng, st):
        """Waits for ``eng``'s step of ``st`` (its error kept on ``st``, a
        CommError breaking the State), records it and, where it went well,
        copies the staged averages back."""
        err = self._wait(eng, st)
        self._record(eng, st.number)
        if err is None:
            self._copy_back(st)

    @staticmethod
    def _copy_back(st):
        """Writes the averages of staged (float32 copies) reduce outputs
        back into them (on a GPU, on the hook's stream)."""
        pending, st.pending = st.pending, []
        for out, staged in pending:
            if staged is not out:
                out.copy_(staged)

    def _abort(self, st, e):
        """A step that cannot go on after gc_engine_step: the engine is
        destroyed (error feedback keeping e + g) and the State broken."""
        if st.started and not st.done and self._engine is not None:
            self._drop_engine(e)

    def _end(self, st):
        """After FSDP's end of backward: closes the step, learns the buckets
        of a plain step, raises the step's error. Under
        on_nonfinite="raise" it waits for the device engine's step first,
        whose NonFiniteError must fail this backward; otherwise an error
        the finisher finds breaks the State and fails the next step."""
        if self.on_nonfinite == "raise":
            self._settled()
        self._cur = None
        self.iter += 1
        if st.error is None and st.plain:
            try:
                for name, dtype in list(zip(st.names, st.dtypes))[:-1]:
                    self._check_dtype(name, dtype)
            except NotImplementedError as e:
                st.fail(e)
        if st.error is None and st.plain:
            self._names, self._sizes = list(st.names), list(st.sizes)
            self._count_plain(len(st.sizes), st.plain_sent)
            logger.info("gradcomp.fsdp: %d buckets (module, elements) %s", len(st.sizes), self.buckets)
        if st.error is None and not st.plain and st.started and not st.done:
            e = ValueError("gradcomp.fsdp: step %d ended after %d of the engine's %d buckets %s: modules without "
                           "gradients in this step? (set_reduce_scatter_unused_params(True))"
                           % (st.number, len(st.names), len(self._sizes), self.buckets))
            st.fail(e)
            self._abort(st, e)
        if st.error is not None:
            raise st.error
