"""CPU SpMM: sparsetorch (OpenMP) against scipy.sparse (csr @ dense) and torch.sparse.mm.

Random m x m CSR with exactly `per_row` entries per row (uniform columns), dense B (m, n), float32.
Each output is checked against SciPy in float64 first; times are medians of `--reps` runs.
Floor model: the kernel must read B rows once per stored entry it touches (random gathers of
n*4 bytes each) and write C once; on 2 cores this is bound by gather bandwidth, not flops.

    python benchmarks/cpu_spmm_vs_scipy.py [--m 100000] [--per-row 20] [--n 64] [--out FILE]
"""
import argparse
import json
import os
import platform
import statistics
import time

import numpy as np
import scipy.sparse as sp
import torch

import sparsetorch as st


def median_time(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--m", type=int, default=100_000)
    ap.add_argument("--per-row", type=int, default=20)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--reps", type=int, default=15)
    ap.add_argument("--out", default=None, help="write the results as JSON here")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    m, n = args.m, args.n
    rows = np.repeat(np.arange(m), args.per_row)
    cols = rng.integers(0, m, size=rows.size)
    a = sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(m, m))
    a.sort_indices()
    b_np = rng.standard_normal((m, n)).astype(np.float32)
    b = torch.from_numpy(b_np)
    A = st.from_scipy(a)
    A_torch = st.to_torch(A)
    ref = a.astype(np.float64) @ b_np.astype(np.float64)

    impls = {
        "scipy.sparse csr @ dense": lambda: a @ b_np,
        "torch.sparse.mm": lambda: torch.sparse.mm(A_torch, b),
        "sparsetorch.spmm": lambda: st.spmm(A, b),
    }
    results = []
    for name, fn in impls.items():
        out = np.asarray(fn() if not isinstance(fn(), torch.Tensor) else fn().numpy())
        err = np.linalg.norm(out - ref) / np.linalg.norm(ref)
        assert err < 1e-5, f"{name}: relative error {err}"
        results.append({"impl": name, "seconds": median_time(fn, args.reps), "rel_err": float(err)})
    base = results[0]["seconds"]
    nnz = a.nnz
    print(f"CPU SpMM, {m} x {m}, {args.per_row} nnz/row (nnz {nnz}), n = {n}, float32, "
          f"{torch.get_num_threads()} threads, {platform.processor() or platform.machine()}")
    for r in results:
        r["speedup_vs_scipy"] = base / r["seconds"]
        r["GFLOPs"] = 2 * nnz * n / r["seconds"] / 1e9
        print(f"  {r['impl']:28s} {r['seconds'] * 1e3:8.1f} ms   x{r['speedup_vs_scipy']:5.2f} vs SciPy   "
              f"{r['GFLOPs']:5.2f} GFLOP/s   rel err {r['rel_err']:.1e}")
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        with open(args.out, "w") as f:
            json.dump({"m": m, "per_row": args.per_row, "n": n, "threads": torch.get_num_threads(),
                       "cpus": os.cpu_count(), "torch": torch.__version__, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
