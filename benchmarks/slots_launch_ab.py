"""slot_linear with the blocks per SM its work split assumes: the occupancy the runtime reports for the
compiled kernel (the default) against a forced count (SPARSETORCH_SLOT_BLOCKS_PER_SM, e.g. 3, the old fixed
assumption), on issue 19's shapes, dense F.linear in the same run; outputs must agree with float64 (the
split changes the order of the fp32 partial sums, so not bit for bit).

    python benchmarks/slots_launch_ab.py 3 > results/.../slots_launch_ab.txt
"""
import os
import sys

import torch
import torch.nn.functional as F
import triton.testing

import sparsetorch as st
from slots_cuda import pruned


def bench(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3


def main():
    forced = sys.argv[1:] or ["3"]
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; median us (do_bench, L2 flushed)")
    print("| shape | sparsity | N | dense | slots (occupancy) | " + " | ".join(f"forced {f}/SM" for f in forced) + " |")
    print("|---|---|---|---|---|" + "---|" * len(forced))
    for m, k in ((11008, 4096), (4096, 11008)):
        for sp in (0.7, 0.9, 0.95):
            w = pruned(m, k, sp, seed=m + int(sp * 100))
            sw = st.SlotWeight.from_csr(w.to_sparse_csr())
            for n in (1, 4, 8, 16):
                x = torch.randn(n, k, device="cuda").to(torch.bfloat16)
                ref = x.double() @ w.double().T
                times = []
                for f in [None] + forced:
                    if f is None:
                        os.environ.pop("SPARSETORCH_SLOT_BLOCKS_PER_SM", None)
                    else:
                        os.environ["SPARSETORCH_SLOT_BLOCKS_PER_SM"] = f
                    out = st.slot_linear(x, sw)
                    err = ((out.double() - ref).norm() / ref.norm()).item()
                    assert err < 1e-2, (f, err)
                    times.append(bench(lambda: st.slot_linear(x, sw)))
                os.environ.pop("SPARSETORCH_SLOT_BLOCKS_PER_SM", None)
                dense = bench(lambda: F.linear(x, w))
                print(f"| {m}x{k} | {int(sp * 100)}% | {n} | {dense:.1f} | "
                      + " | ".join(f"{t:.1f} ({dense / t:.2f}x)" for t in times) + " |", flush=True)


if __name__ == "__main__":
    main()
