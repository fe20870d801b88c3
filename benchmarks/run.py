"""python -m benchmarks (or python benchmarks/run.py), from the repository root: sparsetorch against dense
matmul and the libraries users would pick, on the best device present (CUDA if available, else the CPU).

Suites (--suites, comma-separated; default: the first five, and with --full also gnn and pruned). Sizes are
the quick run's on CUDA / on the CPU; --full adds the sizes in brackets:
  density      A 4096 x 4096 @ B 4096 x 1024 / A 1024 x 1024 @ B 1024 x 128, at 5 densities from 50% (CPU:
               30%) to 0.1% [10 / 8 densities]: sparsetorch vs dense matmul in fp32 (TF32 off), TF32 and
               bf16 (CUDA), torch.sparse.mm (fp32; bf16 on CUDA) and SciPy (CPU); the crossover densities.
  graphs       random and power-law graphs of 100k / 20k nodes [1M on CUDA], the real matrices and
               Planetoid graphs of the data folder (below), feature widths 32, 128 / 32 [32..512 / 32, 128]:
               vs torch.sparse.mm, cupy and torch_geometric where installed (CUDA), SciPy (CPU).
  batched      batches with a different pattern per matrix, (b, size) = (8, 4096), (512, 256), (4096, 64)
               / (8, 512), (64, 64) [more]: vs a loop of torch.sparse.mm, dense torch.bmm (fp32, TF32) and
               one block-diagonal torch.sparse.mm.
  elementwise  the fused bias + activation and elementwise kernels on 2^26 / 2^24 elements, held to the
               copy ceiling (the copy row is the ceiling's own measurement); eager torch [torch.compile].
  skew         matrices adversarial to a route chooser (power-law rows at 4 exponents, one dense row, half
               the rows empty, banded, clustered, pruned, the real matrices; 100k / 5k rows), B widths 1, 32,
               128 / 1, 32 [1..512 on CUDA], fp32 and bf16 (CUDA): the default st.spmm (its route recorded)
               against every route and torch.sparse.mm; the host time per call and the cost of validation.
  gnn          2-layer GCN and GraphSAGE training steps (fwd + bwd + Adam) and peak memory against
               torch_geometric (edge_index and sparse adjacency), Planetoid and power-law graphs (1M nodes
               with --full on CUDA); Cora accuracy; mini-batch training with a new sampled subgraph every
               step (300k / 20k-node power-law graph, 3 layers, fanouts [15, 10] and [25, 10, 5] on CUDA),
               batches on the device and moved each step, host syncs per step.
  fresh        never-seen matrices (the skew suite's on CUDA, and small ones): the first call and ten
               calls from new against torch.sparse.mm's, the costliest call against 20x the steady call;
               a stream of 300 / 60 fresh 5k-node matrices; what the caches hold after 3000 / 1000.
  pruned       pruned linear layers and a Llama-style MLP block (bf16 on CUDA, float32 on the CPU;
               unstructured 50-95% and 2:4) against dense F.linear, torch's 2:4 and BSR; then the decode suite.
  decode       decode steps (N = 1..16 tokens) of a Llama-3-8B-shaped decoder stack (--layers, default 4 /
               a 1-layer hidden-256 stack on the CPU), Wanda-pruned to 50% and 70% per row and 2:4:
               SparseLinear against the pruned weights stored dense, tokens/s, eager and CUDA graph.
  serving      pruned layers as a server runs them: a fixed 300-step sequence of 1-64-token decode steps and
               128-2048-token prefill chunks / a CPU sequence of 64 steps at a sixteenth of the sizes, over a
               Llama-3-8B MLP block at 70% per row, 90% and 2:4, first calls included: SparseLinear default,
               with a tuning cache file, prepared, compact, against dense F.linear and nn.Linear; the
               costliest call, memory held, prepare() time [the 4-layer stack's projections].
  e2e          (CUDA) a causal LM with random weights in the Llama-3 layout (2 layers of Llama-3-8B's shapes),
               Wanda-pruned to 2:4, prepared and compacted, decoding 256 tokens at batch 1 and 16, eager and
               reduce-overhead, against the dense model run the same ways: tokens/s, weight bytes.
  compile      the layers under torch.compile and CUDA graphs: GCN / SAGE mini-batch and Planetoid training
               steps against torch_geometric, the pruned MLP block and decoder stack against dense, eager /
               compiled / reduce-overhead / a manual CUDA graph, with graph and break counts and compile
               times [every Planetoid graph, 70% per row].
  distributed  SpMM and GCN steps on 1 vs 2+ GPUs (left out with fewer than 2 devices; with --device cpu a
               rehearsal on CPU processes).
  cpu          the CPU kernels, on the CPU also on a GPU machine: SpMM on graphs and pruned weights
               (n = 1..128) vs torch.sparse.mm (MKL) and SciPy, SDDMM, scaling, and the elementwise
               ops and fused bias + GELU vs eager torch [and torch.compile].
Floors (max(bytes / copy bandwidth, flops / GEMM rate)) come
from one copy and one GEMM per dtype measured at the start of the run and printed in its first line.
--full runs every size. Every implementation's output is checked against a float64 reference before it is
timed. Results go to --out (default bench-results/<device>): results.json, results.csv, README.md (table +
headlines) and PNG plots.

Real data (graphs, skew, cpu, gnn): --data DIR, else $SPARSETORCH_DATA, else ~/.cache/sparsetorch:
DIR/matrices/*.mtx and the Planetoid graphs (the folder torch_geometric's Planetoid(DIR, name) download
leaves, or DIR/planetoid/ind.<name>.*). Without it those suites run their synthetic cases only;
the run says what it left out, and why, at its start and at its end.
"""
from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import re
import sys
import time
import warnings
from typing import Callable, List, Optional

