"""CUDA elementwise kernels, the fused bias + activation, the cuBLASLt linear, and the sparse/dense
crossover, in one run. Outputs are checked against float64 references before timing; times are
medians of CUDA-event timings with the L2 zeroed before each call (_results.bench).

Elementwise floor: bytes moved (each input read once, the output written once) over the copy
bandwidth of a tensor of the same size measured in this run. Linear floor: 2*M*N*K over the GEMM
rate of the same dtype measured here. Crossover: the density where the sparse kernel's time equals
the dense GEMM's (linear interpolation between measured densities).

    python -m benchmarks.elementwise_dense_cuda [--out DIR]
"""
import argparse

import torch
import torch.nn.functional as F

import sparsetorch as st
from benchmarks._results import bench, run_meta, write_results

torch.backends.cuda.matmul.allow_tf32 = False


def rel_err(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1e-30)).item()


def elementwise_suite(results):
    N = 2**26
    for dtype in (torch.float32, torch.bfloat16):
        size = torch.tensor([], dtype=dtype).element_size()
        x = torch.randn(N, device="cuda", dtype=dtype)
        y = torch.randn(N, device="cuda", dtype=dtype)
        dst = torch.empty_like(x)
        copy_s = bench(lambda: dst.copy_(x))
        copy_bw = 2 * N * size / copy_s
        n = 1024
        x2, g2 = x.view(-1, n), y.view(-1, n)
        bias = torch.randn(n, device="cuda", dtype=dtype)
        scale = torch.randn(n, device="cuda", dtype=dtype)

        def eager():
            return F.gelu(x2 * scale + bias)

        compiled = torch.compile(eager)
        ref_fused = F.gelu(x2.double() * scale.double() + bias.double())
        cases = [
            ("add (x + 2y)", lambda: st.add(x, y, alpha=2.0), x.double() + 2 * y.double(), 3),
            ("mul by scalar", lambda: st.mul(x, 3.0), x.double() * 3, 2),
            ("relu", lambda: st.relu(x), F.relu(x.double()), 2),
            ("gelu", lambda: st.gelu(x), F.gelu(x.double()), 2),
            ("silu", lambda: st.silu(x), F.silu(x.double()), 2),
            ("bias_act gelu (fused)", lambda: st.bias_act(x2, bias=bias, scale=scale, activation="gelu"), ref_fused, 2),
            ("bias_act relu (fused)", lambda: st.bias_act(x2, bias=bias, scale=scale, activation="relu"),
             F.relu(x2.double() * scale.double() + bias.double()), 2),
            ("bias_act silu (fused)", lambda: st.bias_act(x2, bias=bias, scale=scale, activation="silu"),
             F.silu(x2.double() * scale.double() + bias.double()), 2),
            ("eager gelu(x*scale+bias)", eager, ref_fused, 2),
            ("torch.compile gelu(x*scale+bias)", compiled, ref_fused, 2),
        ]
        fused_s = None
        for name, fn, ref, tensors in cases:
            err = rel_err(fn(), ref)
            assert err < (1e-5 if dtype == torch.float32 else 1e-2), f"{name} {dtype}: rel err {err}"
            s = bench(fn)
            bw = tensors * N * size / s
            fused_s = s if name.startswith("bias_act gelu") else fused_s
            results.append({"suite": "elementwise 2^26", "dtype": str(dtype), "case": name, "ms": s * 1e3,
                            "GBps": bw / 1e9, "of_copy_bw": bw / copy_bw, "copy_GBps": copy_bw / 1e9,
                            "fused_speedup": s / fused_s if fused_s and not name.startswith("bias_act") else None})
        # Backward of the fused op: reads grad and x, writes grad_x (+ two column sums).
        xr, sr, br = (t.detach().clone().requires_grad_() for t in (x2, scale, bias))
        out = st.bias_act(xr, bias=br, scale=sr, activation="gelu")
        s = bench(lambda: torch.ops.sparsetorch.bias_act_backward(g2, x2, scale, bias, "gelu", 0.01,
                                                                  [True, True, True]))
        bw = 3 * N * size / s
        results.append({"suite": "elementwise 2^26", "dtype": str(dtype), "case": "bias_act backward (fused)",
                        "ms": s * 1e3, "GBps": bw / 1e9, "of_copy_bw": bw / copy_bw, "copy_GBps": copy_bw / 1e9})
        del out


