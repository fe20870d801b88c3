"""Where a densify call's host time goes: torch.profiler (CPU side, CUDA runtime calls included) over
50 calls on the skew suite's pruned 4096 x 4096 at 10%, bf16, n = 8; native for comparison."""
import time
import numpy as np, torch
from torch.profiler import ProfilerActivity, profile
import sparsetorch as st
from sparsetorch.bench.suites.skew import with_row_lengths

a = with_row_lengths(np.full(4096, 410), 4096, 19)
A = st.from_scipy(a, device="cuda", dtype=torch.bfloat16, index_dtype=torch.int32)
B = torch.randn(4096, 8, device="cuda").to(torch.bfloat16)
for route in ("densify", "native", "cusparse"):
    f = lambda: st.spmm(A, B, backend=route)
    for _ in range(20): f()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(50): f()
    host = (time.perf_counter() - t0) / 50 * 1e6
    torch.cuda.synchronize()
    print(f"\n{route}: {host:.1f} us host per call (50 calls, no sync)")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(50): f()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=16, max_name_column_width=50))
