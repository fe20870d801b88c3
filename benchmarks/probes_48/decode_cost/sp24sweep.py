"""2:4 decode kernel sweep (env overrides SP24_*: sweep build only): x chunks, U, splits; clean-L2 timer vs F.linear."""
import os, torch, torch.nn.functional as F
import sparsetorch as st
from sparsetorch.bench.timing import make_clean_l2_timer
from sparsetorch.bench.suites.decode import heavy_tailed_weight
dev = torch.device("cuda"); t = make_clean_l2_timer(dev, quick=True)
g = torch.Generator(device="cuda").manual_seed(3)
def prune24(w):
    a = w.abs().view(w.shape[0], -1, 4); keep = a.argsort(-1, descending=True)[..., :2]
    mask = torch.zeros_like(a, dtype=torch.bool).scatter_(-1, keep, True)
    return (w.view(w.shape[0], -1, 4) * mask).view_as(w)
def setenv(**kw):
    for k in ("SP24_U", "SP24_SPLITS", "SP24_XCHUNKS"): os.environ.pop(k, None)
    for k, v in kw.items(): os.environ["SP24_" + k.upper()] = str(v)
for (m, k) in [(14336, 4096), (4096, 14336), (4096, 4096), (11008, 4096), (4096, 11008), (1024, 4096)]:
    w = prune24(heavy_tailed_weight(m, k, dev, torch.bfloat16, g)); W = st.Sparse24DecodeWeight(w)
    for n in (1, 4, 8, 16, 32):
        x = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
        ref = x.double() @ w.double().t()
        td = t(lambda: F.linear(x, w)) * 1e6
        confs = [dict(), dict(xchunks=1), dict(xchunks=4), dict(u=4, xchunks=4)]
        row = []
        for c in confs:
            setenv(**c)
            y = st.sparse24_decode_linear(x, W); err = ((y.double() - ref).abs().max() / ref.abs().max()).item()
            ts = t(lambda: st.sparse24_decode_linear(x, W)) * 1e6
            row.append(f"{','.join(f'{a}{b}' for a, b in c.items())} {ts:.1f}({td/ts:.2f}){'' if err < 1e-2 else ' BAD %.1e' % err}")
        setenv()
        print(f"{m}x{k} N={n} dense {td:.1f}: " + " | ".join(row), flush=True)
