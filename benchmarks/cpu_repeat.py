"""The CPU suite (benchmarks/suites/cpu.py) run several times in a row, for ranges on a noisy
machine: per case, sparsetorch's median time and its speedup over each baseline as min .. max over the
runs; per run, the geomeans; the load average (os.getloadavg) before each run.

    python -m benchmarks.cpu_repeat [--runs 3] [--full] [--out benchmarks/results/cpu/cpu_repeat]

Writes cpu_repeat.json (every row of every run) and cpu_repeat.md (the tables) to --out.
"""
import argparse
import json
import os
import platform
import statistics
import time
from collections import defaultdict

import torch

import sparsetorch as st
from benchmarks import report
from benchmarks.harness import make_timer, measure_ceilings
from benchmarks.suites.common import Context
from benchmarks.suites.cpu import cpu_suite, headlines
from sparsetorch.datasets import default_data_root


def one_run(full: bool):
    cpu = torch.device("cpu")
    timer = make_timer(cpu, not full)
    ceilings = measure_ceilings(cpu, timer, not full)
    root = default_data_root()
    ctx = Context(cpu, timer, ceilings, not full, root if os.path.isdir(root) else None)
    rows = []
    for job in cpu_suite(ctx):
        rows += job()
    report.add_speedups(rows)
    return rows, ceilings


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--out", default=os.path.join("benchmarks", "results", "cpu", "cpu_repeat"))
    args = ap.parse_args()
    runs = []
    for i in range(args.runs):
        load = os.getloadavg()
        t0 = time.time()
        rows, ceilings = one_run(args.full)
        runs.append({"load_before": load, "seconds": time.time() - t0, "copy_GBps": ceilings.bandwidth / 1e9,
                     "gemm_fp32_GFLOPs": ceilings.gemm["float32"] / 1e9, "rows": rows,
                     "headlines": headlines(rows)})
        print(f"run {i + 1}/{args.runs}: load {load[0]:.2f}, {time.time() - t0:.0f} s", flush=True)
        for h in runs[-1]["headlines"]:
            print("  *", h)

    ours = defaultdict(list)      # case -> sparsetorch times (ms), one per run
    speed = defaultdict(list)     # (case, baseline) -> speedups, one per run
    order = []
    for run in runs:
        for r in run["rows"]:
            if r["case"] not in order:
                order.append(r["case"])
            if r["impl"] == "sparsetorch":
                ours[r["case"]].append(r["time_ms"])
            elif r.get("speedup"):
                speed[(r["case"], r["impl"])].append(r["speedup"])
    baselines = ["torch.sparse.mm", "scipy", "torch.sparse.sampled_addmm", "eager torch", "torch.compile"]
    lines = [f"# CPU suite, {args.runs} runs ({'full' if args.full else 'quick'})", "",
             f"torch {torch.__version__}, sparsetorch {st.__version__} ({torch.ops.sparsetorch._cpu_isa()} kernels), "
             f"{torch.get_num_threads()} threads, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}, "
             f"{time.strftime('%Y-%m-%d')}. Regenerate: `python -m benchmarks.cpu_repeat --runs {args.runs}"
             f"{' --full' if args.full else ''}`.", "",
             "Load average (1 min) before each run: " + ", ".join(f"{r['load_before'][0]:.2f}" for r in runs)
             + "; copy bandwidth measured per run: " + ", ".join(f"{r['copy_GBps']:.1f}" for r in runs) + " GB/s.", "",
             "Per case: sparsetorch's median time per run (min .. max over runs), and each baseline's time over "
             "sparsetorch's (> 1: sparsetorch faster), min .. max over runs.", "",
             "| case | sparsetorch ms | " + " | ".join(f"x vs {b}" for b in baselines) + " |",
             "|---|---|" + "---|" * len(baselines)]
    for case in order:
        t = ours[case]
        cells = [f"{min(t):.3g} .. {max(t):.3g}" if len(t) > 1 else f"{t[0]:.3g}"]
        for b in baselines:
            s = speed.get((case, b))
            cells.append("" if not s else (f"{min(s):.2f} .. {max(s):.2f}" if len(s) > 1 else f"{s[0]:.2f}"))
        lines.append(f"| {case} | " + " | ".join(cells) + " |")
    lines += ["", "Headlines per run:", ""]
    for i, run in enumerate(runs):
        lines += [f"- run {i + 1} (load {run['load_before'][0]:.2f}):"] + [f"  - {h}" for h in run["headlines"]]
    geo = defaultdict(list)
    for run in runs:
        for r in run["rows"]:
            if r.get("op") == "spmm" and r.get("speedup") and r["impl"] != "sparsetorch":
                geo[(id(run), r["impl"])].append(r["speedup"])
    per_base = defaultdict(list)
    for (_, impl), vals in geo.items():
        per_base[impl].append(report.geomean(vals))
    lines += ["", "SpMM geomean speedup over each baseline, min .. max over runs: "
              + "; ".join(f"{b} {min(v):.2f} .. {max(v):.2f} (median {statistics.median(v):.2f})"
                          for b, v in per_base.items())]
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "cpu_repeat.json"), "w") as f:
        json.dump({"runs": runs, "full": args.full, "torch": torch.__version__}, f, indent=1)
    with open(os.path.join(args.out, "cpu_repeat.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
