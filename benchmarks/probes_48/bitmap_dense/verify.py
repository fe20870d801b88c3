"""The final kernel (final.cubin, launch choice mirrored in drv.choose_final) against float64."""
import os, sys, torch, torch.nn.functional as F
import sparsetorch as st
from drv import Module, choose_final, run
from run import weight, pad8
HERE = os.path.dirname(os.path.abspath(__file__))
KN = "_ZN11sparsetorch4cuda6bitmap20bitmap_linear_kernelI13__nv_bfloat16Li{}ELi{}EEEvNS1_6ParamsE"
RN = "_ZN11sparsetorch4cuda6bitmap27bitmap_splitk_reduce_kernelI13__nv_bfloat16EEvPKfillPKtNS_10ActivationEfPt"
mod = Module(os.path.join(HERE, os.environ.get("CUBIN", "final") + ".cubin"))
gen = torch.Generator(device="cuda"); gen.manual_seed(0)
shapes = [(40, 200), (333, 4104), (16, 64)] if os.environ.get("SMALL") else [(16, 64), (40, 200), (256, 512), (1000, 640), (4096, 4096), (333, 4104), (11008, 256)]
fails = cases = 0
for (m, k) in shapes:
    for sp in (0.5, 0.7, 0.9, 0.99, 1.0, 0.0):
        for per_row in (True, False):
            w = weight(m, k, sp, per_row, gen) if sp < 1 else torch.zeros(m, k, dtype=torch.bfloat16, device="cuda")
            bw = st.BitmapWeight.from_dense(w)
            for n in (1, 9, 16):
                x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
                bias = torch.randn(m, generator=gen, device="cuda").to(torch.bfloat16)
                ref = F.silu(x.double() @ w.double().t() + bias.double())
                for smax in (256, -1, 1024):
                    L = choose_final(m, n, k, bw.values.numel(), torch.cuda.get_device_properties(0).multi_processor_count)
                    out = torch.full((n, m), 7.0, dtype=torch.bfloat16, device="cuda")
                    work = torch.empty(L["splits"], n, m, dtype=torch.float32, device="cuda") if L["splits"] > 1 else None
                    run(mod, KN.format(L["nt"], L["blocks"]), RN, bw, pad8(x), out, work, L, 5, bias, smax)
                    torch.cuda.synchronize(); cases += 1
                    err = ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                    if not err < 1e-2:
                        fails += 1
                        if fails < 10: print("FAIL", m, k, sp, per_row, n, smax, err, L, flush=True)
print(f"final kernel: {cases} cases, {fails} fails", flush=True)
