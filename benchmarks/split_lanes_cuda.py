"""The split route's lanes per group at narrow B (n = 8, 16, 32): the default (groups of 4 lanes where
4 lanes of 16-byte vectors cover B's width) against groups forced to 8 lanes (the rule before), with
cuSPARSE, the row-group kernel and torch.sparse.mm beside them, on the skew suite's skewed matrices,
float32 and bfloat16, int32 indices. Every output is checked against a float64 product first.

    python benchmarks/split_lanes_cuda.py --out DIR
"""
import argparse
import os

import torch

import sparsetorch as st
from sparsetorch.bench.suites.common import Context
from sparsetorch.bench.suites.skew import cases
from sparsetorch.bench.timing import make_timer, measure_ceilings, relative_error
from _results import run_meta, write_results

WIDTHS = (8, 16, 32)
TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2}
WANTED = ("uniform", "power-law", "1% of rows", "one dense row", "half the rows")


def timed_split(timer, A, B, lanes):
    os.environ["SPARSETORCH_SPLIT_LANES"] = str(lanes)
    try:
        out = st.spmm(A, B, backend="split")
        return timer(lambda: st.spmm(A, B, backend="split")), out
    finally:
        os.environ.pop("SPARSETORCH_SPLIT_LANES")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    args = ap.parse_args()
    device = torch.device("cuda")
    timer = make_timer(device, quick=False)
    ctx = Context(device, timer, measure_ceilings(device, timer, quick=True), True, None)
    rows = []
    for name, make in cases(ctx):
        if not name.startswith(WANTED):
            continue
        a_sp = make()
        for dtype in (torch.float32, torch.bfloat16):
            A = st.from_scipy(a_sp, device=device, dtype=dtype, index_dtype=torch.int32)
            A64 = st.to_torch(A.to(dtype=torch.float64))
            A_torch = st.to_torch(A)
            for n in WIDTHS:
                B = torch.randn(a_sp.shape[1], n, device=device, generator=torch.Generator(device).manual_seed(n))
                B = B.to(dtype)
                ref = torch.sparse.mm(A64, B.double())
                row = {"case": name, "dtype": str(dtype).replace("torch.", ""), "n": n, "nnz": a_sp.nnz}
                for label, lanes in (("split_default_us", 0), ("split_lanes8_us", 8)):
                    t, out = timed_split(timer, A, B, lanes)
                    err = relative_error(out, ref)
                    assert err < TOL[dtype], (name, dtype, n, label, err)
                    row[label] = t * 1e6
                for route in ("native", "cusparse"):
                    row[f"{route}_us"] = timer(lambda: st.spmm(A, B, backend=route)) * 1e6
                row["torch_us"] = timer(lambda: torch.sparse.mm(A_torch, B)) * 1e6
                row["default_over_lanes8"] = row["split_lanes8_us"] / row["split_default_us"]
                rows.append(row)
                print(f"{name:<34} {row['dtype']:<8} n={n:<3} split {row['split_default_us']:7.1f} "
                      f"(8 lanes {row['split_lanes8_us']:7.1f}, {row['default_over_lanes8']:.2f}x)  native "
                      f"{row['native_us']:7.1f}  cusparse {row['cusparse_us']:7.1f}  torch {row['torch_us']:7.1f}",
                      flush=True)
    write_results(args.out, "split_lanes_cuda.json", run_meta(), rows, results_key="rows")


if __name__ == "__main__":
    main()
