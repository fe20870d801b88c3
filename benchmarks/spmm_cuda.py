"""CUDA SpMM benchmark (fp32): sparsetorch's routes against torch.sparse.mm, a Python loop of
torch.sparse.mm, dense torch.bmm and the block-diagonal torch.sparse.mm, plus per-call latency with
and without a plan. Every implementation's output is checked against a float64 reference before it
is timed. Times are medians of CUDA-event timings (triton.testing.do_bench).

Floors: bytes / measured copy bandwidth and flops / measured fp32 GEMM peak (TF32 off), both
measured in the same run. Byte model of one CSR SpMM (row-major B, n columns):
    A: (m+1)*idx + nnz*(idx + val)   B: (rows of B referenced)*n*val   C: m*n*val (written once)
flops = 2 * nnz * n.

    python benchmarks/spmm_cuda.py --out benchmarks/results/<device>
"""
import argparse
import platform
import time

import torch
import triton.testing

import sparsetorch as st
from _results import run_meta, write_results

torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def bench(fn, warmup=25, rep=200):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")  # milliseconds


def rel_err(x, ref):
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def ceilings():
    x = torch.empty(2**28, dtype=torch.float32, device="cuda")  # 1 GiB
    y = torch.empty_like(x)
    x.normal_()
    t = bench(lambda: y.copy_(x))
    bw = 2 * x.numel() * 4 / (t * 1e-3)
    del x, y
    a = torch.randn(8192, 8192, device="cuda")
    b = torch.randn(8192, 8192, device="cuda")
    t = bench(lambda: torch.mm(a, b), rep=100)
    peak = 2 * 8192**3 / (t * 1e-3)
    return bw, peak


def floor_ms(bytes_, flops, bw, peak):
    return max(bytes_ / bw, flops / peak) * 1e3


