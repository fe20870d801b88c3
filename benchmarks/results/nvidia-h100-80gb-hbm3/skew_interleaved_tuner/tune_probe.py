"""How often the autotuner picks each route on the skew suite's near-miss cases (fresh analysis each try)."""
import collections, sys
import numpy as np, torch, triton
import sparsetorch as st
from sparsetorch._ops import ops
from sparsetorch.bench.suites.skew import with_row_lengths
from sparsetorch.bench.suites.graphs import real_graphs

data = sys.argv[1]
mats = {"pruned 4096 10%": with_row_lengths(np.full(4096, 410), 4096, 19)}
for name, make in real_graphs(data):
    if name.split(",")[0] in ("G51", "dwt_992", "jagmesh7"):
        mats[name] = make()
cases = [("pruned 4096 10%", 8, torch.bfloat16), ("pruned 4096 10%", 8, torch.float32), ("pruned 4096 10%", 32, torch.bfloat16)]
for name in mats:
    if name != "pruned 4096 10%":
        cases += [(name, 1, torch.bfloat16), (name, 8, torch.float32), (name, 128, torch.bfloat16), (name, 32, torch.float32)]
for name, n, dtype in cases:
    A = st.from_scipy(mats[name], device="cuda", dtype=dtype, index_dtype=torch.int32)
    B = torch.randn(A.shape[1], n, device="cuda").to(dtype)
    picks = collections.Counter()
    for _ in range(8):
        picks[ops.spmm_tune(A.crow_indices.clone(), A.col_indices.clone(), A.values, B)] += 1
    times = {}
    for r in ("native", "balanced", "cusparse", "densify", "split"):
        try:
            times[r] = triton.testing.do_bench(lambda: st.spmm(A, B, backend=r), warmup=10, rep=40, return_mode="median") * 1e3
        except Exception as e:
            times[r] = None
    print(f"{name:28s} n={n:4d} {str(dtype)[6:]:9s} picks {dict(picks)}  do_bench us " +
          " ".join(f"{r} {t:.1f}" for r, t in times.items() if t), flush=True)
