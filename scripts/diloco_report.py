"""The report of scripts/diloco.py: its tables, from the JSON lines of one
run, and the exactness rows (a configuration against reference).

A run's rows are those of its id; where a configuration has several rows
on a link (a rerun), the last counts. The target of a link is ddp's
validation loss at its last evaluation at or before half its steps; a
configuration's time to target is its training time at its first
evaluation at or below it.
"""

import json
import os

#: the configurations compared with reference, and the rest by kind
EXACT = ("diloco", "torchft")
OUTER = ("diloco", "streaming", "sparseloco", "reference", "torchft")


def load(path, run):
    """{link: {config: row}} of run's configuration rows in path."""
    out = {}
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            if not line.strip():
                continue
            r = json.loads(line)
            if r.get("run") == run and "config" in r:
                out.setdefault(r["link"], {})[r["config"]] = r
    return out


def target(rows):
    """ddp's validation loss at its last evaluation at or before half its
    steps, or None."""
    d = rows.get("ddp")
    if not d or "evals" not in d:
        return None
    early = [v for s, v, _ in d["evals"] if s <= d["steps"] // 2]
    return early[-1] if early else None


def time_to(row, goal):
    """Training seconds at row's first evaluation at or below goal, or None."""
    for _, v, t in row.get("evals", ()):
        if goal is not None and v <= goal:
            return t
    return None


def exactness(rows, params_path):
    """One dict per configuration of EXACT that ran with reference on this
    link: the largest |Δθ| of the final shared weights, ‖Δθ‖/‖θ‖ (AdamW
    turns a rounding difference in a gradient near 0 into up to an lr's
    step: the largest |Δθ| can be ~lr where the norm is not) and the
    difference of final validation losses."""
    import torch

    ref = rows.get("reference")
    out = []
    for c in EXACT:
        row = rows.get(c)
        if not (ref and row and "final_val_loss" in ref and "final_val_loss" in row):
            continue
        a, b = torch.load(params_path(row["link"], c)), torch.load(params_path(ref["link"], "reference"))
        out.append({"run": row["run"], "link": row["link"], "compare": [c, "reference"],
                    "max_abs_dtheta": max(float((x - y).abs().max()) for x, y in zip(a, b)),
                    "rel_l2_dtheta": float(torch.cat([(x - y).reshape(-1) for x, y in zip(a, b)]).norm()
                                           / torch.cat([y.reshape(-1) for y in b]).norm()),
                    "val_loss_diff": row["final_val_loss"] - ref["final_val_loss"]})
    return out


def _f(x, fmt):
    return fmt % x if x is not None else "—"


def link_table(link, rows):
    goal = target(rows)
    base = rows.get("ddp", {}).get("final_val_loss")
    print("\nlink %s: target %s (ddp's validation loss at half its steps)" % (link, _f(goal, "%.4f")))
    print("| config | final val loss | × ddp | to target (s) | train wall (s) | MB sent / worker | peak MB / sync"
          " | syncs | inner step ms: median (in flight / idle) | in sync calls (s) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for c, r in rows.items():
        if "skipped" in r or r.get("error"):
            why = r.get("skipped") or r["error"].strip().splitlines()[-1]
            print("| %s | %s: %s |" % (c, "not run" if "skipped" in r else "failed", why.replace("|", "/")))
            continue
        v = r["final_val_loss"]
        split = ""
        if r["inner_inflight_median_s"] is not None:
            split = " (%.1f / %.1f)" % (1e3 * r["inner_inflight_median_s"], 1e3 * r["inner_idle_median_s"])
        print("| %s | %.4f | %s | %s | %.1f | %.2f | %.3f | %d | %.1f%s | %.2f |" % (
            c, v, _f(v / base if base else None, "%.4f"), _f(time_to(r, goal), "%.1f"), r["wall_s"],
            r["bytes_total"] / 1e6, r["bytes_peak"] / 1e6, r["syncs"], 1e3 * r["inner_median_s"], split,
            r["sync_call_s"]))


def summary(runs):
    """Across links: wall time and time to target of ddp, the best gradcomp
    hook (ddp:SPEC) and the best outer configuration (the least time to
    target, then the least wall time)."""
    print("\n| link | ddp wall (s) | ddp to target (s) | best hook | its to target (s) | best outer | its to target "
          "(s) | its wall (s) |")
    print("|---|---:|---:|---|---:|---|---:|---:|")
    for link, rows in runs.items():
        goal = target(rows)
        ok = {c: r for c, r in rows.items() if "final_val_loss" in r}

        def best(names):
            cand = [(time_to(ok[c], goal) is None, time_to(ok[c], goal) or 0, ok[c]["wall_s"], c) for c in names]
            return min(cand)[3] if cand else None

        hook = best([c for c in ok if c.startswith("ddp:")])
        outer = best([c for c in ok if c in OUTER])
        d = ok.get("ddp")
        print("| %s | %s | %s | %s | %s | %s | %s | %s |" % (
            link, _f(d and d["wall_s"], "%.1f"), _f(d and time_to(d, goal), "%.1f"), hook or "—",
            _f(hook and time_to(ok[hook], goal), "%.1f"), outer or "—", _f(outer and time_to(ok[outer], goal), "%.1f"),
            _f(outer and ok[outer]["wall_s"], "%.1f")))


def report(path, run, params_path, append):
    """Prints run's tables from path, appends its exactness rows that path
    lacks; 1 when a configuration failed."""
    runs = load(path, run)
    if not runs:
        print("scripts/diloco.py --report: no rows of run %r in %s" % (run, path))
        return 1
    with open(path) as f:
        have = {(r["link"], tuple(r["compare"])) for r in map(json.loads, filter(str.strip, f))
                if r.get("run") == run and "compare" in r}
    for link, rows in runs.items():
        link_table(link, rows)
        for e in exactness(rows, params_path):
            print("%s vs reference on %s: max |Δθ| %.3g, ‖Δθ‖/‖θ‖ %.3g, final validation loss difference %.3g"
                  % (e["compare"][0], link, e["max_abs_dtheta"], e["rel_l2_dtheta"], e["val_loss_diff"]))
            if (link, tuple(e["compare"])) not in have:
                append(path, e)
    summary(runs)
    return 1 if any(r.get("error") for rows in runs.values() for r in rows.values()) else 0
