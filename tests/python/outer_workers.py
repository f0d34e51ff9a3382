"""Rank side of test_outer: gradcomp.outer.DiLoCo on gloo ranks (run
through ranks.run in spawned processes), against references written here
in plain torch. Each function returns what the test checks, as JSON."""

import base64
import logging
import os

import torch
import torch.distributed as dist

#: The 2-rank cases' tensors: a matrix, a bias, a vector.
SHAPES = [(16, 8), (8,), (40,)]
INNER_LR = 0.1


def _target(rank, i, shape):
    return torch.randn(shape, generator=torch.Generator().manual_seed(100 * rank + i))


def _init(rank):
    """Rank ``rank``'s initial tensors (the loop makes rank 0's everyone's)."""
    g = torch.Generator().manual_seed(7 + rank)
    return [torch.randn(s, generator=g) for s in SHAPES]


def _inner(params, rank, s):
    """One inner SGD step on rank ``rank``'s quadratic ½‖p − target‖² plus
    a step's noise, in place."""
    with torch.no_grad():
        for i, p in enumerate(params):
            noise = torch.randn(p.shape, generator=torch.Generator().manual_seed(10000 * rank + 100 * s + i))
            p.sub_(INNER_LR * (p - _target(rank, i, p.shape) + 0.1 * noise))


def _flat(ts):
    return [float(v) for t in ts for v in t.detach().reshape(-1).tolist()]


def _bits(ts):
    """The tensors' float32 bits, for bit-for-bit comparisons in JSON."""
    return [int(v) for t in ts for v in t.detach().contiguous().reshape(-1).view(torch.int32).tolist()]


def _run(loop, params, rank, first, last):
    """Inner steps first+1 .. last, each followed by loop.step(); the
    reports as lists."""
    reports = []
    for s in range(first, last):
        _inner(params, rank, s)
        reports.append(list(loop.step()))
    return reports


def reference(rank, world, params0, steps, sync_every, group=None, inner=_inner):
    """DiLoCo in plain torch: each rank trains its local copy; every H
    steps the pseudo-gradients are all-reduced in fp32 and averaged, and
    torch.optim.SGD(nesterov=True, lr=0.7, momentum=0.9) steps the global
    weights, which the local ones then take."""
    glob = [torch.nn.Parameter(t.clone()) for t in params0]
    local = [t.clone() for t in params0]
    outer = torch.optim.SGD(glob, lr=0.7, momentum=0.9, nesterov=True)
    for s in range(steps):
        inner(local, rank, s)
        if (s + 1) % sync_every:
            continue
        for g, l in zip(glob, local):
            d = (g.detach() - l).contiguous()
            dist.all_reduce(d, group=group)
            g.grad = d / world
        outer.step()
        for g, l in zip(glob, local):
            l.copy_(g.detach())
    return [g.detach() for g in glob], local


