"""One launch per case of the final kernel (choose_final), for ncu."""
import os, torch
import sparsetorch as st
from run import weight, pad8
from drv import Module, choose_final, choose_v2, run
HERE = os.path.dirname(os.path.abspath(__file__))
KN = "_ZN11sparsetorch4cuda6bitmap20bitmap_linear_kernelI13__nv_bfloat16Li{}ELb{}EEEvNS1_6ParamsE"
RN = "_ZN11sparsetorch4cuda6bitmap27bitmap_splitk_reduce_kernelI13__nv_bfloat16EEvPKfillPKtNS_10ActivationEfPt"
mod = Module(os.path.join(HERE, os.environ.get("CUBIN", "v2") + ".cubin"))
gen = torch.Generator(device="cuda"); gen.manual_seed(0)
for (sp, n) in [(0.5, 1), (0.5, 16)]:
    w = weight(14336, 4096, sp, True, gen); bw = st.BitmapWeight.from_dense(w)
    x = torch.randn(n, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    L = choose_v2(14336, n, 4096, bw.values.numel(), 132)
    print(sp, n, L, flush=True)
    out = torch.empty(n, 14336, dtype=torch.bfloat16, device="cuda")
    work = torch.empty(L["splits"], n, 14336, dtype=torch.float32, device="cuda") if L["splits"] > 1 else None
    run(mod, KN.format(L["nt"], int(L["dense"])), RN, bw, pad8(x), out, work, L)
    torch.cuda.synchronize()
