"""The density sweep: one A at 50% .. 0.1% density against dense matmul and torch.sparse.mm."""
from __future__ import annotations

from typing import List

import torch

import sparsetorch as st
from benchmarks.suites.common import (Context, Job, copies, densify_model, gemm_model, measure, plan_route,
                                             spmm_model)
from benchmarks.harness import tf32_mode


def density_suite(ctx: Context) -> List[Job]:
    if ctx.cuda:
        m, n = 4096, 1024
        densities = (0.5, 0.1, 0.02, 0.005, 0.001) if ctx.quick else (0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005,
                                                                       0.002, 0.001)
    else:
        m, n = 1024, 128
        densities = (0.3, 0.1, 0.03, 0.01, 0.001) if ctx.quick else (0.5, 0.3, 0.1, 0.05, 0.02, 0.01, 0.003, 0.001)

    def job(d):
        def run():
            g = torch.Generator(device=ctx.device).manual_seed(int(d * 1e6))
            mask = torch.rand(m, m, device=ctx.device, generator=g) < d
            dense64 = torch.where(mask, torch.randn(m, m, device=ctx.device, generator=g, dtype=torch.float64), 0.0)
            del mask
            B64 = torch.randn(m, n, device=ctx.device, generator=g, dtype=torch.float64)
            ref = dense64 @ B64
            dense32, B32 = dense64.float(), B64.float()
            A32 = st.from_torch(dense32.to_sparse_csr()).to(index_dtype=torch.int32)
            nnz = A32.col_indices.numel()
            plan = st.SpmmPlan(A32, validate=False)
            a_torch = st.to_torch(A32)
            sb, sf = spmm_model(nnz, m, m, n, 4, 4)
            gb, gf = gemm_model(m, m, n, 4)
            work = sb
            routes = {"float32": plan_route(plan, B32)}
            ob, of = densify_model(nnz, m, m, n, 4, 4) if routes["float32"] == "densify" else (sb, sf)
            impls = {
                "sparsetorch": (lambda b: plan(b), copies(ctx, B32, work), ob, of, "float32", "float32"),
                "torch.sparse.mm": (lambda b: torch.sparse.mm(a_torch, b), copies(ctx, B32, work), sb, sf,
                                    "float32", "float32"),
                "dense fp32": (lambda b: dense32 @ b, copies(ctx, B32, gb), gb, gf, "float32", "float32"),
            }
            if ctx.cuda:
                def tf32_mm(b):
                    with tf32_mode(True):
                        return dense32 @ b

                dense16, B16 = dense64.bfloat16(), B64.bfloat16()
                A16 = A32.to(dtype=torch.bfloat16)
                plan16 = st.SpmmPlan(A16, validate=False)
                impls["dense tf32"] = (tf32_mm, copies(ctx, B32, gb), gb, gf, "tf32", "tf32")
                impls["dense bf16"] = (lambda b: dense16 @ b, copies(ctx, B16, gb // 2), gb // 2, gf, "bfloat16",
                                       "bfloat16")
                sb16, _ = spmm_model(nnz, m, m, n, 2, 4)
                # A sparse kernel's flops run on CUDA cores (fp32 FMA rate); the densify route's on tensor cores.
                routes["bfloat16"] = plan_route(plan16, B16)
                ob16, of16, rate16 = ((*densify_model(nnz, m, m, n, 2, 4), "bfloat16") if routes["bfloat16"] == "densify"
                                      else (sb16, sf, "float32"))
                impls["sparsetorch bf16"] = (lambda b: plan16(b), copies(ctx, B16, sb16), ob16, of16, rate16,
                                             "bfloat16")
                a_torch16 = st.to_torch(A16)
                impls["torch.sparse.mm bf16"] = (lambda b: torch.sparse.mm(a_torch16, b), copies(ctx, B16, sb16),
                                                 sb16, sf, "float32", "bfloat16")
            else:
                import scipy.sparse  # noqa: F401

                a_sp, b_np = st.to_scipy(A32), B32.numpy()
                impls["scipy"] = (lambda: a_sp @ b_np, None, sb, sf, "float32", "float32")
            base = {"suite": "density", "case": f"{m}x{m} @ {m}x{n}, {100 * d:g}%", "density": d, "m": m, "n": n,
                    "nnz": nnz, "sparsetorch_routes": routes}
            return measure(ctx, base, impls, ref, work)

        return run

    return [job(d) for d in densities]


