"""st.bitmap_linear with the splits added in a cluster (default on sm_90) against the second kernel
(SPARSETORCH_SPLIT_REDUCE=kernel) and F.linear, clean L2 (read flush), H100."""
import os, torch, torch.nn.functional as F
import sparsetorch as st
from run import weight
from sparsetorch.plan import _device_time
scratch = torch.zeros(100 * 2**20, dtype=torch.int8, device="cuda")
t = lambda f: _device_time(f, scratch, clean=True, budget_ms=20.0, max_reps=100) * 1e3
gen = torch.Generator(device="cuda"); gen.manual_seed(5)
for (m, k) in [(11008, 4096), (1024, 4096), (4096, 4096), (14336, 4096), (4096, 14336)]:
    for sp in (0.5, 0.7):
        w = weight(m, k, sp, True, gen); bw = st.BitmapWeight.from_dense(w)
        for n in (1, 16):
            x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
            td = t(lambda: F.linear(x, w)); tc = t(lambda: st.bitmap_linear(x, bw))
            os.environ["SPARSETORCH_SPLIT_REDUCE"] = "kernel"; tk = t(lambda: st.bitmap_linear(x, bw)); del os.environ["SPARSETORCH_SPLIT_REDUCE"]
            print(f"{m}x{k} {int(sp*100)}% N={n}: dense {td:.1f} cluster {tc:.1f} ({td/tc:.2f}x) kernel {tk:.1f} ({td/tk:.2f}x)", flush=True)
