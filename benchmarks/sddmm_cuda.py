"""SDDMM (the gradient of SpMM w.r.t. A's values) on CUDA: the native kernel against cusparseSDDMM,
in one run, outputs checked against each other before timing. Also the full SpMM backward
(grad_B via the cached transpose + grad_values) against torch.sparse's autograd.

Floor: bytes of the pattern (indices) + output values + every referenced row of b once + a once,
over the copy bandwidth measured here.

Times: median device seconds with the L2 zeroed before each call (_results.bench).

    python -m benchmarks.sddmm_cuda [--out DIR]
"""
import argparse
import json

import torch

import sparsetorch as st
from benchmarks._results import bench, run_meta, write_results


def random_graph(m, k, per_row, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    col = torch.randint(0, k, (m * per_row,), device=device, generator=g)
    crow = torch.arange(0, m * per_row + 1, per_row, device=device)
    values = torch.randn(m * per_row, device=device, generator=g)
    return st.CSR(crow, col, values, (m, k))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    x = torch.empty(2**26, device="cuda")
    copy_bw = 2 * x.numel() * 4 / bench(lambda: x.clone())
    del x
    cases = [("random 100k x 100k, 20/row", 100_000, 100_000, 20, n) for n in (32, 128)]
    cases += [("pruned 4096 x 4096, 10%", 4096, 4096, 410, 1024)]
    results = []
    for name, m, k, per_row, n in cases:
        for dtype in (torch.float32, torch.bfloat16):
            a = random_graph(m, k, per_row, "cuda", 0).to(dtype=dtype)
            ga = torch.randn(m, n, device="cuda", dtype=dtype)
            b = torch.randn(k, n, device="cuda", dtype=dtype)
            size = ga.element_size()
            nnz = a.values.numel()
            floor_bytes = nnz * (a.col_indices.element_size() + size) + min(nnz, k) * n * size + m * n * size
            floor = floor_bytes / copy_bw
            row = {"case": name, "n": n, "dtype": str(dtype), "nnz": nnz, "floor_us": floor * 1e6}
            native = lambda: torch.ops.sparsetorch.sddmm(a.crow_indices, a.col_indices, ga, b, 1.0, "native")  # noqa
            ref = native()
            row["native_us"] = bench(native) * 1e6
            if dtype == torch.float32:
                cus = lambda: torch.ops.sparsetorch.sddmm(a.crow_indices, a.col_indices, ga, b, 1.0, "cusparse")  # noqa
                torch.testing.assert_close(cus(), ref, rtol=1e-4, atol=1e-4)
                row["cusparse_us"] = bench(cus) * 1e6
            # Whole SpMM backward (grad of values and of B) vs torch.sparse.mm's autograd.
            values = a.values.clone().requires_grad_()
            bb = b.clone().requires_grad_()
            g = torch.randn(m, n, device="cuda", dtype=dtype)
            y = st.spmm(a.with_values(values), bb)

            def ours():
                return torch.autograd.grad(y, (values, bb), g, retain_graph=True)

            row["backward_us"] = bench(ours) * 1e6
            if dtype == torch.float32:
                ts = torch.sparse_csr_tensor(a.crow_indices, a.col_indices, a.values.detach(), (m, k)).to_sparse_coo()
                ts = ts.coalesce().requires_grad_()
                yt = torch.sparse.mm(ts, bb)
                try:
                    row["torch_backward_us"] = bench(lambda: torch.autograd.grad(yt, (ts, bb), g, retain_graph=True)) * 1e6
                except RuntimeError as e:
                    row["torch_backward_error"] = str(e)[:200]
            results.append(row)
            print(json.dumps(row))
    write_results(args.out, "sddmm_cuda.json", run_meta(copy_GBps=copy_bw / 1e9), results)


if __name__ == "__main__":
    main()
