"""Outer synchronization (DiLoCo, Streaming DiLoCo, SparseLoCo) against DDP
on a small transformer LM: validation loss, bytes sent and wall time.

    PYTHON scripts/diloco.py [--configs ddp,diloco,streaming,sparseloco,reference,torchft]
        [--workers 4] [--steps 300] [--sync-every 50] [--eval-every H]
        [--batch 16] [--context 64] [--layers 2] [--dim 64] [--heads 4]
        [--lr 1e-3] [--lr-warmup 20] [--weight-decay 0.01] [--seed 1]
        [--outer-lr 0.7] [--outer-momentum 0.9]
        [--fragments 4] [--delay 2] [--alpha 0.5]
        [--topk-ratio 0.02] [--feedback-decay 0.95] [--sparse-lr 1.0]
        [--decision compressed] [--torchft DIR] [--quick]
        [--timeout SECONDS] [--out out/diloco/results.jsonl]
    PYTHON scripts/diloco.py --report --run ID [--out ...]

PYTHON is the interpreter, and so the torch, of the script and of its
workers: torch 2.15's venv (~/.cache/gradcomp/torch-venv/bin/python) or
Debian's /usr/bin/python3 (torch 1.13). CPU only; the library must be
built (``make plugin``).

Model, data and inner optimizer are scripts/lm.py's (imported from it):
its character-level decoder-only transformer, the text of
/usr/share/common-licenses, worker r's batch at step s drawn from a
generator seeded by (seed, r, s) — the same tokens per worker in every
configuration — and AdamW with warm-up and cosine decay.

Configurations (--configs), each on --workers processes of their own (one
torch thread each, gloo), one after the other:

  ddp          torch DDP, its default all-reduce every step
  ddp:SPEC     DDP with gradcomp's hook (gradcomp.torch.State(SPEC)), e.g.
               ddp:int4, ddp:topk:0.01
  diloco       gradcomp.outer.DiLoCo: every H (--sync-every) steps, spec
               none (fp32), Nesterov outer lr --outer-lr, μ --outer-momentum
  streaming    F = --fragments fragments, τ = --delay, α = --alpha, int4
               with error feedback, Nesterov, the same H
  sparseloco   topk:R:chunk=4096:bits=2 (R = --topk-ratio), error feedback
               decayed by β = --feedback-decay, outer SGD lr --sparse-lr
  reference    DiLoCo in plain torch (scripts/outersync.py's Reference):
               fp32 all_reduce of the pseudo-gradients and
               torch.optim.SGD(nesterov=True); diloco must match it to
               rounding
  torchft      torchft.local_sgd.DiLoCo as the reference's set-up, when
               torchft imports (from --torchft DIR, a pip --target
               install, or the interpreter's own); else one line says why

Every --eval-every steps (default H) and after the last, all workers stop
at a barrier and worker 0 computes the validation loss (lm.py's) of the
weights the workers share (the outer configurations' global weights);
that time is left out of the training wall time. Per configuration a
JSON line goes to --out: the evaluations (step, loss, training seconds so
far), the final loss, bytes sent per worker (in total and the most in one
step — a synchronization step for the outer configurations; DDP's a ring
all-reduce's 2(W−1)/W·4·n per step), the training wall time and the
median inner-step time (forward, backward, optimizer step); for
configurations with --delay, the median inner step while a fragment is in
flight (its synchronization started within the last τ steps) and while
none is. Worker 0 saves the final shared weights next to --out
(params-LINK-CONFIG.pt), and the report adds one line per comparison with
reference (diloco, torchft): the largest |Δθ| and the difference of
final validation losses.

The report (printed at the end, or by --report --run ID over the lines of
that run, every link) is a table per link: final validation loss and its
ratio to ddp's, the time to reach ddp's validation loss at half its steps
(its last evaluation at or before steps/2), wall time, bytes and step
times.

scripts/diloco runs it over emulated links (--netns, --master, --port,
--link); --worker is the mode a worker process runs in. Exit status 1
when a configuration failed.
"""

