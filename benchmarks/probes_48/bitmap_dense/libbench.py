"""st.bitmap_linear (the library op, whatever module is on the path) against F.linear; LABEL tags the rows."""
import json, os, sys
import torch, torch.nn.functional as F
import sparsetorch as st
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run import weight
import triton.testing as tt
bench = lambda f: tt.do_bench(f, warmup=10, rep=50, return_mode="median") * 1e3
label = os.environ.get("LABEL", "lib")
gen = torch.Generator(device="cuda"); gen.manual_seed(1)
res = []
for (m, k) in [(14336, 4096), (4096, 14336), (11008, 4096), (4096, 11008), (4096, 4096)][:int(os.environ.get("NSHAPES", "5"))]:
    for sp, per_row in ((0.5, True), (0.7, True), (0.9, True), (0.5, False)):
        w = weight(m, k, sp, per_row, gen); bw = st.BitmapWeight.from_dense(w)
        for n in (1, 16):
            x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
            ref = x.double() @ w.double().t()
            out = st.bitmap_linear(x, bw)
            err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            td = bench(lambda: F.linear(x, w)); tb = bench(lambda: st.bitmap_linear(x, bw))
            res.append(dict(label=label, m=m, k=k, sp=sp, per_row=per_row, n=n, dense=td, bitmap=tb, err=err))
            print(f"{label} {m}x{k} {int(sp*100)}{'r' if per_row else 'g'} N={n}: dense {td:.1f} bitmap {tb:.1f} ({td/tb:.2f}x) err {err:.1e}", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), f"lib_{label}.json"), "w"), indent=1)
