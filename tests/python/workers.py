"""Rank functions for the multi-process tests (run through ranks.run).

Each takes (rank, world, ...) inside an initialized gloo process group and
returns a JSON-serializable value.
"""

import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as gct

BATCH = 32


class FakeBucket:
    """What the hook reads of a dist.GradBucket: buffer, index, is_last,
    parameters (one flat parameter of the buffer's size)."""

    def __init__(self, buffer, index=0):
        self._buffer = buffer
        self._index = index
        self._params = [torch.nn.Parameter(torch.zeros(buffer.numel()))] if hasattr(buffer, "numel") else []

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def is_last(self):
        return True

    def parameters(self):
        return self._params


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


def two_bucket_mlp(seed):
    """A digits MLP (64 → 1024 → 1024 → 10, 1.1M parameters) that DDP splits
    into two buckets: its first bucket is capped at 1 MiB, so the last two
    layers (4.2 MB) fill it and the first layer goes into the second."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )


def make_ddp(model, spec, name_params=True, **state_kw):
    """DDP over model; with spec, gradcomp's hook on a new State (returned;
    given the model when name_params), else torch's default all-reduce
    (state None)."""
    ddp = DDP(model)
    if spec is None:
        return ddp, None
    state = gct.State(spec, workers=1, model=model if name_params else None, **state_kw)
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


def mismatched_specs(rank, world, specs):
    """Rank r's hook uses specs[r % len(specs)]; returns the message of the
    error the first compressed step raised on this rank (None if none)."""
    x, y, _, _ = digits()
    ddp, state = make_ddp(mlp(0), specs[rank % len(specs)], warmup_steps=2)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for xb, yb in list(batches(rank, world, x, y, 0, 0))[:3]:
        try:
            train_step(ddp, opt, xb, yb)
        except Exception as e:  # DDP re-raises the hook's error from backward
            return "%s: %s" % (type(e).__name__, e)
    return None


def nonfinite_bucket(rank, world, spec, bad_rank):
    """Warm up, then one backward where bad_rank's gradient holds a NaN (in
    both buckets of two_bucket_mlp: their dense fallbacks are issued in
    bucket order), then a clean one. Returns what each step did: the stats,
    the bucket count, whether every gradient came back NaN, and whether the
    error-feedback memory changed."""
    x, y, _, _ = digits()
    ddp, state = make_ddp(two_bucket_mlp(0), spec, warmup_steps=2, cost_model="off")
    data = list(batches(rank, world, x, y, 0, 0))
    for xb, yb in data[:3]:  # two warm-up steps and one compressed
        ddp.zero_grad()
        torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
    ef_before = state.compressor.save_state()
    xb, yb = data[3]
    if rank == bad_rank:
        xb = xb.clone()
        xb[0, 0] = float("nan")
    ddp.zero_grad()
    torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
    nan_stats = dict(state.stats)
    all_nan = all(bool(torch.isnan(p.grad).any()) for p in ddp.parameters())
    ef_same = state.compressor.save_state() == ef_before
    ddp.zero_grad()
    torch.nn.functional.cross_entropy(ddp(data[4][0]), data[4][1]).backward()
    clean_finite = all(bool(torch.isfinite(p.grad).all()) for p in ddp.parameters())
    return {
        "buckets": len(state.layout),
        "stats_after_nan": nan_stats,
        "stats_after_clean": dict(state.stats),
        "grads_nan": all_nan,
        "ef_unchanged": ef_same,
        "clean_finite": clean_finite,
    }


def _params(model):
    return [p.detach().clone() for p in model.parameters()]


def checkpoint_resume(rank, world, spec, steps, cut, name_params=True):
    """Trains `steps` steps straight, and again with a checkpoint after `cut`
    steps restored into a fresh model, optimizer, DDP and State (given the
    model when name_params). Returns whether the final parameters match bit
    for bit, whether they are finite, and the resumed state's stats."""
    x, y, _, _ = digits()
    data = [b for epoch in range(4) for b in batches(rank, world, x, y, epoch, 7)][:steps]
    kw = dict(warmup_steps=3, cost_model="off")

    def fresh():
        model = mlp(7)
        ddp, state = make_ddp(model, spec, name_params, **kw)
        return model, ddp, state, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    model, ddp, state, opt = fresh()
    for xb, yb in data:
        train_step(ddp, opt, xb, yb)
    straight = _params(model)

    model, ddp, state, opt = fresh()
    for xb, yb in data[:cut]:
        train_step(ddp, opt, xb, yb)
    ckpt = {"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict() if state else None}
    ckpt = {k: _roundtrip(v) for k, v in ckpt.items()}
    model, ddp, state, opt = fresh()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    if state:
        state.load_state_dict(ckpt["hook"])
    for xb, yb in data[cut:]:
        train_step(ddp, opt, xb, yb)
    resumed = _params(model)
    return {
        "bit_exact": all(torch.equal(a, b) for a, b in zip(straight, resumed)),
        "max_abs_diff": max(float((a - b).abs().max()) for a, b in zip(straight, resumed)),
        "finite": all(bool(torch.isfinite(p).all()) for p in resumed),
        "stats": dict(state.stats) if state else {},
    }


def _roundtrip(obj):
    """obj through torch.save/torch.load, as a checkpoint file would take it."""
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def checkpoint_resume_all(rank, world, variants, steps, cut):
    """checkpoint_resume for each (spec, name_params) in variants."""
    return [checkpoint_resume(rank, world, spec, steps, cut, name_params) for spec, name_params in variants]


def measured_decisions(rank, world, spec, steps, dense_seconds=None):
    """Trains `steps` steps with cost_model="measure" (3 warm-up steps, 2
    probe steps); with dense_seconds, the warm-up's dense exchanges are
    recorded as taking that long (a slow link, as the cost model sees it).
    Returns the link bandwidth, guesses, decisions and stats."""
    x, y, _, _ = digits()
    ddp, state = make_ddp(mlp(0), spec, warmup_steps=3, probe_steps=2)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for step, (xb, yb) in enumerate(list(batches(rank, world, x, y, 0, 0))[:steps]):
        if step == state.warmup_steps and dense_seconds is not None:
            for times in state._dense_times.values():
                times[:] = [dense_seconds] * len(times)
        train_step(ddp, opt, xb, yb)
    keyed = lambda d: {str(k): v for k, v in d.items()}
    return {
        "bandwidth": state.bandwidth,
        "guesses": keyed(state.guesses),
        "decisions": keyed(state.decisions),
        "stats": dict(state.stats),
    }


def measured_decisions_all(rank, world, spec, steps, dense_seconds_list):
    """measured_decisions for each dense_seconds in dense_seconds_list."""
    return [measured_decisions(rank, world, spec, steps, d) for d in dense_seconds_list]


def late_rank(rank, world, spec, delay):
    """The hook on crafted buckets (warm-up 2, cost model off), with
    overlap=True and then overlap=False, where the last rank reaches its
    hook `delay` seconds late in step 3 (after the handshake). Returns per
    mode whether this rank's hook returned before its exchange completed,
    and the step-3 result."""
    out = {}
    for overlap in (True, False):
        state = gct.State(spec, warmup_steps=2, cost_model="off", overlap=overlap, workers=1)
        g = torch.Generator().manual_seed(rank)
        for step in range(4):
            buf = torch.randn(4096, generator=g)
            if step == 3 and rank == world - 1:
                time.sleep(delay)
            fut = gct.hook(state, FakeBucket(buf))
            returned_pending = not fut.done()
            result = fut.wait()
        out[str(overlap)] = {"returned_pending": returned_pending, "result": result.tolist(), "stats": dict(state.stats)}
    return out
