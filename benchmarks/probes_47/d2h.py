"""Host cost of the CSR analysis's read-back: pageable .cpu() against a pinned non-blocking copy + sync."""
import time, torch, numpy as np
import sparsetorch as st
from sparsetorch._ops import ops
from sparsetorch.bench.suites.skew import power_law_lengths, with_row_lengths
a = with_row_lengths(power_law_lengths(161, 4.6, 1.5, 44, 80), 161, 45, hub_exponent=1.5)
A = st.from_scipy(a, device="cuda", index_dtype=torch.int32)
crow, col = A.crow_indices, A.col_indices
pinned = torch.empty(256, dtype=torch.int64).pin_memory()
s = torch.cuda.current_stream()
def t(fn, reps=2000):
    for _ in range(50): fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps): fn()
    return (time.perf_counter() - t0) / reps * 1e6
def pageable():
    return ops.csr_stats(crow, col, 161).cpu()
def pin():
    r = ops.csr_stats(crow, col, 161)
    p = pinned[: r.numel()]
    p.copy_(r, non_blocking=True)
    s.synchronize()
    return p
def stats_only():
    r = ops.csr_stats(crow, col, 161); s.synchronize(); return r
x = torch.zeros(1, device="cuda")
def tiny_sync():
    x.add_(1); s.synchronize()
def spmm_first():
    ops.csr_analysis_cache(True)
    return st.spmm(A, B)
B = torch.randn(161, 32, device="cuda")
for name, fn in (("launch+sync (x.add_)", tiny_sync), ("csr_stats + sync", stats_only), ("csr_stats + .cpu()", pageable),
                 ("csr_stats + pinned copy + sync", pin), ("st.spmm, analysis cache cleared", spmm_first),
                 ("torch.sparse.mm", lambda: torch.sparse.mm(st.to_torch(A), B))):
    print(f"{name:40s} {t(fn):7.1f} us", flush=True)
