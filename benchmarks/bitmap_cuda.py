"""bitmap_linear (BitmapWeight: bitmap tiles on tensor cores) against dense F.linear, bf16, y = x @ W.T,
for the pruned-weight shapes of issue 19 (11008 x 4096 and 4096 x 11008, unstructured magnitude
pruning) and N = 1 .. 2048 tokens, in one run; every output checked against float64 first.

Two timings of each call, both the median of many with L2 flushed before each:
  dirty = triton's do_bench (it flushes L2 by writing 256 MB: the timed call also pays for writing
          those dirty lines back; what issue 19's table used);
  clean = L2 flushed by reading 256 MB (no write-back during the call).
Floor next to every time: max(bytes / copy bandwidth, 2 M K N / bf16 GEMM rate), both measured here;
bytes = the weight as stored (bitmap: values + bitmaps + offsets) + x + y.
For N <= 16 the CUDA kernel's two decode paths are also timed alone (SPARSETORCH_BITMAP_SCATTER).

    python benchmarks/bitmap_cuda.py --out benchmarks/results/nvidia-h100-80gb-hbm3
"""
import argparse
import os
import statistics

import torch
import torch.nn.functional as F
import triton.testing

import sparsetorch as st
from sparsetorch.bench.timing import call_seconds
from _results import ceiling_meta, measure_ceilings, write_results, write_table


def bench_dirty(fn):
    return triton.testing.do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e-3


_flush = None


def bench_clean(fn, reps=40):
    global _flush
    if _flush is None:
        _flush = torch.ones(64 * 2**20, device="cuda")  # 256 MB
    for _ in range(5):
        fn()
    times = []
    for _ in range(reps):
        _flush.sum()
        times.append(call_seconds(fn, torch.device("cuda")))
    return statistics.median(times)


def pruned(m, k, sparsity, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(m, k, device="cuda", generator=g)
    if sparsity > 0:
        threshold = w.abs().flatten().kthvalue(int(sparsity * w.numel())).values
        w[w.abs() <= threshold] = 0.0
    return w.to(torch.bfloat16)


def scatter_env(value):
    if value is None:
        os.environ.pop("SPARSETORCH_BITMAP_SCATTER", None)
    else:
        os.environ["SPARSETORCH_BITMAP_SCATTER"] = str(value)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--quick", action="store_true", help="N = 1, 16, 2048 and 50 / 90% only")
    args = ap.parse_args()
    copy_bw, rates = measure_ceilings(bench_dirty, (torch.bfloat16,))
    rate = rates[torch.bfloat16]
    shapes = [(11008, 4096), (4096, 11008)]
    sparsities = (0.5, 0.9) if args.quick else (0.5, 0.7, 0.9, 0.95)
    tokens = (1, 16, 2048) if args.quick else (1, 8, 16, 64, 128, 512, 2048)
    results, dense_cache = [], {}
    for m, k in shapes:
        for sp in sparsities:
            w = pruned(m, k, sp, seed=m + int(sp * 100))
            W = st.BitmapWeight.from_dense(w)
            w64 = w.double()
            for n in tokens:
                x = torch.randn(n, k, device="cuda").to(torch.bfloat16)
                ref = x.double() @ w64.t()
                y = st.bitmap_linear(x, W)
                err = ((y.double() - ref).norm() / ref.norm()).item()
                assert err <= 1e-2, (m, k, sp, n, err)
                assert torch.equal(y, st.bitmap_linear(x, W)), "not repeatable"
                if (m, k, n) not in dense_cache:
                    dense_err = ((F.linear(x, w).double() - ref).norm() / ref.norm()).item()
                    dense_cache[(m, k, n)] = (bench_dirty(lambda: F.linear(x, w)), bench_clean(lambda: F.linear(x, w)),
                                              dense_err)
                dense_dirty, dense_clean, dense_err = dense_cache[(m, k, n)]
                t_dirty = bench_dirty(lambda: st.bitmap_linear(x, W))
                t_clean = bench_clean(lambda: st.bitmap_linear(x, W))
                io = 2 * n * (k + m)
                floor = max((W.nbytes + io) / copy_bw, 2.0 * m * k * n / rate)
                dense_floor = max((2 * m * k + io) / copy_bw, 2.0 * m * k * n / rate)
                row = dict(shape=f"{m}x{k}", sparsity=sp, n=n, weight_MB=W.nbytes / 1e6, dense_MB=2 * m * k / 1e6,
                           bitmap_us=t_dirty * 1e6, dense_us=dense_dirty * 1e6, speedup=dense_dirty / t_dirty,
                           bitmap_clean_us=t_clean * 1e6, dense_clean_us=dense_clean * 1e6,
                           speedup_clean=dense_clean / t_clean, floor_us=floor * 1e6, dense_floor_us=dense_floor * 1e6,
                           floor_fraction=floor / t_clean, rel_err=err, dense_rel_err=dense_err)
                if n <= 16:
                    for name, value in (("gather_clean_us", -1), ("scatter_clean_us", 1024)):
                        scatter_env(value)
                        row[name] = bench_clean(lambda: st.bitmap_linear(x, W)) * 1e6
                    scatter_env(None)
                results.append(row)
                print(f"{m:5d}x{k:<5d} {sp:4.2f} N={n:4d}  bitmap {t_dirty * 1e6:8.1f} us  dense {dense_dirty * 1e6:8.1f} us"
                      f"  {dense_dirty / t_dirty:5.2f}x | clean {t_clean * 1e6:8.1f} vs {dense_clean * 1e6:8.1f} us "
                      f"{dense_clean / t_clean:5.2f}x | floor {floor * 1e6:7.1f} us ({floor / t_clean:4.0%})"
                      + (f" | gather {row['gather_clean_us']:.1f} scatter {row['scatter_clean_us']:.1f}" if n <= 16 else "")
                      + f" | err {err:.2e}", flush=True)
    meta = ceiling_meta(copy_bw, rates, "bitmap_linear vs F.linear, bf16, y = x @ W.T; times in us; "
                        "dirty: do_bench (memset L2 flush), clean: read L2 flush")
    write_results(args.out, "bitmap_cuda.json", meta, results)
    lines = [f"# bitmap_linear vs dense F.linear ({meta['device']}, torch {meta['torch']}, {meta['date']})", "",
             f"Copy {copy_bw / 1e9:.0f} GB/s, bf16 GEMM {rate / 1e12:.0f} TFLOP/s (measured in this run). "
             "Times in us, median; speedup = dense / bitmap in the same run; floor = max(bytes / copy bandwidth, "
             "flops / GEMM rate); fraction = floor / clean time.", "",
             "| shape | sparsity | N | weight MB | bitmap (dirty) | dense (dirty) | speedup | bitmap (clean) | "
             "dense (clean) | speedup (clean) | floor | fraction | gather / scatter only (clean) | rel. err |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        paths = f"{r['gather_clean_us']:.1f} / {r['scatter_clean_us']:.1f}" if "gather_clean_us" in r else ""
        lines.append(f"| {r['shape']} | {r['sparsity']:.0%} | {r['n']} | {r['weight_MB']:.1f} | {r['bitmap_us']:.1f} | "
                     f"{r['dense_us']:.1f} | {r['speedup']:.2f}x | {r['bitmap_clean_us']:.1f} | {r['dense_clean_us']:.1f} | "
                     f"{r['speedup_clean']:.2f}x | {r['floor_us']:.1f} | {r['floor_fraction']:.0%} | {paths} | "
                     f"{r['rel_err']:.1e} |")
    write_table(args.out, "bitmap_cuda.md", lines)


if __name__ == "__main__":
    main()
