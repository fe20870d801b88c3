"""st.bitmap_linear against F.linear, clean-L2 timer, Llama shapes, 50/70% per row and 50% global, N = 1, 16."""
import torch, torch.nn.functional as F
import sparsetorch as st
from sparsetorch.bench.timing import make_clean_l2_timer
from run import weight
t = make_clean_l2_timer(torch.device("cuda"), quick=True)
gen = torch.Generator(device="cuda"); gen.manual_seed(0)
for (m, k) in [(14336, 4096), (4096, 14336), (11008, 4096)]:
    for sp, per_row in ((0.5, True), (0.7, True), (0.5, False)):
        w = weight(m, k, sp, per_row, gen); bw = st.BitmapWeight.from_dense(w)
        for n in (1, 16):
            x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
            ref = x.double() @ w.double().t(); y = st.bitmap_linear(x, bw)
            err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
            td = t(lambda: F.linear(x, w)) * 1e6; tb = t(lambda: st.bitmap_linear(x, bw)) * 1e6
            print(f"bitmap {m}x{k} {int(sp*100)}{'r' if per_row else 'g'} N={n}: dense {td:.1f} bitmap {tb:.1f} us ({td/tb:.2f}x) err {err:.1e}", flush=True)
