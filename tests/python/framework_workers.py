"""Rank functions for tests/python/test_frameworks.py (run through
ranks.run with init=False: each starts before the process group exists,
in torchrun's environment): gradcomp.torch.State made before
init_process_group, then DDP under plain torch, PyTorch Lightning and
Hugging Face Accelerate. The Lightning and Accelerate functions hold the
recipes of docs/PYTORCH.md line for line (the test compares them), and
import their framework when they run."""

import datetime
import hashlib
import logging
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as gct

import ranks
import workers

#: Training samples: 6 steps of 32 per rank on 2 ranks.
SAMPLES = 384


def _dataset():
    x, y, _, _ = workers.digits()
    return torch.utils.data.TensorDataset(x[:SAMPLES], y[:SAMPLES])


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


def lightning_fit(rank, world):
    """The Lightning recipe: a State made before the Trainer (which
    initializes the process group in fit), gradcomp.lightning.CommHook
    registering its hook, 6 steps of the two-bucket digits MLP on
    Lightning's "ddp" strategy over 2 CPU ranks. Returns its outcome."""
    import torch.nn.functional as F
    from pytorch_lightning import LightningModule, Trainer

    import gradcomp.torch
    from gradcomp.lightning import CommHook

    class Classifier(LightningModule):
        def __init__(self):
            super().__init__()
            self.net = workers.two_bucket_mlp(0)

        def training_step(self, batch, _):
            x, y = batch
            return F.cross_entropy(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.05)

    for name in ("pytorch_lightning", "lightning_fabric"):
        logging.getLogger(name).setLevel(logging.WARNING)  # not its start-up lines in the test's output
    model, loader = Classifier(), torch.utils.data.DataLoader(_dataset(), batch_size=32)
    state = gradcomp.torch.State("int8", warmup_steps=4, decision="compressed", workers=1)
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_steps=6, callbacks=[CommHook(state)],
                      logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(model, loader)
    return outcome(state, model)


def accelerate_train(rank, world):
    """The Accelerate recipe: Accelerator(cpu=True) over 2 CPU ranks (it
    initializes the process group from torchrun's environment), the hook
    registered on the DDP model prepare() returns, one epoch of 6 steps of
    the two-bucket digits MLP. Returns its outcome."""
    import torch.nn.functional as F
    from accelerate import Accelerator

    import gradcomp.torch

    model = workers.two_bucket_mlp(0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loader = torch.utils.data.DataLoader(_dataset(), batch_size=32)
    accelerator = Accelerator(cpu=True)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    state = gradcomp.torch.State("int8", warmup_steps=4, decision="compressed", workers=1)
    model.register_comm_hook(state, gradcomp.torch.hook)
    for x, y in loader:
        optimizer.zero_grad()
        accelerator.backward(F.cross_entropy(model(x), y))
        optimizer.step()
    return outcome(state, model)
