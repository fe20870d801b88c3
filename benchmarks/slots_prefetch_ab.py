"""A/B of slot_linear's prefetch hints (SPARSETORCH_SLOT_PREFETCH: 0 none, 1 entries into L2, 2 x into L1,
3 both) on issue 19's shapes, against dense F.linear and csr16_linear in the same run; every variant's
output must equal the others bit for bit (hints only) and match float64.

    python benchmarks/slots_prefetch_ab.py > results/.../slots_prefetch_ab.txt
"""
import os

import torch
import torch.nn.functional as F
import triton.testing

import sparsetorch as st
from slots_cuda import pruned


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def main():
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median us (do_bench, L2 flushed)")
    print("| shape | sparsity | N | dense | csr16 | slots p=0 | p=1 | p=2 | p=3 | best ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for m, k in ((11008, 4096), (4096, 11008)):
        for sp in (0.7, 0.9, 0.95):
            w = pruned(m, k, sp, seed=m + int(sp * 100))
            csr = w.to_sparse_csr()
            sw, cw = st.SlotWeight.from_csr(csr), st.Csr16Weight.from_csr(csr)
            for n in (1, 8, 16, 32, 64):
                x = torch.randn(n, k, device="cuda").to(torch.bfloat16)
                ref = x.double() @ w.double().T
                outs, times = [], []
                for pf in range(4):
                    os.environ["SPARSETORCH_SLOT_PREFETCH"] = str(pf)
                    outs.append(st.slot_linear(x, sw))
                    times.append(bench(lambda: st.slot_linear(x, sw)))
                os.environ.pop("SPARSETORCH_SLOT_PREFETCH")
                err = ((outs[0].double() - ref).norm() / ref.norm()).item()
                assert err < 1e-2, err
                assert all(torch.equal(o, outs[0]) for o in outs), "prefetch hints changed the result"
                dense = bench(lambda: F.linear(x, w))
                c16 = bench(lambda: st.csr16_linear(x, cw)) if n <= 64 else float("nan")
                print(f"| {m}x{k} | {int(sp * 100)}% | {n} | {dense:.1f} | {c16:.1f} | "
                      + " | ".join(f"{t:.1f}" for t in times) + f" | {dense / min(times):.2f}x |", flush=True)


if __name__ == "__main__":
    main()
