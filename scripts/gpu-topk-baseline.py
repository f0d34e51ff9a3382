#!/usr/bin/env python3
"""torch baselines for scripts/gpu-check: torch.topk(x.abs(), k) and a
device-to-device copy on the same 256M float32 Laplace gradient, timed with
CUDA events (median of several runs after a warm-up). Prints one JSON object
and, given a path as its argument, writes it there too. Exits 2 with
{"gpu": false} when torch sees no GPU.

usage: gpu-topk-baseline.py [OUT_JSON]"""
import json
import sys

N = 256 << 20
RATIO = 0.01
RUNS = 5


def emit(obj):
    text = json.dumps(obj)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text + "\n")


def main():
    try:
        import torch
    except ImportError as e:
        emit({"gpu": False, "reason": "no torch: %s" % e})
        return 2
    if not torch.cuda.is_available():
        emit({"gpu": False, "reason": "torch %s sees no CUDA device" % torch.__version__})
        return 2
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(1)
    u = torch.rand(N, device=dev, generator=g).clamp_(min=2 ** -24)
    x = -torch.log(u)
    x[torch.rand(N, device=dev, generator=g) < 0.5] *= -1  # Laplace(0, 1)
    k = round(RATIO * N)

    def timed(fn):
        fn()  # warm-up
        torch.cuda.synchronize()
        ms = []
        for _ in range(RUNS):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            ms.append(a.elapsed_time(b))
        return sorted(ms)[len(ms) // 2]

    dst = torch.empty_like(x)
    copy_ms = timed(lambda: dst.copy_(x))
    topk_ms = timed(lambda: torch.topk(x.abs(), k, sorted=False))
    emit({
        "gpu": True,
        "device": torch.cuda.get_device_name(0),
        "torch": torch.__version__,
        "n": N, "k": k,
        "torch_copy_ms": copy_ms,
        "torch_copy_GBps": 2 * 4 * N / copy_ms / 1e6,
        "torch_topk_ms": topk_ms,
    })
    return 0


if __name__ == "__main__":
    sys.exit(main())
