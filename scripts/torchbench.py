"""One rank of scripts/torchbench: DDP step time of an MLP (~1.09M params)
under torch's default all-reduce, torch's fp16_compress_hook and gradcomp's
hook, over gloo. Rank 0 prints one JSON object per hook.

usage: torchbench.py RANK WORLD MASTER_ADDR PORT LINK SPEC [STEPS [BATCH]]
"""

import datetime
import json
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as gct

WARMUP = 15  # steps before timing: gradcomp's 10 warm-up steps and 3 probes, and 2 more


def model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(1024, 768), torch.nn.ReLU(), torch.nn.Linear(768, 384), torch.nn.ReLU(), torch.nn.Linear(384, 10)
    )


def bench(rank, hook_name, spec, steps, batch):
    m = model()
    ddp = DDP(m)
    state = None
    if hook_name == "fp16":
        ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif hook_name == "gradcomp":
        state = gct.State(spec, model=m, warmup_steps=10, probe_steps=3, workers=1)
        ddp.register_comm_hook(state, gct.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(batch, 1024, generator=g), torch.randint(0, 10, (batch,), generator=g)
    times = []
    for i in range(WARMUP + steps):
        dist.barrier()
        start = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        t = torch.tensor([time.perf_counter() - start], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
        if i >= WARMUP:
            times.append(float(t))
    row = {
        "hook": hook_name if hook_name != "gradcomp" else "gradcomp " + spec,
        "params": sum(p.numel() for p in m.parameters()),
        "steps": steps,
        "batch": batch,
        "median_s": statistics.median(times),
        "min_s": min(times),
        "max_s": max(times),
    }
    if state is not None:
        row["decisions"] = {str(k): v for k, v in state.decisions.items()}
        row["stats"] = dict(state.stats)
    return row


def main():
    rank, world, addr, port, link, spec = sys.argv[1:7]
    steps = int(sys.argv[7]) if len(sys.argv) > 7 else 20
    batch = int(sys.argv[8]) if len(sys.argv) > 8 else 32
    rank, world = int(rank), int(world)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method="tcp://%s:%s" % (addr, port), rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=120),
    )
    for hook_name in ("default", "fp16", "gradcomp"):
        row = bench(rank, hook_name, spec, steps, batch)
        row.update(link=link, world=world)
        if rank == 0:
            print(json.dumps(row), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
