"""Batches of graphs with a different sparsity pattern per batch."""
from __future__ import annotations

from typing import List

import numpy as np
import torch

import sparsetorch as st
from benchmarks.suites.common import Context, Job, copies, gemm_model, measure, spmm_model
from benchmarks.harness import tf32_mode


def batched_suite(ctx: Context) -> List[Job]:
    if ctx.cuda:
        cases = [(8, 4096), (512, 256), (4096, 64)] if ctx.quick else [(8, 4096), (64, 1024), (512, 256),
                                                                        (4096, 64)]
        n = 64
    else:
        cases = [(8, 512), (64, 64)] if ctx.quick else [(8, 1024), (64, 256), (512, 64)]
        n = 32

    def job(b, s):
        def run():
            import scipy.sparse as sp

            rng = np.random.default_rng(b * 7 + s)
            per_row = min(16, s // 4)
            mats = []
            for _ in range(b):  # a different pattern (and nnz) per batch
                d = per_row / s * rng.uniform(0.5, 1.5)
                mats.append(sp.random(s, s, density=d, format="csr", random_state=rng, dtype=np.float32))
            A = st.from_list(mats, device=ctx.device, index_dtype=torch.int32)
            B = torch.randn(b, s, n, device=ctx.device)
            A_dense = A.to_dense()
            ref = torch.bmm(A_dense.double(), B.double())
            nnz = sum(x.nnz for x in mats)
            torch_list = [st.to_torch(st.from_scipy(x, device=ctx.device)) for x in mats]
            block = st.to_torch(st.from_scipy(sp.block_diag(mats, format="csr"), device=ctx.device))
            sb, sf = spmm_model(nnz, s, s, n, 4, 4, batch=b)
            gb, gf = gemm_model(s, s, n, 4, batch=b)

            def loop(B):
                return torch.stack([torch.sparse.mm(t, B[i]) for i, t in enumerate(torch_list)])

            def tf32_bmm(B):
                with tf32_mode(True):
                    return torch.bmm(A_dense, B)

            impls = {"sparsetorch": (lambda B: st.spmm(A, B), copies(ctx, B, sb), sb, sf, "float32", "float32"),
                     "block-diagonal torch.sparse.mm": (
                         lambda B: torch.sparse.mm(block, B.reshape(b * s, n)).reshape(b, s, n),
                         copies(ctx, B, sb), sb, sf, "float32", "float32"),
                     "dense bmm fp32": (lambda B: torch.bmm(A_dense, B), copies(ctx, B, gb), gb, gf, "float32",
                                        "float32")}
            if ctx.cuda:
                impls["dense bmm tf32"] = (tf32_bmm, copies(ctx, B, gb), gb, gf, "tf32", "tf32")
            if b <= 512:  # a Python loop over thousands of matrices measures the interpreter
                impls["loop of torch.sparse.mm"] = (loop, [(B,)], sb, sf, "float32", "float32")
            base = {"suite": "batched", "case": f"b={b}, {s}x{s}, n={n}", "batch": b, "m": s, "n": n, "nnz": nnz}
            return measure(ctx, base, impls, ref, sb)

        return run

    return [job(b, s) for b, s in cases]


