"""Convergence of a small character-level transformer LM under gradcomp's hooks.

    PYTHON scripts/lm.py [--hooks default,powersgd:2] [--ranks 4] [--steps 1000]
        [--batch 16] [--context 64] [--layers 2] [--dim 128] [--heads 4]
        [--lr 1e-3] [--lr-warmup 20] [--weight-decay 0.01] [--seed 1]
        [--eval-every 100] [--decision compressed|auto|dense] [--warmup-steps 10]
        [--timeout SECONDS] [--out out/lm/results.jsonl] [--verbose]

PYTHON is the interpreter, and so the torch, of the parent and of its ranks
(spawned with it): /usr/bin/python3 (Debian's torch 1.13) or a venv's, e.g.
~/.cache/gradcomp/torch-venv/bin/python (torch 2.15). CPU only, gloo. The
script puts ../plugin/python (relative to itself) on sys.path; the library
must be built (``make plugin``).

What it checks: whether a compressed exchange keeps a small transformer
language model trained with AdamW on text that ships with the machine
within 1 % of the uncompressed validation loss at the same steps.

Data: the regular files of /usr/share/common-licenses (symlinks skipped,
sorted by name) concatenated, as bytes (vocabulary 256). The text is cut
into blocks of 1024 bytes; every 10th block (block 9, 19, ...) goes to the
validation text, the others to the training text (a fixed 90/10 split).
The corpus's SHA-256 is printed and recorded.

Model: a decoder-only transformer of our own (torch.nn only): token and
learned position embeddings, --layers pre-LayerNorm blocks of causal
multi-head self-attention and a 4×dim GELU MLP, a final LayerNorm, the
output layer tied to the token embedding; no dropout; initialized from
--seed (normal 0.02 weights, zero biases).

Training, per hook: --ranks processes (torch.multiprocessing spawn,
init_method file:// in a fresh temporary directory, gloo, one torch thread
each), DDP, AdamW (lr --lr, linear warm-up over --lr-warmup steps then
cosine decay to 0.1·lr at --steps, weight decay --weight-decay on the
matrices and embeddings, none on biases and LayerNorms). Rank r's batch at
step s is --batch random windows of the training text drawn from a
generator seeded by (seed, r, s): the same data for every hook. Hook
"default" is torch's all-reduce (no hook registered); any other name is a
gradcomp spec (powersgd:2, powersgd:4, int8, topk:0.01, ...), registered as

    state = gradcomp.torch.State(spec, model=module, decision=D,
                                 warmup_steps=W, workers=1)
    ddp.register_comm_hook(state, gradcomp.torch.hook)

(D: --decision, "compressed" by default so the run is reproducible; W:
--warmup-steps dense steps first) and closed at the end. For reference,
"torch:powersgd:R" is torch's own powerSGD_hook (PowerSGDState with
matrix_approximation_rank R, start_powerSGD_iter W, torch's defaults
otherwise: error feedback and warm start on) with DDP's buckets made large
enough for one bucket (with more it crashes or hangs on gloo, see
docs/TORCH-HOOKS.md: the run fails at step 2 if DDP still has more than
one, as torch 1.13's DDP does). Each hook runs in ranks of its own,
bounded by --timeout seconds (default 120 + 0.4·steps): a hook that
raises or hangs gets an error row (the first failing rank's traceback is
printed) and the next hook runs.

The defaults (437,760 parameters, 1000 steps) take about 3 minutes per
hook with 4 ranks on a 2-core machine (0.1–0.2 s a step); at 300 steps
the model is still near 2.4 nats/byte, before it learns much beyond
pairs of bytes, so the comparison runs longer.

Every --eval-every steps and after the last, rank 0 computes the
validation loss (mean cross-entropy in nats per byte) over every
non-overlapping window of --context bytes of the validation text (the
same windows for every hook).

Prints, as it goes, one line per evaluation; at the end a table of
validation loss per evaluated step and hook, then a table per hook: final
validation loss, its ratio to default's (and whether it is within 1 %),
the median step time (rank 0, forward + backward + optimizer step, over
the steps after the hook's warm-up), rank 0's bytes sent per step (the
engine's count for gradcomp over the whole run; for default a ring
all-reduce's 2(N−1)/N·4·parameters) and the bucket-steps compressed.
Appends one JSON line per hook to --out (default out/lm/results.jsonl).
Exit status 1 when a hook failed, else 0.
"""

