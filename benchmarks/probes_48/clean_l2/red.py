"""What the split-K reduce kernel costs: the bitmap kernel with and without its second launch (clean L2)."""
import os, torch, torch.nn.functional as F
import sparsetorch as st
from drv import Module, run
from run import weight, pad8
import importlib.util
spec = importlib.util.spec_from_file_location("v2", os.path.join(os.path.dirname(os.path.abspath(__file__)), "var2.py"))
HERE = os.path.dirname(os.path.abspath(__file__))
src = open(os.path.join(HERE, "var2.py")).read()
ns = {"__file__": os.path.join(HERE, "var2.py")}
exec(src[:src.index("gen = torch.Generator")], ns)
choose, t_clean, KV, RN = ns["choose"], ns["t_clean"], ns["KV"], ns["RN"]
mod = Module(os.path.join(HERE, "cur2.cubin"))
gen = torch.Generator(device="cuda"); gen.manual_seed(3)
for (m, k) in [(11008, 4096), (1024, 4096), (4096, 4096), (4096, 11008)]:
    for sp in (0.5, 0.7):
        w = weight(m, k, sp, True, gen); bw = st.BitmapWeight.from_dense(w)
        for n in (1, 16):
            x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16); xx = pad8(x)
            L = choose(m, n, k, bw.values.numel()); kn = KV.format(L["nt"], int(L["dense"]))
            out = torch.empty(n, m, dtype=torch.bfloat16, device="cuda")
            work = torch.empty(L["splits"], n, m, dtype=torch.float32, device="cuda") if L["splits"] > 1 else None
            full = lambda: run(mod, kn, RN, bw, xx, out, work, L)
            L1 = dict(L, splits=1) if False else L
            def main_only():
                s = L["splits"]; L["splits"] = 1 if s == 1 else s
                mod.launch(kn, (L["ct"], L["rb"], L["splits"]), (256, 1, 1), L["smem"], [mk_params()])
            from drv import Params
            def mk_params():
                p = Params(); p.x = xx.data_ptr(); p.ldx = xx.stride(0); p.kx = xx.shape[1]; p.n = n; p.m = m
                p.strips, p.chunks = bw.bitmaps.shape[0], bw.bitmaps.shape[1]
                p.out = (work if L["splits"] > 1 else out).data_ptr(); p.bias = None; p.act = 0; p.slope = 0.01
                p.ws, p.wk, p.chunks_per_split = L["ws"], L["wk"], L["cps"]
                p.bitmaps, p.offsets, p.values = bw.bitmaps.data_ptr(), bw.offsets.data_ptr(), bw.values.data_ptr()
                p.nvalues = bw.values.numel(); p.scatter_max = 256; p.batch = L["batch"]; p.stage_values = L["sv"]; p.even_warps = 0
                return p
            full(); torch.cuda.synchronize()
            ref = x.double() @ w.double().t(); err = ((out.double() - ref).abs().max() / ref.abs().max()).item()
            td = t_clean(lambda: F.linear(x, w)); tf = t_clean(full); tm = t_clean(main_only); tl = t_clean(lambda: st.bitmap_linear(x, bw))
            print(f"{m}x{k} {int(sp*100)}% N={n}: dense {td:.1f} lib {tl:.1f} cubin {tf:.1f} main-only {tm:.1f} (reduce {tf-tm:.1f}) grid {L['rb']}x{L['splits']} err {err:.1e}", flush=True)
