"""python -m sparsetorch.bench: sparsetorch against dense matmul and the libraries users would pick,
on the best device present (CUDA if available, else the CPU).

Suites (--suites, comma-separated; default: the first five, and with --full also gnn and pruned):
  density      A (4096 x 4096 on CUDA, 1024 on the CPU) at 50% .. 0.1% density @ B: sparsetorch vs dense
               matmul in fp32 (TF32 off), TF32 and bf16, and torch.sparse.mm (fp32; bf16 on CUDA); the
               crossover densities.
  graphs       random and power-law graphs (100k nodes; 1M with --full), the real matrices and Planetoid
               graphs of ../shared/data, feature widths 32..512: vs torch.sparse.mm, cupy and
               torch_geometric where installed (SciPy on the CPU).
  batched      batches of graphs with different patterns (b = 8 .. 4096, sizes 64 .. 4096): vs a loop of
               torch.sparse.mm, dense torch.bmm (fp32, TF32) and one block-diagonal torch.sparse.mm.
  elementwise  the fused bias + activation and elementwise kernels against the copy bandwidth, eager
               torch and (with --full) torch.compile.
  skew         matrices adversarial to a route chooser (power-law rows at 4 exponents, one dense row, half
               the rows empty, banded, clustered, pruned, the real matrices), B widths 1..512, fp32 and
               bf16: the default st.spmm (its route recorded) against every route and torch.sparse.mm;
               the host time per call and the cost of validation by default.
  gnn          2-layer GCN and GraphSAGE training steps (fwd + bwd + Adam) and peak memory against
               torch_geometric (edge_index and sparse adjacency), Planetoid and power-law graphs (1M nodes
               with --full); Cora accuracy.
  pruned       pruned linear layers and a Llama-style MLP block in bf16 (unstructured 50-95%, 2:4) against
               dense F.linear, torch's 2:4 and BSR.
  distributed  SpMM and GCN steps on 1 vs 2+ GPUs (skipped with fewer than 2 devices).
  cpu          the CPU kernels, on the CPU also on a GPU machine: SpMM on graphs and pruned weights
               (n = 1..128) vs torch.sparse.mm (MKL) and SciPy, SDDMM, scaling, and the elementwise
               ops and fused bias + GELU vs eager torch (and torch.compile with --full).
The quick default takes about a minute on a 2-core CPU; --full runs every size. Every implementation's
output is checked against a float64 reference before it is timed. Results go to --out (default
bench-results/<device>): results.json, results.csv, README.md (table + headlines) and PNG plots.
"""
from __future__ import annotations

import argparse
import os
import re
import time

import torch

import sparsetorch as st
from sparsetorch.bench import report
from sparsetorch.bench.suites import SUITES, Context
from sparsetorch.bench.timing import make_timer, measure_ceilings
from sparsetorch.datasets import default_data_root


def device_slug(device: torch.device) -> str:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
    else:
        name = f"cpu-{torch.get_num_threads()}threads"
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def progress(total: int):
    try:
        from tqdm import tqdm

        return tqdm(total=total, unit="case", dynamic_ncols=True)
    except ImportError:
        class Plain:
            def __init__(self):
                self.done = 0

            def set_description(self, text):
                print(f"[{self.done + 1}/{total}] {text}", flush=True)

            def update(self, k=1):
                self.done += k

            def close(self):
                pass

        return Plain()


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sparsetorch.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--suites", default=None,
                    help=f"comma-separated, from {', '.join(SUITES)} (default: density,graphs,batched,"
                         "elementwise,skew; with --full also gnn,pruned)")
    ap.add_argument("--full", action="store_true", help="every size (minutes); default: the quick set")
    ap.add_argument("--data", default=None, help="folder with matrices/ and planetoid/ (default ../shared/data)")
    ap.add_argument("--out", default=None, help="results folder (default bench-results/<device>)")
    ap.add_argument("--widths", default=None, help="comma-separated B widths, for suites that sweep them (skew)")
    ap.add_argument("--dtypes", default=None, help="comma-separated dtypes, e.g. float32,bfloat16 (skew)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--replot", metavar="DIR", default=None,
                    help="rewrite README.md, CSV and plots of DIR from its results.json, without running")
    args = ap.parse_args(argv)
    if args.replot:
        print("wrote", ", ".join(report.replot(args.replot, plots=not args.no_plots)))
        return
    suites = args.suites or ("density,graphs,batched,elementwise,skew" + (",gnn,pruned" if args.full else ""))
    wanted = [s.strip() for s in suites.split(",") if s.strip()]
    for s in wanted:
        if s not in SUITES:
            ap.error(f"unknown suite {s!r}; choose from {', '.join(SUITES)}")
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device or ("cuda" if st.build_info()["cuda_available"] else "cpu"))
    quick = not args.full
    data_root = args.data or default_data_root()
    timer = make_timer(device, quick)
    ceilings = measure_ceilings(device, timer, quick)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"sparsetorch {st.__version__} on {name}: copy {ceilings.bandwidth / 1e9:.0f} GB/s, GEMM "
          + ", ".join(f"{k} {v / 1e12:.2f} TFLOP/s" for k, v in ceilings.gemm.items())
          + f"; {'full' if args.full else 'quick'} run of {', '.join(wanted)}")
    widths = tuple(int(w) for w in args.widths.split(",")) if args.widths else None
    dtypes = tuple(getattr(torch, d.strip()) for d in args.dtypes.split(",")) if args.dtypes else None
    ctx = Context(device, timer, ceilings, quick, data_root if os.path.isdir(data_root) else None, widths, dtypes)
    # The cpu suite runs on the CPU whatever the device; its rows are marked so that the GPU
    # headlines leave them out.
    jobs = [(s, j, s == "cpu" and device.type != "cpu") for s in wanted for j in SUITES[s](ctx)]
    rows = []
    bar = progress(len(jobs))
    start = time.time()
    for suite, job, on_cpu in jobs:
        bar.set_description(suite)
        for r in job():
            r["cpu"] = on_cpu
            rows.append(r)
        bar.update(1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    bar.close()
    report.add_speedups(rows)
    print()
    report.print_table(rows)
    print()
    for line in report.headlines(rows):
        print("*", line)
    out = args.out or os.path.join("bench-results", device_slug(device))
    meta = {"device": name, "device_slug": device_slug(device), "torch": torch.__version__,
            "sparsetorch": st.__version__, "date": time.strftime("%Y-%m-%d"), "mode": "full" if args.full else "quick",
            "suites": wanted, "copy_GBps": ceilings.bandwidth / 1e9, "gemm_flops": ceilings.gemm,
            "seconds": time.time() - start,
            "command": "python -m sparsetorch.bench " + " ".join(argv if argv is not None else __import__("sys").argv[1:])}
    written = report.write(out, meta, rows, plots=not args.no_plots)
    print(f"\nwrote {', '.join(written)} ({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