if __package__ in (None, ""):  # run as a file (python benchmarks/run.py): the repository root holds the package
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch

import sparsetorch as st
from benchmarks import report
from benchmarks.harness import make_timer, measure_ceilings
from benchmarks.suites.common import Context
from benchmarks.suites.graphs import PLANETOID
from sparsetorch.datasets import data_roots, how_to_get_planetoid, matrix_files, planetoid_available

# The suites: name -> "module:function" in benchmarks/suites/ (imported when the run asks for the suite).
# Adding a suite is its module there and one line here (and a paragraph in the docstring above, for -h).
SUITES = {
    "density": "density:density_suite",
    "graphs": "graphs:graph_suite",
    "batched": "batched:batched_suite",
    "elementwise": "elementwise:elementwise_suite",
    "skew": "skew:skew_suite",
    "distributed": "distributed:distributed_suite",
    "pruned": "pruned:pruned_suite",
    "decode": "decode:decode_suite",
    "gnn": "gnn:gnn_suite",
    "fresh": "fresh:fresh_suite",
    "cpu": "cpu:cpu_suite",
    "serving": "serving:serving_suite",
    "e2e": "serving:e2e_suite",
    "compile": "compile:compile_suite",
}


def suite_function(name: str) -> Callable:
    """The function of suite ``name`` (SUITES may also hold the function itself)."""
    entry = SUITES[name]
    if callable(entry):
        return entry
    module, function = entry.split(":")
    return getattr(importlib.import_module(f"benchmarks.suites.{module}"), function)

# torch's notices about its own sparse CSR support, provoked by the harness building torch CSR baselines:
# not about anything the user passed, so they stay out of the output.
HARNESS_WARNINGS = ("Sparse CSR tensor support is in beta state", "Sparse invariant checks are implicitly disabled")


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


def find_data(root: Optional[str]) -> Optional[str]:
    """The data folder of the run: ``root`` (--data) if it exists, else the default folder
    (sparsetorch.datasets.data_roots) if it holds any matrices or Planetoid graphs."""
    if root:
        return root if os.path.isdir(root) else None
    for r in data_roots():
        if matrix_files(r) or any(planetoid_available(name, r, graph_only=True) for name in PLANETOID):
            return r
    return None


def data_left_out(root: Optional[str], asked: Optional[str], wanted: List[str]) -> List[str]:
    """What the suites in `wanted` leave out for want of data, one line each (empty when all is there)."""
    where = asked or root or " or ".join(data_roots())
    lines = []
    users = [s for s in ("graphs", "skew", "cpu") if s in wanted]
    if users and not (root and matrix_files(root)):
        lines.append(f"{', '.join(users)}: the real matrices (no Matrix Market files in {where}/matrices)")
    users = [s for s in ("graphs", "skew", "cpu", "gnn") if s in wanted]
    missing = [name for name in PLANETOID if not (root and planetoid_available(name, root, graph_only=True))]
    if users and missing:
        lines.append(f"{', '.join(users)}: the Planetoid graphs {', '.join(missing)} (not found under {where})")
    return lines


