#!/usr/bin/env python3
"""The PyTorch hooks on CUDA under init_process_group("nccl"): scripts/gpu-check's
`hooks` step, for a GPU machine.

    scripts/gpu-hooks-check.py LIBDIR OUT.json

One rank per GPU torch sees (spawned processes; one rank on one GPU still
runs the whole path: the unique id through the store, the engine's own
NCCL communicator, CUDA-aware futures). With libgradcomp_cuda.so from
LIBDIR:

- DDP: an MLP (about 34M parameters, 4 DDP buckets) trained a few steps
  with torch's default hook and with gradcomp's hook (int8, top-k 1 %,
  PowerSGD rank 4; decision pinned to compressed after 2 warm-up steps)
  from the same initialization and inputs: each hook's gradients after
  its first compressed step against the default's (relative error, with a
  bound per codec), whether the engine carried the buckets (counters) on
  its own communicator (no Python host); then the median step time of
  every gradcomp hook beside torch's default, fp16_compress_hook and
  powerSGD_hook (rank 4) on the same model.
- FSDP2 (torch ≥ 2.4): the same MLP fully_shard'ed on a mesh of one shard
  per replica (every rank a replica), gradcomp.fsdp's hook (int8) against
  FSDP's own all-reduce across replicas: the gradients after the first
  compressed step, and the median step times.

Prints every figure and writes them to OUT.json. Exit status: 0 all checks
passed, 1 a check failed, 2 torch sees no GPU (said so). Bounded: each
part ends by itself (a hung rank is killed after PART_SECONDS).
"""

import json
import os
import socket
import statistics
import sys
import tempfile
import time
import traceback

PART_SECONDS = 140
STEPS, WARMUP = 12, 2
WIDTH, DEPTH, BATCH = 2048, 8, 64
#: Relative error of each gradcomp codec's averaged gradient against the
#: default hook's after the first compressed step: int8's error bound is
#: about 1 % of the norm; top-k 1 % and PowerSGD rank 4 send a fraction
#: of the gradient in their first step (error feedback holds the rest).
BOUNDS = {"int8": 0.02, "topk:0.01": 1.0, "powersgd:4": 1.0}


def model(torch):
    torch.manual_seed(0)
    layers = []
    for _ in range(DEPTH):
        layers += [torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU()]
    return torch.nn.Sequential(*layers, torch.nn.Linear(WIDTH, 10))


def batch(torch, rank, step, device):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(BATCH, WIDTH, generator=g).to(device)


def timed_steps(torch, m, opt, rank, device, after_step=None):
    """STEPS steps; returns the per-step seconds (synchronized at the
    step's end only, as a training loop's logging would) and the flat
    gradient after step WARMUP (the first compressed one)."""
    times, grad = [], None
    for step in range(STEPS):
        x = batch(torch, rank, step, device)
        torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        m(x).square().mean().backward()
        if step == WARMUP:
            grad = torch.cat([p.grad.detach().flatten().float() for p in m.parameters()]).cpu()
        opt.step()
        torch.cuda.synchronize(device)
        times.append(time.perf_counter() - t0)
    return times[WARMUP + 1:], grad


def ddp_rank(rank, world, port, libdir, outdir):
    os.environ["GRADCOMP_LIB"] = os.path.join(libdir, "libgradcomp_cuda.so")
    import torch
    import torch.distributed as dist
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook as psgd

    import gradcomp.torch as gct

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    out = {"runs": {}}
    base = model(torch).state_dict()
    hooks = [("torch default", None), ("torch fp16", "fp16"), ("torch powerSGD:4", "psgd")]
    hooks += [("gradcomp " + spec, spec) for spec in BOUNDS]
    ref = None
    for name, how in hooks:
        m = model(torch)
        m.load_state_dict(base)
        ddp = torch.nn.parallel.DistributedDataParallel(m.to(device), device_ids=[rank], bucket_cap_mb=40)
        state = None
        if how == "fp16":
            ddp.register_comm_hook(None, default_hooks.fp16_compress_hook)
        elif how == "psgd":
            ddp.register_comm_hook(psgd.PowerSGDState(None, matrix_approximation_rank=4,
                                                      start_powerSGD_iter=WARMUP), psgd.powerSGD_hook)
        elif how is not None:
            state = gct.State(how, warmup_steps=WARMUP, decision="compressed")
            ddp.register_comm_hook(state, gct.hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        times, grad = timed_steps(torch, ddp, opt, rank, device)
        run = {"median_ms": 1e3 * statistics.median(times), "steps": len(times)}
        if ref is None:
            ref = grad
        else:
            run["rel_error"] = float((grad - ref).norm() / ref.norm())
        if state is not None:
            run["stats"] = {k: state.stats[k] for k in ("compressed", "dense", "native", "engine_steps")}
            run["own_nccl"] = state.engine.host is None
            run["strategies"] = [b.strategy for b in state.last_step.buckets]
            state.close()
        out["runs"][name] = run
        del ddp, m, opt
        torch.cuda.empty_cache()
    dist.barrier()
    return out


def fsdp_rank(rank, world, port, libdir, outdir):
    os.environ["GRADCOMP_LIB"] = os.path.join(libdir, "libgradcomp_cuda.so")
    import torch
    import torch.distributed as dist

    try:
        from torch.distributed.fsdp import fully_shard
    except ImportError as e:
        return {"skipped": "no FSDP2 in torch %s: %s" % (torch.__version__, e)}
    from torch.distributed.device_mesh import init_device_mesh

    from gradcomp.fsdp import FSDPState, register

    device = torch.device("cuda", rank)
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", init_method="tcp://127.0.0.1:%d" % port, rank=rank, world_size=world)
    mesh = init_device_mesh("cuda", (world, 1), mesh_dim_names=("replicate", "shard"))
    out = {"runs": {}}
    base = model(torch).state_dict()
    ref = None
    for name, spec in (("FSDP2 HSDP (torch)", None), ("FSDP2 + gradcomp int8", "int8")):
        m = model(torch)
        m.load_state_dict(base)
        m.to(device)
        state = None
        if spec is None:
            for layer in m:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh)
            fully_shard(m, mesh=mesh)
        else:
            for layer in m:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=mesh["shard"])
            fully_shard(m, mesh=mesh["shard"])
            state = register(m, FSDPState(spec, replicate_group=mesh["replicate"], warmup_steps=WARMUP,
                                          decision="compressed"))
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        times, grad = timed_steps(torch, m, opt, rank, device)
        run = {"median_ms": 1e3 * statistics.median(times)}
        if ref is None:
            ref = grad
        else:
            run["rel_error"] = float((grad - ref).norm() / ref.norm())
        if state is not None:
            run["stats"] = {k: state.stats[k] for k in ("compressed", "dense", "engine_steps")}
            run["own_nccl"] = state.engine.host is None
            state.close()
        out["runs"][name] = run
    dist.barrier()
    return out


