"""Rank functions for the multi-process tests (run through ranks.run).

Each takes (rank, world, ...) inside an initialized gloo process group and
returns a JSON-serializable value.
"""

import ctypes
import io
import time

import torch
from torch.nn.parallel import DistributedDataParallel as DDP

import gradcomp
import gradcomp.torch as gct
from gradcomp import _engine, _host, _lib

BATCH = 32


class FakeBucket:
    """What the hook reads of a dist.GradBucket: buffer, index, is_last."""

    def __init__(self, buffer, index=0, last=True):
        self._buffer = buffer
        self._index = index
        self._last = last

    def buffer(self):
        return self._buffer

    def index(self):
        return self._index

    def is_last(self):
        return self._last


def digits():
    """sklearn's digits, standardized, split 80/20 (fixed seed): float32
    tensors (x_train, y_train, x_test, y_test)."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    x, y = load_digits(return_X_y=True)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)
    scaler = StandardScaler().fit(x_train)
    as_x = lambda a: torch.tensor(scaler.transform(a), dtype=torch.float32)
    as_y = lambda a: torch.tensor(a, dtype=torch.int64)
    return as_x(x_train), as_y(y_train), as_x(x_test), as_y(y_test)


def mlp(seed, hidden=128):
    """The digits MLP (64 → hidden → 10), initialized from seed."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, 10))


def two_bucket_mlp(seed):
    """A digits MLP (64 → 1024 → 1024 → 10, 1.1M parameters) that DDP splits
    into two buckets: its first bucket is capped at 1 MiB, so the last two
    layers (4.2 MB) fill it and the first layer goes into the second."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
        torch.nn.Linear(1024, 10),
    )


def make_ddp(module, spec, **state_kw):
    """DDP over module; with spec, gradcomp's hook on a new State (returned),
    else torch's default all-reduce (state None)."""
    ddp = DDP(module)
    if spec is None:
        return ddp, None
    state_kw.setdefault("workers", 1)
    state = gct.State(spec, **state_kw)
    ddp.register_comm_hook(state, gct.hook)
    return ddp, state


def batches(rank, world, x, y, epoch, seed):
    """This rank's shard of (x, y), shuffled per epoch, as equal-count
    batches on every rank (the last partial batch dropped)."""
    xs, ys = x[rank::world], y[rank::world]
    steps = len(x) // world // BATCH
    g = torch.Generator().manual_seed(seed * 1000 + epoch * 10 + rank)
    perm = torch.randperm(len(xs), generator=g)
    for s in range(steps):
        idx = perm[s * BATCH : (s + 1) * BATCH]
        yield xs[idx], ys[idx]


def train_step(ddp, opt, xb, yb):
    opt.zero_grad()
    torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
    opt.step()


def train_digits(rank, world, configs, epochs, seed, warmup_steps):
    """Trains the digits MLP once per (spec, strategy[, error_feedback])
    (spec None: the default hook; error feedback on unless given) with the
    same data and initialization, decision pinned to compressed; returns
    {"spec strategy": {accuracy, stats}} (" no-ef" appended without error
    feedback)."""
    x, y, xt, yt = digits()
    out = {}
    for config in configs:
        spec, strategy, ef = (tuple(config) + (True,))[:3]
        kw = dict(warmup_steps=warmup_steps, decision="compressed", strategy=strategy, error_feedback=ef) if spec else {}
        ddp, state = make_ddp(mlp(seed), spec, **kw)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for epoch in range(epochs):
            for xb, yb in batches(rank, world, x, y, epoch, seed):
                train_step(ddp, opt, xb, yb)
        with torch.no_grad():
            accuracy = (ddp.module(xt).argmax(1) == yt).float().mean().item()
        out["%s %s%s" % (spec, strategy, "" if ef else " no-ef")] = {
            "accuracy": accuracy, "stats": state.stats if state else {},
            "strategy": state.last_step.buckets[0].strategy if state else None,
        }
        if state:
            state.close()
    return out


def mismatched_configs(rank, world, variants):
    """Per variant (a list of State keyword dicts, rank r taking
    variant[r % len]): trains DDP until an error; returns per variant the
    error's type and message, the step it came at and the seconds it took."""
    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 0))
    out = []
    for variant in variants:
        kw = dict(variant[rank % len(variant)])
        spec = kw.pop("spec", "int8")
        ddp, state = make_ddp(mlp(0), spec, **kw)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        got = None
        for step, (xb, yb) in enumerate(data[:4]):
            t0 = time.monotonic()
            try:
                train_step(ddp, opt, xb, yb)
            except Exception as e:
                got = {"type": type(e).__name__, "is_value_error": isinstance(e, ValueError), "message": str(e),
                       "step": step, "seconds": time.monotonic() - t0}
                break
        out.append(got)
        state.close()
    return out