def packages_left_out(device: torch.device, wanted: List[str]) -> List[str]:
    """Baselines the suites in `wanted` leave out because their package is not installed."""
    def missing(module):
        return importlib.util.find_spec(module) is None

    lines = []
    if "graphs" in wanted and device.type == "cuda":
        for module, pip in (("cupy", "cupy-cuda12x"), ("torch_geometric", "torch-geometric")):
            if missing(module):
                lines.append(f"graphs: the {module} baseline ({module} not installed: pip install {pip})")
    if "gnn" in wanted and missing("torch_geometric"):
        lines.append("gnn: every torch_geometric variant (not installed: pip install torch-geometric)")
    return lines


def _existing(out: str, device: str) -> Optional[dict]:
    """The results.json already in `out` (for --append), None if there is none."""
    import json

    path = os.path.join(out, "results.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        old = json.load(f)
    if old["meta"].get("device") != device:
        raise SystemExit(f"--append: {path} holds results of {old['meta'].get('device')}, not of {device}")
    return old


def _appended(old: Optional[dict], meta: dict, rows: List[dict]):
    """meta and rows of the folder's earlier results `old` with this run's suites replaced by its own."""
    if old is None:
        return meta, rows
    # A suite's jobs may emit rows of another suite name (pruned emits the decode stack's "decode" rows):
    # those are replaced too.
    replaced = set(meta["suites"]) | {r["suite"] for r in rows}
    kept = [r for r in old["rows"] if r["suite"] not in replaced]
    suites = [s for s in old["meta"]["suites"] if s not in meta["suites"]] + meta["suites"]
    commands = old["meta"].get("commands") or [old["meta"]["command"]]
    merged = {**meta, "suites": suites, "commands": commands + [meta["command"]],
              "command": " ; ".join(commands + [meta["command"]]),
              "seconds": old["meta"].get("seconds", 0.0) + meta["seconds"],
              "left_out": list(dict.fromkeys(old["meta"].get("left_out", []) + meta["left_out"]))}
    if old["meta"].get("date") != meta["date"]:
        merged["date"] = f"{old['meta'].get('date')} and {meta['date']}"
    merged.pop("partial", None)
    merged.pop("unfinished", None)
    return merged, kept + rows  # speedups compare within a suite: the merged rows keep theirs


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--suites", default=None,
                    help=f"comma-separated, from {', '.join(SUITES)} (default: density,graphs,batched,"
                         "elementwise,skew; with --full also gnn,pruned)")
    ap.add_argument("--full", action="store_true", help="every size (minutes); default: the quick set")
    ap.add_argument("--data", default=None, help="folder with the real data: matrices/*.mtx and the Planetoid graphs "
                    "(default: $SPARSETORCH_DATA, else ~/.cache/sparsetorch)")
    ap.add_argument("--out", default=None, help="results folder (default bench-results/<device>)")
    ap.add_argument("--widths", default=None, help="comma-separated B widths, for suites that sweep them (skew; "
                    "decode: the tokens per step)")
    ap.add_argument("--layers", type=int, default=None,
                    help="decoder layers of the decode stack (decode, pruned; default 4 on CUDA, 1 on the CPU)")
    ap.add_argument("--dtypes", default=None, help="comma-separated dtypes, e.g. float32,bfloat16 (skew)")
    ap.add_argument("--no-plots", action="store_true")
    ap.add_argument("--append", action="store_true",
                    help="add this run's suites to the results already in --out (same device), replacing the rows of "
                         "the suites it runs again; the folder's meta lists every command that wrote it")
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
    device = torch.device(args.device or ("cuda" if st.build_info()["cuda_available"] else "cpu"))
    quick = not args.full
    with warnings.catch_warnings():
        for message in HARNESS_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        run(args, argv, wanted, device, quick)