import argparse
import datetime
import json
import os
import socket
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import lm  # noqa: E402  (scripts/lm.py: data, model, inner optimizer; puts plugin/python on sys.path)

DEFAULT_CONFIGS = "ddp,diloco,streaming,sparseloco,reference,torchft"
#: --quick: a tiny model and few steps (the smoke test's sizes).
QUICK = dict(steps=40, sync_every=10, batch=4, context=32, layers=1, dim=32, heads=2, lr_warmup=5)


def parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default=DEFAULT_CONFIGS, help="comma-separated (see the docstring)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--sync-every", type=int, default=50, help="H: inner steps between synchronizations")
    p.add_argument("--eval-every", type=int, default=0, help="steps between evaluations (0: H)")
    p.add_argument("--batch", type=int, default=16, help="windows per worker per step")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3, help="inner AdamW's peak lr")
    p.add_argument("--lr-warmup", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--outer-lr", type=float, default=0.7)
    p.add_argument("--outer-momentum", type=float, default=0.9)
    p.add_argument("--fragments", type=int, default=4, help="streaming's F")
    p.add_argument("--delay", type=int, default=2, help="streaming's τ (τ·F < H)")
    p.add_argument("--alpha", type=float, default=0.5, help="streaming's α")
    p.add_argument("--topk-ratio", type=float, default=0.02, help="sparseloco's top-k ratio (0.01 to 0.03)")
    p.add_argument("--feedback-decay", type=float, default=0.95, help="sparseloco's β")
    p.add_argument("--sparse-lr", type=float, default=1.0, help="sparseloco's outer SGD lr")
    p.add_argument("--decision", choices=("compressed", "auto", "dense"), default="compressed",
                   help="gradcomp's decision (compressed: the codec always, reproducible)")
    p.add_argument("--torchft", default="", help="a directory to import torchft from (pip install --target)")
    p.add_argument("--quick", action="store_true", help="smoke test: %s" % QUICK)
    p.add_argument("--timeout", type=int, default=0, help="seconds per configuration (0: 120 + 1 per step)")
    p.add_argument("--collective-timeout", type=int, default=60, help="seconds, gloo's and gradcomp's")
    p.add_argument("--out", default=os.path.join("out", "diloco", "results.jsonl"))
    p.add_argument("--report", action="store_true", help="print the report of --run from --out, and exit")
    p.add_argument("--run", default="", help="the run's id in --out (default: now)")
    p.add_argument("--link", default="local", help="the link's name in the rows")
    p.add_argument("--netns", default="", help="PREFIX: worker r runs in network namespace PREFIXr<r> (scripts/diloco)")
    p.add_argument("--master", default="127.0.0.1", help="worker 0's address")
    p.add_argument("--port", type=int, default=0, help="worker 0's port (0: a free one)")
    p.add_argument("--worker", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--config", default="", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.quick:
        for k, v in QUICK.items():
            setattr(a, k, v)
    a.eval_every = a.eval_every or a.sync_every
    if a.dim % a.heads:
        p.error("--dim %d must be a multiple of --heads %d" % (a.dim, a.heads))
    if min(a.steps, a.sync_every, a.eval_every, a.workers) < 1:
        p.error("--steps, --sync-every, --eval-every and --workers must be ≥ 1")
    if a.delay * a.fragments >= a.sync_every:
        p.error("--delay %d × --fragments %d must be < --sync-every %d" % (a.delay, a.fragments, a.sync_every))
    a.timeout = a.timeout or 120 + a.steps
    a.run = a.run or datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    return a


# ---- one worker


def train(rank, world, a, trn, val):
    """Trains configuration a.config on this worker; worker 0's row (the
    others' None)."""
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    import outersync

    model = lm.make_model(256, a.context, a.layers, a.dim, a.heads, a.seed)
    inner = lm.adamw(model, a)
    sync = outersync.build(a.config, model, inner, rank, world, a)
    probe = lm.make_model(256, a.context, a.layers, a.dim, a.heads, a.seed) if rank == 0 else None
    evals, inner_s, inflight, sync_s, sent = [], [], [], 0.0, []
    last_start = -10**9  # the last step whose report started a fragment
    dist.barrier()
    clock, paused = time.perf_counter(), 0.0
    for step in range(1, a.steps + 1):
        x, y = lm.batch_at(trn, a, rank, step - 1)
        for g in inner.param_groups:
            g["lr"] = lm.lr_at(step - 1, a)
        t0 = time.perf_counter()
        inner.zero_grad(set_to_none=True)
        logits = sync.net(x)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1)).backward()
        inner.step()
        t1 = time.perf_counter()
        inner_s.append(t1 - t0)
        inflight.append(0 < step - last_start <= sync.delay)
        nbytes, started = sync.after_step(step)
        sync_s += time.perf_counter() - t1
        sent.append(nbytes)
        if started:
            last_start = step
        if step % a.eval_every == 0 or step == a.steps:
            dist.barrier()
            t_eval = time.perf_counter()
            if rank == 0:
                with torch.no_grad():
                    for p, g in zip(probe.parameters(), sync.global_params()):
                        p.copy_(g)
                evals.append((step, lm.evaluate(probe, val, a), t_eval - clock - paused))
                print("  %-12s %-8s step %4d  val %.4f  (%.0f s training)" % (a.config, a.link, *evals[-1]),
                      flush=True)
            dist.barrier()
            paused += time.perf_counter() - t_eval
    wall = time.perf_counter() - clock - paused
    if rank == 0:
        torch.save([g.detach().clone() for g in sync.global_params()], params_path(a, a.link, a.config))
    sync.close()
    if rank != 0:
        return None
    idle = [t for t, f in zip(inner_s, inflight) if not f]
    busy = [t for t, f in zip(inner_s, inflight) if f]
    return {"evals": evals, "final_val_loss": evals[-1][1], "wall_s": wall, "nparams": sum(
        p.numel() for p in model.parameters()), "bytes_total": sum(sent), "bytes_peak": max(sent),
        "syncs": sum(1 for b in sent if b), "inner_median_s": statistics.median(inner_s),
        "inner_inflight_median_s": statistics.median(busy) if busy else None,
        "inner_idle_median_s": statistics.median(idle) if idle else None, "sync_call_s": sync_s}


