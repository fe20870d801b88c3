"""Kernel-by-kernel device time of one densify SpMM call (torch.profiler), for the overhead above
the GEMM: python benchmarks/_prof_densify.py"""
import torch
from torch.profiler import ProfilerActivity, profile

import sparsetorch as st

for dtype, n, d in ((torch.bfloat16, 64, 0.1), (torch.bfloat16, 1024, 0.1), (torch.float32, 64, 0.002)):
    g = torch.Generator(device="cuda").manual_seed(0)
    m = k = 4096
    dense = torch.where(torch.rand(m, k, device="cuda", generator=g) < d, torch.randn(m, k, device="cuda"), 0.0)
    a = st.from_dense(dense.to(dtype)).to(index_dtype=torch.int32)
    b = torch.randn(k, n, device="cuda", dtype=dtype)
    for _ in range(3):
        st.spmm(a, b, backend="densify")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            st.spmm(a, b, backend="densify")
        torch.cuda.synchronize()
    print(f"--- {dtype} n={n} density {d}")
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10, max_name_column_width=90))