def run(args, argv, wanted: List[str], device: torch.device, quick: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = False
    data_root = find_data(args.data)
    timer = make_timer(device, quick)
    ceilings = measure_ceilings(device, timer, quick)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({torch.get_num_threads()} threads)"
    print(f"sparsetorch {st.__version__} on {name}: ceilings measured once for every floor of the run: copy "
          f"{ceilings.bandwidth / 1e9:.0f} GB/s ({2 * ceilings.copy_numel * 4 / 2**20:.0f} MiB moved), GEMM "
          + ", ".join(f"{k} {v / 1e12:.2f} TFLOP/s" for k, v in ceilings.gemm.items())
          + f"; {'full' if args.full else 'quick'} run of {', '.join(wanted)}")
    left_out = data_left_out(data_root, args.data, wanted) + packages_left_out(device, wanted)
    needs_data = any(s in wanted for s in ("graphs", "skew", "cpu", "gnn"))
    if needs_data:
        print(f"data: {data_root}" if data_root else
              f"data: none found ({args.data or ' or '.join(data_roots())}): the real matrices and graphs are left out")
    for line in left_out:
        print(f"left out: {line}")
    widths = tuple(int(w) for w in args.widths.split(",")) if args.widths else None
    dtypes = tuple(getattr(torch, d.strip()) for d in args.dtypes.split(",")) if args.dtypes else None
    ctx = Context(device, timer, ceilings, quick, data_root, widths, dtypes, args.layers)
    # The cpu suite runs on the CPU whatever the device; its rows are marked so that the GPU
    # headlines leave them out.
    if "pruned" in wanted and "decode" in wanted:  # the pruned suite runs the decode suite's jobs itself
        wanted.remove("decode")
    jobs = [(s, j, s == "cpu" and device.type != "cpu") for s in wanted for j in suite_function(s)(ctx)]
    rows = []
    bar = progress(len(jobs))
    start = time.time()
    out = args.out or os.path.join("bench-results", device_slug(device))

    def meta_of(suites_done: List[str]) -> dict:
        return {"device": name, "device_slug": device_slug(device), "torch": torch.__version__,
                "sparsetorch": st.__version__, "date": time.strftime("%Y-%m-%d"),
                "mode": "full" if args.full else "quick", "suites": suites_done,
                "copy_GBps": ceilings.bandwidth / 1e9, "gemm_flops": ceilings.gemm, "seconds": time.time() - start,
                "data": data_root, "left_out": left_out + [l for l in ctx.left_out if l not in left_out],
                "command": "python -m benchmarks " + " ".join(argv if argv is not None else sys.argv[1:])}

    earlier = _existing(out, name) if args.append else None
    for i, (suite, job, on_cpu) in enumerate(jobs):
        bar.set_description(suite)
        for r in job():
            r["cpu"] = on_cpu
            rows.append(r)
        bar.update(1)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        if i + 1 < len(jobs):
            # The rows so far go to disk (without plots) after every job, so a run cut short keeps them
            # (meta "partial": true, and the suite it stopped in; --replot DIR redraws the folder).
            started = list(dict.fromkeys(s for s, _, _ in jobs[:i + 1]))
            report.add_speedups(rows)  # in place; the end of the run sets them again
            meta, partial = _appended(earlier, meta_of(started), rows)
            if jobs[i + 1][0] == suite:
                done = sum(1 for s, _, _ in jobs[:i + 1] if s == suite)
                meta["unfinished"] = f"{suite}: {done} of {sum(1 for s, _, _ in jobs if s == suite)} jobs"
            report.write(out, {**meta, "partial": True}, partial, plots=False)
    bar.close()
    report.add_speedups(rows)
    print()
    report.print_table(rows)
    print()
    for line in report.headlines(rows):
        print("*", line)
    left_out += ctx.left_out
    if left_out:
        print("\nLeft out of this run:")
        for line in left_out:
            print(f"  - {line}")
        if any("Planetoid" in line or "real matrices" in line for line in left_out):
            print("  To add the real data: put Matrix Market files in DIR/matrices and the Planetoid graphs in DIR; "
                  "Planetoid: " + how_to_get_planetoid("cora").replace("\n", "\n  "))
    meta, rows = _appended(earlier, meta_of(wanted), rows)
    written = report.write(out, meta, rows, plots=not args.no_plots)
    print(f"\nwrote {', '.join(written)} ({time.time() - start:.0f} s)")


if __name__ == "__main__":
    main()
