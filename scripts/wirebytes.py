"""One rank of scripts/wirebytes: the bytes a DDP step puts on the wire
under each hook, read from the network namespace's loopback counter.

Every rank runs, for each hook in --hooks, a fresh DDP model (an MLP of
about 300k parameters, one DDP bucket) with that hook: a few steps to get
past DDP's bucket rebuild, gradcomp's engine creation and warm-up, then a
barrier, rank 0 reads the tx bytes of `lo` (/proc/net/dev: every byte
between ranks crosses it, as they all live in one namespace), --steps
steps, a barrier, and rank 0 reads it again. An empty interval (two
barriers and nothing between) is measured the same way and subtracted.
Rank 0 prints one JSON row per hook: measured bytes per rank per step, the
engine's own count (its statistics), and the strategy's formula (see
FORMULAS) for the model's bucket sizes.

Hooks: "default" (torch's all-reduce), or a gradcomp spec with an optional
"/strategy" (e.g. "int8/allgather", the all-gather of whole payloads that
gradcomp's hook did before it ran the engine's strategies). Compression is
pinned on (decision="compressed").
"""

import argparse
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch

# Bytes of one payload's framing: its 56-byte header and 4-byte CRC, and
# the engine's 16-byte slot status.
FRAME = 56 + 4 + 16
# Per 512-element bucket: int8/int4/int2 carry (min, scale) as float32, sign one scale.
QUANT = {"int8": (8, 8), "int4": (4, 8), "int2": (2, 8), "sign": (1, 4)}


def formula(spec, strategy, n, world):
    """Bytes one rank sends for a bucket of n float32 elements, by the
    strategy's formula (docs/DESIGN.md's section 3, with each codec's exact payload
    size: per-bucket scales, frames)."""
    codec = spec.split(":")[0]
    ring = 2 * (world - 1) / world
    if spec == "default" or codec == "none":
        return ring * 4 * n
    if codec == "topk":
        k = max(1, round(float(spec.split(":")[1]) * n))
        return (world - 1) * (k * 8 + FRAME)
    if codec == "randomk":
        k = max(1, round(float(spec.split(":")[1]) * n))
        if strategy == "allgather":
            return (world - 1) * (k * 4 + FRAME)
        return ring * 4 * (k + world)  # the k values and N statuses, all-reduced
    bits, per_bucket = QUANT[codec]
    body = lambda m: (m * bits + 7) // 8 + per_bucket * ((m + 511) // 512) + FRAME
    if strategy == "allgather":
        return (world - 1) * body(n)
    # SRA: an all-to-all of N part payloads, then an all-gather of this rank's part.
    part = n // world
    return (world - 1) / world * world * body(part) + (world - 1) * body(part)


def lo_tx():
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, rest = line.partition(":")
            if name.strip() == "lo":
                return int(rest.split()[8])
    raise RuntimeError("no lo in /proc/net/dev")


def model():
    return nn.Sequential(nn.Linear(1024, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(), nn.Linear(128, 10))


def interval(run, rank):
    dist.barrier()
    before = lo_tx() if rank == 0 else 0
    run()
    dist.barrier()
    return (lo_tx() - before) if rank == 0 else 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--port", type=int, default=29541)
    ap.add_argument("--hooks", default="default,int8")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warm", type=int, default=3, help="steps after the engine exists, before measuring")
    a = ap.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d" % a.port, rank=a.rank, world_size=a.world)
    empty = interval(lambda: None, a.rank)
    for hook in a.hooks.split(","):
        spec, _, strategy = hook.partition("/")
        torch.manual_seed(0)
        net = DDP(model())
        state = None
        sizes = {}
        if spec != "default":
            state = gradcomp.torch.State(spec, strategy=strategy or "auto", decision="compressed", warmup_steps=2)

            def counting(state, bucket):
                sizes[bucket.index()] = bucket.buffer().numel()
                return gradcomp.torch.hook(state, bucket)

            net.register_comm_hook(state, counting)
        else:

            def default(state, bucket):
                sizes[bucket.index()] = bucket.buffer().numel()
                t = bucket.buffer().div_(dist.get_world_size())
                return dist.all_reduce(t, async_op=True).get_future().then(lambda f: f.value()[0])

            net.register_comm_hook(None, default)
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        x, y = torch.randn(16, 1024), torch.randint(0, 10, (16,))

        def steps(k):
            for _ in range(k):
                opt.zero_grad()
                nn.functional.cross_entropy(net(x), y).backward()
                opt.step()

        steps(2 + a.warm)  # DDP's rebuild step, the layout step, then the engine's first steps
        t0 = time.perf_counter()
        sent = interval(lambda: steps(a.steps), a.rank)
        elapsed = time.perf_counter() - t0
        engine = None
        if state is not None:
            engine = state.stats["bytes_sent"]  # the engine's count for the last step
        if a.rank == 0:
            measured = (sent - empty) / a.world / a.steps
            want = sum(formula(spec, strategy or "auto", n, a.world) for n in sizes.values())
            print(json.dumps({"world": a.world, "hook": hook, "elements": sum(sizes.values()), "buckets": len(sizes),
                              "measured_bytes_per_rank_step": round(measured), "formula_bytes": round(want),
                              "measured_over_formula": round(measured / want, 4) if want else None,
                              "engine_bytes": engine, "dense_bytes": round(formula("default", "", sum(sizes.values()), a.world)),
                              "seconds_per_step": round(elapsed / a.steps, 4)}), flush=True)
        if state is not None:
            state.close()
        del net
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
