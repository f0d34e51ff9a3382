"""Runs a function on several CPU ranks (gloo over TCP on 127.0.0.1), bounded.

``run(fn, world, *args, timeout=...)`` starts ``world`` processes with
torch.multiprocessing's spawn method; each calls ``fn(rank, world, *args)``
inside an initialized gloo process group (``init=False``: in torchrun's
environment, where ``fn`` initializes it, or a framework does) and
returns a JSON-serializable value; ``run`` returns the values by rank.
Each rank ends with os._exit (see _entry). A rank that raises fails the run
with its traceback; a run past ``timeout`` seconds is killed and fails: a
test never hangs.
"""

import datetime
import json
import os
import socket
import tempfile
import time
import traceback

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

#: Seconds a gloo collective may wait before failing.
COLLECTIVE_TIMEOUT = 60


def free_port():
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_env(rank, world):
    """What torchrun sets in a rank's environment on one node, beside
    MASTER_ADDR and MASTER_PORT (OMP_NUM_THREADS=1: its default with
    several ranks on a node)."""
    return {"RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(world),
            "GROUP_RANK": "0", "OMP_NUM_THREADS": "1"}


def _entry(rank, fn, world, port, outdir, args, barrier=True, init=True):
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    try:
        if init:
            dist.init_process_group(
                "gloo", rank=rank, world_size=world, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT)
            )
        else:
            os.environ.update(torchrun_env(rank, world))
        result = {"value": fn(rank, world, *args)}
        if barrier and dist.is_initialized():
            dist.barrier()  # every rank is done with the group
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(outdir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    # No destroy_process_group and no interpreter teardown: in torch 1.13,
    # destroying a gloo group holds the GIL while it joins the group's
    # threads, and a thread still releasing a finished collective's tensors
    # needs the GIL: the rank hangs (seen here) or aborts.
    os._exit(0)


def run(fn, world, *args, timeout=120, dies=(), init=True):
    """Runs fn(rank, world, *args) on ``world`` ranks; returns their values
    by rank. Raises AssertionError naming the rank on an error or timeout.
    Ranks in ``dies`` are expected to end without a result (their value is
    None; no rank waits in a final barrier then). ``init=False``: fn runs
    before the process group exists, in torchrun's environment
    (:func:`torchrun_env`), and initializes it itself (env://), or has a
    framework do it."""
    with tempfile.TemporaryDirectory(prefix="gradcomp-ranks-") as outdir:
        ctx = mp.start_processes(
            _entry, args=(fn, world, free_port(), outdir, args, not dies, init), nprocs=world, join=False,
            start_method="spawn",
        )
        deadline = time.monotonic() + timeout
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    raise AssertionError("ranks did not finish within %ds" % timeout)
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join()
        results = []
        for rank in range(world):
            path = os.path.join(outdir, "rank%d.json" % rank)
            if rank in dies:
                results.append(None)
                continue
            if not os.path.exists(path):
                raise AssertionError("rank %d left no result" % rank)
            with open(path) as f:
                r = json.load(f)
            if "error" in r:
                raise AssertionError("rank %d failed:\n%s" % (rank, r["error"]))
            results.append(r["value"])
        return results