def two_ranks(rank, world):
    """The 2-rank cases of test_outer, one loop after another on the
    default group."""
    import gradcomp.outer

    out = {"library": os.path.basename(gradcomp._lib.path())}
    init0 = _init(0)

    def diloco(sync_every, steps, noncontiguous=False):
        params = _init(rank)
        if noncontiguous:  # tensor 0 as a transposed view: the loop mirrors it
            params[0] = params[0].t().contiguous().t()
        with gradcomp.outer.DiLoCo(params, sync_every, timeout=30) as loop:
            reports = _run(loop, params, rank, 0, steps)
            glob = loop.global_params()
            mirrored = loop.tensors.mirrored
        ref_g, ref_l = reference(rank, world, init0, steps, sync_every)
        diff = max((a - b).abs().max().item() for a, b in zip(glob + params, ref_g + ref_l))
        return {"diff": diff, "reports": reports, "global": _bits(glob), "params": _bits(params), "mirrored": mirrored}

    out["diloco_h1"] = diloco(1, 3)
    out["diloco_h10"] = diloco(10, 25)
    out["diloco_h10_noncontiguous"] = diloco(10, 25, noncontiguous=True)

    # Streaming: F = 2, τ = 1, α = 0.5, int4 with error feedback.
    params = _init(rank)
    with gradcomp.outer.DiLoCo(params, 6, fragments=2, delay=1, alpha=0.5, spec="int4", decision="compressed",
                               timeout=30) as loop:
        reports = _run(loop, params, rank, 0, 14)
        glob = loop.global_params()
        out["streaming"] = {"reports": reports, "fragment_of": loop.fragment_of, "fragments": loop.fragments,
                            "global": _bits(glob)}
    gathered = [None] * world
    dist.all_gather_object(gathered, out["streaming"]["global"])
    out["streaming"]["globals_equal"] = all(g == gathered[0] for g in gathered)

    # SparseLoCo's settings: chunked top-k 2 % of 2 bits, decayed error
    # feedback, SGD lr 1; and the dense exchange's bytes for the same syncs.
    def sent(**kw):
        params = _init(rank)
        with gradcomp.outer.DiLoCo(params, 4, timeout=30, **kw) as loop:
            reports = _run(loop, params, rank, 0, 8)
        return sum(r[4] for r in reports), sum(len(r[2]) for r in reports)

    sparse, syncs = sent(spec="topk:0.02:chunk=64:bits=2", feedback_decay=0.9, optimizer="sgd", lr=1.0,
                         decision="compressed")
    dense, _ = sent(optimizer="sgd", lr=1.0)
    out["sparseloco"] = {"bytes": sparse, "dense_bytes": dense, "syncs": syncs}

    # A NaN in rank 1's weights: the sync is skipped on every rank, with a
    # warning naming the fragment; "raise" raises NonFiniteError instead.
    class Keep(logging.Handler):
        def __init__(self):
            super().__init__()
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    keep = Keep()
    logging.getLogger("gradcomp").addHandler(keep)
    nonfinite = {}
    for policy in ("skip", "raise"):
        params = _init(rank)
        with gradcomp.outer.DiLoCo(params, 2, on_nonfinite=policy, timeout=30) as loop:
            before = loop.global_params()
            _inner(params, rank, 0)
            loop.step()
            _inner(params, rank, 1)
            if rank == 1:
                params[2][3] = float("nan")
            try:
                rep = list(loop.step())
                raised = None
            except gradcomp.NonFiniteError as e:
                rep, raised = None, str(e)
            unchanged = all(torch.equal(a, b) for a, b in zip(before, loop.global_params()))
            params[2].nan_to_num_(0.0)
            _run(loop, params, rank, 2, 4)  # usable after it: step 4 syncs
        nonfinite[policy] = {"report": rep, "raised": raised, "global_unchanged": unchanged}
    logging.getLogger("gradcomp").removeHandler(keep)
    nonfinite["warnings"] = [line for line in keep.lines if "skipped" in line]
    out["nonfinite"] = nonfinite

    # Ranks that disagree on sync_every.
    try:
        gradcomp.outer.DiLoCo(_init(rank), 4 + rank, timeout=30).close()
        out["mismatch"] = None
    except gradcomp.ConfigError as e:
        out["mismatch"] = str(e)

    # state_dict round trip: saved at step 6 with fragment 0's sync in
    # flight, resumed in a new loop from the caller's params: bit for bit.
    kw = dict(fragments=2, delay=1, alpha=0.5, spec="int8", decision="compressed", timeout=30)
    params = _init(rank)
    with gradcomp.outer.DiLoCo(params, 4, **kw) as loop:
        _run(loop, params, rank, 0, 6)
        sd = loop.state_dict()
        at_save = [p.clone() for p in params]
        want = _run(loop, params, rank, 6, 11)
        want_g = loop.global_params()
    want_p = params
    params = _init(rank)
    with gradcomp.outer.DiLoCo(params, 4, **kw) as loop:
        try:
            loop.load_state_dict({"format": "something else"})
            refused = None
        except ValueError as e:
            refused = str(e)
        loop.load_state_dict(sd)
        for p, q in zip(params, at_save):
            p.copy_(q)
        got = _run(loop, params, rank, 6, 11)
        got_g = loop.global_params()
    # (A sync that arrived before the save reports no bytes after the load.)
    out["resume"] = {"reports_equal": [r[:4] for r in got] == [r[:4] for r in want], "global_equal": _bits(got_g) == _bits(want_g),
                     "params_equal": _bits(params) == _bits(want_p), "refused": refused,
                     "state": base64.b64encode(sd["state"]).decode(), "world": sd["world"]}
    return out


