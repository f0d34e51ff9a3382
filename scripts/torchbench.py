"""One rank of scripts/torchbench: DDP step time of an MLP (~1.09M params)
under several communication hooks over gloo, their steps interleaved (one
step of each hook in turn, a different one first each round) so that a change in the machine's load falls on
all of them alike. Rank 0 prints one JSON object per hook.

usage: torchbench.py RANK WORLD MASTER_ADDR PORT LINK HOOKS [STEPS [BATCH]]
       torchbench.py --check HOOKS WORLD REFUSED_JSONL

HOOKS is a comma-separated list of:

  default                   torch's all-reduce (no hook)
  fp16, torch:fp16          torch's default_hooks.fp16_compress_hook
  torch:bf16                torch's default_hooks.bf16_compress_hook
  torch:allreduce           torch's default_hooks.allreduce_hook: the default
                            exchange as a Python hook (what any Python hook
                            pays over DDP's built-in C++ one)
  torch:powersgd:R          torch's powerSGD_hook, matrix_approximation_rank R
  torch:batched-powersgd:R  torch's batched_powerSGD_hook, rank R
  local                     no exchange at all: each rank keeps its own
                            gradient; the floor any hook's step time could reach
  a gradcomp spec           gradcomp.torch.hook: the engine, with error
                            feedback and the cost model; "@compressed" or
                            "@dense" pins the decision (e.g. "int4@compressed")

each optionally suffixed "/sync" (gradcomp's only: overlap=False), a
strategy (gradcomp's only: "/hier" for strategy="hier", the hierarchical
exchange over the nodes scripts/torchbench -nodes made, the ranks'
LOCAL_RANK and LOCAL_WORLD_SIZE saying where they run; "/sra",
"/allgather", "/sparse-gather") and/or
"/1bucket" (DDP's bucket_cap_mb set to the model's size, so that from torch
2.x on, where an explicit cap is also the first bucket's, the model is one
bucket; e.g. "torch:powersgd:2/1bucket"). gradcomp's rows carry the hook's
counters (bytes sent per rank in the last step) and its last step's
per-bucket statistics; every row carries the torch version and the number
of DDP buckets at the end.

The PowerSGD hooks get torch's PowerSGDState with its defaults
(min_compression_rate 2, error feedback, warm start, random_seed 0) except
start_powerSGD_iter: POWERSGD_START = 10, the value in the example of
powerSGD_hook's docstring. Torch's default, 1000, would leave every step of
a short run a plain all-reduce; its docstring advises starting from 10 % of
the training's steps.

--check, run before the ranks, decides which of torch's hooks in HOOKS run
(torch_hook_refusal: the hooks this torch lacks, those that raise in 12
steps of this model on a 1-rank gloo group, the PowerSGD hooks where they
crash ranks on gloo). It prints the hooks to run, comma-separated, and
appends a JSON row {"hook", "refused", "torch"} per refused hook to
REFUSED_JSONL. With TORCHBENCH_RUN_REFUSED=1 refused hooks are still
listed there but run anyway (to see them fail).
"""

import datetime
import json
import math
import os
import statistics
import sys
import time
import traceback

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp.torch as gct

GRADCOMP_WARMUP = 10  # gradcomp's dense warm-up steps
VERIFY = 8  # steps of the engine's first online verification (overlap.VerifyWindow) (alternating the decided configuration and the other)
WARMUP = GRADCOMP_WARMUP + VERIFY + 2  # untimed steps: gradcomp's warm-up and first verification, and 2 more
SYNC = "sync"
ONE_BUCKET = "1bucket"
#: gradcomp's strategy suffixes: "/hier" runs State(strategy="hier"), and
#: so on; without one, "auto".
STRATEGIES = ("hier", "sra", "allgather", "sparse-gather")

#: start_powerSGD_iter of torch's PowerSGD hooks here (see the docstring).
POWERSGD_START = 10
#: The prefix of torch's hooks (and "fp16", kept for torch's fp16 hook).
TORCH = "torch:"
#: The first torch whose PowerSGD hooks were seen to run on gloo here.
POWERSGD_TORCH = (2, 15)


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


