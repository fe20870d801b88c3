"""2:4 SparseLinear against F.linear on the Llama-3-8B MLP shapes, clean-L2 timer, N = 1..16 (+ 2048)."""
import torch, torch.nn.functional as F
import sparsetorch as st
from sparsetorch.bench.timing import make_clean_l2_timer
from sparsetorch.bench.suites.decode import heavy_tailed_weight
dev = torch.device("cuda"); t = make_clean_l2_timer(dev, quick=True)
g = torch.Generator(device="cuda").manual_seed(3)
for (m, k) in [(14336, 4096), (4096, 14336)]:
    w = heavy_tailed_weight(m, k, dev, torch.bfloat16, g)
    layer = st.nn.SparseLinear.from_dense(w, scheme="2:4")
    for n in (1, 2, 4, 8, 16, 2048):
        x = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
        with torch.no_grad():
            layer(x); torch.cuda.synchronize()
            td = t(lambda: F.linear(x, w)) * 1e6; ts = t(lambda: layer(x)) * 1e6
        print(f"2:4 {m}x{k} N={n}: dense {td:.1f} us, SparseLinear {ts:.1f} us ({td/ts:.2f}x)", flush=True)
    print("routes", layer.routes, flush=True)
