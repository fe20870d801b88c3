"""Bitmap kernel variants (cubins) against F.linear: correctness vs float64, then timings. OUT gets json."""
import json, os, sys, time
import torch, torch.nn.functional as F
import sparsetorch as st
from drv import Module, choose, run
HERE = os.path.dirname(os.path.abspath(__file__))
log = lambda *a: print(*a, flush=True)
KN = "_ZN11sparsetorch4cuda6bitmap20bitmap_linear_kernelI13__nv_bfloat16Li{}EEEvNS1_6ParamsE"
RN = "_ZN11sparsetorch4cuda6bitmap27bitmap_splitk_reduce_kernelI13__nv_bfloat16EEvPKfillPKtNS_10ActivationEfPt"

def weight(m, k, sparsity, per_row, gen):
    w = torch.randn(m, k, generator=gen, device="cuda")
    w = w * torch.exp(torch.randn(m, 1, generator=gen, device="cuda")) * torch.exp(0.5 * torch.randn(1, k, generator=gen, device="cuda"))
    a = w.abs()
    if per_row:
        kk = int(round(k * (1 - sparsity)))
        mask = a >= a.topk(max(kk, 1), dim=1).values[:, -1:]
        if kk == 0: mask[:] = False
    else:
        kk = int(round(a.numel() * (1 - sparsity)))
        mask = a >= a.flatten().topk(max(kk, 1)).values[-1]
    return (w * mask).to(torch.bfloat16)

def pad8(x):
    k = x.shape[1]; k8 = (k + 7) // 8 * 8
    if k8 == k: return x.contiguous()
    y = torch.zeros(x.shape[0], k8, dtype=x.dtype, device=x.device); y[:, :k] = x; return y

def main():
    names = sys.argv[1:] or ["new"]
    mods = {nm: Module(os.path.join(HERE, nm + ".cubin")) for nm in names}
    for nm, md in mods.items(): md.name = nm
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    log(torch.cuda.get_device_name(), sms)
    gen = torch.Generator(device="cuda"); gen.manual_seed(0)
    def call(mod, bw, x, bias=None, act=0, scatter_max=256, **over):
        m, k = bw.shape; n = x.shape[0]
        import drv
        drv.K_STAGES = 6 if "s6" in mod.name else 4
        L = choose(m, n, k, bw.values.numel(), sms, bar=0 if mod.name.startswith("old") else (48 if "s6" in mod.name else 32), per_sm_regs=2 if ("b2" in mod.name or mod.name.startswith("new")) else None, full_single=mod.name.startswith("new")); L.update(over)
        out = torch.empty(n, m, dtype=torch.bfloat16, device="cuda")
        work = torch.empty(L["splits"], n, m, dtype=torch.float32, device="cuda") if L["splits"] > 1 else None
        xx = pad8(x)
        f = lambda: run(mod, KN.format(L["nt"]), RN, bw, xx, out, work, L, act, bias, scatter_max)
        return f, out, L
    fails = 0
    for (m, k) in ([] if os.environ.get("NOCHECK") else [(16, 64), (40, 200), (256, 512), (1000, 640), (4096, 4096), (333, 4104)]):
        for sp in (0.5, 0.7, 0.9, 0.99, 1.0, 0.0):
            for per_row in (True, False):
                w = weight(m, k, sp, per_row, gen) if sp < 1 else torch.zeros(m, k, dtype=torch.bfloat16, device="cuda")
                bw = st.BitmapWeight.from_dense(w)
                for n in (1, 5, 9, 16):
                    x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
                    bias = torch.randn(m, generator=gen, device="cuda").to(torch.bfloat16)
                    ref = F.silu(x.double() @ w.double().t() + bias.double())
                    for nm, mod in mods.items():
                        for smax in (256, -1, 1024):
                            f, out, L = call(mod, bw, x, bias, 5, smax)
                            f(); torch.cuda.synchronize()
                            err = ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                            if not err < 1e-2:
                                fails += 1
                                if fails < 20: log("FAIL", nm, m, k, sp, per_row, n, smax, err, L)
    log("correctness fails:", fails)
    import triton.testing as tt
    bench = lambda f: tt.do_bench(f, warmup=10, rep=40, return_mode="median") * 1e3
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    copy = 2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-6) / 1e9; del src, dst
    log(f"copy {copy:.0f} GB/s")
    res = []
    shapes = [(14336, 4096), (4096, 14336)] + ([(11008, 4096), (4096, 11008), (4096, 4096), (1024, 4096)] if os.environ.get("MORE") else [])
    for (m, k) in shapes:
        for sp, per_row in [(0.5, True), (0.7, True), (0.9, True), (0.5, False)][:int(os.environ.get("NSP", "4"))]:
            w = weight(m, k, sp, per_row, gen)
            bw = st.BitmapWeight.from_dense(w)
            nbytes = bw.values.numel() * 2 + bw.bitmaps.numel() * 8
            for n in [int(v) for v in os.environ.get("NS", "1,16").split(",")]:
                x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
                td = bench(lambda: F.linear(x, w))
                line = []
                if os.environ.get("SWEEP"):
                    mods_sweep = {nm: md for nm, md in mods.items() if nm == os.environ["SWEEP"]}
                    strips, chunks = (m + 15) // 16, (k + 63) // 64
                    for nm, mod in mods_sweep.items():
                        for ws, wk in ((8, 1), (4, 2), (2, 4), (1, 8)):
                            for sp_ in (1, 2, 3, 4, 6, 8):
                                cps = -(-chunks // sp_); splits = -(-chunks // cps)
                                if cps < wk * 2: continue
                                rb = -(-strips // ws)
                                if rb * splits > 2000 or rb * splits < 100: continue
                                f, out, L = call(mod, bw, x, ws=ws, wk=wk, rb=rb, splits=splits, cps=cps)
                                tn = bench(f)
                                res.append(dict(m=m, k=k, sp=sp, per_row=per_row, n=n, v=nm, us=tn, dense=td, L=L))
                                log(f"   {nm} ws{ws} wk{wk} s{splits} blocks {rb*splits}: {tn:.1f} us {td/tn:.2f}x")
                for nm, mod in mods.items():
                    f, out, L = call(mod, bw, x)
                    tn = bench(f)
                    line.append(f"{nm}:{tn:.1f}us({td/tn:.2f}x,{nbytes/tn/1e3/copy*100:.0f}%cp)")
                    res.append(dict(m=m, k=k, sp=sp, per_row=per_row, n=n, v=nm, us=tn, dense=td, bytes=nbytes, L=L))
                log(f"{m:>5}x{k:<5} {int(sp*100)}%{'r' if per_row else 'g'} N={n:>2} dense {td:.1f}: " + " ".join(line) + f" L={L}")
    if os.environ.get("OUT"):
        json.dump(res, open(os.path.join(os.environ["OUT"], "bm3.json"), "w"), indent=1)

if __name__ == "__main__":
    main()