def linear_suite(results):
    M, K, N = 8192, 4096, 4096
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(M, K, device="cuda", dtype=dtype)
        w = torch.randn(N, K, device="cuda", dtype=dtype) * K**-0.5
        b = torch.randn(N, device="cuda", dtype=dtype)
        ref_lin = x.double() @ w.double().t() + b.double()
        for act, torch_act in (("relu", F.relu), ("gelu_tanh", lambda t: F.gelu(t, approximate="tanh")),
                               ("silu", F.silu)):
            ours = lambda: st.linear(x, w, b, activation=act)  # noqa: E731
            theirs = lambda: torch_act(F.linear(x, w, b))  # noqa: E731
            ref = torch_act(ref_lin)
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            assert rel_err(ours(), ref) < tol and rel_err(theirs(), ref) < tol
            t_ours, t_theirs = bench(ours), bench(theirs)
            results.append({"suite": "linear 8192x4096 @ 4096x4096^T + bias", "dtype": str(dtype), "case": act,
                            "ms": t_ours * 1e3, "torch_ms": t_theirs * 1e3, "speedup": t_theirs / t_ours,
                            "TFLOPs": 2 * M * N * K / t_ours / 1e12})


def crossover_suite(results):
    m = k = 8192
    n = 1024
    densities = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3)
    for label, dtype, tf32 in (("float32", torch.float32, False), ("float32_tf32", torch.float32, True),
                               ("bfloat16", torch.bfloat16, False), ("float16", torch.float16, False),
                               ("float64", torch.float64, False)):
        torch.backends.cuda.matmul.allow_tf32 = tf32
        B = torch.randn(k, n, device="cuda", dtype=dtype)
        rows = []
        for d in densities:
            g = torch.Generator(device="cuda").manual_seed(int(d * 1e4))
            mask = torch.rand(m, k, device="cuda", generator=g) < d
            dense = torch.where(mask, torch.randn(m, k, device="cuda", generator=g), 0.0).to(dtype)
            A = st.from_torch(dense.to_sparse_csr())
            plan = st.SpmmPlan(A, validate=False)
            t_sparse = bench(lambda: plan(B), budget_ms=50)
            t_dense = bench(lambda: dense @ B, budget_ms=50)
            rows.append((d, t_sparse, t_dense))
            results.append({"suite": "crossover 8192x8192 @ 8192x1024", "dtype": label, "density": d,
                            "sparse_ms": t_sparse * 1e3, "dense_ms": t_dense * 1e3})
            del dense, A, plan, mask
        cross = None
        for (d0, s0, g0), (d1, s1, g1) in zip(rows, rows[1:]):
            if s0 <= g0 and s1 > g1:  # sparse stops winning between d0 and d1
                r0, r1 = s0 - g0, s1 - g1
                cross = d0 + (d1 - d0) * (-r0) / (r1 - r0)
                break
        if cross is None:
            cross = densities[-1] if rows[-1][1] <= rows[-1][2] else (0.0 if rows[0][1] > rows[0][2] else None)
        results.append({"suite": "crossover 8192x8192 @ 8192x1024", "dtype": label, "crossover_density": cross})
    torch.backends.cuda.matmul.allow_tf32 = False


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=None)
    ap.add_argument("--suites", default="elementwise,linear,crossover",
                    help="comma-separated subset of elementwise, linear, crossover")
    args = ap.parse_args()
    suites = {"elementwise": elementwise_suite, "linear": linear_suite, "crossover": crossover_suite}
    results = []
    for name in args.suites.split(","):
        suites[name](results)
    for r in results:
        if "GBps" in r:
            extra = f"  eager/compiled vs fused: x{r['fused_speedup']:.2f}" if r.get("fused_speedup") else ""
            print(f"{r['dtype']:15s} {r['case']:34s} {r['ms'] * 1e3:8.1f} us {r['GBps']:7.0f} GB/s "
                  f"({100 * r['of_copy_bw']:5.1f}% of copy {r['copy_GBps']:.0f}){extra}")
        elif "torch_ms" in r:
            print(f"{r['dtype']:15s} linear {r['case']:10s} {r['ms']:.3f} ms vs F.linear+act {r['torch_ms']:.3f} ms "
                  f"(x{r['speedup']:.2f}), {r['TFLOPs']:.0f} TFLOP/s")
        elif "density" in r:
            print(f"{r['dtype']:15s} density {100 * r['density']:5.1f}%  sparse {r['sparse_ms']:8.3f} ms  "
                  f"dense {r['dense_ms']:8.3f} ms")
        else:
            c = r["crossover_density"]
            print(f"{r['dtype']:15s} crossover density: {'n/a' if c is None else f'{100 * c:.2f}%'}")
    tag = "" if args.suites == ap.get_default("suites") else "_" + args.suites.replace(",", "_")
    write_results(args.out, f"elementwise_dense_cuda{tag}.json", run_meta(), results)


if __name__ == "__main__":
    main()