import argparse
import datetime
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "plugin", "python"))

LICENSES = "/usr/share/common-licenses"
BLOCK = 1024  # split block, bytes
VAL_EVERY = 10  # every 10th block is validation
COLLECTIVE_TIMEOUT = 60  # seconds, gloo and gradcomp
TORCH_PSGD = "torch:powersgd:"  # torch's own hook, hook name torch:powersgd:R


# ---- data


def corpus(root=LICENSES):
    """The corpus bytes (regular files under root, sorted, symlinks
    skipped) and the names of the files."""
    names = sorted(n for n in os.listdir(root)
                   if os.path.isfile(os.path.join(root, n)) and not os.path.islink(os.path.join(root, n)))
    parts = []
    for n in names:
        with open(os.path.join(root, n), "rb") as f:
            parts.append(f.read())
    return b"".join(parts), names


def split(data):
    """(train, validation) bytes: every VAL_EVERY-th block of BLOCK bytes
    goes to validation."""
    train, val = [], []
    for i in range(0, len(data), BLOCK):
        (val if (i // BLOCK) % VAL_EVERY == VAL_EVERY - 1 else train).append(data[i:i + BLOCK])
    return b"".join(train), b"".join(val)


# ---- model


def make_model(vocab, context, layers, dim, heads, seed):
    import torch
    from torch import nn

    class Attention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(dim, 3 * dim)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            b, t, c = x.shape
            q, k, v = self.qkv(x).split(dim, dim=2)
            q, k, v = (z.view(b, t, heads, c // heads).transpose(1, 2) for z in (q, k, v))
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // heads))
            mask = torch.ones(t, t, dtype=torch.bool).triu(1)
            att = att.masked_fill(mask, float("-inf")).softmax(dim=-1)
            y = (att @ v).transpose(1, 2).reshape(b, t, c)
            return self.proj(y)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1 = nn.LayerNorm(dim)
            self.attn = Attention()
            self.ln2 = nn.LayerNorm(dim)
            self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

        def forward(self, x):
            x = x + self.attn(self.ln1(x))
            return x + self.mlp(self.ln2(x))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.tok = nn.Embedding(vocab, dim)
            self.pos = nn.Embedding(context, dim)
            self.blocks = nn.ModuleList(Block() for _ in range(layers))
            self.ln = nn.LayerNorm(dim)

        def forward(self, idx):
            t = idx.shape[1]
            x = self.tok(idx) + self.pos(torch.arange(t))
            for blk in self.blocks:
                x = blk(x)
            return self.ln(x) @ self.tok.weight.t()  # tied output layer

    torch.manual_seed(seed)
    model = LM()
    for m in model.modules():
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
    return model


def adamw(module, a):
    """AdamW with lr a.lr, weight decay a.weight_decay on the matrices and
    embeddings (parameters of 2 or more dimensions), none on biases and
    LayerNorms."""
    import torch

    decay = [p for p in module.parameters() if p.dim() >= 2]
    no_decay = [p for p in module.parameters() if p.dim() < 2]
    return torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=a.lr)


def lr_at(step, a):
    """Linear warm-up over a.lr_warmup steps, then cosine to 0.1·lr."""
    if step < a.lr_warmup:
        return a.lr * (step + 1) / a.lr_warmup
    frac = (step - a.lr_warmup) / max(1, a.steps - a.lr_warmup)
    return a.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


# ---- one rank


def batch_at(train, a, rank, step):
    import torch

    g = torch.Generator()
    g.manual_seed((a.seed * 1000003 + rank * 10007 + step) & 0x7FFFFFFF)
    starts = torch.randint(0, len(train) - a.context - 1, (a.batch,), generator=g)
    idx = starts[:, None] + torch.arange(a.context + 1)[None, :]
    w = train[idx]
    return w[:, :-1], w[:, 1:]


def evaluate(model, val, a):
    """Mean cross-entropy (nats/byte) over every non-overlapping window of
    a.context (+1 target) bytes of val."""
    import torch
    import torch.nn.functional as F

    n = (len(val) - 1) // a.context
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for i in range(0, n, 64):
            j = min(n, i + 64)
            starts = torch.arange(i, j) * a.context
            idx = starts[:, None] + torch.arange(a.context + 1)[None, :]
            w = val[idx]
            logits = model(w[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), w[:, 1:].reshape(-1), reduction="sum")
            total += loss.item()
            count += w[:, 1:].numel()
    model.train()
    return total / count


def train(rank, world, hook_name, a, train_bytes, val_bytes):
    import logging

    import torch
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel as DDP

    logging.basicConfig(level=logging.INFO if (a.verbose and rank == 0) else logging.WARNING,
                        format="rank %d %%(name)s %%(levelname)s %%(message)s" % rank)
    trn = torch.frombuffer(bytearray(train_bytes), dtype=torch.uint8).long()
    val = torch.frombuffer(bytearray(val_bytes), dtype=torch.uint8).long()
    module = make_model(256, a.context, a.layers, a.dim, a.heads, a.seed)
    nparams = sum(p.numel() for p in module.parameters())
    state = tstate = None
    if hook_name.startswith(TORCH_PSGD):
        # torch's own powerSGD_hook, for reference: one DDP bucket (with
        # more, it crashes or hangs on gloo: docs/TORCH-HOOKS.md)
        from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as psgd

        size = sum(p.numel() * p.element_size() for p in module.parameters())
        ddp = DDP(module, bucket_cap_mb=max(1, math.ceil(4 * size / 2**20)))
        tstate = psgd.PowerSGDState(process_group=None, matrix_approximation_rank=int(hook_name[len(TORCH_PSGD):]),
                                    start_powerSGD_iter=a.warmup_steps)
        ddp.register_comm_hook(tstate, psgd.powerSGD_hook)
    else:
        ddp = DDP(module)
    if hook_name != "default" and tstate is None:
        import gradcomp.torch as gct

        state = gct.State(hook_name, model=module, decision=a.decision, warmup_steps=a.warmup_steps, workers=1,
                          timeout=float(COLLECTIVE_TIMEOUT))
        ddp.register_comm_hook(state, gct.hook)
    opt = adamw(module, a)
    evals, times, losses, buckets = [], [], [], None
    t_start = time.monotonic()
    for step in range(a.steps):
        x, y = batch_at(trn, a, rank, step)
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, a)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = ddp(x)
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        if step == 1:  # DDP's buckets are final after its first step
            buckets = _ddp_buckets(ddp)
            if tstate is not None and buckets is not None and buckets > 1:
                raise RuntimeError("%s: DDP has %d buckets: torch's powerSGD_hook needs one on gloo" %
                                   (hook_name, buckets))
        losses.append(loss.item())
        done = step + 1
        if rank == 0 and (done % a.eval_every == 0 or done == a.steps):
            v = evaluate(module, val, a)
            evals.append((done, v))
            print("  %-14s step %4d  train %.4f  val %.4f  (%.3f s/step, %.0f s)" % (
                hook_name, done, statistics.mean(losses[-a.eval_every:]), v,
                statistics.median(times[-a.eval_every:]), time.monotonic() - t_start), flush=True)
    out = {"evals": evals, "nparams": nparams, "ddp_buckets": buckets,
           "train_loss_last": statistics.mean(losses[-a.eval_every:])}
    # compressed steps only (after the hook's warm-up), the same range for every hook
    tail = times[a.warmup_steps:] or times
    out["median_step_s"] = statistics.median(tail)
    if state is not None:
        st = state.stats
        out["stats"] = {k: st[k] for k in ("compressed", "dense", "nonfinite", "engine_steps", "plain_steps",
                                           "bytes_sent_total")}
        out["bytes_per_step"] = st["bytes_sent_total"] / a.steps
        state.close()
    elif tstate is not None:  # the plain all-reduces, then the Ps, Qs and uncompressed tensors
        plain = min(a.steps, a.warmup_steps)
        after = tstate.compression_stats()[2]  # elements sent over the compressed steps
        out["bytes_per_step"] = 2 * (world - 1) / world * 4 * (plain * nparams + after) / a.steps
    else:
        out["bytes_per_step"] = 2 * (world - 1) * 4 * nparams / world
    return out


def _ddp_buckets(ddp):
    """DDP's number of buckets, or None where torch does not say."""
    get = getattr(ddp.reducer, "_get_zeros_like_grad_buckets", None)
    return len(get()) if get is not None else None


def _entry(rank, world, store, outdir, hook_name, a, train_bytes, val_bytes):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    try:
        dist.init_process_group("gloo", init_method="file://" + store, rank=rank, world_size=world,
                                timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
        result = {"value": train(rank, world, hook_name, a, train_bytes, val_bytes)}
        dist.barrier()
    except BaseException:
        result = {"error": traceback.format_exc()}
    with open(os.path.join(outdir, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    sys.stderr.flush()
    # No destroy_process_group and no interpreter teardown (as
    # tests/python/ranks.py): torch 1.13's gloo teardown can hang or abort.
    os._exit(0)


def run_hook(hook_name, a, train_bytes, val_bytes):
    """Runs one hook on a.ranks spawned ranks; returns (rank 0's result,
    error or None)."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory(prefix="gradcomp-lm-") as tmp:
        store = os.path.join(tmp, "store")
        ctx = mp.start_processes(_entry, args=(a.ranks, store, tmp, hook_name, a, train_bytes, val_bytes),
                                 nprocs=a.ranks, join=False, start_method="spawn")
        deadline = time.monotonic() + a.timeout
        error = None
        try:
            while not ctx.join(timeout=1):
                if time.monotonic() > deadline:
                    error = "ranks did not finish within %ds" % a.timeout
                    break
        except Exception as e:  # a rank died (signal, nonzero exit)
            error = "%s: %s" % (type(e).__name__, e)
        finally:
            for p in ctx.processes:
                if p.is_alive():
                    p.kill()
                    p.join(10)
        results = []
        for rank in range(a.ranks):
            path = os.path.join(tmp, "rank%d.json" % rank)
            if not os.path.exists(path):
                results.append({"error": "rank %d left no result" % rank})
                continue
            with open(path) as f:
                results.append(json.load(f))
        errs = [(r, res["error"]) for r, res in enumerate(results) if "error" in res]
        if errs:
            # the first failing rank in full, the others' last lines
            lines = ["rank %d: %s" % errs[0]] + ["rank %d: %s" % (r, e.strip().splitlines()[-1]) for r, e in errs[1:]]
            error = "\n".join(([error] if error else []) + lines)
        return results[0].get("value"), error


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--hooks", default="default,powersgd:2", help="comma-separated: default or gradcomp specs")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--steps", type=int, default=1000)
    p.add_argument("--batch", type=int, default=16, help="windows per rank per step")
    p.add_argument("--context", type=int, default=64)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--lr-warmup", type=int, default=20)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--decision", choices=("compressed", "auto", "dense"), default="compressed")
    p.add_argument("--warmup-steps", type=int, default=10, help="gradcomp's dense warm-up steps (≥ 2)")
    p.add_argument("--timeout", type=int, default=0, help="seconds per hook (0: 120 + 0.4 per step)")
    p.add_argument("--out", default=os.path.join("out", "lm", "results.jsonl"))
    p.add_argument("--verbose", action="store_true", help="gradcomp's INFO log on rank 0")
    a = p.parse_args()
    hooks = [h.strip() for h in a.hooks.split(",") if h.strip()]
    if not hooks:
        p.error("--hooks: none given")
    if a.dim % a.heads:
        p.error("--dim must be a multiple of --heads")
    if a.eval_every < 1 or a.steps < 1:
        p.error("--steps and --eval-every must be ≥ 1")
    if a.timeout <= 0:
        a.timeout = int(120 + 0.4 * a.steps)
    import torch

    data, names = corpus()
    sha = hashlib.sha256(data).hexdigest()
    train_bytes, val_bytes = split(data)
    nparams = sum(p.numel() for p in make_model(256, a.context, a.layers, a.dim, a.heads, a.seed).parameters())
    print("torch %s (%s), %d ranks × batch %d × context %d, %d layers, dim %d, %d heads: %d parameters"
          % (torch.__version__, sys.executable, a.ranks, a.batch, a.context, a.layers, a.dim, a.heads, nparams))
    print("corpus: %d files of %s, %d bytes (sha256 %s…): %d train, %d validation"
          % (len(names), LICENSES, len(data), sha[:16], len(train_bytes), len(val_bytes)))
    print("%d steps, AdamW lr %g (warm-up %d, cosine to 0.1×), weight decay %g, seed %d; gradcomp: decision %s, "
          "%d warm-up steps" % (a.steps, a.lr, a.lr_warmup, a.weight_decay, a.seed, a.decision, a.warmup_steps),
          flush=True)
    runs = {}
    for h in hooks:
        t0 = time.monotonic()
        value, error = run_hook(h, a, train_bytes, val_bytes)
        runs[h] = {"value": value, "error": error, "elapsed_s": time.monotonic() - t0}
        print("%s: %s in %.0f s" % (h, "failed" if error else "done", runs[h]["elapsed_s"]), flush=True)
        if error:
            print(error, flush=True)

    ok = {h: r["value"] for h, r in runs.items() if not r["error"] and r["value"]}
    base = ok["default"]["evals"][-1][1] if "default" in ok else None
    steps = sorted({s for v in ok.values() for s, _ in v["evals"]})
    if ok:
        print()
        print("validation loss (nats/byte) by step:")
        print("| step | " + " | ".join(ok) + " |")
        print("|---:|" + "---:|" * len(ok))
        for s in steps:
            row = []
            for v in ok.values():
                d = dict(v["evals"])
                row.append("%.4f" % d[s] if s in d else "—")
            print("| %d | %s |" % (s, " | ".join(row)))
    print()
    print("| hook | final val loss | ratio to default | within 1 % | median step (s) | bytes/step (rank 0) | "
          "compressed bucket-steps |")
    print("|---|---:|---:|---|---:|---:|---:|")
    stamp = datetime.datetime.now().isoformat(timespec="seconds")
    os.makedirs(os.path.dirname(os.path.abspath(a.out)), exist_ok=True)
    with open(a.out, "a") as f:
        for h, r in runs.items():
            v = r["value"]
            rec = {"time": stamp, "hook": h, "python": sys.executable, "torch": torch.__version__,
                   "ranks": a.ranks, "steps": a.steps, "batch": a.batch, "context": a.context, "layers": a.layers,
                   "dim": a.dim, "heads": a.heads, "lr": a.lr, "lr_warmup": a.lr_warmup,
                   "weight_decay": a.weight_decay, "seed": a.seed, "decision": a.decision,
                   "warmup_steps": a.warmup_steps, "corpus_sha256": sha, "elapsed_s": round(r["elapsed_s"], 1),
                   "error": r["error"]}
            if r["error"] or not v:
                print("| %s | failed: %s | — | — | — | — | — |" % (
                    h, (r["error"] or "no result").strip().splitlines()[-1].replace("|", "/")))
            else:
                final = v["evals"][-1][1]
                ratio = final / base if base else None
                st = v.get("stats")
                rec.update(final_val_loss=final, ratio=ratio, evals=v["evals"], median_step_s=v["median_step_s"],
                           bytes_per_step=v["bytes_per_step"], stats=st, nparams=v["nparams"],
                           train_loss_last=v["train_loss_last"])
                print("| %s | %.4f | %s | %s | %.3f | %.0f | %s |" % (
                    h, final, "%.4f" % ratio if ratio else "—",
                    ("yes" if ratio <= 1.01 else "NO") if ratio else "—", v["median_step_s"], v["bytes_per_step"],
                    "%d / %d" % (st["compressed"], st["compressed"] + st["dense"]) if st else "—"))
            f.write(json.dumps(rec) + "\n")
    print("\nappended %d lines to %s" % (len(runs), a.out))
    return 1 if any(r["error"] for r in runs.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