def fake_device(rank, world):
    """Streaming and DiLoCo H = 10 in the fake-device test mode, where CPU
    tensors take the CUDA branch: every tensor through a host mirror."""
    from gradcomp import _lib

    os.environ[_lib.ENV_FAKE_DEVICE] = "1"  # before the library loads
    import gradcomp.outer

    init0 = _init(0)
    params = _init(rank)
    with gradcomp.outer.DiLoCo(params, 10, timeout=30) as loop:
        _run(loop, params, rank, 0, 25)
        glob = loop.global_params()
        mirrored = all(m is not None for m in loop.tensors.mirrors)
    ref_g, ref_l = reference(rank, world, init0, 25, 10)
    diff = max((a - b).abs().max().item() for a, b in zip(glob + params, ref_g + ref_l))
    params = _init(rank)
    with gradcomp.outer.DiLoCo(params, 6, fragments=2, delay=1, alpha=0.5, spec="int4", decision="compressed",
                               timeout=30) as loop:
        reports = _run(loop, params, rank, 0, 14)
        sglob = loop.global_params()
    return {"library": os.path.basename(gradcomp._lib.path()), "mirrored": mirrored, "diff": diff,
            "streaming": {"reports": reports, "global": _bits(sglob)}}


# ---- two levels: 2 workers × 2 ranks

IN, OUT, BATCH, HIDDEN = 12, 4, 8, 16
WORKERS, PER_WORKER = 2, 2


def _net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, OUT))


def _batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, IN, generator=g)
    w = torch.randn(IN, OUT, generator=torch.Generator().manual_seed(5))
    return x, (x @ w).argmax(1)


def _loss(model, step, ranks):
    xs, ys = zip(*(_batch(step, r) for r in ranks))
    return torch.nn.functional.cross_entropy(model(torch.cat(xs)), torch.cat(ys))


def _two_level_reference(steps, sync_every):
    """The 2-worker reference: worker w trains on its ranks' batches (the
    mean loss over them: what DDP and FSDP average), DiLoCo across the two
    workers (fp32 mean of the pseudo-gradients, torch's SGD(nesterov=True,
    lr 0.7, momentum 0.9) on the global weights)."""
    glob = list(_net().parameters())
    outer = torch.optim.SGD(glob, lr=0.7, momentum=0.9, nesterov=True)
    workers = [_net() for _ in range(WORKERS)]
    opts = [torch.optim.SGD(m.parameters(), lr=INNER_LR) for m in workers]
    for s in range(steps):
        for w, (m, opt) in enumerate(zip(workers, opts)):
            opt.zero_grad()
            _loss(m, s, range(w * PER_WORKER, (w + 1) * PER_WORKER)).backward()
            opt.step()
        if (s + 1) % sync_every:
            continue
        for i, g in enumerate(glob):
            g.grad = sum(g.detach() - list(m.parameters())[i].detach() for m in workers) / WORKERS
        outer.step()
        for m in workers:
            with torch.no_grad():
                for p, g in zip(m.parameters(), glob):
                    p.copy_(g)
    return [g.detach() for g in glob]


