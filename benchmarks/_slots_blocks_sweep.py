"""How slot_linear's time depends on its blocks per column tile (SPARSETORCH_SLOT_BLOCKS; 0 = the launch
rule): one block per strip / two strips per block put every block boundary on a strip boundary (no strip
settled between blocks), the default (as many blocks as fit) cuts strips between blocks. H100 diagnostics
for issue 19; medians of do_bench with L2 flushed, dense F.linear in the same run."""
import os

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import sparsetorch as st

g = torch.Generator(device="cuda").manual_seed(0)
for m, k in ((11008, 4096), (4096, 11008)):
    w = torch.randn(m, k, device="cuda", generator=g)
    w[w.abs() <= w.abs().flatten().kthvalue(int(0.9 * w.numel())).values] = 0.0
    w = w.to(torch.bfloat16)
    W = st.SlotWeight.from_csr(w.to_sparse_csr())
    strips = (m + 15) // 16
    for n in (1, 16, 32):
        x = torch.randn(n, k, device="cuda").to(torch.bfloat16)
        dense = do_bench(lambda: F.linear(x, w), return_mode="median") * 1e3
        ref = F.linear(x.float(), w.float())
        row = []
        for blocks in (0, strips, strips // 2, 264, 396, 528):
            os.environ["SPARSETORCH_SLOT_BLOCKS"] = str(blocks)
            out = st.slot_linear(x, W)
            err = ((out.float() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (m, k, n, blocks, err)
            t = do_bench(lambda: st.slot_linear(x, W), return_mode="median") * 1e3
            row.append(f"{blocks or 'rule'}:{t:.1f}")
        os.environ.pop("SPARSETORCH_SLOT_BLOCKS")
        print(f"{m}x{k} 90% N={n:3d} dense {dense:.1f} us | slots by blocks per tile: " + "  ".join(row), flush=True)