def nonfinite_bucket(rank, world, spec, bad_rank):
    """Per on_nonfinite mode: two plain steps and one compressed (decision
    pinned, warm-up 2), then one backward where bad_rank's gradient holds a
    NaN in both buckets of two_bucket_mlp, then a clean one. Returns what
    each step did."""
    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 0))
    out = {}
    for mode in ("dense", "raise"):
        ddp, state = make_ddp(two_bucket_mlp(0), spec, warmup_steps=2, decision="compressed", on_nonfinite=mode)
        for xb, yb in data[:3]:
            ddp.zero_grad()
            torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
        before = state.stats
        xb, yb = data[3]
        if rank == bad_rank:
            xb = xb.clone()
            xb[0, 0] = float("nan")
        ddp.zero_grad()
        err = None
        try:
            torch.nn.functional.cross_entropy(ddp(xb), yb).backward()
        except Exception as e:
            err = {"type": type(e).__name__, "is_fpe": isinstance(e, FloatingPointError), "message": str(e)}
        after_nan = state.stats
        grads_nan = all(bool(torch.isnan(p.grad).any()) for p in ddp.parameters())
        ddp.zero_grad()
        torch.nn.functional.cross_entropy(ddp(data[4][0]), data[4][1]).backward()
        out[mode] = {
            "buckets": len(state.engine.sizes),
            "before": before,
            "after_nan": after_nan,
            "after_clean": state.stats,
            "error": err,
            "grads_nan": grads_nan,
            "clean_finite": all(bool(torch.isfinite(p.grad).all()) for p in ddp.parameters()),
            "nonfinite_last": [b.nonfinite for b in state.last_step.buckets],
        }
        state.close()
    return out


def _roundtrip(obj):
    """obj through torch.save/torch.load, as a checkpoint file would take it."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf)


def golden_gradient(rank, step, bucket, n):
    """tests/golden's gradients: multiples of 1/64 (exact sums in any order)."""
    i = torch.arange(n, dtype=torch.int64)
    h = (rank * 1000003 + step * 10007 + bucket * 101 + i * 7919) % 2003
    return (h - 1001).to(torch.float32) / 64


def _engine_steps(eng, rank, steps, sizes):
    out = []
    for s in steps:
        grads = [golden_gradient(rank, s, b, n) for b, n in enumerate(sizes)]
        eng.step()
        for b, g in enumerate(grads):
            eng.ready(b, g)
        eng.wait()
        out.append([g.numpy().tobytes().hex() for g in grads])
    return out


def engine_resume(rank, world, specs, steps, cut):
    """Per spec: an engine runs `steps` steps straight; another runs `cut`,
    saves, and a third (new transport and engine) loads that state and
    runs the rest. Returns whether the averages and the final states are
    equal bit for bit."""
    sizes = [1000, 37]
    out = {}
    for spec in specs:
        kw = dict(decision="compressed", workers=1)
        with gradcomp.Engine(spec, sizes, **kw) as a:
            straight = _engine_steps(a, rank, range(steps), sizes)
            want = a.save_state()
        with gradcomp.Engine(spec, sizes, **kw) as b:
            first = _engine_steps(b, rank, range(cut), sizes)
            saved = b.save_state()
        with gradcomp.Engine(spec, sizes, **kw) as c:
            c.load_state(saved)
            rest = _engine_steps(c, rank, range(cut, steps), sizes)
            got = c.save_state()
            info = gradcomp.Engine.state_info(got)
        out[spec] = {"averages_equal": straight == first + rest, "state_equal": want == got,
                     "next_step": info.next_step, "sizes": info.sizes}
    return out


def _state_bytes(state):
    sd = state.state_dict()
    return {k: (v.hex() if isinstance(v, bytes) else v) for k, v in sd.items()}


