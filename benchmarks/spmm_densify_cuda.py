"""The densify route (A expanded on the GPU, one cuBLAS GEMM, the NaN/Inf guard) against the sparse
routes, torch.sparse.mm and a dense GEMM of an already-dense A, on a uniformly random 4096 x 4096 A
(the harness's density suite pattern) times a dense 4096 x n, all four dtypes, in one run; every
output is checked against a float64 product first. The crossovers of csrc/cuda/spmm_cuda.cu's
"auto" rule come from here.

"sparse" is the fastest of the own kernels (row-group, balanced, tiled) and cuSPARSE (fp32/fp64).
Floor of the densify route, with the ceilings measured here: bytes = the dense A written and read
once + indices and values + B twice (check, GEMM) + out, over the copy bandwidth; flops = 2 m k n
over the dense GEMM rate of the dtype (tensor cores for the half types; TF32 off).

    python benchmarks/spmm_densify_cuda.py --out benchmarks/results/h200
"""
import argparse

import torch
import triton.testing

import sparsetorch as st
from _results import ceiling_meta, measure_ceilings, uniform_csr, write_results

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e-3


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="bf16 and fp32 at n = 1024 only")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    copy_bw, rates = measure_ceilings(bench, DTYPES)
    m = k = 4096
    densities = (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5)
    widths = (1024,) if args.quick else (64, 256, 1024)
    dtypes = (torch.float32, torch.bfloat16) if args.quick else DTYPES
    results = []
    for n in widths:
        for dtype in dtypes:
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            for d in densities:
                a = uniform_csr(m, k, d, seed=int(d * 1e4) + n, dtype=dtype)
                ref = a.to(dtype=torch.float64).to_dense() @ b.double()
                dense_a = a.to_dense()
                t_sparse = a.to_torch()
                sparse_routes = ["native", "balanced", "tiled"] + (["cusparse"] if dtype in (torch.float32,
                                                                                              torch.float64) else [])
                impls = {"densify": lambda: st.spmm(a, b, backend="densify"), "auto": lambda: st.spmm(a, b),
                         "torch.sparse.mm": lambda: torch.sparse.mm(t_sparse, b), "dense GEMM": lambda: dense_a @ b}
                for route in sparse_routes:
                    impls[route] = lambda route=route: st.spmm(a, b, backend=route)
                times = {}
                for name, fn in impls.items():
                    if name == "tiled" and dtype == torch.float64:
                        continue
                    try:
                        out = fn()
                    except Exception as e:  # noqa: BLE001 - torch.sparse.mm lacks some dtypes: reported, not fatal
                        print(f"{name} failed: {type(e).__name__}: {str(e)[:100]}")
                        continue
                    tol = {torch.float32: 1e-4, torch.float64: 1e-10}.get(dtype, 3e-2)  # torch.sparse.mm: bf16 sums
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    assert err < tol, (name, dtype, d, n, err)
                    times[name] = bench(fn)
                nnz = a.values.numel()
                size = b.element_size()
                nbytes = 2 * m * k * size + nnz * (4 + size) + 2 * k * n * size + m * n * size
                floor = max(nbytes / copy_bw, 2.0 * m * k * n / rates[dtype])
                sparse_best = min(sparse_routes, key=lambda r: times.get(r, float("inf")))
                row = {"n": n, "dtype": str(dtype).replace("torch.", ""), "density": d, "nnz": nnz,
                       "densify_floor_us": floor * 1e6, "best_sparse": sparse_best,
                       "us": {k_: v * 1e6 for k_, v in times.items()}}
                results.append(row)
                t = times["densify"]
                print(f"n={n:5d} {row['dtype']:8s} {100 * d:5.1f}%  densify {t * 1e6:8.1f} us (floor "
                      f"{floor * 1e6:6.1f} us = {floor / t:4.0%})  sparse[{sparse_best}] {times[sparse_best] / t:6.2f}x"
                      + "".join(f"  {name} {times[name] / t:5.2f}x" for name in ("auto", "torch.sparse.mm",
                                                                                 "dense GEMM") if name in times),
                      flush=True)
                del a, dense_a, t_sparse, ref
    meta = ceiling_meta(copy_bw, rates, "x = that implementation's time / densify's (> 1: densify faster); "
                        "dense GEMM = A already dense")
    print(meta)
    write_results(args.out, "spmm_densify_cuda.json", meta, results)


if __name__ == "__main__":
    main()
