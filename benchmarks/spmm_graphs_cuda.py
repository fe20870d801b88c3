"""SpMM routes on the graph suite: every CUDA backend of st.spmm (row-group "native", load-balanced
"balanced", "cusparse"), SpmmPlan with "auto", and torch.sparse.mm, on the graphs of the main
harness (random and power-law 100k and 1M, the real matrices and Planetoid graphs of ../shared/data),
feature widths 32..512, fp32, int32 indices. Every output is checked against cuSPARSE in float64
first; B is rotated through copies so one call's B is not in L2 from the previous one.

Floor per row: bytes = nnz * (index + value) + (m + 1) * index + min(nnz, k) * n * value + m * n * value
(each referenced B row once) over the copy bandwidth measured here; flops = 2 nnz n over the SGEMM
rate measured here. Gathers of B rows in random order reach far less than copy bandwidth, so the
floor is optimistic for graphs whose B does not fit in L2.

    python benchmarks/spmm_graphs_cuda.py --out benchmarks/results/h200 [--quick]
"""
import argparse
import json
import math
import os

import numpy as np
import torch

import sparsetorch as st
from sparsetorch.bench.suites import power_law_graph, random_graph, real_graphs, spmm_model
from sparsetorch.bench.timing import Rotating, make_timer, measure_ceilings, relative_error, rotation
from _results import run_meta, write_results

BACKENDS = ("native", "balanced", "cusparse")


def graphs(quick: bool, data_root):
    found = [("random 100k, 20/row", lambda: random_graph(100_000, 20, 1)),
             ("power-law 100k", lambda: power_law_graph(100_000, 20, 2))]
    if not quick:
        found += [("random 1M, 20/row", lambda: random_graph(1_000_000, 20, 3)),
                  ("power-law 1M", lambda: power_law_graph(1_000_000, 20, 4))]
    return found + real_graphs(data_root)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    device = torch.device("cuda")
    timer = make_timer(device, quick=False)
    ceil = measure_ceilings(device, timer, quick=False)
    data_root = os.environ.get("SPARSETORCH_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                                  "data"))
    widths = (32, 128, 512) if args.quick else (32, 64, 128, 256, 512)
    results = []
    header = (f"{'graph':<22} {'n':>4} {'longest':>7} | " + " ".join(f"{b:>9}" for b in BACKENDS)
              + f" {'plan':>9} {'torch':>9} | {'floor':>8} | best/torch  plan/torch  balanced/native")
    print(f"copy {ceil.bandwidth / 1e12:.2f} TB/s, SGEMM {ceil.gemm['float32'] / 1e12:.1f} TFLOP/s; times in us")
    print(header)
    for name, make in graphs(args.quick, data_root):
        a_sp = make()
        a_sp.sort_indices()
        A = st.from_scipy(a_sp, device=device, dtype=torch.float32, index_dtype=torch.int32)
        plan = st.SpmmPlan(A, validate=False)
        a_torch = st.to_torch(A)
        a64 = st.to_torch(A.to(dtype=torch.float64))
        m, k, nnz = a_sp.shape[0], a_sp.shape[1], a_sp.nnz
        longest = int(np.diff(a_sp.indptr).max()) if m else 0
        for n in widths:
            g = torch.Generator(device=device).manual_seed(n)
            B = torch.randn(k, n, device=device, generator=g)
            ref = torch.sparse.mm(a64, B.double())
            nbytes, flops = spmm_model(nnz, m, k, n, 4, 4)
            inputs = [(B,)] + [(B.clone(),) for _ in range(rotation(device, nbytes) - 1)]
            impls = {be: (lambda b, be=be: st.spmm(A, b, backend=be)) for be in BACKENDS}
            impls["plan"] = lambda b: plan(b)
            impls["torch"] = lambda b: torch.sparse.mm(a_torch, b)
            times = {}
            for label, fn in impls.items():
                err = relative_error(fn(B), ref)
                if not err <= 1e-4:
                    raise AssertionError(f"{name} n={n} {label}: relative error {err:.2e}")
                times[label] = timer(Rotating(fn, inputs))
            del inputs
            floor = ceil.floor(nbytes, flops)
            best = min(times[be] for be in BACKENDS)
            row = {"graph": name, "n": n, "m": m, "nnz": nnz, "longest_row": longest, "floor_s": floor,
                   "times_s": times, "best_over_torch": times["torch"] / best,
                   "plan_over_torch": times["torch"] / times["plan"], "plan_route": plan.backend,
                   "balanced_over_native": times["native"] / times["balanced"]}
            results.append(row)
            print(f"{name:<22} {n:>4} {longest:>7} | " + " ".join(f"{times[b] * 1e6:>9.1f}" for b in BACKENDS)
                  + f" {times['plan'] * 1e6:>9.1f} {times['torch'] * 1e6:>9.1f} | {floor * 1e6:>8.1f} | "
                  f"{row['best_over_torch']:>9.2f}x {row['plan_over_torch']:>9.2f}x {row['balanced_over_native']:>9.2f}x",
                  flush=True)
        del A, plan, a_torch, a64
        torch.cuda.empty_cache()

    def geomean(key):
        return math.exp(sum(math.log(r[key]) for r in results) / len(results))

    summary = {"plan_over_torch_geomean": geomean("plan_over_torch"),
               "plan_over_torch_min": min(r["plan_over_torch"] for r in results),
               "best_over_torch_geomean": geomean("best_over_torch"),
               "balanced_over_native_geomean": geomean("balanced_over_native")}
    print(json.dumps(summary, indent=1))
    write_results(args.out, "spmm_graphs_cuda.json",
                  run_meta(copy_Bps=ceil.bandwidth, sgemm_flops=ceil.gemm["float32"]), results, results_key="rows",
                  summary=summary)


if __name__ == "__main__":
    main()
