#!/usr/bin/env python3
"""Turns scripts/gpu-check's raw outputs into its JSON report and summary.

usage: gpu-report.py BENCH_OUTPUT TORCH_JSON TEST_STATUS OUT_JSON

BENCH_OUTPUT is the `go test -bench` output of the kernels test binary
(lines "BenchmarkX-P  N  T ns/op  M MB/s [R recall]"); TORCH_JSON is
gpu-topk-baseline.py's output; TEST_STATUS is a file of "name rc" lines.
Prints every figure and each target of issue 4 with PASS/FAIL."""
import json
import re
import sys

LINE = re.compile(r"^(Benchmark[\w/:.=-]+?)(?:-\d+)?\s+\d+\s+([\d.]+) ns/op(.*)$")


def parse_bench(text):
    out = {}
    for line in text.splitlines():
        m = LINE.match(line.strip())
        if not m:
            continue
        rec = {"ns_per_op": float(m.group(2))}
        for val, unit in re.findall(r"([\d.e+-]+) (\S+)", m.group(3)):
            rec[unit.replace("/", "_per_")] = float(val)
        out[m.group(1)] = rec
    return out


def main(bench_path, torch_path, status_path, out_path):
    bench = parse_bench(open(bench_path).read())
    try:
        torch = json.load(open(torch_path))
    except (OSError, ValueError) as e:
        torch = {"error": str(e)}
    tests = {}
    for line in open(status_path):
        name, rc = line.split()
        tests[name] = int(rc)
    report = {"tests": tests, "bench": bench, "torch": torch, "targets": []}

    def target(name, value, op, limit):
        ok = value is not None and (value >= limit if op == ">=" else value <= limit)
        report["targets"].append({"name": name, "value": value, "want": "%s %g" % (op, limit), "pass": ok})

    def mbps(name):
        return bench.get(name, {}).get("MB_per_s")

    def ms(name):
        r = bench.get(name)
        return r["ns_per_op"] / 1e6 if r else None

    copy = mbps("BenchmarkCopy")
    for name, key in [("fused EF + int8 quantize / copy bandwidth", "BenchmarkQuantizeEF"),
                      ("dequantize-accumulate of 8 int8 payloads / copy bandwidth", "BenchmarkDequantAccumulate8")]:
        v = mbps(key)
        target(name, v / copy if v and copy else None, ">=", 0.8)
    tk = torch.get("torch_topk_ms")
    s, e = ms("BenchmarkTopKSampled"), ms("BenchmarkTopKExact")
    target("torch.topk time / sampled top-k 1% time", tk / s if tk and s else None, ">=", 10)
    target("sampled top-k recall", bench.get("BenchmarkTopKSampled", {}).get("recall"), ">=", 0.95)
    target("exact top-k time / torch.topk time", e / tk if tk and e else None, "<=", 0.5)
    for spec in ("none", "int8", "topk:0.01"):
        r = bench.get("BenchmarkDeviceOverlap/" + spec, {})
        target("overlap %s: step time / compute-only time" % spec, r.get("step_per_compute"), "<=", 1.1)
    json.dump(report, open(out_path, "w"), indent=2)

    print("gpu-check: tests:", " ".join("%s=%s" % (k, "ok" if v == 0 else "FAIL(%d)" % v) for k, v in tests.items()))
    for k, v in sorted(bench.items()):
        print("gpu-check: %-30s %10.3f ms  %s" % (k, v["ns_per_op"] / 1e6,
              "  ".join("%s=%g" % (u, x) for u, x in v.items() if u != "ns_per_op")))
    print("gpu-check: torch:", json.dumps(torch))
    for t in report["targets"]:
        print("gpu-check: target %-60s %-12s want %-8s %s" % (
            t["name"], "n/a" if t["value"] is None else "%.3f" % t["value"], t["want"], "PASS" if t["pass"] else "FAIL"))
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
