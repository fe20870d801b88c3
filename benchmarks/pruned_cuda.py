"""Run the pruned suite job by job, rewriting DIR/results.json after each (so a run cut short keeps what it
measured), and stop starting jobs after --budget seconds. Same rows as `python -m sparsetorch.bench
--suites pruned`; then print issue 19's tables (benchmarks/pruned_summary.py).

    python benchmarks/pruned_cuda.py --out DIR [--budget 160] [--full]
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time

import torch

import sparsetorch as st
from sparsetorch.bench import report
from sparsetorch.bench.__main__ import device_slug
from sparsetorch.bench.suites import Context
from sparsetorch.bench.suites.pruned import pruned_suite
from sparsetorch.bench.timing import make_timer, measure_ceilings


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--budget", type=float, default=1e9)
    ap.add_argument("--full", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    start = time.time()
    timer = make_timer(device, quick=not args.full)
    ceilings = measure_ceilings(device, timer, quick=not args.full)
    ctx = Context(device, timer, ceilings, not args.full, None)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    meta = {"device": name, "device_slug": device_slug(device), "torch": torch.__version__, "sparsetorch": st.__version__,
            "date": time.strftime("%Y-%m-%d"), "mode": "full" if args.full else "quick", "suites": ["pruned"],
            "copy_GBps": ceilings.bandwidth / 1e9, "gemm_flops": ceilings.gemm,
            "command": "python benchmarks/pruned_cuda.py " + " ".join(sys.argv[1:])}
    print(f"{name}: copy {ceilings.bandwidth / 1e9:.0f} GB/s, GEMM " +
          ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in ceilings.gemm.items()), flush=True)
    rows, jobs = [], pruned_suite(ctx)
    for i, job in enumerate(jobs):
        if time.time() - start > args.budget:
            print(f"budget reached: {len(jobs) - i} of {len(jobs)} jobs not run", flush=True)
            break
        t0 = time.time()
        got = job()
        for r in got:
            r["cpu"] = False
        rows += got
        print(f"job {i + 1}/{len(jobs)} {got[0]['case'].split(', N')[0] if got else ''}: {time.time() - t0:.1f} s",
              flush=True)
        meta["seconds"] = time.time() - start
        report.write(args.out, meta, rows, plots=False)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    subprocess.run([sys.executable, __file__.replace("pruned_cuda.py", "pruned_summary.py"), args.out, "--md",
                    f"{args.out}/summary.md"])


if __name__ == "__main__":
    main()
