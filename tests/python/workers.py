"""Rank functions for the multi-process tests (run through ranks.run).

Each takes (rank, world, ...) inside an initialized gloo process group and
returns a JSON-serializable value.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as gct

BATCH = 32


def digits():
    """sklearn's digits, standardized, split 80/20 (fixed seed): float32
    tensors (x_train, y_train, x_test, y_test)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(x_train)
    as_x = lambda a: torch.tensor(scaler.transform(a), dtype=torch.float32)
    as_y = lambda a: torch.tensor(a, dtype=torch.int64)
    return as_x(x_train), as_y(y_train), as_x(x_test), as_y(y_test)


def mlp(seed, hidden=128):
    """The digits MLP (64 → hidden → 10), initialized from seed."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def make_ddp(model, spec, **state_kw):
    """DDP over model; with spec, gradcomp's hook on a new State (returned),
    else torch's default all-reduce (state None)."""
    ddp = DDP(model)
    if spec is None:
        return ddp, None
    state = gct.State(spec, workers=1, **state_kw)
    ddp.register_comm_hook(state, gct.hook)
    return ddp, state


def batches(rank, world, x, y, epoch, seed):
    """This rank's shard of (x, y), shuffled per epoch, as equal-count
    batches on every rank (the last partial batch dropped)."""
    xs, ys = x[rank::world], y[rank::world]
    steps = len(x) // world // BATCH
    g = torch.Generator().manual_seed(seed * 1000 + epoch * 10 + rank)
    perm = torch.randperm(len(xs), generator=g)
    for s in range(steps):
        idx = perm[s * BATCH : (s + 1) * BATCH]
        yield xs[idx], ys[idx]


def train_step(ddp, opt, xb, yb):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
    opt.step()


def train_digits(rank, world, specs, epochs, seed, warmup_steps):
    """Trains the digits MLP once per spec (None: the default hook) with the
    same data and initialization; returns {spec: {accuracy, stats}}."""
    x, y, xt, yt = digits()
    out = {}
    for spec in specs:
        ddp, state = make_ddp(mlp(seed), spec, warmup_steps=warmup_steps, cost_model="off")
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for epoch in range(epochs):
            for xb, yb in batches(rank, world, x, y, epoch, seed):
                train_step(ddp, opt, xb, yb)
        with torch.no_grad():
            accuracy = (ddp.module(xt).argmax(1) == yt).float().mean().item()
        out[str(spec)] = {"accuracy": accuracy, "stats": dict(state.stats) if state else {}}
    return out