def random_graph(m, k, per_row, device="cuda", seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    rows = torch.arange(m, device=device).repeat_interleave(per_row)
    cols = torch.randint(0, k, (m * per_row,), device=device, generator=g)
    order = torch.argsort(rows * k + cols)  # sorted columns within each row, as torch expects
    cols = cols[order]
    crow = torch.arange(0, m * per_row + 1, per_row, device=device)
    values = torch.randn(m * per_row, device=device, generator=g)
    return crow, cols, values


def spmm_bytes(m, k, n, nnz, idx_bytes=8, val_bytes=4, b_rows=None):
    b_rows = k if b_rows is None else b_rows
    return (m + 1) * idx_bytes + nnz * (idx_bytes + val_bytes) + b_rows * n * val_bytes + m * n * val_bytes


def row(name, case, ms, baseline_ms, floor, bytes_, flops, err):
    return {
        "suite": name, "case": case, "ms": ms, "speedup_vs_baseline": baseline_ms / ms if baseline_ms else None,
        "floor_ms": floor, "of_floor": floor / ms, "GBps": bytes_ / (ms * 1e-3) / 1e9,
        "GFLOPs": flops / (ms * 1e-3) / 1e9, "rel_err": err,
    }


def graph_suite(bw, peak, results):
    m = k = 100_000
    crow, col, values = random_graph(m, k, 20)
    A_torch = torch.sparse_csr_tensor(crow, col, values, (m, k), check_invariants=False)
    A = st.CSR(crow, col, values, (m, k))
    plan_native = st.SpmmPlan(A, backend="native")
    plan_cus = st.SpmmPlan(A, backend="cusparse")
    A64 = torch.sparse_csr_tensor(crow, col, values.double(), (m, k), check_invariants=False)
    nnz = values.numel()
    for n in (32, 128, 512):
        B = torch.randn(k, n, device="cuda")
        ref = torch.sparse.mm(A64, B.double())
        impls = {
            "torch.sparse.mm": lambda: torch.sparse.mm(A_torch, B),
            "st.spmm cusparse": lambda: st.spmm(A, B, backend="cusparse"),
            "st.spmm native": lambda: st.spmm(A, B, backend="native"),
            "st.spmm auto": lambda: st.spmm(A, B),
            "plan native": lambda: plan_native(B),
            "plan cusparse": lambda: plan_cus(B),
        }
        base = None
        bytes_ = spmm_bytes(m, k, n, nnz)
        flops = 2 * nnz * n
        fl = floor_ms(bytes_, flops, bw, peak)
        for name, fn in impls.items():
            err = rel_err(fn(), ref)
            assert err < 1e-5, f"{name} n={n}: relative error {err}"
            ms = bench(fn)
            base = ms if base is None else base
            results.append(row("graph 100k x 100k, 20/row", f"n={n} {name}", ms, base, fl, bytes_, flops, err))


def block_diagonal(mats, k):
    """One torch CSR holding the batch on its diagonal (batch i's columns shifted by i*k)."""
    crows, cols, offset = [], [], 0
    for i, x in enumerate(mats):
        crows.append(x.crow_indices()[:-1] + offset)
        cols.append(x.col_indices() + i * k)
        offset += x.values().numel()
    crow = torch.cat(crows + [torch.tensor([offset], device=crows[0].device)])
    values = torch.cat([x.values() for x in mats])
    m = sum(x.shape[0] for x in mats)
    return torch.sparse_csr_tensor(crow, torch.cat(cols), values, (m, len(mats) * k), check_invariants=False)


def batched_suite(bw, peak, results):
    for b, size, density, n in ((64, 512, 0.05, 128), (256, 256, 0.10, 64)):
        g = torch.Generator(device="cuda").manual_seed(1)
        dense_A = torch.rand(b, size, size, device="cuda", generator=g)
        dense_A = torch.where(dense_A < density, torch.randn_like(dense_A), torch.zeros_like(dense_A))
        mats = [x.to_sparse_csr() for x in dense_A.unbind(0)]  # a different pattern (and nnz) per batch
        A = st.from_list([st.from_torch(x) for x in mats])
        B = torch.randn(b, size, n, device="cuda")
        ref = torch.bmm(dense_A.double(), B.double())
        nnz = sum(x.values().numel() for x in mats)
        big = block_diagonal(mats, size)  # built once, outside the timing
        plan = st.SpmmPlan(A, backend="native")
        plan_cus = st.SpmmPlan(A, backend="cusparse")  # block-diagonal matrix built once
        impls = {
            "loop of torch.sparse.mm": lambda: torch.stack([torch.sparse.mm(x, B[i]) for i, x in enumerate(mats)]),
            "dense torch.bmm fp32": lambda: torch.bmm(dense_A, B),
            "block-diag torch.sparse.mm": lambda: torch.sparse.mm(big, B.reshape(b * size, n)).view(b, size, n),
            "st.spmm cusparse (block-diag)": lambda: st.spmm(A, B, backend="cusparse"),
            "st.spmm native": lambda: st.spmm(A, B, backend="native"),
            "st.spmm auto": lambda: st.spmm(A, B),
            "plan native": lambda: plan(B),
            "plan cusparse (block-diag built once)": lambda: plan_cus(B),
        }
        bytes_ = spmm_bytes(b * size, b * size, n, nnz)
        flops = 2 * nnz * n
        fl = floor_ms(bytes_, flops, bw, peak)
        base = None
        case = f"b={b} {size}x{size} {int(density * 100)}% n={n}"
        for name, fn in impls.items():
            err = rel_err(fn(), ref)
            assert err < 1e-5, f"{name} {case}: relative error {err}"
            ms = bench(fn, rep=100)
            base = ms if base is None else base
            results.append(row("batched, per-batch patterns", f"{case} {name}", ms, base, fl, bytes_, flops, err))


def latency_suite(results):
    """Host time per call for a small product (the kernel itself takes a few microseconds)."""
    m, k, n = 1000, 1000, 16
    crow, col, values = random_graph(m, k, 10)
    A = st.CSR(crow, col, values, (m, k))
    A_torch = torch.sparse_csr_tensor(crow, col, values, (m, k), check_invariants=False)
    B = torch.randn(k, n, device="cuda")
    plans = {be: st.SpmmPlan(A, backend=be) for be in ("cusparse", "native")}
    impls = {
        "torch.sparse.mm": lambda: torch.sparse.mm(A_torch, B),
        "st.spmm cusparse": lambda: st.spmm(A, B, backend="cusparse"),
        "st.spmm native": lambda: st.spmm(A, B, backend="native"),
        "plan cusparse": lambda: plans["cusparse"](B),
        "plan native": lambda: plans["native"](B),
        "raw op native": lambda: torch.ops.sparsetorch.spmm(crow, col, values, B, 1.0, None, 0.0, None, "none", 0.01,
                                                            "native"),
    }
    for name, fn in impls.items():
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        reps = 2000
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        torch.cuda.synchronize()
        us = (time.perf_counter() - t0) / reps * 1e6
        results.append({"suite": "latency 1000x1000, 10/row, n=16", "case": name, "us_per_call": us})


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None, help="folder for spmm_cuda.json (default: print only)")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "this benchmark needs a CUDA device"
    bw, peak = ceilings()
    results = []
    graph_suite(bw, peak, results)
    batched_suite(bw, peak, results)
    latency_suite(results)
    meta = run_meta(build=st.build_info(), copy_bandwidth_GBps=bw / 1e9, fp32_peak_TFLOPs=peak / 1e12,
                    host=platform.node())
    print(f"device {meta['device']}: copy {bw / 1e9:.0f} GB/s, fp32 GEMM (TF32 off) {peak / 1e12:.1f} TFLOP/s")
    for r in results:
        if "ms" in r:
            print(f"{r['suite'][:28]:28s} {r['case']:58s} {r['ms'] * 1e3:9.1f} us  x{r['speedup_vs_baseline']:6.2f}"
                  f"  floor {r['floor_ms'] * 1e3:7.1f} us ({100 * r['of_floor']:5.1f}%)  {r['GBps']:7.0f} GB/s")
        else:
            print(f"{r['suite'][:28]:28s} {r['case']:58s} {r['us_per_call']:9.1f} us/call (host)")
    write_results(args.out, "spmm_cuda.json", meta, results)


if __name__ == "__main__":
    main()