def worker(a):
    """One worker process (--worker R): joins the group, trains, and on
    worker 0 appends the configuration's row to a.out."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if a.torchft:
        sys.path.insert(0, a.torchft)
    rank, world = a.worker, a.workers
    data, _ = lm.corpus()
    train_bytes, val_bytes = lm.split(data)
    row = row_head(a, a.config)
    status = 0
    try:
        dist.init_process_group("gloo", init_method="tcp://%s:%d" % (a.master, a.port), rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=a.collective_timeout))
        trn = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8).long()
        val = torch.frombuffer(bytearray(val_bytes), dtype=torch.uint8).long()
        out = train(rank, world, a, trn, val)
        if out is not None:
            row.update(out)
        dist.barrier()
    except BaseException:
        status = 1
        row["error"] = "worker %d: %s" % (rank, traceback.format_exc())
        print(row["error"], file=sys.stderr, flush=True)
    if rank == 0:
        append(a.out, row)
    sys.stdout.flush()
    sys.stderr.flush()
    # No destroy_process_group and no interpreter teardown (as scripts/lm.py).
    os._exit(status)


# ---- the parent


def row_head(a, config):
    """What every row of configuration config carries."""
    import torch

    keys = ("run", "link", "workers", "steps", "sync_every", "eval_every", "batch", "context", "layers", "dim",
            "heads", "lr", "lr_warmup", "weight_decay", "seed", "outer_lr", "outer_momentum", "fragments",
            "delay", "alpha", "topk_ratio", "feedback_decay", "sparse_lr", "decision")
    row = {"config": config, "torch": torch.__version__, "python": sys.executable,
           "time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")}
    row.update({k: getattr(a, k) for k in keys})
    return row


def append(path, row):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row) + "\n")


def has_row(path, run, link, config):
    """Whether path holds a row of config on link in run."""
    if not os.path.exists(path):
        return False
    with open(path) as f:
        rows = [json.loads(x) for x in f if x.strip()]
    return any(r.get("run") == run and r.get("link") == link and r.get("config") == config for r in rows)


def params_path(a, link, config):
    """Where worker 0 saves config's final shared weights on link."""
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    return os.path.join(os.path.dirname(os.path.abspath(a.out)), "params-%s-%s.pt" % (link, config))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchft_missing(a):
    """Why torchft cannot run here (a line), or None."""
    cmd = [sys.executable, "-c", "import sys; sys.path.insert(0, sys.argv[1]); import torchft.local_sgd",
           a.torchft or os.devnull]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        return "import torchft.local_sgd took over 120 s"
    if r.returncode:
        return "import torchft.local_sgd failed: %s (--torchft DIR: a pip --target install)" % (
            (r.stderr.strip().splitlines() or ["status %d" % r.returncode])[-1])
    return None


