"""Digits accuracy with and without momentum correction, 4 gloo ranks.

    /usr/bin/python3 scripts/digits-momentum.py [--seeds 1,2,3] [--epochs 10] [--model mlp|cnn]

For each seed, trains tests/python's digits MLP (the same data, shards
and initialization as tests/python/test_digits.py), or with --model cnn a
small CNN on the same 8×8 images, under torch's default
all-reduce with SGD(lr 0.05, momentum 0.9), and under gradcomp's hook
(10 warm-up steps) for top-k 1 %, int4 and sign: decision pinned to
compressed, with the optimizer's momentum (SGD momentum 0.9) or momentum
correction instead (State(momentum=0.9), SGD momentum 0), top-k with a
compression warm-up (RAMP), the ablations without error feedback, and the
cost model's decision ("auto"). Prints one line
of test accuracies per seed, then per configuration the mean and spread
and how many bucket-steps went compressed (rank 0's count, all seeds).
"""

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "plugin", "python"))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))

#: DGC's warm-up for top-k 1 %, shortened to this run's ~110 steps.
RAMP = [(10, "topk:0.25"), (10, "topk:0.0625"), (10, "topk:0.016")]

#: (name, spec, State keywords, SGD momentum); spec None: the default
#: hook. Every gradcomp run has 10 warm-up steps and, unless it says
#: otherwise, error feedback on and the decision pinned to compressed.
CONFIGS = [
    ("default", None, {}, 0.9),
    ("topk:0.01", "topk:0.01", {}, 0.9),
    ("topk:0.01+mc", "topk:0.01", dict(momentum=0.9), 0.0),
    ("topk:0.01+ramp", "topk:0.01", dict(schedule=RAMP), 0.9),
    ("topk:0.01+mc+ramp", "topk:0.01", dict(momentum=0.9, schedule=RAMP), 0.0),
    ("topk:0.01+ramp-ef", "topk:0.01", dict(schedule=RAMP, error_feedback=False), 0.9),
    ("topk:0.01 auto", "topk:0.01", dict(decision="auto"), 0.9),
    ("int4", "int4", {}, 0.9),
    ("int4-ef", "int4", dict(error_feedback=False), 0.9),
    ("int4 auto", "int4", dict(decision="auto"), 0.9),
    ("sign", "sign", {}, 0.9),
    ("sign+mc", "sign", dict(momentum=0.9), 0.0),
    ("sign-ef", "sign", dict(error_feedback=False), 0.9),
    ("sign auto", "sign", dict(decision="auto"), 0.9),
]


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


def run(rank, world, seed, epochs, model):
    """One rank: every configuration for one seed and model ("mlp" or
    "cnn"); returns per configuration [accuracy, compressed, bucket-steps]."""
    import torch

    from workers import batches, digits, make_ddp, mlp, train_step

    make_model = {"mlp": mlp, "cnn": cnn}[model]

    x, y, xt, yt = digits()
    out = {}
    for name, spec, state_kw, sgd_momentum in CONFIGS:
        kw = dict(dict(warmup_steps=10, decision="compressed"), **state_kw) if spec else {}
        ddp, state = make_ddp(make_model(seed), spec, **kw)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=sgd_momentum)
        for epoch in range(epochs):
            for xb, yb in batches(rank, world, x, y, epoch, seed):
                train_step(ddp, opt, xb, yb)
        with torch.no_grad():
            accuracy = (ddp.module(xt).argmax(1) == yt).float().mean().item()
        stats = state.stats if state else {}
        out[name] = [accuracy, stats.get("compressed", 0), stats.get("compressed", 0) + stats.get("dense", 0)]
        if state:
            state.close()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--model", choices=("mlp", "cnn"), default="mlp")
    a = p.parse_args()
    import ranks

    table = {name: [] for name, *_ in CONFIGS}
    sent = {name: [0, 0] for name in table}
    for seed in (int(s) for s in a.seeds.split(",")):
        res = ranks.run(run, 4, seed, a.epochs, a.model, timeout=900)[0]
        print("seed %d: %s" % (seed, ", ".join("%s %.4f" % (n, res[n][0]) for n in table)), flush=True)
        for n in table:
            table[n].append(res[n][0])
            sent[n][0] += res[n][1]
            sent[n][1] += res[n][2]
    for n, v in table.items():
        c, t = sent[n]
        print("%-18s mean %.4f, min %.4f, max %.4f; %d of %d bucket-steps compressed"
              % (n, statistics.mean(v), min(v), max(v), c, t))
    return 0


if __name__ == "__main__":
    sys.exit(main())