#: The ranks of this rank's node (scripts/torchbench sets LOCAL_WORLD_SIZE).
LOCAL_SIZE = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))


def node_sent():
    """The bytes this network namespace's interfaces but lo have sent
    (/proc/net/dev): in scripts/torchbench's namespaces, what left the
    node."""
    total = 0
    with open("/proc/net/dev") as f:
        for line in f:
            name, sep, counters = line.partition(":")
            if sep and name.strip() != "lo":
                total += int(counters.split()[8])
    return total


def split_name(name):
    """A HOOKS entry as (base, flags): "int4@compressed/sync" →
    ("int4@compressed", {"sync"}). ValueError on an unknown flag."""
    base, *flags = name.split("/")
    flags = set(flags)
    unknown = flags - {SYNC, ONE_BUCKET, *STRATEGIES}
    if unknown or not base:
        raise ValueError("hook %r: unknown suffix %s (want /sync, /1bucket or a strategy: /%s)"
                         % (name, "/".join(sorted(unknown)), ", /".join(STRATEGIES)))
    if len(flags & set(STRATEGIES)) > 1:
        raise ValueError("hook %r: more than one strategy" % name)
    return base, flags


#: default_hooks' functions whose names are not KIND_compress_hook.
HOOK_FUNCTIONS = {"allreduce": "allreduce_hook"}


def torch_hook_kind(base):
    """torch's hook named by base as (kind, rank): ("fp16", None),
    ("bf16", None), ("powersgd", R), ("batched-powersgd", R); None when
    base is not one of torch's hooks. ValueError on a malformed name."""
    if base == "fp16":
        return "fp16", None
    if not base.startswith(TORCH):
        return None
    kind, _, rank = base[len(TORCH):].partition(":")
    if kind in ("fp16", "bf16", "allreduce") and not rank:
        return kind, None
    if kind in ("powersgd", "batched-powersgd") and rank.isdigit() and int(rank) >= 1:
        return kind, int(rank)
    raise ValueError("hook %r: want torch:fp16, torch:bf16, torch:allreduce, torch:powersgd:R or "
                     "torch:batched-powersgd:R" % base)


def torch_version():
    """torch's (major, minor)."""
    major, minor = torch.__version__.split(".")[:2]
    return int(major), int(minor)


def torch_hook_missing(kind):
    """Why this torch cannot run torch's hook kind at all, or None: the
    hook is absent, or (the PowerSGD hooks) this torch is older than
    POWERSGD_TORCH."""
    if kind in ("fp16", "bf16", "allreduce"):
        name = HOOK_FUNCTIONS.get(kind, kind + "_compress_hook")
        if getattr(default_hooks, name, None) is None:
            return "torch %s has no default_hooks.%s" % (torch.__version__, name)
        return None
    try:
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd
    except ImportError as e:
        return "torch %s has no PowerSGD hooks (%s)" % (torch.__version__, e)
    fn = "powerSGD_hook" if kind == "powersgd" else "batched_powerSGD_hook"
    if getattr(psgd, fn, None) is None:
        return "torch %s has no powerSGD_hook.%s" % (torch.__version__, fn)
    if torch_version() < POWERSGD_TORCH:
        return (
            "torch %s: not run. torch 1.13's powerSGD_hook aborted a rank on gloo here (4 ranks, 2 DDP "
            "buckets: SIGABRT, gloo EnforceNotMet op.preamble.length <= op.nbytes; the other ranks then "
            "failed, connection reset); the PowerSGD hooks were seen to run only on torch 2.15, with one "
            "bucket; versions between were not tried" % torch.__version__
        )
    return None


def register_torch_hook(ddp, kind, rank):
    """Registers torch's hook kind (matrix approximation rank for the
    PowerSGD hooks) on ddp; returns the PowerSGDState, or None."""
    if kind in ("fp16", "bf16", "allreduce"):
        ddp.register_comm_hook(None, getattr(default_hooks, HOOK_FUNCTIONS.get(kind, kind + "_compress_hook")))
        return None
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

    state = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=POWERSGD_START)
    ddp.register_comm_hook(state, psgd.powerSGD_hook if kind == "powersgd" else psgd.batched_powerSGD_hook)
    return state


