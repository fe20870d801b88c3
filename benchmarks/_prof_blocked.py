"""Kernel-by-kernel device time of one SpmmPlan "blocked" call (4096 x 4096 at 25%, B 4096 x 1024, fp32):
the blocked kernel, the NaN/Inf check of B and the fallback's early-exit launch.
    python benchmarks/_prof_blocked.py"""
import torch
from torch.profiler import ProfilerActivity, profile

import sparsetorch as st

g = torch.Generator(device="cuda").manual_seed(0)
dense = torch.randn(4096, 4096, device="cuda", generator=g) * (torch.rand(4096, 4096, device="cuda", generator=g) < 0.25)
a = st.from_torch(dense.to_sparse_csr())
b = torch.randn(4096, 1024, device="cuda")
plan = st.SpmmPlan(a, backend="blocked")
for _ in range(3):
    plan(b)
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(10):
        plan(b)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8))
