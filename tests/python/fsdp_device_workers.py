"""Rank functions of test_fsdp_device: gradcomp.fsdp's device branch in the
fake-device test mode (run through ranks.run on 4 ranks as 2 replicas × 2
shards, test_fsdp's MLP and batches).

Each rank process picks its library before gradcomp loads one
(device_workers.use_library): with ``fake`` the fake-device build, whose
hook hands the reduce outputs (CPU tensors) in place to the device engine
on its own (mock) NCCL communicator, else the CPU library and the host
engine over the hosted transport (gloo).
"""

import inspect
import os

import torch
import torch.distributed as dist

import device_workers
import test_fsdp
from test_fsdp import REPLICAS, SHARDS


class GroupCounter(device_workers.Counter):
    """device_workers.Counter, counting only the collectives on the
    replicate group or the default group ("calls"); those on other groups
    (FSDP's shard group) go to "elsewhere"."""

    def __init__(self):
        self.replicate = None
        self.elsewhere = {}
        super().__init__()

    def _wrap(self, name, orig):
        sig = inspect.signature(orig)

        def counted(*args, **kw):
            if self.armed:
                group = sig.bind_partial(*args, **kw).arguments.get("group")
                calls = self.calls if group is None or group is self.replicate else self.elsewhere
                calls[name] = calls.get(name, 0) + 1
            return orig(*args, **kw)
        return counted

    def watch_fsdp(self, state):
        """Starts a count for ``state`` (before register): armed once its
        engine exists (the bootstrap done), hook and Engine.wait threads."""
        self.armed, self.calls, self.elsewhere = False, {}, {}
        self.wait_threads, self.hook_threads = set(), set()
        self.replicate = state.replicate_group
        state._hook = self.watch(state, state._hook)


def _hex(model):
    return [t.numpy().tobytes().hex() for t in test_fsdp._locals(model)]


def _trained(counter, mesh, rank, spec, steps, hidden, state_kw):
    import gradcomp.fsdp as gf
    from gradcomp import _lib

    model = test_fsdp._sharded(mesh["shard"], hidden=hidden)
    state = gf.FSDPState(spec, mesh["replicate"], **state_kw)
    counter.watch_fsdp(state)
    gf.register(model, state)
    losses = test_fsdp._train(model, torch.optim.SGD(model.parameters(), lr=0.5), rank, steps)
    stats = state.stats
    out = {
        "params": _hex(model),
        "losses": losses,
        "stats": {k: stats[k] for k in ("compressed", "dense", "plain_steps", "engine_steps")},
        "strategies": [b.strategy for b in state.last_step.buckets],
        "python_host": state.engine.host is not None,
        "device": state.engine.device,
        "collectives": dict(counter.calls),
        "elsewhere": dict(counter.elsewhere),
        "wait_on_hook_thread": bool(counter.wait_threads & counter.hook_threads),
        "library": os.path.basename(_lib.path()),
    }
    counter.armed = False
    return model, state, out


def _mismatch(counter, mesh, rank, steps):
    """Rank SHARDS (replica 1, shard 0) has spec int4, the others int8: one
    replicate group differs. Every rank's error, or None if it trained."""
    import gradcomp.fsdp as gf

    model = test_fsdp._sharded(mesh["shard"])
    spec = "int4" if rank == SHARDS else "int8"
    state = gf.register(model, gf.FSDPState(spec, mesh["replicate"], decision="compressed", warmup_steps=2,
                                            workers=1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    try:
        for step in range(steps):
            test_fsdp._train(model, opt, rank, 1, first=step)
    except Exception as e:
        return {"step": step, "type": type(e).__name__, "is_value_error": isinstance(e, ValueError),
                "message": str(e)}
    finally:
        state.close()
    return None


def _other_device(mesh, rank, model, state):
    """Fake mode: the State's fake device is the local rank; a model, and a
    reduce output, on another fake device (LOCAL_RANK changed) are refused
    naming both devices."""
    import gradcomp.fsdp as gf

    out = {}
    os.environ["LOCAL_RANK"] = str(rank + REPLICAS * SHARDS)
    try:
        try:
            gf.register(test_fsdp._sharded(mesh["shard"]), state)
            out["register"] = None
        except ValueError as e:
            out["register"] = str(e)
        try:
            test_fsdp._train(model, torch.optim.SGD(model.parameters(), lr=0.1), rank, 1, first=50)
            out["hook"] = None
        except ValueError as e:
            out["hook"] = str(e)
    finally:
        del os.environ["LOCAL_RANK"]
    return out


def fsdp_device(rank, world, fake, mock, cases, mismatch_steps):
    """Trains each of ``cases``, [(spec, steps, hidden, FSDPState keywords)],
    from the same initialization and batches (a model and State each),
    then the replicate-group mismatch; in fake mode also the refusal of
    another device. Returns {"cases": [per case: parameters (hex), losses,
    counters, strategies, the engine's host and device, the collectives
    after the bootstrap, ...], "mismatch": ..., "other_device": ...}."""
    device_workers.use_library(fake, mock)
    import gradcomp.fsdp as gf

    counter = GroupCounter()
    mesh = gf.init_mesh(REPLICAS, SHARDS)
    res = {"cases": []}
    for spec, steps, hidden, state_kw in cases:
        model, state, out = _trained(counter, mesh, rank, spec, steps, hidden, state_kw)
        res["cases"].append(out)
        if fake and "other_device" not in res:
            res["other_device"] = _other_device(mesh, rank, model, state)
        state.close()
    res["mismatch"] = _mismatch(counter, mesh, rank, mismatch_steps)
    dist.barrier()
    return res