def _subgroup(lists):
    """This rank's group among groups of the ranks in ``lists``, every one
    made on every rank in the same order (dist.new_group: torch 1.13's
    new_subgroups_by_enumeration wants CUDA)."""
    groups = [dist.new_group(rs) for rs in lists]
    return next(g for g, rs in zip(groups, lists) if dist.get_rank() in rs)


def _groups():
    """This rank's worker group (ranks 2w, 2w+1) and cross-worker group
    (the ranks with its local rank, one per worker)."""
    return _subgroup([[0, 1], [2, 3]]), _subgroup([[0, 2], [1, 3]])


def two_level(rank, world, kind, steps, sync_every):
    """``kind`` "ddp" or "fsdp2" inside each worker, DiLoCo across the
    workers on the cross-worker group; then (ddp) the loop's state across
    world sizes: a 4-rank loop's states loaded by two 2-rank jobs (4 → 2),
    and those jobs' states by a 4-rank loop whose ranks 2 and 3 pass None
    (2 → 4)."""
    import gradcomp.outer

    w = rank // PER_WORKER
    mine = [rank]
    if kind == "ddp":
        worker, cross = _groups()
        model = torch.nn.parallel.DistributedDataParallel(_net(), process_group=worker)
        full = lambda: [p.detach() for p in model.parameters()]  # noqa: E731
    else:
        from torch.distributed.fsdp import fully_shard

        import gradcomp.fsdp as gf

        mesh = gf.init_mesh(WORKERS, PER_WORKER)
        cross = mesh["replicate"].get_group()
        model = _net()
        fully_shard(model, mesh=mesh["shard"])
        full = lambda: [p.full_tensor().detach() for p in model.parameters()]  # noqa: E731
    opt = torch.optim.SGD(model.parameters(), lr=INNER_LR)
    loop = gradcomp.outer.DiLoCo(model.parameters(), sync_every, group=cross, timeout=30)
    for s in range(steps):
        opt.zero_grad()
        _loss(model, s, mine).backward()
        opt.step()
        loop.step()
    got = full()
    loop.close()
    ref = _two_level_reference(steps, sync_every)
    everyone = [None] * world
    dist.all_gather_object(everyone, _bits(got))
    out = {"diff": max((a - b).abs().max().item() for a, b in zip(got, ref)),
           "identical": all(e == everyone[0] for e in everyone), "worker": w,
           "mirrored": loop.tensors.mirrored}
    if kind == "ddp":
        out["reshape"] = _reshape(rank, world)
    return out


def _reshape(rank, world):
    """4 → 2 → 4 workers through state_dict: every load's global weights
    are the saved ones, and the loops go on."""
    import gradcomp.outer

    pair = _subgroup([[0, 1], [2, 3]])
    params = _init(rank % 2)
    loop = gradcomp.outer.DiLoCo(params, 2, spec="int8", decision="compressed", timeout=30)
    _run(loop, params, rank, 0, 3)
    sd4, g4 = loop.state_dict(), loop.global_params()
    loop.close()
    # 4 → 2: each pair loads the states of its own ranks.
    params = _init(rank % 2)
    loop = gradcomp.outer.DiLoCo(params, 2, spec="int8", decision="compressed", group=pair, timeout=30)
    loop.load_state_dict(sd4)
    to2 = _bits(loop.global_params()) == _bits(g4)
    _run(loop, params, rank, 3, 5)
    sd2, g2 = loop.state_dict(), loop.global_params()
    loop.close()
    # 2 → 4: pair {0, 1}'s states on ranks 0 and 1; ranks 2 and 3 had none.
    params = _init(rank % 2)
    loop = gradcomp.outer.DiLoCo(params, 2, spec="int8", decision="compressed", timeout=30)
    loop.load_state_dict(sd2 if rank < 2 else None)
    g = loop.global_params()
    everyone = [None] * world
    dist.all_gather_object(everyone, _bits(g2))
    to4 = _bits(g) == everyone[0]
    _run(loop, params, rank, 5, 7)
    loop.close()
    return {"to2": to2, "to4": to4, "world": sd4["world"]}
