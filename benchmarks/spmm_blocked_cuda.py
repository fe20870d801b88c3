"""The blocked route (SpmmPlan(A, backend="blocked"): 8-row strips of row pairs, float32) against the other routes
and cuBLAS SGEMM (TF32 off) on a uniformly random 4096 x 4096 A (the harness's density suite
pattern) times a dense 4096 x n, in one run; every output is checked against a float64 product first.

Two floors per row, with the ceilings measured here:
  useful   = 2 nnz n / the SGEMM rate (what a sparse kernel running at cuBLAS's rate would take);
  blocked  = the shared-memory bound of the kernel: per 256 columns, 9 wavefronts of 128 bytes per
             block (B row 8, column 1) and 1 per stored pair (its two values, broadcast), at 128
             bytes per clock per SM, the SM clock taken from the SGEMM rate measured here (FP32
             peak = 256 flop/clock/SM).

    python benchmarks/spmm_blocked_cuda.py --out benchmarks/results/h200
"""
import argparse
import math

import torch
import triton.testing

import sparsetorch as st
from _results import ceiling_meta, measure_ceilings, uniform_csr, write_results
from sparsetorch._blocked import BlockedLayout


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e-3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="n = 1024 only")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    copy_bw, rates = measure_ceilings(bench, (torch.float32,))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # The clock cuBLAS ran at, if it ran at 100% of 256 flop/clock/SM: an upper bound of the clock.
    clock = rates[torch.float32] / (256 * sms)
    m = k = 4096
    densities = (0.02, 0.05, 0.1, 0.15, 0.2, 0.25, 0.3, 0.4, 0.5)
    widths = (1024,) if args.quick else (256, 1024)
    results = []
    for n in widths:
        b = torch.randn(k, n, device="cuda")
        for d in densities:
            a = uniform_csr(m, k, d, seed=int(d * 1e4) + n)
            ref = a.to(dtype=torch.float64).to_dense() @ b.double()
            dense_a = a.to_dense()
            layout = BlockedLayout(a)
            blocked = st.SpmmPlan(a, backend="blocked")
            impls = {"blocked": lambda: blocked(b), "dense SGEMM": lambda: dense_a @ b}
            for route in ("tiled", "densify", "cusparse"):
                impls[route] = lambda route=route: st.spmm(a, b, backend=route)
            times = {}
            for name, fn in impls.items():
                err = ((fn().double() - ref).norm() / ref.norm()).item()
                assert err < 1e-5, (name, d, n, err)
                times[name] = bench(fn)
            nnz = a.values.numel()
            useful_floor = 2.0 * nnz * n / rates[torch.float32]
            blocked_floor = (9 * layout.blocks + layout.pairs) * math.ceil(n / 256) / (sms * clock)
            row = {"n": n, "density": d, "nnz": nnz, "blocks": layout.blocks, "pairs": layout.pairs, "fill": layout.fill,
                   "useful_floor_us": useful_floor * 1e6, "blocked_floor_us": blocked_floor * 1e6,
                   "us": {k_: v * 1e6 for k_, v in times.items()}}
            results.append(row)
            t = times["blocked"]
            others = "  ".join(f"{k_} {v / t:5.2f}x" for k_, v in times.items() if k_ != "blocked")
            print(f"n={n:5d} {100 * d:4.0f}%  blocked {t * 1e6:8.1f} us (fill {layout.fill:.2f}; floors: useful "
                  f"{useful_floor * 1e6:6.1f} us = {useful_floor / t:4.0%}, smem {blocked_floor * 1e6:6.1f} us = "
                  f"{blocked_floor / t:4.0%})  vs blocked: {others}", flush=True)
    meta = ceiling_meta(copy_bw, rates, "fp32 SGEMM rate with TF32 off; clock = SGEMM rate / (256 flop/clk/SM)")
    meta["clock_ghz_upper_bound"] = clock / 1e9
    write_results(args.out, "spmm_blocked_cuda.json", meta, results)


if __name__ == "__main__":
    main()