def _entry(rank, fn, world, port, libdir, outdir):
    try:
        result = {"value": fn(rank, world, port, libdir, outdir)}
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(outdir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    os._exit(0)


def run_part(fn, world, libdir):
    """fn on world spawned ranks, bounded by PART_SECONDS; rank 0's value
    and every rank's error."""
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as outdir:
        ctx = mp.start_processes(_entry, args=(fn, world, port, libdir, outdir), nprocs=world, join=False,
                                 start_method="spawn")
        deadline = time.monotonic() + PART_SECONDS
        while not ctx.join(timeout=1):
            if time.monotonic() > deadline:
                for p in ctx.processes:
                    p.kill()
                return None, ["%s did not finish within %ds" % (fn.__name__, PART_SECONDS)]
        results, errors = [], []
        for r in range(world):
            path = os.path.join(outdir, "rank%d.json" % r)
            if not os.path.exists(path):
                errors.append("rank %d left no result" % r)
                continue
            with open(path) as f:
                res = json.load(f)
            if "error" in res:
                errors.append("rank %d: %s" % (r, res["error"]))
            else:
                results.append(res["value"])
        return (results[0] if results else None), errors


def main():
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    libdir, out_json = sys.argv[1], sys.argv[2]
    import torch

    report = {"torch": torch.__version__, "cuda": torch.version.cuda}
    if not torch.cuda.is_available():
        print("gpu-hooks-check: torch sees no GPU: nothing to check")
        report["skipped"] = "torch sees no GPU"
        with open(out_json, "w") as f:
            json.dump(report, f, indent=1)
        return 2
    world = torch.cuda.device_count()
    report["ranks"] = world
    report["device"] = torch.cuda.get_device_name(0)
    failed = []
    for part, fn in (("ddp", ddp_rank), ("fsdp2", fsdp_rank)):
        t0 = time.perf_counter()
        value, errors = run_part(fn, world, libdir)
        report[part] = {"value": value, "errors": errors, "seconds": time.perf_counter() - t0}
        print("== %s on %d rank(s) of %s (%.1f s)" % (part, world, report["device"], time.perf_counter() - t0))
        for e in errors:
            print("ERROR", e)
            failed.append("%s: %s" % (part, e.splitlines()[-1] if e else e))
        if not value or "runs" not in value:
            print(value)
            continue
        default = None
        for name, run in value["runs"].items():
            default = default or run["median_ms"]
            line = "%-26s median step %8.2f ms  (%.2f× the first)" % (name, run["median_ms"], run["median_ms"] / default)
            if "rel_error" in run:
                line += "  gradient rel. error %.2e" % run["rel_error"]
            if "stats" in run:
                line += "  %s own NCCL=%s" % (run["stats"], run["own_nccl"])
            print(line)
            spec = name.split()[-1]
            if "stats" in run:
                if not run["own_nccl"] or run["stats"]["compressed"] == 0:
                    failed.append("%s: the engine did not carry compressed buckets on its own NCCL (%s)" % (name, run))
                bound = BOUNDS.get(spec, 0.02)
                if not run.get("rel_error", 0) < bound:
                    failed.append("%s: gradient rel. error %s over %g" % (name, run.get("rel_error"), bound))
    report["failed"] = failed
    with open(out_json, "w") as f:
        json.dump(report, f, indent=1)
    print("gpu-hooks-check: %d check(s) failed%s" % (len(failed), "".join("\n  " + f for f in failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