def checkpoint_resume(rank, world, spec, steps, cut):
    """DDP with the hook: `cut` steps, a checkpoint (through torch.save),
    restored into a fresh model, optimizer, DDP and State, `steps` − `cut`
    more. Then refusals: the checkpoint into a State of another spec and
    into States for another model (with and without model=, before and
    after their engine exists), each leaving that State as it was."""
    x, y, _, _ = digits()
    data = [b for epoch in range(2) for b in batches(rank, world, x, y, epoch, 7)][:steps]
    kw = dict(warmup_steps=2, decision="compressed")

    def fresh(hidden=128, spec=spec, with_model=True):
        model = mlp(7, hidden)
        ddp, state = make_ddp(model, spec, model=model if with_model else None, **kw)
        return model, ddp, state, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    model, ddp, state, opt = fresh()
    for xb, yb in data[:cut]:
        train_step(ddp, opt, xb, yb)
    saved = state.state_dict()
    saved_info = gradcomp.Engine.state_info(saved["engine"])
    ckpt = _roundtrip({"model": model.state_dict(), "opt": opt.state_dict(), "hook": saved})
    state.close()
    model, ddp, state, opt = fresh()
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    state.load_state_dict(ckpt["hook"])
    pending_same = state.state_dict() == saved
    for xb, yb in data[cut:]:
        train_step(ddp, opt, xb, yb)
    resumed = state.state_dict()
    info = gradcomp.Engine.state_info(resumed["engine"])
    out = {
        "pending_same": pending_same,
        "saved_next_step": saved_info.next_step,
        "resumed_next_step": info.next_step,
        "resumed_iter": resumed["iter"],
        "stats": state.stats,
        "split": state.last_split,
        "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()),
        "refusals": {},
    }
    state.close()

    def refuse(name, state, ddp=None, opt=None, train=0):
        for xb, yb in data[:train]:
            train_step(ddp, opt, xb, yb)
        before = _state_bytes(state)
        try:
            state.load_state_dict(_roundtrip(saved))
            result = {"refused": False}
        except ValueError as e:
            result = {"refused": True, "message": str(e)}
        result["unchanged"] = _state_bytes(state) == before
        if train:  # still usable
            train_step(ddp, opt, *data[train])
            result["usable"] = state.stats["engine_steps"] > 0
        out["refusals"][name] = result
        state.close()

    refuse("other spec", gct.State("sign", workers=1, **kw))
    # Another strategy before the engine exists: kept, to load across shapes.
    other = gct.State(spec, strategy="allgather", workers=1, **kw)
    other.load_state_dict(_roundtrip(saved))
    out["other_strategy_reshape"] = other._pending_reshape
    other.close()
    refuse("other guard (engine state)", gct.State(spec, guard=5.0, workers=1, **kw))
    relabeled = dict(saved, strategy="allgather")  # the dict says allgather; its engine state says auto
    st = gct.State(spec, strategy="allgather", workers=1, **kw)
    st.load_state_dict(relabeled)  # the engine state's strategy differs: kept, to load across shapes
    out["relabeled_reshape"] = st._pending_reshape
    st.close()
    _, ddp, st, opt = fresh(hidden=64)
    refuse("other model (model=)", st)
    _, ddp, st, opt = fresh(hidden=64, with_model=False)
    refuse("other model (engine)", st, ddp, opt, train=3)
    bad = dict(saved)
    bad["engine"] = saved["engine"][:-1] + bytes([saved["engine"][-1] ^ 1])
    st = gct.State(spec, workers=1, **kw)
    try:
        st.load_state_dict(bad)
        out["refusals"]["corrupt"] = {"refused": False}
    except ValueError as e:
        out["refusals"]["corrupt"] = {"refused": True, "message": str(e), "unchanged": st.state_dict()["engine"] is None}
    return out


def bytes_sent(rank, world, configs, n):
    """Per (spec, strategy): the hook (direct calls, decision pinned,
    warm-up 2) on one bucket of n elements for 4 steps; returns this rank's
    bytes sent in the last step, the strategy the engine reports and
    whether the bucket went compressed."""
    out = {}
    g = torch.Generator().manual_seed(rank)
    for spec, strategy in configs:
        state = gct.State(spec, strategy=strategy, warmup_steps=2, decision="compressed", workers=1)
        for _ in range(4):
            gct.hook(state, FakeBucket(torch.randn(n, generator=g))).wait()
        b = state.last_step.buckets[0]
        out["%s %s" % (spec, strategy)] = {"bytes": state.stats["bytes_sent"], "strategy": b.strategy,
                                           "compressed": b.compressed, "elements": b.elements}
        state.close()
    return out


def late_rank(rank, world, spec, delay):
    """The hook on crafted buckets (warm-up 2, decision pinned), with
    overlap=True and then overlap=False, where the last rank reaches its
    hook `delay` seconds late in step 3. Returns per mode whether this
    rank's hook returned before its exchange completed, and the step-3
    result."""
    out = {}
    for overlap in (True, False):
        state = gct.State(spec, warmup_steps=2, decision="compressed", overlap=overlap, workers=1)
        g = torch.Generator().manual_seed(rank)
        for step in range(4):
            buf = torch.randn(4096, generator=g)
            if step == 3 and rank == world - 1:
                time.sleep(delay)
            fut = gct.hook(state, FakeBucket(buf))
            returned_pending = not fut.done()
            result = fut.wait()
        out[str(overlap)] = {"returned_pending": returned_pending, "result": result.tolist(),
                             "compressed": state.stats["compressed"]}
        state.close()
    return out


def _op(kind, count, send, recv, send_bytes, recv_bytes, root=0, op_id=1):
    op = _lib.Op()
    op.id, op.kind, op.root, op.count = op_id, int(kind), root, count
    op.send, op.recv = send, recv
    op.send_bytes, op.recv_bytes = send_bytes, recv_bytes
    return op


