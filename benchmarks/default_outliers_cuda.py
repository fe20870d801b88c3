"""The skew suite's cases where the default st.spmm call was timed far slower than the same route
forced (e.g. banded 200k bf16 n = 1: 89.9 us on "cusparse" against 32.6 us forced): time them again
several ways, in one run, to tell a harness artifact from a slow default path.

    python benchmarks/default_outliers_cuda.py [--data DIR]

Per case: the route the default takes (st.spmm_route); do_bench medians (L2 flushed before each call)
of the default call on the torch sparse tensor (as the suite calls it) and on the st.CSR, the forced
route on both, torch.sparse.mm; the default timed again last; then the kernels and host time of
three default calls under torch.profiler.
"""
from __future__ import annotations

import argparse
import os

import numpy as np
import torch
import triton.testing

import sparsetorch as st
from sparsetorch.bench.suites import skew
from sparsetorch.bench.suites.common import Context


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=40, return_mode="median") * 1e3


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default=os.environ.get("SPARSETORCH_DATA"))
    args = ap.parse_args(argv)
    ctx = Context(torch.device("cuda"), None, None, False, args.data)
    wanted = {("banded 200k, 17/row", 1), ("ca-CondMat", 32), ("uniform 100k, 16/row", 8), ("G51", 8),
              ("G51", 32), ("Erdos971", 8)}
    makers = dict(skew.cases(ctx))
    for name, n in sorted(wanted):
        if name not in makers:
            print(f"{name}: not found (data: {args.data})")
            continue
        a_sp = makers[name]()
        for dtype in (torch.bfloat16, torch.float32):
            A = st.from_scipy(a_sp, device="cuda", dtype=dtype, index_dtype=torch.int32)
            A_torch = st.to_torch(A)
            g = torch.Generator(device="cuda").manual_seed(n)
            B = torch.randn(a_sp.shape[1], n, device="cuda", generator=g).to(dtype)
            st.spmm(A_torch, B)
            st.spmm(A_torch, B)  # the second call measures the candidates
            route = st.spmm_route(A_torch, B)
            t = {"default (torch tensor)": bench(lambda: st.spmm(A_torch, B)),
                 "default (st.CSR)": bench(lambda: st.spmm(A, B)),
                 f"forced {route} (st.CSR)": bench(lambda: st.spmm(A, B, backend=route)),
                 f"forced {route} (torch tensor)": bench(lambda: st.spmm(A_torch, B, backend=route)),
                 "torch.sparse.mm": bench(lambda: torch.sparse.mm(A_torch, B))}
            for other in ("native", "balanced", "split", "cusparse"):
                if other != route:
                    t[f"forced {other}"] = bench(lambda other=other: st.spmm(A, B, backend=other))
            t["default (torch tensor), again"] = bench(lambda: st.spmm(A_torch, B))
            print(f"\n{name}, n={n}, {str(dtype)[6:]}: default route {route}; "
                  f"{a_sp.shape[0]} rows, {a_sp.nnz} entries")
            for k, v in t.items():
                print(f"  {k:>34}: {v:8.1f} us")
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU,
                                                    torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    st.spmm(A_torch, B)
                torch.cuda.synchronize()
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60))


if __name__ == "__main__":
    main()
