"""How much of the slot kernel's time is fixed cost: `st.slot_linear` on 11008 x 4096 (the issue-19 tall shape,
banded layout) as the weight empties, from 70% sparsity to no entries at all, at N = 1 and 16. The time at zero
entries is the kernel's skeleton (launch, group walk, reduction, output); the rest scales with the entries.

Beside it, do_bench of an empty torch op (a 1-element add): what any launch pays under the same timing. The
streaming floors of these byte counts are in tile_entries_proto/floors.log (a tuned read kernel); torch.sum is
not one (0.4 TB/s on int32 here). Times: the median of triton's do_bench (L2 flushed by a 256 MB memset before each call), us. Outputs checked
against float64.

    python benchmarks/slots_fixed_cost_cuda.py > benchmarks/results/nvidia-h100-80gb-hbm3/tile_entries_proto/library_fixed_cost.log
"""
import torch
import torch.nn.functional as F

import sparsetorch as st
from slots_cuda import bench, pruned

M, K = 11008, 4096


def main():
    print(torch.cuda.get_device_name(), "torch", torch.__version__)
    one = torch.zeros(1, device="cuda")
    print(f"empty op (1-element add): {bench(lambda: one.add_(1)) * 1e6:.1f} us")
    for sp in (0.7, 0.9, 0.95, 0.99, 0.999, 0.9999, 1.0):
        w = torch.zeros(M, K, device="cuda", dtype=torch.bfloat16) if sp == 1.0 else pruned(M, K, sp, seed=7)
        form = st.SlotWeight.from_csr(w.to_sparse_csr(), banded=True)
        nbytes = (form.offsets.numel() + form.entries.numel()) * 4
        for n in (1, 16):
            x = torch.randn(n, K, device="cuda").to(torch.bfloat16)
            y = st.slot_linear(x, form)
            ref = x.double() @ w.double().t()
            err = ((y.double() - ref).norm() / ref.norm().clamp_min(1e-300)).item() if sp < 1.0 else y.abs().max().item()
            assert err <= 1e-2, (sp, n, err)
            t = bench(lambda: st.slot_linear(x, form)) * 1e6
            d = bench(lambda: F.linear(x, w)) * 1e6
            print(f"sparsity {sp:6.4f} N={n:2d}: nnz {int((w != 0).sum()):9d}, layout {nbytes / 1e6:6.2f} MB | slot {t:6.1f} us "
                  f"| dense {d:5.1f} us ({d / t:4.2f}x) | err {err:.1e}")


if __name__ == "__main__":
    main()