def hosted_ops(rank, world):
    """Every collective kind through the host's op runner (no engine):
    crafted gc_op structs over ctypes buffers. Returns what each produced."""
    K = _lib.OpKind
    out = {}
    f32 = lambda vals: (ctypes.c_float * len(vals))(*vals)
    u8 = lambda vals: (ctypes.c_uint8 * len(vals))(*vals)
    addr = ctypes.addressof
    run = lambda op: _host.run_op(op, None, rank, world)

    buf = f32([rank + 1.0, 2.0 * rank, 0.5])
    out["allreduce_written"] = run(_op(K.ALLREDUCE, 3, addr(buf), addr(buf), 12, 12))
    out["allreduce"] = list(buf)
    send, recv = u8([rank, 10 + rank]), u8([0] * 2 * world)
    out["allgather_written"] = run(_op(K.ALLGATHER, 2, addr(send), addr(recv), 2, 2 * world))
    out["allgather"] = list(recv)
    rs_send = f32([float(rank * 100 + j) for j in range(2 * world)])
    rs_recv = f32([0.0, 0.0])
    run(_op(K.REDUCESCATTER, 2, addr(rs_send), addr(rs_recv), 8 * world, 8))
    out["reducescatter"] = list(rs_recv)
    a_send = u8([rank * 16 + j for j in range(2 * world)])
    a_recv = u8([0] * 2 * world)
    run(_op(K.ALLTOALL, 2 * world, addr(a_send), addr(a_recv), 2 * world, 2 * world))
    out["alltoall"] = list(a_recv)
    b = u8([rank + 1] * 3)
    run(_op(K.BROADCAST, 3, addr(b), addr(b), 3, 3, root=world - 1))
    out["broadcast"] = list(b)
    out["barrier_written"] = run(_op(K.BARRIER, 0, 0, 0, 0, 0))
    out["empty_allreduce"] = run(_op(K.ALLREDUCE, 0, 0, 0, 0, 0))
    errors = {}
    for name, op in [
        ("wrong length", _op(K.ALLGATHER, 2, addr(send), addr(recv), 2, 3)),
        ("not in place", _op(K.ALLREDUCE, 1, addr(rs_send), addr(rs_recv), 4, 4)),
        ("bad root", _op(K.BROADCAST, 3, addr(b), addr(b), 3, 3, root=world)),
        ("bad kind", _op(99, 0, 0, 0, 0, 0)),
    ]:
        try:
            run(op)
            errors[name] = None
        except ValueError as e:
            errors[name] = str(e)
    out["errors"] = errors
    return out


def peer_dies(rank, world, spec, dead, timeout):
    """DDP with the hook (decision pinned, warm-up 2, a `timeout`-second
    collective timeout): rank `dead` ends its process before step 4's
    backward; the others' step 4 must fail with a typed error within the
    timeout, and so must their next step (the engine is broken)."""
    import os

    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 0))
    ddp, state = make_ddp(mlp(0), spec, warmup_steps=2, decision="compressed", timeout=timeout)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for xb, yb in data[:4]:
        train_step(ddp, opt, xb, yb)
    if rank == dead:
        os._exit(0)
    out = []
    for xb, yb in data[4:6]:
        t0 = time.monotonic()
        try:
            train_step(ddp, opt, xb, yb)
            out.append(None)
        except Exception as e:
            out.append({"type": type(e).__name__, "is_comm": isinstance(e, gradcomp.CommError), "message": str(e),
                        "seconds": time.monotonic() - t0})
    return out


class TwoHeads(torch.nn.Module):
    """A trunk and two heads, b and c; forward(x, head) uses one of them,
    so the other's parameters get no gradient that step."""

    def __init__(self, seed):
        super().__init__()
        torch.manual_seed(seed)
        self.trunk = torch.nn.Linear(64, 96)
        self.b = torch.nn.Linear(96, 10)
        self.c = torch.nn.Linear(96, 10)
        self.frozen = torch.nn.Linear(4, 4)  # never used

    def forward(self, x, head):
        return getattr(self, head)(torch.relu(self.trunk(x)))


def _params_hex(module):
    return [p.detach().numpy().tobytes().hex() for p in module.parameters()]