def ddp_kwargs(module, flags):
    """DDP's keywords for flags: /1bucket → bucket_cap_mb the module's
    parameter size (MiB, rounded up)."""
    if ONE_BUCKET not in flags:
        return {}
    size = sum(p.numel() * p.element_size() for p in module.parameters())
    return {"bucket_cap_mb": max(1, math.ceil(size / 2**20))}


def ddp_buckets(ddp):
    """The number of DDP's buckets now (after its first two steps: the
    final layout), or None where torch does not say."""
    get = getattr(ddp.reducer, "_get_zeros_like_grad_buckets", None)
    return len(get()) if get is not None else None


def _error(e):
    """An exception as one line: type, message's first line, innermost frame."""
    msg = (str(e).strip().splitlines() or [""])[0]
    tb = traceback.extract_tb(e.__traceback__)
    where = " (%s:%d in %s)" % (os.path.basename(tb[-1].filename), tb[-1].lineno, tb[-1].name) if tb else ""
    return "%s%s%s" % (type(e).__name__, ": " + msg if msg else "", where)


def torch_hook_refusal(name, make_module, x, world):
    """Why torch's hook `name` (a HOOKS entry) must not run on `world`
    gloo ranks of make_module()'s model, or None. Needs an initialized
    1-rank gloo group: there the hook runs POWERSGD_START + 2 steps of the
    model on the batch x (loss: the mean squared output). Refused:

    * a hook this torch lacks, and the PowerSGD hooks before torch 2.15
      (torch_hook_missing);
    * a hook that raises in those steps (torch 1.13: bf16_compress_hook's
      TypeError on a build without CUDA 11 and NCCL 2.10; torch 1.13 and 2.15:
      batched_powerSGD_hook's AssertionError in _orthogonalize at its first
      compressed step);
    * on more than one rank, the PowerSGD hooks where DDP makes the model
      more than one bucket. powerSGD_hook issues its P and Q all-reduces
      from future callbacks; with two buckets, 4 ranks of torch 2.15 on
      gloo aborted (SIGABRT: gloo EnforceNotMet "op.preamble.length <=
      op.nbytes ... Is there a distributed collective mismatch") or hung
      until the timeout in every run tried (6 of 6), and ran in every run
      with one bucket (6 of 6).
    """
    base, flags = split_name(name)
    kind, rank = torch_hook_kind(base)
    if SYNC in flags:
        raise ValueError("hook %r: /sync is for gradcomp's hook" % name)
    why = torch_hook_missing(kind)
    if why:
        return why
    module = make_module()
    ddp = DDP(module, **ddp_kwargs(module, flags))
    try:
        register_torch_hook(ddp, kind, rank)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        for _ in range(POWERSGD_START + 2):
            opt.zero_grad()
            ddp(x).float().pow(2).mean().backward()
            opt.step()
    except Exception as e:  # noqa: BLE001 - any failure of torch's hook is the reason
        return "raised in %d steps on one rank: %s" % (POWERSGD_START + 2, _error(e))
    n = ddp_buckets(ddp)
    if world > 1 and kind.endswith("powersgd") and n != 1:
        return (
            "DDP made this model %s buckets: with more than one, runs of the PowerSGD hooks on gloo here "
            "(torch 2.15, 4 ranks, 2 buckets) aborted a rank (SIGABRT, gloo EnforceNotMet op.preamble.length "
            "<= op.nbytes: a collective mismatch) or hung, 6 of 6; /1bucket makes it one"
            % (n if n is not None else "an unknown number of")
        )
    return None


