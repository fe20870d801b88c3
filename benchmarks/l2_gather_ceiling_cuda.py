"""How fast can an SpMM gather B rows that all hit L2? The ceiling of any gather-order SpMM kernel on
graphs whose B does not fit in L2 is max(HBM bytes / HBM rate, gathered bytes / this rate): every gathered
row crosses L2 whether it hits or misses.

A: 100k rows x 200 random columns in [0, cols) with cols chosen so that B (cols x n) takes 24 MB (fits in the
H100's 50 MB L2 with room), so the 20M gathers hit L2 and C stays small (100k x n). Timed: torch.sparse.mm
(cuSPARSE) and st.spmm (default route, after its measuring call), do_bench medians without an L2 flush
(B is meant to stay resident). Rate = nnz x n x element size / time.

    python benchmarks/l2_gather_ceiling_cuda.py > results/nvidia-h100-80gb-hbm3/l2_window/l2_gather_ceiling.txt
"""
import torch
import triton.testing

import sparsetorch as st


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=100, return_mode="median") * 1e-3  # s


def main():
    props = torch.cuda.get_device_properties(0)
    print(f"{props.name}, torch {torch.__version__}, L2 {props.L2_cache_size / 2**20:.0f} MB")
    g = torch.Generator(device="cuda").manual_seed(0)
    rows, per_row = 100_000, 200
    for dtype in (torch.float32, torch.bfloat16):
        for n in (32, 128, 256):
            esize = torch.tensor([], dtype=dtype).element_size()
            cols = 24 * 2**20 // (n * esize)
            col = torch.randint(0, cols, (rows * per_row,), device="cuda", generator=g)
            col = col.view(rows, per_row).sort(dim=1).values.flatten()
            crow = torch.arange(0, rows * per_row + 1, per_row, device="cuda")
            val = torch.randn(rows * per_row, device="cuda", generator=g).to(dtype)
            A = torch.sparse_csr_tensor(crow, col, val, (rows, cols))
            B = torch.randn(cols, n, device="cuda", generator=g).to(dtype)
            sA = st.as_csr(A)
            st.spmm(sA, B)
            st.spmm(sA, B)  # the measuring call
            gathered = rows * per_row * n * esize
            out = []
            for name, fn in (("torch.sparse.mm", lambda: torch.sparse.mm(A, B)), ("st.spmm", lambda: st.spmm(sA, B))):
                t = bench(fn)
                out.append(f"{name} {t * 1e6:.0f} us = {gathered / t / 1e12:.2f} TB/s")
            tag = "fp32" if dtype == torch.float32 else "bf16"
            print(f"{tag} n = {n} (B {cols} x {n}, {gathered / 1e9:.1f} GB gathered): " + "; ".join(out), flush=True)


if __name__ == "__main__":
    main()