def unused_parameters(rank, world, spec, case, steps):
    """DDP over TwoHeads with the hook
    (decision pinned, warm-up 2, a 20 s timeout), `steps` steps of `case`:
    "alternate" (head c every third step, else b, on every rank), "per
    rank" (rank r uses head c when (step + r) is odd: ranks differ),
    "no_sync" (alternate, with two accumulation steps under no_sync before
    each synchronized one), "not found" (alternate, without
    find_unused_parameters: DDP itself must refuse the next step, as it
    does under its default hook, and nothing may hang). Returns the
    parameters (hex), the State's counters, the seconds taken and the
    error a step raised (None if none did)."""
    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 3))
    model = TwoHeads(3)
    ddp = DDP(model, find_unused_parameters=case != "not found")
    state = gct.State(spec, warmup_steps=2, decision="compressed", workers=1, timeout=20, model=model)
    ddp.register_comm_hook(state, gct.hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    t0 = time.monotonic()
    error = None
    for step in range(steps):
        head = "c" if step % 3 == 0 else "b"
        if case == "per rank":
            head = "c" if (step + rank) % 2 else "b"
        xb, yb = data[step % len(data)]
        opt.zero_grad()
        if case == "no_sync":
            with ddp.no_sync():
                for k in range(2):
                    torch.nn.functional.cross_entropy(ddp(xb[k::3], head), yb[k::3]).backward()
            xb, yb = xb[2::3], yb[2::3]
        try:
            torch.nn.functional.cross_entropy(ddp(xb, head), yb).backward()
        except RuntimeError as e:
            error = str(e)
            break
        opt.step()
    out = {"params": _params_hex(model), "stats": state.stats, "seconds": time.monotonic() - t0,
           "finite": all(bool(torch.isfinite(p).all()) for p in model.parameters()), "error": error}
    state.close()
    return out


def resume_exact(rank, world, spec, steps, cut, warmup, phase, path):
    """Bit-exact resume. Phase "straight": DDP over two_bucket_mlp with the
    hook (decision pinned, `warmup` warm-up steps) trains `steps` steps and
    returns its parameters; then a second model trains `cut` steps and
    saves model, optimizer and State to path.rank (torch.save). Phase
    "resume" (a new process group, new processes): a fresh model, DDP and
    State load that checkpoint and train the remaining steps; returns the
    parameters and the State's counters."""
    x, y, _, _ = digits()
    data = [b for epoch in range(3) for b in batches(rank, world, x, y, epoch, 11)][:steps]

    def fresh():
        model = two_bucket_mlp(11)
        ddp, state = make_ddp(model, spec, warmup_steps=warmup, decision="compressed")
        return model, ddp, state, torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)

    ckpt = "%s.%d" % (path, rank)
    if phase == "straight":
        model, ddp, state, opt = fresh()
        for xb, yb in data:
            train_step(ddp, opt, xb, yb)
        out = {"params": _params_hex(model), "stats": state.stats}
        state.close()
        model, ddp, state, opt = fresh()
        for xb, yb in data[:cut]:
            train_step(ddp, opt, xb, yb)
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state.state_dict()}, ckpt)
        state.close()
        return out
    saved = torch.load(ckpt)
    model, ddp, state, opt = fresh()
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    state.load_state_dict(saved["hook"])
    for xb, yb in data[cut:]:
        train_step(ddp, opt, xb, yb)
    out = {"params": _params_hex(model), "stats": state.stats}
    state.close()
    return out


def bucket_orders(rank, world, spec, steps):
    """The hook on three crafted buckets (warm-up 2, decision pinned) that
    each rank hands over in its own order, changing every step. Returns
    per step the averages (hex), the exact average of the gradients, the
    State's counters, whether it made a finisher thread, the last step's
    split, and the most its "exposed" can be: from just before the last
    bucket's hook to just after its averages came (the State is read half
    a second later, which a split timed at the reading would count)."""
    sizes = [300, 1000, 37]
    state = gct.State(spec, warmup_steps=2, decision="compressed", workers=1)
    out = {"averages": [], "exact": []}
    for step in range(steps):
        grads = [golden_gradient(rank, step, b, n) for b, n in enumerate(sizes)]
        order = [(b + rank + step) % 3 for b in range(3)]
        futs = {}
        for k, b in enumerate(order):
            if k == 2:
                before_last = time.perf_counter()
            futs[b] = gct.hook(state, FakeBucket(grads[b].clone(), b, k == 2))
        out["averages"].append([futs[b].wait().numpy().tobytes().hex() for b in range(3)])
        averaged = time.perf_counter()
        exact = [sum(golden_gradient(r, step, b, n) for r in range(world)) / world for b, n in enumerate(sizes)]
        out["exact"].append([e.numpy().tobytes().hex() for e in exact])
    time.sleep(0.5)
    out.update((k, state.stats[k]) for k in ("compressed", "dense", "native", "plain_steps", "engine_steps"))
    out["split"] = state.last_split
    out["exposed_bound"] = 1e3 * (averaged - before_last)
    out["finisher"] = state._finisher is not None
    state.close()
    return out


def _ranks_per_node(k):
    """Places rank r on node r // k for the States made after it (None:
    unset)."""
    import os

    if k is None:
        os.environ.pop(gct.ENV_RANKS_PER_NODE, None)
    else:
        os.environ[gct.ENV_RANKS_PER_NODE] = str(k)