def init_one_rank():
    """A 1-rank gloo group in this process (an in-memory store: no port)."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=60))


class Run:
    """One hook's DDP model, optimizer and step times."""

    def __init__(self, name):
        self.name = name
        self.module = model()
        base, flags = split_name(name)
        self.ddp = DDP(self.module, **ddp_kwargs(self.module, flags))
        self.state = None
        self.powersgd = None
        kind = torch_hook_kind(base)
        if kind is not None:
            if flags & {SYNC, *STRATEGIES}:
                raise ValueError("hook %r: /sync and the strategies are for gradcomp's hook" % name)
            self.powersgd = register_torch_hook(self.ddp, *kind)
        elif base == "local":
            self.ddp.register_comm_hook(None, local_hook)
        elif base != "default":
            spec, _, decision = base.partition("@")
            self.state = gct.State(
                spec, decision=decision or "auto", model=self.module, warmup_steps=GRADCOMP_WARMUP, workers=1,
                overlap=SYNC not in flags, strategy=next(iter(flags & set(STRATEGIES)), "auto"),
            )
            self.ddp.register_comm_hook(self.state, gct.hook)
        self.opt = torch.optim.SGD(self.ddp.parameters(), lr=0.01)
        self.times = []
        self.untimed = []  # the untimed steps' times (ms): warm-up and the first verification window
        self.across = []  # per timed step, what the node's interfaces sent per rank (the largest over ranks)
        self.splits = []  # gradcomp: per timed engine step, State.last_split (this rank's)

    def step(self, x, y, timed):
        dist.barrier()
        sent = node_sent()
        start = time.perf_counter()
        self.opt.zero_grad()
        torch.nn.functional.cross_entropy(self.ddp(x), y).backward()
        self.opt.step()
        took = time.perf_counter() - start
        sent = node_sent() - sent
        t = torch.tensor([took, sent / LOCAL_SIZE], dtype=torch.float64)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)  # a step takes as long as its slowest rank
        if not timed:
            self.untimed.append(1e3 * float(t[0]))
        if timed:
            self.times.append(float(t[0]))
            self.across.append(float(t[1]))
            if self.state is not None and self.state.last_split is not None:
                self.splits.append(self.state.last_split)

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
            "torch": torch.__version__,
            "ddp_buckets": ddp_buckets(self.ddp),
            "across_bytes": statistics.median(self.across),
            "untimed_ms": [round(t, 1) for t in self.untimed],
        }
        if self.powersgd is not None:
            rate, before, after = self.powersgd.compression_stats()
            row["powersgd"] = {"start_iter": self.powersgd.start_powerSGD_iter, "iter": self.powersgd.iter,
                               "rate": rate, "numel_before": before, "numel_after": after}
        if self.state is not None:
            row["stats"] = self.state.stats
            last = self.state.last_step
            if last is not None:
                row["exposed_s"] = last.exposed_seconds
                row["buckets"] = [b._asdict() for b in last.buckets]
            if self.splits:  # each part's median over the timed steps, rank 0's
                row["split_ms"] = {k: statistics.median(s[k] for s in self.splits) for k in self.splits[0]}
        return row


def check(hooks, world, refused_path):
    """--check: prints the hooks of `hooks` to run; appends refused rows."""
    init_one_rank()
    force = os.environ.get("TORCHBENCH_RUN_REFUSED") == "1"
    run = []
    for name in hooks.split(","):
        base, _ = split_name(name)
        why = torch_hook_refusal(name, model, torch.randn(32, 1024), world) if torch_hook_kind(base) is not None else None
        if why:
            with open(refused_path, "a") as f:
                f.write(json.dumps({"hook": name, "refused": why, "torch": torch.__version__}) + "\n")
            print("torchbench.py: %s: refused%s: %s" % (name, " (run anyway: TORCHBENCH_RUN_REFUSED=1)" if force else "",
                                                         why), file=sys.stderr)
        if not why or force:
            run.append(name)
    print(",".join(run), flush=True)
    os._exit(0)  # no group teardown (see main)


def main():
    if sys.argv[1:2] == ["--check"]:
        if len(sys.argv) != 5:
            sys.exit("usage: torchbench.py --check HOOKS WORLD REFUSED_JSONL")
        try:
            check(sys.argv[2], int(sys.argv[3]), sys.argv[4])
        except ValueError as e:
            print("torchbench.py: %s" % e, file=sys.stderr)
            os._exit(2)
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
