"""final.cubin (choose_final) against v2.cubin (choose_v2): float64 checks, then do_bench medians vs F.linear."""
import os, sys, json, torch, torch.nn.functional as F
import sparsetorch as st
from drv import Module, choose_final, choose_v2, choose_v4, choose_v5, choose_v6, run
from run import weight, pad8
HERE = os.path.dirname(os.path.abspath(__file__))
KF = "_ZN11sparsetorch4cuda6bitmap20bitmap_linear_kernelI13__nv_bfloat16Li{}ELi{}EEEvNS1_6ParamsE"
KV = "_ZN11sparsetorch4cuda6bitmap20bitmap_linear_kernelI13__nv_bfloat16Li{}ELb{}EEEvNS1_6ParamsE"
RN = "_ZN11sparsetorch4cuda6bitmap27bitmap_splitk_reduce_kernelI13__nv_bfloat16EEvPKfillPKtNS_10ActivationEfPt"
RN4 = "_ZN11sparsetorch4cuda6bitmap27bitmap_splitk_reduce_kernelI13__nv_bfloat16EEvPKfillNS1_9EvenSplitEPKtNS_10ActivationEfPt"
V = os.environ.get("V", "v2"); B = os.environ.get("BASE", "final")
mods = {B: Module(os.path.join(HERE, B + ".cubin")), V: Module(os.path.join(HERE, V + ".cubin"))}
sms = torch.cuda.get_device_properties(0).multi_processor_count
def make(name, bw, x, bias=None, act=0, smax=256):
    m, k = bw.shape; n = x.shape[0]
    if name == "final" and B == "final":
        L = choose_final(m, n, k, bw.values.numel(), sms); kn = KF.format(L["nt"], L["blocks"])
    else:
        L = (choose_v6 if name == "v6" else choose_v5 if name == "v5" else choose_v4 if name == "v4" else choose_v2)(m, n, k, bw.values.numel(), sms); kn = KV.format(L["nt"], int(L["dense"]))
        if name == V and os.environ.get("FORCE_BATCH"):
            L["batch"] = int(os.environ["FORCE_BATCH"]); L["sv"] = L["batch"] * 1024 + 16
        if name == V and os.environ.get("FORCE_SMEM"): L["smem"] = int(os.environ["FORCE_SMEM"])
    out = torch.full((n, m), 7.0, dtype=torch.bfloat16, device="cuda")
    work = torch.empty(L.get("slots") or L["splits"], n, m, dtype=torch.float32, device="cuda") if (L["splits"] > 1 or L.get("even")) else None
    xx = pad8(x)
    rn = RN4 if "even" in L else RN
    return (lambda: run(mods[name], kn, rn, bw, xx, out, work, L, act, bias, smax)), out, L
gen = torch.Generator(device="cuda"); gen.manual_seed(0)
fails = cases = 0
evens = 0
for (m, k) in [] if os.environ.get("NOCHECK") else [(16, 64), (40, 200), (256, 512), (1000, 640), (333, 4104), (4096, 4096), (16, 4096), (500, 4104), (5000, 2048), (3000, 4096), (30000, 256)]:
    for sp in ((0.5, 0.7, 0.8, 0.9, 0.99, 1.0, 0.0) if m * k < 4e6 else (0.5, 0.7)):
        for per_row in (True, False):
            w = weight(m, k, sp, per_row, gen) if sp < 1 else torch.zeros(m, k, dtype=torch.bfloat16, device="cuda")
            bw = st.BitmapWeight.from_dense(w)
            for n in (1, 9, 16):
                x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
                bias = torch.randn(m, generator=gen, device="cuda").to(torch.bfloat16)
                ref = F.silu(x.double() @ w.double().t() + bias.double())
                for smax in (256, -1):
                    f, out, L = make(V, bw, x, bias, 5, smax); f(); torch.cuda.synchronize(); cases += 1; evens += bool(L.get("even"))
                    err = ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                    if not err < 1e-2:
                        fails += 1
                        if fails < 10: print("FAIL", m, k, sp, per_row, n, smax, err, L, flush=True)
print(f"{V}: {cases} cases ({evens} with the even split), {fails} fails", flush=True)
import triton.testing as tt
bench = lambda f: tt.do_bench(f, warmup=10, rep=40, return_mode="median") * 1e3
res = []
src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
print(f"copy {2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-6) / 1e9:.0f} GB/s", flush=True); del src, dst
SHAPES = [tuple(int(v) for v in t.split(",")) for t in os.environ["SHAPES"].split(";")] if os.environ.get("SHAPES") else [(14336, 4096), (4096, 14336), (11008, 4096)]
CASES = [(float(v), True) for v in os.environ["SPS"].split(",")] if os.environ.get("SPS") else [(0.5, True), (0.7, True), (0.8, True), (0.9, True), (0.5, False), (0.7, False)]
for (m, k) in SHAPES:
    for sp, per_row in CASES:
        w = weight(m, k, sp, per_row, gen); bw = st.BitmapWeight.from_dense(w)
        for n in [int(v) for v in os.environ.get("NS", "1,16").split(",")]:
            x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
            td = bench(lambda: F.linear(x, w)); row = dict(m=m, k=k, sp=sp, per_row=per_row, n=n, dense=td)
            for name in (B, V):
                f, out, L = make(name, bw, x); row[name] = bench(f); row[name + "_L"] = L
            res.append(row)
            print(f"{m}x{k} {int(sp*100)}{'r' if per_row else 'g'} N={n}: dense {td:.1f} {B} {row[B]:.1f} ({td/row[B]:.2f}x) {V} {row[V]:.1f} ({td/row[V]:.2f}x) grid {row[V+'_L']['rb']}x{row[V+'_L']['splits']} b{row[V+'_L']['batch']} even {row[V+'_L'].get('even')}", flush=True)
json.dump(res, open(os.path.join(os.environ.get("OUT", "."), f"cmp_{V}.json"), "w"), indent=1)