def hier_dense(rank, world, k, steps):
    """DDP trained `steps` steps with State("none", strategy="hier") on
    nodes of k ranks and with torch's default all-reduce, same data and
    initialization: returns the largest parameter difference, the State's
    topology, the last step's strategy and reason, and the ops each host
    group carried out."""
    _ranks_per_node(k)
    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 0))[:steps]
    params = []
    out = {}
    for spec in (None, "none"):
        ddp, state = make_ddp(two_bucket_mlp(0), spec, strategy="hier", warmup_steps=2) if spec else make_ddp(
            two_bucket_mlp(0), None)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for xb, yb in data:
            train_step(ddp, opt, xb, yb)
        params.append([p.detach().clone() for p in ddp.parameters()])
        if state:
            out["topology"] = list(state.topology)
            out["strategy"] = [b.strategy for b in state.last_step.buckets]
            out["reason"] = state.last_step.buckets[0].reason
            out["ops_by_group"] = dict(state.engine.host.ops_by_group)
            out["engine_steps"] = state.stats["engine_steps"]
            state.close()
    out["max_diff"] = max(float((a - b).abs().max()) for a, b in zip(*params))
    return out


def hier_node_spec(rank, world, k, steps):
    """DDP trained `steps` steps with State("none", strategy="hier") with
    float32 and bf16 node stages, and torch's default all-reduce, same data
    and initialization: each one's largest parameter difference from the
    default's and bytes sent; then the error of a State whose node_spec
    differs from the other ranks' (rank 0 bf16, the others int8)."""
    _ranks_per_node(k)
    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 0))[:steps]
    params, out = {}, {}
    for name, kw in (("default", None), ("fp32", {}), ("bf16", {"node_spec": "bf16"})):
        if kw is None:
            ddp, state = make_ddp(two_bucket_mlp(0), None)
        else:
            ddp, state = make_ddp(two_bucket_mlp(0), "none", strategy="hier", warmup_steps=2, **kw)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
        for xb, yb in data:
            train_step(ddp, opt, xb, yb)
        params[name] = [p.detach().clone() for p in ddp.parameters()]
        if state:
            out[name] = {"bytes_sent": state.stats["bytes_sent"], "strategy": state.last_step.buckets[0].strategy}
            state.close()
    for name in ("fp32", "bf16"):
        out[name]["max_diff"] = max(float((a - b).abs().max()) for a, b in zip(params[name], params["default"]))
    ddp, state = make_ddp(two_bucket_mlp(0), "none", strategy="hier", warmup_steps=2,
                          node_spec="bf16" if rank == 0 else "int8")
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    try:
        for xb, yb in data[:3]:
            train_step(ddp, opt, xb, yb)
        out["mismatch"] = None
    except Exception as e:  # the engine's ConfigError, raised through DDP's backward
        out["mismatch"] = {"type": type(e).__name__, "message": str(e)}
    state.close()
    return out


def hier_train(rank, world, k, epochs, seed):
    """The digits MLP trained with the default hook, flat int8 and hier
    int8 with error feedback (nodes of k ranks), decision compressed:
    returns {name: {accuracy, loss, compressed}}."""
    _ranks_per_node(k)
    x, y, xt, yt = digits()
    out = {}
    for name, spec, strategy in (("default", None, None), ("int8 flat", "int8", "sra"), ("int8 hier", "int8", "hier")):
        kw = dict(warmup_steps=4, decision="compressed", strategy=strategy) if spec else {}
        ddp, state = make_ddp(mlp(seed), spec, **kw)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        for epoch in range(epochs):
            for xb, yb in batches(rank, world, x, y, epoch, seed):
                train_step(ddp, opt, xb, yb)
        with torch.no_grad():
            logits = ddp.module(xt)
            out[name] = {"accuracy": (logits.argmax(1) == yt).float().mean().item(),
                         "loss": torch.nn.functional.cross_entropy(logits, yt).item(),
                         "compressed": state.stats["compressed"] if state else 0,
                         "strategy": state.last_step.buckets[0].strategy if state else None}
        if state:
            state.close()
    return out


