"""Skewed graphs: every SpMM route on power-law graphs (row and column degrees from Pareto laws of three
exponents, 100k and 1M nodes, 20 entries per row on average) and on uniform random graphs, B widths
32..256, float32 and bfloat16, int32 indices: the row-group kernel ("native"), "balanced", the
entry-split kernel ("split"), our cuSPARSE route and torch.sparse.mm, each output checked against a
float64 cuSPARSE product first, B rotated through copies where it would stay in L2 between calls.

Floor per case, next to every time: the gather bound (every stored entry reads its B row: nnz * n *
bytes, from L2 when B fits in L2, else from HBM) + A once + C once (+ B once from HBM when it fits in
L2), over the bandwidths measured in the run (HBM: a device copy; L2: copies of an 8 MB buffer).
Power-law columns (hub columns) make many gathers hit L2 even when B does not fit, so on the 1M
graphs a kernel can beat the HBM-gather floor; the fraction of floor is reported as measured.

For the routing model, each graph's one-pass statistics: rows, nnz, longest row, mean, coefficient of
variation of row lengths, share of entries in rows longer than 32 / 256 / 4096, empty rows.

    python benchmarks/spmm_skew_cuda.py --out benchmarks/results/h100 [--quick] [--sweep]
    python benchmarks/spmm_skew_cuda.py --generate DIR   # write the graphs (no GPU), e.g. during a build;
    python benchmarks/spmm_skew_cuda.py --graphs DIR ... # then read them from there
"""
import argparse
import json
import math
import os
import time
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import torch

import sparsetorch as st
from sparsetorch.bench.suites import power_law_graph, random_graph, real_graphs
from sparsetorch.bench.timing import Rotating, make_timer, measure_ceilings, relative_error, rotation
from _results import run_meta, write_results

ROUTES = ("native", "balanced", "split", "cusparse")
EXPONENTS = (1.2, 1.5, 2.0)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}


def graph_specs(quick: bool):
    """(name, kind, nodes, exponent, seed); seeds as the harness's graph suite where it has the graph."""
    sizes = (100_000,) if quick else (100_000, 1_000_000)
    specs = []
    for nodes in sizes:
        tag = f"{nodes // 1000}k" if nodes < 1_000_000 else "1M"
        seed = 2 if nodes < 1_000_000 else 4
        specs += [(f"power-law {tag} a={e}", "power", nodes, e, seed) for e in EXPONENTS]
        specs.append((f"random {tag}, 20/row", "random", nodes, 0.0, 1 if nodes < 1_000_000 else 3))
    return specs


def _key(name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in name)


def make_graph(spec):
    name, kind, nodes, exponent, seed = spec
    a = power_law_graph(nodes, 20, seed, exponent) if kind == "power" else random_graph(nodes, 20, seed)
    a.sort_indices()
    return a


def _generate_one(spec, out_dir):
    a = make_graph(spec)
    path = os.path.join(out_dir, _key(spec[0]))
    np.savez(path + ".npz", indptr=a.indptr.astype(np.int64), indices=a.indices.astype(np.int32),
             data=a.data.astype(np.float32), shape=np.array(a.shape))
    open(path + ".done", "w").close()
    return spec[0]


def generate(out_dir: str, quick: bool):
    """Write every graph of the run to out_dir (4 processes), each with a .done marker when complete."""
    os.makedirs(out_dir, exist_ok=True)
    with ProcessPoolExecutor(max_workers=4) as ex:
        for name in ex.map(_generate_one, graph_specs(quick), [out_dir] * len(graph_specs(quick))):
            print(f"generated {name}", flush=True)


def load_graph(spec, graphs_dir):
    import scipy.sparse as sp

    if spec[1] == "real":
        a = spec[2]()
        a.sort_indices()
        return a
    if not graphs_dir:
        return make_graph(spec)
    path = os.path.join(graphs_dir, _key(spec[0]))
    waited = 0.0
    while not os.path.exists(path + ".done"):  # written by a --generate run started earlier
        if waited > 600:
            raise TimeoutError(f"{path}.npz was not generated")
        time.sleep(0.5)
        waited += 0.5
    z = np.load(path + ".npz")
    return sp.csr_matrix((z["data"], z["indices"], z["indptr"]), shape=tuple(z["shape"]))


def row_stats(a) -> dict:
    """The per-matrix statistics of the routing table, from the row lengths (one O(m) pass over crow)."""
    lengths = np.diff(a.indptr).astype(np.float64)
    m, nnz = a.shape[0], int(a.nnz)
    mean = nnz / m if m else 0.0
    stats = {"rows": m, "nnz": nnz, "longest": int(lengths.max()) if m else 0, "mean": mean,
             "cv": float(lengths.std() / mean) if mean else 0.0, "empty_rows": float((lengths == 0).mean())}
    for t in (32, 256, 4096):
        stats[f"share_gt{t}"] = float(lengths[lengths > t].sum() / nnz) if nnz else 0.0
    return stats


