"""Rank functions for tests/python/test_frameworks.py (run through
ranks.run with init=False: each starts before the process group exists,
in torchrun's environment): gradcomp.torch.State made before
init_process_group, then DDP."""

import datetime
import hashlib
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as gct

import ranks
import workers


def outcome(state, module):
    """What the tests assert on: the State's counters, its last step's
    strategy and compression per bucket, its reason for bucket 0, its
    topology, and a digest of ``module``'s parameters (the same on every
    rank when every rank got the same averages)."""
    last = state.last_step
    h = hashlib.sha256()
    for p in module.parameters():
        h.update(p.detach().contiguous().numpy().tobytes())
    return {"stats": state.stats, "strategies": [b.strategy for b in last.buckets],
            "compressed": [bool(b.compressed) for b in last.buckets], "reason": last.buckets[0].reason,
            "topology": list(state.topology) if state.topology else None, "digest": h.hexdigest()}


def _train(state, data):
    """DDP over the digits MLP with ``state``'s hook, trained on ``data``
    (batches); returns its outcome."""
    ddp = DDP(workers.mlp(0))
    ddp.register_comm_hook(state, gct.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for xb, yb in data:
        workers.train_step(ddp, opt, xb, yb)
    return outcome(state, ddp.module)


def state_before_init(rank, world, k, steps):
    """States("int8") made before torch.distributed is initialized, on
    nodes of k ranks (GRADCOMP_RANKS_PER_NODE): one of strategy "hier",
    one of "auto" and a "hier" one to resume. Then the process group;
    `steps` steps of DDP with the first two States' hooks in turn; the
    third loads the "hier" State's state_dict and trains 2 more steps.
    Returns {"hier", "auto", "resumed": outcome, with "made_with": the
    topology right after the State was made, and for "resumed"
    "loaded_with": right after its load_state_dict}."""
    os.environ[gct.ENV_RANKS_PER_NODE] = str(k)
    kw = dict(warmup_steps=2, decision="compressed", workers=1)
    states = {s: gct.State("int8", strategy=s, **kw) for s in ("hier", "auto")}
    states["resumed"] = gct.State("int8", strategy="hier", **kw)
    made_with = {s: state.topology for s, state in states.items()}
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=ranks.COLLECTIVE_TIMEOUT))
    x, y, _, _ = workers.digits()
    data = list(workers.batches(rank, world, x, y, 0, 0))
    out = {s: _train(states[s], data[:steps]) for s in ("hier", "auto")}
    resumed = states["resumed"]
    resumed.load_state_dict(states["hier"].state_dict())
    loaded_with = list(resumed.topology) if resumed.topology else None
    out["resumed"] = dict(_train(resumed, data[steps:steps + 2]), loaded_with=loaded_with)
    for s, state in states.items():
        out[s]["made_with"] = made_with[s]
        state.close()
    return out
