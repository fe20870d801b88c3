"""The tiled SpMM kernel on pruned-weight shapes: a density sweep of a random 4096 x 4096 CSR
(every row the same length, columns sorted, as SparseLinear stores a row-pruned weight) times a
dense 4096 x n, against the row-group kernel, cuSPARSE, torch.sparse.mm and dense GEMM, all in
one run, every output checked against a float64 product first.

Rows: fp32 with TF32 off (dense fp32 = cuBLAS SGEMM), and bf16 (fp32 accumulation; dense bf16 =
tensor cores). Floors, with the ceilings measured here: bytes = indices + values + B once + out,
over the copy bandwidth; flops = 2 nnz n over the dense GEMM rate of the dtype (the CUDA-core FMA
rate is the real limit of a sparse kernel, so the flop floor of fp32 is its rate, not the tensor
cores').

    python benchmarks/spmm_tiled_cuda.py --out benchmarks/results/h100
"""
import argparse

import torch
import triton.testing

import sparsetorch as st
from _results import ceiling_meta, measure_ceilings, write_results


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3


def pruned(m, k, density, dtype, seed, index_dtype=torch.int32):
    """Row-pruned weight: the same number of entries per row, sorted columns."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    per_row = max(1, round(density * k))
    keys = torch.rand(m, k, device="cuda", generator=g)
    col = keys.topk(per_row, dim=1).indices.sort(dim=1).values.to(index_dtype)
    crow = torch.arange(0, m * per_row + 1, per_row, device="cuda", dtype=index_dtype)
    values = torch.randn(m * per_row, device="cuda", generator=g).to(dtype)
    return st.CSR(crow, col.reshape(-1), values, (m, k))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    copy_bw, rates = measure_ceilings(bench, (torch.float32, torch.bfloat16))
    m = k = 4096
    densities = [0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5]
    widths = (1024,) if args.quick else (64, 256, 1024)
    results = []
    for n in widths:
        for dtype in (torch.float32, torch.bfloat16):
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            dense_w = None
            for d in densities if n == 1024 or dtype == torch.float32 else (0.01, 0.1):
                a = pruned(m, k, d, dtype, seed=int(d * 1e4))
                ref = a.to(dtype=torch.float64).to_dense() @ b.double()
                dense_w = a.to_dense()
                t_sparse = a.to_torch()
                impls = {
                    "tiled": lambda: st.spmm(a, b, backend="tiled"),
                    "native": lambda: st.spmm(a, b, backend="native"),
                    "auto": lambda: st.spmm(a, b),
                    "torch.sparse.mm": lambda: torch.sparse.mm(t_sparse, b),
                    "dense": lambda: dense_w @ b,
                }
                if dtype == torch.float32:
                    impls["cusparse"] = lambda: st.spmm(a, b, backend="cusparse")
                nnz = a.values.numel()
                size = b.element_size()
                nbytes = nnz * (4 + size) + (m + 1) * 4 + k * n * size + m * n * size
                flops = 2.0 * nnz * n
                floor = max(nbytes / copy_bw, flops / rates[dtype])
                times = {}
                for name, fn in impls.items():
                    try:
                        out = fn()
                    except Exception as e:  # noqa: BLE001 - torch.sparse.mm lacks some dtypes: reported, not fatal
                        print(f"{name} failed: {type(e).__name__}: {str(e)[:100]}")
                        continue
                    tol = 1e-4 if dtype == torch.float32 else 3e-2
                    if name != "dense":
                        err = ((out.double() - ref).norm() / ref.norm()).item()
                        assert err < tol, (name, d, n, err)
                    times[name] = bench(fn)
                row = {"n": n, "dtype": str(dtype).replace("torch.", ""), "density": d, "nnz": nnz,
                       "floor_us": floor * 1e6, "us": {k_: v * 1e6 for k_, v in times.items()}}
                results.append(row)
                t = times["tiled"]
                print(f"n={n:5d} {row['dtype']:8s} {100 * d:5.1f}%  tiled {t * 1e6:8.1f} us "
                      f"({flops / t / 1e12:5.1f} TFLOP/s, floor {floor * 1e6:6.1f} us = {floor / t:4.0%})  "
                      + "  ".join(f"{name} {times[name] / t:5.2f}x" for name in times if name != "tiled"),
                      flush=True)
    meta = ceiling_meta(copy_bw, rates, "x = that implementation's time / tiled's (> 1: tiled faster)")
    print(meta)
    write_results(args.out, "spmm_tiled_cuda.json", meta, results)


if __name__ == "__main__":
    main()