def hier_checkpoint(rank, world, k, other_k, steps, cut):
    """State("int8", strategy="hier") on nodes of k ranks: `cut` steps,
    state_dict through torch.save, then a new State of the same layout
    loads it (before its engine exists) and trains on; returns its engine's
    next step, the iter, whether the parameters stayed finite, and the
    refusals of the dict by a State on nodes of other_k ranks: before its
    engine exists (gc_engine_state_check) and after (the engine's load)."""
    _ranks_per_node(k)
    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 0))
    kw = dict(strategy="hier", warmup_steps=2, decision="compressed")
    ddp, state = make_ddp(mlp(0), "int8", **kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for xb, yb in data[:cut]:
        train_step(ddp, opt, xb, yb)
    sd = _roundtrip(state.state_dict())
    saved_next = _engine.Engine.state_info(sd["engine"]).next_step
    module = ddp.module
    state.close()
    ddp2, state2 = make_ddp(module, "int8", **kw)
    state2.load_state_dict(sd)
    opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.05)
    for xb, yb in data[cut:steps]:
        train_step(ddp2, opt2, xb, yb)
    out = {"saved_next_step": saved_next, "iter": state2.iter,
           "resumed_next_step": _engine.Engine.state_info(state2.state_dict()["engine"]).next_step,
           "finite": all(bool(torch.isfinite(p).all()) for p in ddp2.parameters()), "refusals": {}}
    state2.close()
    _ranks_per_node(other_k)
    other = gct.State("int8", workers=1, **kw)
    other.load_state_dict(sd)  # before the engine exists: kept, to load across shapes
    out["pending_reshape"] = other._pending_reshape
    other.close()
    # With its engine: train it past its plain steps, then load.
    ddp3, other = make_ddp(mlp(0), "int8", **kw)
    opt3 = torch.optim.SGD(ddp3.parameters(), lr=0.05)
    for xb, yb in data[:3]:
        train_step(ddp3, opt3, xb, yb)
    try:
        other.load_state_dict(sd)
        out["refusals"]["engine"] = {"refused": False}
    except ValueError as e:
        out["refusals"]["engine"] = {"refused": True, "message": str(e), "iter": other.iter}
    other.close()
    _ranks_per_node(k)
    return out


def hier_auto(rank, world, k, steps, cut):
    """State("int8", strategy="auto") on nodes of k ranks: the engine's
    choice (the strategy its buckets report, the reason) after `cut` steps,
    then state_dict through torch.save into a new auto State, which resumes
    in the saved strategy and trains on to `steps`."""
    _ranks_per_node(k)
    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 0))
    kw = dict(strategy="auto", warmup_steps=2, decision="compressed")
    ddp, state = make_ddp(mlp(0), "int8", **kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for xb, yb in data[:cut]:
        train_step(ddp, opt, xb, yb)
    out = {"topology": list(state.topology) if state.topology else None,
           "strategy": state.last_step.buckets[0].strategy, "reason": state.last_step.buckets[0].reason}
    sd = _roundtrip(state.state_dict())
    out["saved_next_step"] = _engine.Engine.state_info(sd["engine"]).next_step
    module = ddp.module
    state.close()
    ddp2, state2 = make_ddp(module, "int8", **kw)
    state2.load_state_dict(sd)
    opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.05)
    for xb, yb in data[cut:steps]:
        train_step(ddp2, opt2, xb, yb)
    out["resumed_strategy"] = state2.last_step.buckets[0].strategy
    out["resumed_next_step"] = _engine.Engine.state_info(state2.state_dict()["engine"]).next_step
    out["finite"] = all(bool(torch.isfinite(p).all()) for p in ddp2.parameters())
    state2.close()
    # Whichever shape the trial kept, an auto State resumes a state of the
    # other in that state's strategy, and its check before the engine
    # exists agrees.
    other = "sra" if out["strategy"] == "hier" else "hier"
    ddp3, state3 = make_ddp(mlp(0), "int8", **dict(kw, strategy=other))
    opt3 = torch.optim.SGD(ddp3.parameters(), lr=0.05)
    for xb, yb in data[:4]:
        train_step(ddp3, opt3, xb, yb)
    engine_state = state3.state_dict()["engine"]
    state3.close()
    auto = gct.State("int8", workers=1, **kw)
    settings = auto._settings(engine_state)
    out["resume_other"] = settings["strategy"]
    _engine.Engine.check_state(engine_state, _engine.Engine.state_info(engine_state).sizes, world, spec="int8",
                               **settings)
    auto.close()
    return out


