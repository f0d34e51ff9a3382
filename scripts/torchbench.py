"""One rank of scripts/torchbench: DDP step time of an MLP (~1.09M params)
under several communication hooks over gloo, their steps interleaved (one
step of each hook in turn, a different one first each round) so that a change in the machine's load falls on
all of them alike. Rank 0 prints one JSON object per hook.

usage: torchbench.py RANK WORLD MASTER_ADDR PORT LINK HOOKS [STEPS [BATCH]]

HOOKS is a comma-separated list of: default (torch's all-reduce), fp16
(torch's fp16_compress_hook), local (no exchange at all: each rank keeps
its own gradient; the floor any hook's step time could reach), or a
gradcomp spec (gradcomp.torch.hook: the engine, with error feedback
and the cost model), optionally suffixed "/sync" for overlap=False and/or
"@compressed" or "@dense" to pin the decision (e.g. "int4@compressed/sync").
gradcomp's rows carry the hook's counters (bytes sent per rank in the last
step) and its last step's per-bucket statistics.
"""

import datetime
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as gct

GRADCOMP_WARMUP = 10  # gradcomp's dense warm-up steps
VERIFY = 4  # steps of the engine's first online verification (alternating the decided configuration and the other)
WARMUP = GRADCOMP_WARMUP + VERIFY + 2  # untimed steps: gradcomp's warm-up and first verification, and 2 more
SYNC = "/sync"


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 768), torch.nn.ReLU(), torch.nn.Linear(768, 384), torch.nn.ReLU(), torch.nn.Linear(384, 10)
    )


def local_hook(_, bucket):
    """A hook that exchanges nothing: the bucket as it is, at once."""
    fut = torch.futures.Future()
    fut.set_result(bucket.buffer())
    return fut


class Run:
    """One hook's DDP model, optimizer and step times."""

    def __init__(self, name):
        self.name = name
        self.module = model()
        self.ddp = DDP(self.module)
        self.state = None
        if name == "fp16":
            self.ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif name == "local":
            self.ddp.register_comm_hook(None, local_hook)
        elif name != "default":
            spec = name[: -len(SYNC)] if name.endswith(SYNC) else name
            spec, _, decision = spec.partition("@")
            self.state = gct.State(
                spec, decision=decision or "auto", model=self.module, warmup_steps=GRADCOMP_WARMUP, workers=1,
                overlap=not name.endswith(SYNC),
            )
            self.ddp.register_comm_hook(self.state, gct.hook)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.01)
        self.times = []

    def step(self, x, y, timed):
        dist.barrier()
        start = time.perf_counter()
        self.opt.zero_grad()
        torch.nn.functional.cross_entropy(self.ddp(x), y).backward()
        self.opt.step()
        t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
        if timed:
            self.times.append(float(t))

    def row(self):
        ts = sorted(self.times)
        row = {
            "hook": self.name if self.state is None else "gradcomp " + self.name,
            "params": sum(p.numel() for p in self.module.parameters()),
            "steps": len(ts),
            "median_s": statistics.median(ts),
            "q1_s": ts[len(ts) // 4],
            "q3_s": ts[(3 * len(ts)) // 4],
            "min_s": ts[0],
            "max_s": ts[-1],
        }
        if self.state is not None:
            row["stats"] = self.state.stats
            last = self.state.last_step
            if last is not None:
                row["exposed_s"] = last.exposed_seconds
                row["buckets"] = [b._asdict() for b in last.buckets]
        return row


def main():
    rank, world, addr, port, link, hooks = sys.argv[1:7]
    steps = int(sys.argv[7]) if len(sys.argv) > 7 else 20
    batch = int(sys.argv[8]) if len(sys.argv) > 8 else 32
    rank, world = int(rank), int(world)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method="tcp://%s:%s" % (addr, port), rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    runs = [Run(name) for name in hooks.split(",")]
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, 1024, generator=g), torch.randint(0, 10, (batch,), generator=g)
    for i in range(WARMUP + steps):
        k = i % len(runs)  # each hook goes first in turn
        for run in runs[k:] + runs[:k]:
            run.step(x, y, timed=i >= WARMUP)
    for run in runs:
        row = run.row()
        row.update(link=link, world=world, batch=batch)
        if rank == 0:
            print(json.dumps(row), flush=True)
    dist.barrier()
    # No destroy_process_group and no interpreter teardown: in torch 1.13,
    # destroying a gloo group holds the GIL while it joins the group's
    # threads, and a thread still releasing a finished collective's tensors
    # needs the GIL: a rank hung there, spinning, in a run of this script.
    os._exit(0)


if __name__ == "__main__":
    main()