def l2_bandwidth(timer) -> float:
    """Bytes/s (read + write) of device copies of an 8 MB buffer that stays in L2: 20 copies in one CUDA
    graph, so launch gaps do not count."""
    x = torch.randn(2 * 2**20, device="cuda")
    y = torch.empty_like(x)
    for _ in range(3):
        y.copy_(x)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            y.copy_(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 20 * 2 * x.numel() * 4 / sorted(times)[len(times) // 2]


def floor_s(m, k, n, nnz, elt, idx, hbm_bw, l2_bw, l2_size) -> float:
    gathers = nnz * n * elt
    b_bytes = k * n * elt
    once = nnz * (idx + elt) + (m + 1) * idx + m * n * elt
    if b_bytes <= l2_size:
        return gathers / l2_bw + (once + b_bytes) / hbm_bw
    return (gathers + once) / hbm_bw


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="100k graphs only")
    ap.add_argument("--sweep", action="store_true", help="also time the split route's unit / lane knobs")
    ap.add_argument("--generate", default=None, metavar="DIR", help="write the graphs to DIR and exit")
    ap.add_argument("--graphs", default=None, metavar="DIR", help="read the graphs from DIR (see --generate)")
    args = ap.parse_args()
    if args.generate:
        return generate(args.generate, args.quick)

    device = torch.device("cuda")
    timer = make_timer(device, quick=True)
    ceil = measure_ceilings(device, timer, quick=False)
    l2_bw = l2_bandwidth(timer)
    l2_size = torch.cuda.get_device_properties(device).L2_cache_size
    print(f"{torch.cuda.get_device_name()}: copy {ceil.bandwidth / 1e12:.2f} TB/s, L2 copy {l2_bw / 1e12:.2f} TB/s "
          f"(L2 {l2_size / 2**20:.0f} MiB); times in us, [x] = time / torch.sparse.mm, floor% = floor / split")
    data_root = os.environ.get("SPARSETORCH_DATA", os.path.join(os.path.dirname(__file__), "..", "..", "shared",
                                                                  "data"))
    # (graph, dtypes, widths): the skewed and uniform graphs in full; the real matrices and Planetoid
    # graphs of ../shared/data (small: launch-bound) at two widths in float32, for balanced vs split.
    cases = [(spec, (torch.float32, torch.bfloat16), (32, 64, 128, 256)) for spec in graph_specs(args.quick)]
    cases += [((name, "real", make, 0.0, 0), (torch.float32,), (32, 128)) for name, make in real_graphs(data_root)]
    results, sweep, stats = [], [], {}
    cols = ROUTES + ("torch",)
    print(f"{'graph':<22} {'dtype':<5} {'n':>4} | " + " ".join(f"{c:>9}" for c in cols)
          + f" | {'floor':>8} {'floor%':>6} | split/torch best-other/torch split/balanced")
    for spec, dtypes, widths in cases:
        name = spec[0]
        a_sp = load_graph(spec, args.graphs)
        stats[name] = row_stats(a_sp)
        m, k, nnz = a_sp.shape[0], a_sp.shape[1], int(a_sp.nnz)
        for dtype in dtypes:
            A = st.from_scipy(a_sp, device=device, dtype=dtype, index_dtype=torch.int32)
            a_torch = st.to_torch(A)
            a64 = st.to_torch(A.to(dtype=torch.float64))
            elt = torch.finfo(dtype).bits // 8
            for n in widths:
                g = torch.Generator(device=device).manual_seed(n)
                B = torch.randn(k, n, device=device, generator=g).to(dtype)
                ref = torch.sparse.mm(a64, B.double())
                copies = rotation(device, k * n * elt + m * n * elt + nnz * (4 + elt))
                inputs = [(B,)] + [(B.clone(),) for _ in range(copies - 1)]
                impls = {r: (lambda b, r=r: st.spmm(A, b, backend=r)) for r in ROUTES}
                impls["torch"] = lambda b: torch.sparse.mm(a_torch, b)
                times, errors = {}, {}
                for label, fn in impls.items():
                    try:
                        err = relative_error(fn(B), ref)
                    except Exception as e:  # noqa: BLE001 - a route that refuses the case is recorded, not fatal
                        errors[label] = f"{type(e).__name__}: {str(e)[:120]}"
                        continue
                    if not err <= TOL[dtype]:
                        errors[label] = f"relative error {err:.2e}"
                        continue
                    times[label] = timer(Rotating(fn, inputs))
                del inputs, ref
                floor = floor_s(m, k, n, nnz, elt, 4, ceil.bandwidth, l2_bw, l2_size)
                row = {"graph": name, "dtype": str(dtype).replace("torch.", ""), "n": n, "m": m, "k": k, "nnz": nnz,
                       "floor_s": floor, "times_s": times, "errors": errors, "stats": stats[name]}
                t_torch, t_split = times.get("torch"), times.get("split")
                others = [times[r] for r in ("native", "balanced", "cusparse") if r in times]
                if t_torch and t_split:
                    row["split_over_torch"] = t_torch / t_split
                    row["floor_fraction"] = floor / t_split
                if t_torch and others:
                    row["best_other_over_torch"] = t_torch / min(others)
                if t_split and "balanced" in times:
                    row["split_over_balanced"] = times["balanced"] / t_split
                results.append(row)
                cells = " ".join(f"{times[c] * 1e6:>9.1f}" if c in times else f"{'--':>9}" for c in cols)
                fmt = lambda key: f"{row[key]:>6.2f}x" if key in row else f"{'--':>7}"  # noqa: E731
                print(f"{name:<22} {row['dtype'][:5]:<5} {n:>4} | {cells} | {floor * 1e6:>8.1f} "
                      f"{100 * row.get('floor_fraction', 0):>5.0f}% | {fmt('split_over_torch'):>11} "
                      f"{fmt('best_other_over_torch'):>16} {fmt('split_over_balanced'):>14}"
                      + (f"  errors: {errors}" if errors else ""), flush=True)
                if args.sweep and name.startswith("power-law") and "a=1.5" in name and n in (32, 128, 256):
                    sweep += knob_sweep(A, B, name, dtype, n, timer, times.get("split"))
            torch.cuda.empty_cache()

    def geomean(rows, key):
        vals = [r[key] for r in rows if key in r]
        return math.exp(sum(math.log(v) for v in vals) / len(vals)) if vals else float("nan")

    power = [r for r in results if r["graph"].startswith("power-law")]
    uniform = [r for r in results if r["graph"].startswith("random")]
    real = [r for r in results if not r["graph"].startswith(("power-law", "random"))]
    summary = {}
    for label, rows in (("power_law", power), ("uniform", uniform), ("real", real)):
        for dt in ("all", "float32", "bfloat16"):
            sel = [r for r in rows if dt == "all" or r["dtype"] == dt]
            summary[f"{label}_{dt}_split_over_torch_geomean"] = geomean(sel, "split_over_torch")
            summary[f"{label}_{dt}_split_over_torch_min"] = min((r["split_over_torch"] for r in sel
                                                                 if "split_over_torch" in r), default=float("nan"))
            summary[f"{label}_{dt}_best_other_over_torch_geomean"] = geomean(sel, "best_other_over_torch")
            summary[f"{label}_{dt}_split_over_balanced_geomean"] = geomean(sel, "split_over_balanced")
    print(json.dumps(summary, indent=1))
    print("graph statistics:")
    for name, s in stats.items():
        print(f"  {name:<22} " + " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in s.items()))
    if sweep:
        print("split knob sweep (us; default = the rules):")
        for s in sweep:
            print(f"  {s['graph']:<22} {s['dtype']:<8} n={s['n']:<4} lanes={s['lanes']:<7} unit={s['unit']:<7} "
                  f"{s['time_s'] * 1e6:9.1f}  ({s['time_s'] / s['default_s']:.2f} of default)")
    write_results(args.out, "spmm_skew_cuda.json",
                  run_meta(copy_Bps=ceil.bandwidth, l2_copy_Bps=l2_bw, l2_bytes=l2_size), results,
                  results_key="rows", summary=summary, graph_stats=stats, sweep=sweep)


def knob_sweep(A, B, name, dtype, n, timer, default_s):
    """The split route with each lane count (column tile) and a few unit sizes forced by its knobs."""
    out = []
    variants = [(lanes, None) for lanes in (4, 8, 16, 32)] + [(None, unit) for unit in (64, 256, 1024)]
    for lanes, unit in variants:
        os.environ["SPARSETORCH_SPLIT_LANES"] = str(lanes or 0)
        os.environ["SPARSETORCH_SPLIT_UNIT"] = str(unit or 0)
        try:
            t = timer(lambda: st.spmm(A, B, backend="split"))
        finally:
            os.environ.pop("SPARSETORCH_SPLIT_LANES")
            os.environ.pop("SPARSETORCH_SPLIT_UNIT")
        out.append({"graph": name, "dtype": str(dtype).replace("torch.", ""), "n": n, "lanes": lanes or "default",
                    "unit": unit or "default", "time_s": t, "default_s": default_s or t})
    return out


if __name__ == "__main__":
    main()
