"""Digits accuracy with and without momentum correction, 4 gloo ranks.

    /usr/bin/python3 scripts/digits-momentum.py [--seeds 1,2,3] [--epochs 10]

For each seed, trains tests/python's digits MLP (the same data, shards
and initialization as tests/python/test_digits.py) under torch's default
all-reduce with SGD(lr 0.05, momentum 0.9), and under gradcomp's hook
(decision pinned to compressed, 10 warm-up steps) for top-k 1 %, int4 and sign,
each with the optimizer's momentum (SGD momentum 0.9) and with momentum
correction instead (State(momentum=0.9), SGD momentum 0), and top-k with
a compression warm-up (RAMP) too. Prints one line
of test accuracies per seed, then the mean and spread per configuration.
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

#: (name, spec, State momentum, SGD momentum, schedule); spec None: the
#: default hook.
CONFIGS = [
    ("default", None, 0.0, 0.9, None),
    ("topk:0.01", "topk:0.01", 0.0, 0.9, None),
    ("topk:0.01+mc", "topk:0.01", 0.9, 0.0, None),
    ("topk:0.01+ramp", "topk:0.01", 0.0, 0.9, RAMP),
    ("topk:0.01+mc+ramp", "topk:0.01", 0.9, 0.0, RAMP),
    ("int4", "int4", 0.0, 0.9, None),
    ("sign", "sign", 0.0, 0.9, None),
    ("sign+mc", "sign", 0.9, 0.0, None),
]


def run(rank, world, seed, epochs):
    """One rank: every configuration for one seed; returns accuracies."""
    import torch

    from workers import batches, digits, make_ddp, mlp, train_step

    x, y, xt, yt = digits()
    out = {}
    for name, spec, mc, sgd_momentum, schedule in CONFIGS:
        kw = dict(warmup_steps=10, decision="compressed", momentum=mc, schedule=schedule) if spec else {}
        ddp, state = make_ddp(mlp(seed), spec, **kw)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=sgd_momentum)
        for epoch in range(epochs):
            for xb, yb in batches(rank, world, x, y, epoch, seed):
                train_step(ddp, opt, xb, yb)
        with torch.no_grad():
            out[name] = (ddp.module(xt).argmax(1) == yt).float().mean().item()
        if state:
            state.close()
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="1,2,3")
    p.add_argument("--epochs", type=int, default=10)
    a = p.parse_args()
    import ranks

    table = {name: [] for name, *_ in CONFIGS}
    for seed in (int(s) for s in a.seeds.split(",")):
        acc = ranks.run(run, 4, seed, a.epochs, timeout=600)[0]
        print("seed %d: %s" % (seed, ", ".join("%s %.4f" % (n, acc[n]) for n in table)), flush=True)
        for n in table:
            table[n].append(acc[n])
    for n, v in table.items():
        print("%-14s mean %.4f, min %.4f, max %.4f" % (n, statistics.mean(v), min(v), max(v)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
