"""The slot layout's two variants, plain and banded (csrc/common/slot_layout.h), on the same pruned bf16
weights, against dense F.linear: the measurement behind sparsetorch._slots.BANDED_MIN_STRIPS_PER_SM (which
weights SlotWeight builds banded). Tall and wide LLM shapes, 90% (and 70 / 95% on the two issue-19
shapes), N = 1 .. 64; every output checked against float64 first.

Times: the median of triton's do_bench (L2 flushed before each call by a 256 MB memset), us, the two
layouts interleaved per case. Floor: max(bytes / copy bandwidth, 2 M K N / bf16 GEMM rate), both measured
in this run; bytes = offsets + entries + x + y.

    python benchmarks/slots_layouts_cuda.py --out benchmarks/results/nvidia-h100-80gb-hbm3/slots_banded
"""
import argparse

import torch
import torch.nn.functional as F

import sparsetorch as st
from _results import ceiling_meta, measure_ceilings, write_results, write_table
from slots_cuda import bench, pruned

SHAPES = [(14336, 4096), (11008, 4096), (8192, 4096), (6144, 4096), (4096, 4096), (4096, 11008), (4096, 14336)]
TOKENS = (1, 8, 16, 32, 64)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    copy_bw, rates = measure_ceilings(bench, (torch.bfloat16,))
    rate = rates[torch.bfloat16]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    results = []
    for m, k in SHAPES:
        for sp in (0.7, 0.9, 0.95) if (m, k) in ((11008, 4096), (4096, 11008)) else (0.9,):
            w = pruned(m, k, sp, seed=m + k + int(sp * 100))
            csr = w.to_sparse_csr()
            forms = {"plain": st.SlotWeight.from_csr(csr, banded=False),
                     "banded": st.SlotWeight.from_csr(csr, banded=True)}
            default = "banded" if st.SlotWeight.from_csr(csr).banded else "plain"
            w64 = w.double()
            for n in TOKENS:
                x = torch.randn(n, k, device="cuda").to(torch.bfloat16)
                ref = x.double() @ w64.t()
                row = dict(shape=f"{m}x{k}", strips_per_sm=-(-m // 16) / sms, sparsity=sp, n=n, default=default)
                row["dense_us"] = bench(lambda: F.linear(x, w)) * 1e6
                for name, f in forms.items():
                    y = st.slot_linear(x, f)
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    assert err <= 1e-2, (name, m, k, sp, n, err)
                    nbytes = (f.offsets.numel() + f.entries.numel()) * 4 + 2 * n * (k + m)
                    row[f"{name}_err"] = err
                    row[f"{name}_floor_us"] = max(nbytes / copy_bw, 2.0 * m * k * n / rate) * 1e6
                for rnd in range(2):  # interleaved, the smaller of two
                    for name in (forms if rnd == 0 else reversed(list(forms))):
                        t = bench(lambda: st.slot_linear(x, forms[name])) * 1e6
                        row[f"{name}_us"] = min(t, row.get(f"{name}_us", t))
                results.append(row)
                d = row["dense_us"]
                print(f"{m:5d}x{k:<5d} {row['strips_per_sm']:4.1f} strips/SM {sp:4.2f} N={n:3d} dense {d:6.1f} | plain "
                      f"{row['plain_us']:6.1f} ({d / row['plain_us']:4.2f}x) | banded {row['banded_us']:6.1f} "
                      f"({d / row['banded_us']:4.2f}x, floor {row['banded_floor_us']:4.1f}) | "
                      f"banded/plain {row['banded_us'] / row['plain_us']:5.3f} | default {default}", flush=True)
    meta = ceiling_meta(copy_bw, rates, "slot_linear plain vs banded layout vs F.linear, bf16, y = x @ W.T; "
                        "times in us (do_bench median, L2 flushed; layouts: the smaller of two interleaved)")
    write_results(args.out, "slots_layouts_cuda.json", meta, results)
    lines = [f"# Slot layouts: plain vs banded ({meta['device']}, torch {meta['torch']}, {meta['date']})", "",
             f"Copy {copy_bw / 1e9:.0f} GB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s (measured in this run), {sms} SMs. "
             "Median us (do_bench, L2 flushed); x = dense / layout, same run; floor = max(layout bytes / copy "
             "bandwidth, flops / GEMM rate); default = the layout SlotWeight picks for the shape.", "",
             "| shape | strips / SM | sparsity | N | dense | plain | x | banded | x | floor | banded / plain | default |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        d = r["dense_us"]
        lines.append(f"| {r['shape']} | {r['strips_per_sm']:.1f} | {r['sparsity']:.0%} | {r['n']} | {d:.1f} | "
                     f"{r['plain_us']:.1f} | {d / r['plain_us']:.2f}x | {r['banded_us']:.1f} | "
                     f"{d / r['banded_us']:.2f}x | {r['banded_floor_us']:.1f} | {r['banded_us'] / r['plain_us']:.3f} | "
                     f"{r['default']} |")
    write_table(args.out, "slots_layouts_cuda.md", lines)


if __name__ == "__main__":
    main()