def run_config(a, argv, config):
    """Runs config on a.workers worker processes (in a.netns's namespaces
    when given), bounded by a.timeout; the row is worker 0's."""
    port = a.port or free_port()
    procs = []
    for r in range(a.workers):
        cmd = [sys.executable, os.path.abspath(__file__), *argv, "--worker", str(r), "--config", config,
               "--run", a.run, "--port", str(port), "--master", a.master]
        if a.netns:
            cmd = ["ip", "netns", "exec", "%sr%d" % (a.netns, r), "env", "GLOO_SOCKET_IFNAME=%sv%d" % (a.netns, r),
                   *cmd]
        procs.append(subprocess.Popen(cmd))
    deadline, error = time.monotonic() + a.timeout, None
    for r, p in enumerate(procs):
        try:
            p.wait(max(1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            error = "%s: workers did not finish within %d s" % (config, a.timeout)
            break
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    statuses = [p.returncode for p in procs]
    if error is None and any(statuses):
        error = "%s: worker exit statuses %s" % (config, statuses)
    return error


def main(argv):
    a = parse(argv)
    if a.report:
        return report(a)
    if a.worker >= 0:
        return worker(a)
    import torch

    configs = [c.strip() for c in a.configs.split(",") if c.strip()]
    n = sum(p.numel() for p in lm.make_model(256, a.context, a.layers, a.dim, a.heads, a.seed).parameters())
    print("scripts/diloco.py: torch %s (%s), run %s, link %s: %d workers × batch %d × context %d, %d layers, dim %d:"
          " %d parameters, %d steps, H %d" % (torch.__version__, sys.executable, a.run, a.link, a.workers, a.batch,
                                            a.context, a.layers, a.dim, n, a.steps, a.sync_every), flush=True)
    failed = False
    for c in configs:
        why = torchft_missing(a) if c == "torchft" else None
        if why:
            print("torchft: not run: %s" % why, flush=True)
            append(a.out, dict(row_head(a, c), skipped=why))
            continue
        t0 = time.monotonic()
        error = run_config(a, argv, c)
        print("%s: %s in %.0f s%s" % (c, "failed" if error else "done", time.monotonic() - t0,
                                      ": " + error if error else ""), flush=True)
        if error:
            failed = True
            if not has_row(a.out, a.run, a.link, c):  # worker 0 left none: killed, or died
                append(a.out, dict(row_head(a, c), error=error))
    report(a)
    return 1 if failed else 0


def report(a):
    """Prints the tables of run a.run from a.out and appends the exactness
    rows; 1 when a configuration of the run has no result."""
    import diloco_report

    return diloco_report.report(a.out, a.run, lambda link, config: params_path(a, link, config), append)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
