"""Calls for ncu: slot_linear (and, with --form, bitmap_linear / csr16_linear) on a pruned bf16 weight, a few
times, so that a profiler can pick one launch:
    ncu --clock-control none -k regex:slot_linear_kernel --launch-skip 3 --launch-count 1 \
        python3 benchmarks/_prof_slots.py --n 16
"""
import argparse

import torch

import sparsetorch as st

ap = argparse.ArgumentParser()
ap.add_argument("--m", type=int, default=11008)
ap.add_argument("--k", type=int, default=4096)
ap.add_argument("--sparsity", type=float, default=0.9)
ap.add_argument("--n", type=int, default=16)
ap.add_argument("--form", default="slots", choices=("slots", "bitmap", "csr16"))
args = ap.parse_args()
g = torch.Generator(device="cuda").manual_seed(0)
w = torch.randn(args.m, args.k, device="cuda", generator=g)
w[w.abs() <= w.abs().flatten().kthvalue(int(args.sparsity * w.numel())).values] = 0.0
w = w.to(torch.bfloat16)
x = torch.randn(args.n, args.k, device="cuda").to(torch.bfloat16)
if args.form == "slots":
    W = st.SlotWeight.from_csr(w.to_sparse_csr())
    call = lambda: st.slot_linear(x, W)  # noqa: E731
elif args.form == "bitmap":
    W = st.BitmapWeight.from_dense(w)
    call = lambda: st.bitmap_linear(x, W)  # noqa: E731
else:
    W = st.Csr16Weight.from_csr(w.to_sparse_csr())
    call = lambda: st.csr16_linear(x, W)  # noqa: E731
for _ in range(6):
    call()
torch.cuda.synchronize()
