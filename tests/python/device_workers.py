"""Rank functions of test_device_branch: the DDP hook's device branch in
the fake-device test mode (run through ranks.run).

Each rank process picks its library before gradcomp loads one: with
``fake`` the fake-device build (GRADCOMP_FAKE_DEVICE=1) over the mock
libnccl.so.2 at ``mock``, else the CPU library. The same training then
runs through the host engine (hosted transport, gloo) or through the
device engine on its own (mock) NCCL communicator.
"""

import os
import threading

import torch
import torch.distributed as dist

from gradcomp import _lib

import workers

#: torch.distributed's collectives, patched to count the calls made after
#: the State's engine exists.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "broadcast",
               "all_to_all_single", "reduce_scatter_tensor", "barrier", "gather", "scatter")


def use_library(fake, mock):
    """Selects this process's library (before anything loads it)."""
    if fake:
        os.environ[_lib.ENV_FAKE_DEVICE] = "1"
        os.environ["GRADCOMP_NCCL"] = mock
    else:
        os.environ.pop(_lib.ENV_FAKE_DEVICE, None)


class Counter:
    """Counts torch.distributed collectives once ``armed``, and which
    threads called Engine.wait, from the moment it is made."""

    def __init__(self):
        self.armed = False
        self.calls = {}
        self.wait_threads = set()
        self.hook_threads = set()
        for name in COLLECTIVES:
            orig = getattr(dist, name)
            setattr(dist, name, self._wrap(name, orig))

    def _wrap(self, name, orig):
        def counted(*args, **kw):
            if self.armed:
                self.calls[name] = self.calls.get(name, 0) + 1
            return orig(*args, **kw)
        return counted

    def watch(self, state, hook):
        """Wraps ``hook`` to note its thread, the State's engine creation
        to arm the count once it returns (the bootstrap done), and
        Engine.wait to note its threads."""
        from gradcomp import _engine

        new_engine = state._new_engine

        def armed_after(*a, **kw):
            eng = new_engine(*a, **kw)
            self.armed = True
            return eng

        state._new_engine = armed_after

        orig_wait = _engine.Engine.wait

        def wait(eng, *a, **kw):
            self.wait_threads.add(threading.get_ident())
            return orig_wait(eng, *a, **kw)

        _engine.Engine.wait = wait

        def watched(st, bucket):
            self.hook_threads.add(threading.get_ident())
            return hook(st, bucket)
        return watched


def ddp_train(rank, world, fake, mock, spec, steps, state_kw, env=None):
    """Trains the two-bucket MLP ``steps`` steps under DDP with gradcomp's
    hook (State(spec, **state_kw); ``env``: variables set first); returns
    the parameters (hex), the State's counters, the last step's
    strategies, whether the engine has a Python host, the torch
    collectives called once the engine existed, and whether an
    Engine.wait ran on the hook's thread."""
    use_library(fake, mock)
    os.environ.update(env or {})
    import gradcomp.torch as gct

    counter = Counter()
    x, y, _, _ = workers.digits()
    data = list(workers.batches(rank, world, x, y, 0, 0))[:steps]
    module = workers.two_bucket_mlp(0)
    ddp = torch.nn.parallel.DistributedDataParallel(module)
    state = gct.State(spec, **state_kw)
    ddp.register_comm_hook(state, counter.watch(state, gct.hook))
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for xb, yb in data:
        workers.train_step(ddp, opt, xb, yb)
    stats = state.stats
    out = {
        "params": [p.detach().numpy().tobytes().hex() for p in ddp.parameters()],
        "stats": {k: stats[k] for k in ("compressed", "dense", "native", "plain_steps", "engine_steps")},
        "strategies": [b.strategy for b in state.last_step.buckets],
        "python_host": state.engine.host is not None,
        "device": state.engine.device,
        "collectives": counter.calls,
        "wait_on_hook_thread": bool(counter.wait_threads & counter.hook_threads),
        "library": os.path.basename(_lib.path()),
    }
    counter.armed = False
    state.close()
    return out


def in_mode(rank, world, fake, mock, name, *args):
    """workers.<name>(rank, world, *args) with this process's library
    chosen first (``fake``: the fake-device build)."""
    use_library(fake, mock)
    return getattr(workers, name)(rank, world, *args)


def no_unique_id(rank, world, fake, mock, timeout):
    """Rank 0 never makes an engine; the others make one on their own NCCL
    communicator with a ``timeout``-second timeout: they must fail within
    it, saying rank 0's unique id never came. Returns each one's error
    type, message and seconds."""
    use_library(fake, mock)
    import time

    from gradcomp import _engine

    if rank == 0:
        return None
    t0 = time.monotonic()
    try:
        _engine.Engine("int8", [100], device=rank, timeout=timeout).close()
        return {"type": None}
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e), "seconds": time.monotonic() - t0}


def bucket_moves(rank, world, fake, mock):
    """Three steps of DDP through the device branch, then the buckets
    "move" to another device (the fake mode's device is LOCAL_RANK): the
    hook must refuse them by name. Returns the error's type and message."""
    use_library(fake, mock)
    x, y, _, _ = workers.digits()
    data = list(workers.batches(rank, world, x, y, 0, 0))
    ddp, state = workers.make_ddp(workers.mlp(0), "int8", warmup_steps=2, decision="compressed")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for xb, yb in data[:3]:
        workers.train_step(ddp, opt, xb, yb)
    os.environ["LOCAL_RANK"] = str(rank + 2)
    try:
        workers.train_step(ddp, opt, *data[3])
        return {"type": None}
    except Exception as e:
        return {"type": type(e).__name__, "message": str(e)}
