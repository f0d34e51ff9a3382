"""Drives gradcomp's engine through the Python front end, for comparison
with the Go engine bit for bit (tests/golden, tests/python/test_frontends.py).

    /usr/bin/python3 tests/python/frontends.py --spec S --strategy T --world N --steps K --out DIR

spawns N gloo ranks; each drives gradcomp.Engine (the wrapper the DDP hook
uses, its collectives carried out on the gloo group by gradcomp's host
thread; no DDP) with buckets of 1000 and 37 elements, decision
"compressed", error feedback on, and per step the gradients

    g(rank, step, bucket, i) = float32(((rank*1000003 + step*10007 + bucket*101 + i*7919) mod 2003) - 1001) / 64

(int64 arithmetic, then a float32 division by 64), handed to the engine in
reverse bucket order as tests/golden's Go ranks do. It writes per rank
DIR/avg_r{rank}_s{step}_b{bucket}.f32 (the bucket's raw little-endian
float32 average after the step) and DIR/state_r{rank}.bin (the engine's
state after the last step, gc_engine_state_save). Exit status 0 on success.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "plugin", "python"))

#: The buckets' element counts.
SIZES = (1000, 37)


def gradient(rank, step, bucket, n):
    """g(rank, step, bucket, i) for i in 0..n-1, computed exactly."""
    import torch

    i = torch.arange(n, dtype=torch.int64)
    h = (rank * 1000003 + step * 10007 + bucket * 101 + i * 7919) % 2003
    return (h - 1001).to(torch.float32) / 64


def drive(rank, world, spec, strategy, steps, out):
    """One rank: the engine for SIZES over the default group, `steps`
    steps; writes the averages and the final state."""
    import torch

    import gradcomp

    with gradcomp.Engine(spec, SIZES, strategy=strategy, decision="compressed", error_feedback=True,
                         workers=1) as eng:
        for s in range(steps):
            grads = [gradient(rank, s, b, n) for b, n in enumerate(SIZES)]
            eng.step()
            for b in reversed(range(len(SIZES))):
                eng.ready(b, grads[b])
            eng.wait()
            for b, g in enumerate(grads):
                assert g.dtype == torch.float32 and g.is_contiguous()
                with open(os.path.join(out, "avg_r%d_s%d_b%d.f32" % (rank, s, b)), "wb") as f:
                    f.write(g.numpy().astype("<f4").tobytes())
        with open(os.path.join(out, "state_r%d.bin" % rank), "wb") as f:
            f.write(eng.save_state())
        return eng.stats().bytes_sent


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--spec", required=True)
    p.add_argument("--strategy", default="auto")
    p.add_argument("--world", type=int, default=4)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--out", required=True)
    p.add_argument("--timeout", type=float, default=120)
    a = p.parse_args(argv)
    os.makedirs(a.out, exist_ok=True)
    import ranks

    ranks.run(drive, a.world, a.spec, a.strategy, a.steps, os.path.abspath(a.out), timeout=a.timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
