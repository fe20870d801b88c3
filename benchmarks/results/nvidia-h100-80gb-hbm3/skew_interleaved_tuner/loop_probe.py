"""Per-call time of each route in a user's loop (200 calls back to back, one sync) against do_bench's
flushed per-call device time, on the skew suite's pruned 4096 bf16 n = 8 case; and the tuner's picks."""
import collections, time
import numpy as np, torch, triton
import sparsetorch as st
from sparsetorch._ops import ops
from sparsetorch.bench.suites.skew import with_row_lengths

a = with_row_lengths(np.full(4096, 410), 4096, 19)
for dtype, n in ((torch.bfloat16, 8), (torch.bfloat16, 32), (torch.float32, 8)):
    A = st.from_scipy(a, device="cuda", dtype=dtype, index_dtype=torch.int32)
    B = torch.randn(4096, n, device="cuda").to(dtype)
    picks = collections.Counter(ops.spmm_tune(A.crow_indices.clone(), A.col_indices.clone(), A.values, B)
                                for _ in range(16))
    line = []
    for r in ("native", "cusparse", "densify", "balanced"):
        f = lambda: st.spmm(A, B, backend=r)
        for _ in range(20): f()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(200): f()
        host = (time.perf_counter() - t0) / 200 * 1e6
        torch.cuda.synchronize()
        loop = (time.perf_counter() - t0) / 200 * 1e6
        db = triton.testing.do_bench(f, warmup=10, rep=40, return_mode="median") * 1e3
        line.append(f"{r}: loop {loop:.1f} us (host {host:.1f}), do_bench {db:.1f}")
    print(f"{str(dtype)[6:]} n={n}: tuner picks {dict(picks)}\n   " + "\n   ".join(line), flush=True)
