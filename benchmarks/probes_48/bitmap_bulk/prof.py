import os, torch
import sparsetorch as st
from run import weight, pad8
from drv import Module, choose, run
HERE = os.path.dirname(os.path.abspath(__file__))
KN = "_ZN11sparsetorch4cuda6bitmap20bitmap_linear_kernelI13__nv_bfloat16Li{}EEEvNS1_6ParamsE"
mod = Module(os.path.join(HERE, os.environ.get("CUBIN", "new") + ".cubin")); mod.name = "new"
gen = torch.Generator(device="cuda"); gen.manual_seed(0)
for sp in (0.5, 0.9):
    w = weight(14336, 4096, sp, True, gen); bw = st.BitmapWeight.from_dense(w)
    n = int(os.environ.get("N", "1"))
    x = torch.randn(n, 4096, generator=gen, device="cuda").to(torch.bfloat16)
    L = choose(14336, n, 4096, bw.values.numel(), 132)
    out = torch.empty(n, 14336, dtype=torch.bfloat16, device="cuda")
    run(mod, KN.format(L["nt"]), "", bw, x, out, None, L)
    torch.cuda.synchronize()
