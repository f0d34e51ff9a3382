"""Digits accuracy with and without momentum correction, 4 gloo ranks.

    PYTHON scripts/digits-momentum.py [--seeds 1,2,3] [--epochs 10] [--model mlp|cnn] [--only NAMES]

PYTHON is the interpreter, and so the torch, of the parent and its ranks
(spawned with it): /usr/bin/python3 (Debian's torch 1.13) or a venv's, e.g.
~/.cache/gradcomp/torch-venv/bin/python (torch 2.15).

For each seed, trains tests/python's digits MLP (the same data, shards
and initialization as tests/python/test_digits.py), or with --model cnn a
small CNN on the same 8×8 images, under torch's default
all-reduce with SGD(lr 0.05, momentum 0.9), under gradcomp's hook
(10 warm-up steps) for top-k 1 %, int4 and sign, and under torch's own
comm hooks fp16, bf16, PowerSGD (rank 2 and 1) and batched PowerSGD
(see CONFIGS). Prints one line of test accuracies per seed, then a
markdown table: per configuration the mean, its difference from the
default's in points, the spread, the bucket-steps that went compressed
and that the accuracy guard flushed, the bytes rank 0 sent per step (the
engine's count for gradcomp, averaged over the run, warm-up included; for
torch's hooks and the default, a ring all-reduce's bytes for what they
all-reduce), and with a guard the median and largest of what error
feedback held back (|e|/|g|).

torch's hooks are checked first, on one rank (scripts/torchbench.py's
torch_hook_refusal, on this script's model): one that this torch lacks,
that raises, or that crashes ranks on gloo (the PowerSGD hooks before torch
2.15, or with more than one DDP bucket) gets a "refused" row with the
reason instead of a run. The PowerSGD hooks get start_powerSGD_iter=10
(the example in powerSGD_hook's docstring; here also about 10 % of the
run's ~110 steps, as its docstring advises, and gradcomp's 10 warm-up
steps) and torch's PowerSGDState defaults otherwise.
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "plugin", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

#: DGC's warm-up for top-k 1 %, shortened to this run's ~110 steps
#: (overlap.Ramp("topk:0.01", 10) but for the last ratio).
RAMP = [(10, "topk:0.25"), (10, "topk:0.0625"), (10, "topk:0.016")]
#: The same for sign: int8, int4, int2 under SRA (overlap.Ramp("sign", 10)).
SIGN_RAMP = [(10, "int8"), (10, "int4"), (10, "int2")]

#: (name, spec, State keywords, SGD momentum); spec None: the default
#: hook. Every gradcomp run has 10 warm-up steps and, unless it says
#: otherwise, error feedback on and the decision pinned to compressed.
#: "+mc": momentum correction (State momentum 0.9, SGD without momentum),
#: "+mask": with DGC's momentum factor masking, "+ramp": the compression
#: warm-up, "-ef": no error feedback, "+guard=G": the accuracy guard,
#: "auto": the cost model decides. A spec "torch:...": torch's own hook
#: of that name (scripts/torchbench.py's names), no State.
CONFIGS = [
    ("default", None, {}, 0.9),
    ("topk:0.01", "topk:0.01", {}, 0.9),
    ("topk:0.01+mc", "topk:0.01", dict(momentum=0.9), 0.0),
    ("topk:0.01+ramp", "topk:0.01", dict(schedule=RAMP), 0.9),
    ("topk:0.01+mc+ramp", "topk:0.01", dict(momentum=0.9, schedule=RAMP), 0.0),
    ("topk:0.01+mc+mask+ramp", "topk:0.01", dict(momentum=0.9, momentum_masking=True, schedule=RAMP), 0.0),
    ("topk:0.01+mc+ramp-ef", "topk:0.01", dict(momentum=0.9, schedule=RAMP, error_feedback=False), 0.0),
    ("topk:0.01+mc+ramp+guard=20", "topk:0.01", dict(momentum=0.9, schedule=RAMP, guard=20), 0.0),
    ("topk:0.01+mc+ramp auto", "topk:0.01", dict(momentum=0.9, schedule=RAMP, decision="auto"), 0.0),
    ("int4", "int4", {}, 0.9),
    ("int4-ef", "int4", dict(error_feedback=False), 0.9),
    ("int4 auto", "int4", dict(decision="auto"), 0.9),
    ("sign", "sign", {}, 0.9),
    ("sign+mc", "sign", dict(momentum=0.9), 0.0),
    ("sign+ramp", "sign", dict(schedule=SIGN_RAMP), 0.9),
    ("sign+ramp-ef", "sign", dict(schedule=SIGN_RAMP, error_feedback=False), 0.9),
    ("sign+ramp auto", "sign", dict(schedule=SIGN_RAMP, decision="auto"), 0.9),
    # The guard's measure without its action (a threshold never passed).
    ("topk:0.01 held back", "topk:0.01", dict(guard=1e30), 0.9),
    ("topk:0.01+mc+ramp held back", "topk:0.01", dict(momentum=0.9, schedule=RAMP, guard=1e30), 0.0),
    ("int4 held back", "int4", dict(guard=1e30), 0.9),
    ("sign held back", "sign", dict(guard=1e30), 0.9),
    ("sign+ramp20", "sign", dict(schedule=[(20, s) for _, s in SIGN_RAMP]), 0.9),
    ("sign+mc+ramp20", "sign", dict(momentum=0.9, schedule=[(20, s) for _, s in SIGN_RAMP]), 0.0),
    ("topk:0.01+mc+ramp4x15", "topk:0.01", dict(momentum=0.9, schedule=[(15, "topk:0.25"), (15, "topk:0.1"), (15, "topk:0.04"), (15, "topk:0.016")]), 0.0),
    ("topk:0.01+mc+ramp+warm20", "topk:0.01", dict(momentum=0.9, schedule=RAMP, warmup_steps=20), 0.0),
    ("sign+mc+ramp", "sign", dict(momentum=0.9, schedule=SIGN_RAMP), 0.0),
    ("sign+ramp+warm20", "sign", dict(schedule=SIGN_RAMP, warmup_steps=20), 0.9),
    ("topk:0.01+mc+ramp20", "topk:0.01", dict(momentum=0.9, schedule=[(20, s) for _, s in RAMP]), 0.0),
    # torch's own DDP comm hooks, in place of the default all-reduce.
    ("torch:fp16", "torch:fp16", {}, 0.9),
    ("torch:bf16", "torch:bf16", {}, 0.9),
    ("torch:powersgd:2", "torch:powersgd:2", {}, 0.9),
    ("torch:powersgd:1", "torch:powersgd:1", {}, 0.9),
    ("torch:batched-powersgd:1", "torch:batched-powersgd:1", {}, 0.9),
]
TORCH = "torch:"


def cnn(seed):
    """A small CNN on the 8×8 digits: two 3×3 convolutions (16, 32
    channels), a 2×2 max-pool, a linear layer; initialized from seed."""
    import torch

    torch.manual_seed(seed)
    n = torch.nn
    return n.Sequential(
        n.Unflatten(1, (1, 8, 8)), n.Conv2d(1, 16, 3, padding=1), n.ReLU(), n.Conv2d(16, 32, 3, padding=1), n.ReLU(),
        n.MaxPool2d(2), n.Flatten(), n.Linear(32 * 16, 10),
    )


def run(rank, world, seed, epochs, model, configs):
    """One rank: the configurations for one seed and model ("mlp" or
    "cnn"); returns per configuration its test accuracy, bucket-step
    counts (compressed, all, guarded), bytes sent per step (rank 0's, the
    engine's count) and the accuracy guard's measures."""
    import torch

    from workers import batches, digits, make_ddp, mlp, train_step

    make_model = {"mlp": mlp, "cnn": cnn}[model]

    x, y, xt, yt = digits()
    out = {}
    for name, spec, state_kw, sgd_momentum in configs:
        if spec and spec.startswith(TORCH):
            out[name] = _run_torch_hook(rank, world, seed, epochs, make_model, spec, sgd_momentum)
            continue
        kw = dict(dict(warmup_steps=10, decision="compressed"), **state_kw) if spec else {}
        ddp, state = make_ddp(make_model(seed), spec, **kw)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=sgd_momentum)
        held, steps = [], 0
        for epoch in range(epochs):
            for xb, yb in batches(rank, world, x, y, epoch, seed):
                train_step(ddp, opt, xb, yb)
                steps += 1
                if state and state.last_step is not None:
                    held += [b.held_back for b in state.last_step.buckets if b.held_back > 0]
        with torch.no_grad():
            accuracy = (ddp.module(xt).argmax(1) == yt).float().mean().item()
        if state:
            stats = state.stats
            per_step = stats["bytes_sent_total"] / steps
        else:
            stats, per_step = {}, _plain_bytes(ddp, world)
        out[name] = {"accuracy": accuracy, "compressed": stats.get("compressed", 0),
                     "bucket_steps": stats.get("compressed", 0) + stats.get("dense", 0),
                     "guarded": stats.get("guarded", 0), "bytes_per_step": per_step, "held_back": held}
        if state:
            state.close()
    return out


def _run_torch_hook(rank, world, seed, epochs, make_model, name, sgd_momentum):
    """One configuration under torch's hook `name` (torchbench's names):
    the same training as run's; bytes per step: a ring all-reduce's for
    the elements (fp16/bf16: at 2 bytes) the hook all-reduces, averaged
    over the run."""
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    import torchbench
    from workers import batches, digits, train_step

    x, y, xt, yt = digits()
    base, flags = torchbench.split_name(name)
    kind, mrank = torchbench.torch_hook_kind(base)
    module = make_model(seed)
    ddp = DDP(module, **torchbench.ddp_kwargs(module, flags))
    psgd = torchbench.register_torch_hook(ddp, kind, mrank)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=sgd_momentum)
    steps = 0
    for epoch in range(epochs):
        for xb, yb in batches(rank, world, x, y, epoch, seed):
            train_step(ddp, opt, xb, yb)
            steps += 1
    with torch.no_grad():
        accuracy = (ddp.module(xt).argmax(1) == yt).float().mean().item()
    n = sum(p.numel() for p in module.parameters() if p.requires_grad)
    nb = torchbench.ddp_buckets(ddp) or 1
    ring = 2 * (world - 1) / world
    if psgd is None:  # fp16, bf16: every bucket, every step, at 2 bytes
        compressed, per_step = steps * nb, ring * 2 * n
    else:  # the plain all-reduce before start_powerSGD_iter, then P, Q and the uncompressed tensors
        plain = min(steps, psgd.start_powerSGD_iter)
        compressed = (steps - plain) * nb
        per_step = ring * 4 * (plain * n + psgd.compression_stats()[2]) / steps
    return {"accuracy": accuracy, "compressed": compressed, "bucket_steps": steps * nb, "guarded": 0,
            "bytes_per_step": per_step, "held_back": []}


def _check_torch_hooks(rank, world, names, model, ranks_world):
    """On a 1-rank group: {name: why refused or None} for torch's hooks
    `names` on this script's model (torchbench.torch_hook_refusal for
    ranks_world ranks, on a batch of the training data)."""
    import torchbench
    from workers import digits, mlp

    make_model = {"mlp": mlp, "cnn": cnn}[model]
    x = digits()[0][:32]
    return {n: torchbench.torch_hook_refusal(n, lambda: make_model(1), x, ranks_world) for n in names}


def _plain_bytes(ddp, world):
    """A ring all-reduce's bytes per rank for the model's gradients:
    2(N−1)/N · 4 · parameters."""
    n = sum(p.numel() for p in ddp.module.parameters() if p.requires_grad)
    return 2 * (world - 1) * 4 * n // world


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    p.add_argument("--only", default="", help="comma-separated configuration names (default: all)")
    a = p.parse_args()
    import ranks

    only = [n for n in a.only.split(",") if n]
    unknown = set(only) - {name for name, *_ in CONFIGS}
    if unknown:
        p.error("unknown configurations %s" % sorted(unknown))
    configs = [c for c in CONFIGS if not only or c[0] in only]
    import torch

    print("torch %s (%s)" % (torch.__version__, sys.executable), flush=True)
    refused = {}
    torch_names = [spec for _, spec, *_ in configs if spec and spec.startswith(TORCH)]
    if torch_names:
        checked = ranks.run(_check_torch_hooks, 1, torch_names, a.model, 4, timeout=300)[0]
        refused = {name: checked[spec] for name, spec, *_ in configs if checked.get(spec)}
        for name, why in refused.items():
            print("%s: refused: %s" % (name, why), flush=True)
    configs = [c for c in configs if c[0] not in refused]
    runs = {name: [] for name, *_ in configs}
    for seed in (int(s) for s in a.seeds.split(",")):
        res = ranks.run(run, 4, seed, a.epochs, a.model, configs, timeout=900)[0]
        print("seed %d: %s" % (seed, ", ".join("%s %.4f" % (n, res[n]["accuracy"]) for n in runs)), flush=True)
        for n in runs:
            runs[n].append(res[n])
    base = statistics.mean(r["accuracy"] for r in runs["default"]) if "default" in runs else None
    print("| configuration | mean | Δ | min–max | compressed | guarded | bytes/step | held back (median, max) |")
    print("|---|---|---|---|---|---|---|---|")
    for n, rs in runs.items():
        acc = [r["accuracy"] for r in rs]
        held = sorted(h for r in rs for h in r["held_back"])
        print("| %s | %.4f | %s | %.4f–%.4f | %s | %d | %.0f | %s |" % (
            n, statistics.mean(acc), "%+.2f" % (100 * (statistics.mean(acc) - base)) if base is not None else "—",
            min(acc), max(acc),
            "%d / %d" % (sum(r["compressed"] for r in rs), sum(r["bucket_steps"] for r in rs)) if n != "default" else "—",
            sum(r["guarded"] for r in rs), statistics.mean(r["bytes_per_step"] for r in rs),
            "%.2f, %.2f" % (held[len(held) // 2], held[-1]) if held else "—"))
    for n, why in refused.items():
        print("| %s | refused: %s | — | — | — | — | — | — |" % (n, why.replace("|", "/")))
    return 0


if __name__ == "__main__":
    sys.exit(main())
