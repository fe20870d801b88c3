"""slot_linear (SlotWeight: each value with its slot in the tensor-core fragment) against the other pruned
forms -- bitmap_linear (bitmap tiles, tensor cores), csr16_linear (CUDA cores, N <= 64) -- and dense
F.linear, bf16, y = x @ W.T, Llama-7B's shapes (11008 x 4096, 4096 x 11008, 4096 x 4096; magnitude pruning
at 50 / 70 / 90 / 95%) and N = 1 .. 2048 tokens, in one run; every output checked against float64 first.

Times: the median of device events with the L2 read (clean) before each call, in us (the pruned suite's
timer, harness.make_clean_l2_timer: zeroing the L2 instead, as do_bench does, leaves dirty lines that slow
the memory-bound forms more; sparsetorch.timing says by how much). Floor next to each: max(bytes / copy
bandwidth, 2 M K N / bf16 GEMM rate), both measured in this run; bytes = the form's weight as stored + x + y.

    python -m benchmarks.slots_cuda [--quick] [--out DIR]
"""
import argparse

import torch
import torch.nn.functional as F

import sparsetorch as st
from benchmarks._results import ceiling_meta, measure_ceilings, write_results, write_table
from benchmarks.harness import make_clean_l2_timer

bench = make_clean_l2_timer(torch.device("cuda"), quick=False)  # median seconds of fn(), a clean L2 before each call


def pruned(m, k, sparsity, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(m, k, device="cuda", generator=g)
    threshold = w.abs().flatten().kthvalue(int(sparsity * w.numel())).values
    w[w.abs() <= threshold] = 0.0
    return w.to(torch.bfloat16)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="11008 x 4096 and 4096 x 11008, N = 1, 16, 32, 64")
    args = ap.parse_args()
    copy_bw, rates = measure_ceilings(bench, (torch.bfloat16,))
    rate = rates[torch.bfloat16]
    shapes = [(11008, 4096), (4096, 11008)] + ([] if args.quick else [(4096, 4096)])
    tokens = (1, 16, 32, 64) if args.quick else (1, 4, 16, 32, 64, 128, 256, 2048)
    results = []
    for m, k in shapes:
        for sp in (0.5, 0.7, 0.9, 0.95):
            w = pruned(m, k, sp, seed=m + int(sp * 100))
            csr = w.to_sparse_csr()
            forms = {"slots": st.SlotWeight.from_csr(csr), "bitmap": st.BitmapWeight.from_dense(w),
                     "csr16": st.Csr16Weight.from_csr(csr)}
            calls = {"slots": lambda x: st.slot_linear(x, forms["slots"]),
                     "bitmap": lambda x: st.bitmap_linear(x, forms["bitmap"]),
                     "csr16": lambda x: st.csr16_linear(x, forms["csr16"]),
                     "dense": lambda x: F.linear(x, w)}
            nbytes = {name: f.nbytes for name, f in forms.items()}
            nbytes["slots"] = forms["slots"].offsets.numel() * 4 + forms["slots"].entries.numel() * 4  # what it reads
            nbytes["dense"] = 2 * m * k
            w64 = w.double()
            for n in tokens:
                x = torch.randn(n, k, device="cuda").to(torch.bfloat16)
                ref = x.double() @ w64.t()
                row = dict(shape=f"{m}x{k}", sparsity=sp, n=n)
                for name, call in calls.items():
                    if name == "csr16" and n > 64:
                        continue
                    y = call(x)
                    err = ((y.double() - ref).norm() / ref.norm()).item()
                    assert err <= 1e-2, (name, m, k, sp, n, err)
                    assert torch.equal(y, call(x)), f"{name}: not repeatable"
                    t = bench(lambda: call(x))
                    floor = max((nbytes[name] + 2 * n * (k + m)) / copy_bw, 2.0 * m * k * n / rate)
                    row[f"{name}_us"], row[f"{name}_floor_us"], row[f"{name}_err"] = t * 1e6, floor * 1e6, err
                results.append(row)
                d = row["dense_us"]
                print(f"{m:5d}x{k:<5d} {sp:4.2f} N={n:4d} dense {d:7.1f} us | " + " | ".join(
                    f"{name} {row[f'{name}_us']:7.1f} us {d / row[f'{name}_us']:5.2f}x (floor {row[f'{name}_floor_us']:5.1f})"
                    for name in ("slots", "bitmap", "csr16") if f"{name}_us" in row), flush=True)
    meta = ceiling_meta(copy_bw, rates, "slot_linear, bitmap_linear, csr16_linear vs F.linear, bf16, y = x @ W.T; "
                        "times in us (median, clean L2 before each call)")
    write_results(args.out, "slots_cuda.json", meta, results)
    lines = [f"# Pruned forms vs dense F.linear ({meta['device']}, torch {meta['torch']}, {meta['date']})", "",
             f"Copy {copy_bw / 1e9:.0f} GB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s (measured in this run). Median us "
             "(clean L2 before each call); ratio = dense / form, same run; floor = max(form bytes / copy bandwidth, "
             "flops / GEMM rate).", "",
             "| shape | sparsity | N | dense | slots | ratio | floor | bitmap | ratio | csr16 | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        d = r["dense_us"]
        c16 = f"{r['csr16_us']:.1f} | {d / r['csr16_us']:.2f}x" if "csr16_us" in r else " | "
        lines.append(f"| {r['shape']} | {r['sparsity']:.0%} | {r['n']} | {d:.1f} | {r['slots_us']:.1f} | "
                     f"**{d / r['slots_us']:.2f}x** | {r['slots_floor_us']:.1f} | {r['bitmap_us']:.1f} | "
                     f"{d / r['bitmap_us']:.2f}x | {c16} |")
    write_table(args.out, "slots_cuda.md", lines)


if __name__ == "__main__":
    main()
