"""Where the host time of a small default st.spmm goes (1000 x 1000, 10 per row, n = 16: the GPU work
is a few microseconds, so the host sets the pace): the default call on a torch CSR tensor and on a
sparsetorch CSR, a forced route, validate=False, autotuning off, the raw op with "auto" and with a
forced route, torch.sparse.mm; then a cProfile of the default call. Then the small real graphs of the
skew suite at n = 1 and 8 (float32): device time (triton do_bench, median) of the default call, its
route, every forced route and torch.sparse.mm.

    python benchmarks/host_overhead_cuda.py [--data DIR]
"""
import argparse
import cProfile
import io
import pstats
import time

import numpy as np
import torch

import sparsetorch as st
from sparsetorch.bench.suites.graphs import real_graphs
from sparsetorch.bench.suites.skew import with_row_lengths
from sparsetorch.bench.timing import make_timer

ops = torch.ops.sparsetorch


def host_us(fn, reps=3000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / reps * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", default=None)
    args = ap.parse_args()
    small = with_row_lengths(np.full(1000, 10), 1000, 31)
    A = st.from_scipy(small, device="cuda", index_dtype=torch.int32)
    At = st.to_torch(A)
    B = torch.randn(1000, 16, device="cuda")
    raw = (A.crow_indices, A.col_indices, A.values, B, 1.0, None, 0.0, None, "none", 0.01)
    variants = {
        "st.spmm(torch CSR, B)": lambda: st.spmm(At, B),
        "st.spmm(st CSR, B)": lambda: st.spmm(A, B),
        "st.spmm(torch CSR, B, validate=False)": lambda: st.spmm(At, B, validate=False),
        "st.spmm(st CSR, B, backend=native)": lambda: st.spmm(A, B, backend="native"),
        "ops.spmm auto": lambda: ops.spmm(*raw, "auto", True),
        "ops.spmm native": lambda: ops.spmm(*raw, "native", True),
        "ops.spmm native validate=False": lambda: ops.spmm(*raw, "native", False),
        "ops.spmm_route auto": lambda: ops.spmm_route(A.crow_indices, A.col_indices, A.values, B, "auto", True),
        "torch.sparse.mm": lambda: torch.sparse.mm(At, B),
        "torch.mm dense 1000x1000": (lambda D=At.to_dense(): torch.mm(D, B)),
    }
    print(f"route of the default call: {st.spmm_route(At, B)}")
    for name, fn in variants.items():
        print(f"{name:<42} {host_us(fn):7.2f} us/call", flush=True)
    previous = st.set_autotune(False)
    print(f"{'st.spmm(torch CSR, B), autotune off':<42} {host_us(variants['st.spmm(torch CSR, B)']):7.2f} us/call")
    st.set_autotune(previous)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(3000):
        st.spmm(At, B)
    torch.cuda.synchronize()
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(14)
    print(text.getvalue())

    timer = make_timer(torch.device("cuda"), quick=True)
    for name, make in real_graphs(args.data):
        a_sp = make()
        if a_sp.shape[0] > 30_000:
            continue
        A = st.from_scipy(a_sp, device="cuda", dtype=torch.float32, index_dtype=torch.int32)
        At = st.to_torch(A)
        for n in (1, 8):
            B = torch.randn(a_sp.shape[1], n, device="cuda")
            st.spmm(At, B)
            t_default = timer(lambda: st.spmm(At, B))
            line = (f"{name:<14} n={n:<2} default {t_default * 1e6:6.1f} us ({st.spmm_route(At, B)}, host "
                    f"{host_us(lambda: st.spmm(At, B), 500):5.1f} us)")
            for route in ("native", "balanced", "split", "cusparse"):
                line += f"  {route} {timer(lambda: st.spmm(A, B, backend=route)) * 1e6:6.1f}"
            line += f"  torch {timer(lambda: torch.sparse.mm(At, B)) * 1e6:6.1f}"
            print(line, flush=True)


if __name__ == "__main__":
    main()
