"""Where the time of the 2:4 + residual form goes (issue 19): a layer forced to format="2:4" on a weight pruned
to 2:4 (no residual) and on unstructured 90% / 95% weights (a CSR residual of the entries beyond two per
group of four), 11008 x 4096 bf16, N = 1, 16, 128, 2048. Per case: the layer's do_bench median (no grad) and
the GPU time of each kernel of one call from torch.profiler (mean over 20 calls), so the residual kernel and
the cuSPARSELt GEMM are seen apart. Dense F.linear in the same run for the ratio.

    python benchmarks/sparse24_residual_cuda.py [--out DIR] [--shape 11008x4096]
"""
import argparse
import collections

import torch
import torch.nn.functional as F
import triton.testing

import sparsetorch as st
from _results import run_meta, write_results


def bench(fn):
    return triton.testing.do_bench(fn, warmup=25, rep=200, return_mode="median")


def kernel_times(fn, calls=20):
    """Mean GPU microseconds per call of each kernel fn launches."""
    fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    totals = collections.defaultdict(float)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            totals[e.name[:70]] += e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
    return {name: t / calls for name, t in sorted(totals.items(), key=lambda kv: -kv[1])}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", default=None)
    p.add_argument("--shape", default="11008x4096")
    p.add_argument("--tokens", default="1,16,128,2048")
    args = p.parse_args()
    m, k = (int(v) for v in args.shape.split("x"))
    tokens = [int(v) for v in args.tokens.split(",")]
    g = torch.Generator(device="cuda").manual_seed(0)
    w = (torch.randn(m, k, device="cuda", generator=g) / k ** 0.5).to(torch.bfloat16)
    rows = []
    for label in ("2:4", 0.9, 0.95):
        if label == "2:4":
            auto = st.nn.SparseLinear.from_dense(w, scheme="2:4")
        else:
            auto = st.nn.SparseLinear.from_dense(w, sparsity=label, scheme="global")
        layer = st.nn.SparseLinear(k, m, auto.crow_indices, auto.col_indices, auto.values.detach(), format="2:4").cuda()
        wp = auto.to_dense().detach()
        for n in tokens:
            x = torch.randn(n, k, device="cuda", generator=g).to(torch.bfloat16)
            with torch.no_grad():
                y = layer(x)
                ref = x.double() @ wp.double().t()
                err = ((y.double() - ref).norm() / ref.norm()).item()
                t_layer = bench(lambda: layer(x))
                t_dense = bench(lambda: F.linear(x, wp))
                kernels = kernel_times(lambda: layer(x))
            res = layer._forms.sparse24.residual_nnz if layer._forms.sparse24 is not None else None
            row = {"weight": f"{m}x{k}", "sparsity": label if isinstance(label, str) else f"{label:.0%}", "n": n,
                   "residual_nnz": res, "layer_us": 1e3 * t_layer, "dense_us": 1e3 * t_dense,
                   "vs_dense": t_dense / t_layer, "rel_err": err, "kernels_us": kernels}
            rows.append(row)
            print(f"{row['sparsity']:>4} N={n:5d} residual {res}: layer {row['layer_us']:8.1f} us, dense "
                  f"{row['dense_us']:8.1f} us ({row['vs_dense']:.2f}x), err {err:.1e}")
            for name, us in list(kernels.items())[:6]:
                print(f"      {us:8.1f} us  {name}")
    if args.out:
        write_results(args.out, "sparse24_residual.json", run_meta(), rows)


if __name__ == "__main__":
    main()