def hier_reshape(rank, world, k):
    """A hierarchical State's engine state (nodes of k ranks, 5 steps) into
    the engine of a flat State: its load refuses it, the collective
    load_state_reshaped takes it (the step number carried over), and
    training goes on."""
    _ranks_per_node(k)
    x, y, _, _ = digits()
    data = list(batches(rank, world, x, y, 0, 0))
    kw = dict(warmup_steps=2, decision="compressed")
    ddp, state = make_ddp(mlp(0), "int8", strategy="hier", **kw)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for xb, yb in data[:5]:
        train_step(ddp, opt, xb, yb)
    sd = _roundtrip(state.state_dict())
    saved = sd["engine"]
    module = ddp.module
    state.close()
    ddp2, flat = make_ddp(mlp(0), "int8", strategy="sra", **kw)
    opt2 = torch.optim.SGD(ddp2.parameters(), lr=0.05)
    for xb, yb in data[:3]:
        train_step(ddp2, opt2, xb, yb)
    out = {"saved_next_step": _engine.Engine.state_info(saved).next_step}
    try:
        flat.engine.load_state(saved)
        out["plain_refused"] = None
    except ValueError as e:
        out["plain_refused"] = str(e)
    flat.engine.load_state_reshaped(saved)
    out["next_step"] = _engine.Engine.state_info(flat.engine.save_state()).next_step
    for xb, yb in data[3:6]:
        train_step(ddp2, opt2, xb, yb)
    out["finite"] = all(bool(torch.isfinite(p).all()) for p in ddp2.parameters())
    flat.close()
    # The whole State: the hierarchical job's dict resumed on one node of
    # every rank (strategy auto: flat there), across shapes.
    _ranks_per_node(world)
    ddp3, resumed = make_ddp(module, "int8", strategy="auto", **kw)
    resumed.load_state_dict(sd)
    opt3 = torch.optim.SGD(ddp3.parameters(), lr=0.05)
    for xb, yb in data[5:8]:
        train_step(ddp3, opt3, xb, yb)
    out["state_reshape"] = {"strategy": resumed.last_step.buckets[0].strategy,
                            "next_step": _engine.Engine.state_info(resumed.state_dict()["engine"]).next_step,
                            "finite": all(bool(torch.isfinite(p).all()) for p in ddp3.parameters())}
    resumed.close()
    _ranks_per_node(k)
    return out


def hier_bad_layouts(rank, world, cases):
    """Per case (GRADCOMP_RANKS_PER_NODE per rank, a list indexed by rank):
    the error State(strategy="hier") raised on this rank, and the seconds
    it took."""
    out = []
    for per_rank in cases:
        _ranks_per_node(per_rank[rank])
        t0 = time.monotonic()
        try:
            gct.State("int8", strategy="hier", workers=1).close()
            out.append(None)
        except Exception as e:
            out.append({"type": type(e).__name__, "is_value_error": isinstance(e, ValueError), "message": str(e),
                        "seconds": time.monotonic() - t0})
    _ranks_per_node(None)
    return out


def hier_engine_disagree(rank, world):
    """Engines with strategy hier whose ranks claim places that do not make
    one layout (ranks 2 and 3 both local rank 0 of node 1): the error each
    rank's gc_engine_create raised, and the seconds it took."""
    import torch.distributed as dist

    kw = dict(timeout=__import__("datetime").timedelta(seconds=30))
    node = [dist.new_group(ranks=[0, 1], **kw), dist.new_group(ranks=[2, 3], **kw)]
    cross = [dist.new_group(ranks=[0, 2], **kw), dist.new_group(ranks=[1, 3], **kw)]
    topo = (rank // 2, 2, 0 if rank == 3 else rank % 2, 2)
    groups = {_lib.Group.NODE: node[rank // 2], _lib.Group.CROSS: cross[rank % 2]}
    t0 = time.monotonic()
    try:
        gradcomp.Engine("int8", [1000, 37], strategy="hier", topology=topo, groups=groups, timeout=30,
                        decision="compressed", workers=1).close()
        return None
    except Exception as e:
        return {"type": type(e).__name__, "is_value_error": isinstance(e, ValueError), "message": str(e),
                "seconds": time.monotonic() - t0}


def ddp_average(rank, world, spec, steps, warmup):
    """DDP over the digits MLP with gradcomp's hook (State(spec), warm-up
    ``warmup``, decision pinned to compressed) for ``steps`` backward passes
    on random batches, the parameters unchanged: per step the largest
    difference between DDP's gradient and the exact average (every rank's
    gradient of a plain copy of the module on the same batch, all-reduced)
    and the largest range (max - min) of a rank's gradient; then the
    State's stats, the last step's buckets, and the files gradcomp and its
    library were loaded from."""
    import torch.distributed as dist

    ddp, state = make_ddp(mlp(0), spec, warmup_steps=warmup, decision="compressed")
    plain = mlp(0)
    g = torch.Generator().manual_seed(rank)
    out = {"steps": []}
    for _ in range(steps):
        xb, yb = torch.randn(BATCH, 64, generator=g), torch.randint(0, 10, (BATCH,), generator=g)
        grads = []
        for module in (plain, ddp):
            module.zero_grad()
            torch.nn.functional.cross_entropy(module(xb), yb).backward()
            grads.append(torch.cat([p.grad.flatten() for p in module.parameters()]))
        local, averaged = grads
        exact = local.clone()
        dist.all_reduce(exact)
        exact /= world
        spread = (local.max() - local.min()).reshape(1)
        dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        out["steps"].append({"max_err": float((averaged - exact).abs().max()), "range": float(spread)})
    out["stats"] = state.stats
    out["buckets"] = [{"strategy": b.strategy, "compressed": b.compressed} for b in state.last_step.buckets]
    out["gradcomp"] = gradcomp.__file__
    out["library"] = _lib.path()
    state.close()
    return out
