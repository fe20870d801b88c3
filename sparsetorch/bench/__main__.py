"""python -m sparsetorch.bench: sparsetorch's SpMM against dense matmul (and SciPy / torch.sparse.mm)
on the best device present. A quick run (about a minute on a 2-core CPU).

Cases: a random graph (m x m, 20 entries per row, n features) and a pruned weight (m x m at several
densities) times a dense (m, n) operand; every implementation's output is checked against a float64
reference before it is timed. Times are medians (CUDA events on a GPU, wall clock on the CPU).
Floor per row: max(bytes / copy bandwidth, flops / matmul peak) with both ceilings measured here.
"""
import argparse
import json
import statistics
import time

import numpy as np
import scipy.sparse as sp
import torch

import sparsetorch as st


def timer(device):
    if device.type == "cuda":
        try:
            import triton.testing

            return lambda fn: triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median") * 1e-3
        except ImportError:
            pass

        def cuda_time(fn, reps=50):
            fn()
            times = []
            for _ in range(reps):
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end) * 1e-3)
            return statistics.median(times)

        return cuda_time

    def cpu_time(fn, reps=7):
        fn()
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    return cpu_time


def ceilings(device, measure):
    x = torch.randn(2**24 if device.type == "cpu" else 2**28, device=device)
    y = torch.empty_like(x)
    bw = 2 * x.numel() * 4 / measure(lambda: y.copy_(x))
    s = 2048 if device.type == "cpu" else 8192
    a, b = torch.randn(s, s, device=device), torch.randn(s, s, device=device)
    peak = 2 * s**3 / measure(lambda: torch.mm(a, b))
    return bw, peak


def check(out, ref, name):
    got = (out if isinstance(out, torch.Tensor) else torch.from_numpy(np.asarray(out))).double().cpu()
    err = ((got - ref).norm() / ref.norm()).item()
    if not err < 1e-4:
        raise AssertionError(f"{name}: relative error {err:.2e} against the float64 reference")
    return err


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m sparsetorch.bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    ap.add_argument("--m", type=int, default=None, help="matrix size (default 2048 on CPU, 8192 on CUDA)")
    ap.add_argument("--n", type=int, default=None, help="dense columns (default 256 on CPU, 1024 on CUDA)")
    ap.add_argument("--out", default=None, help="write results as JSON to this file")
    args = ap.parse_args(argv)
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device or ("cuda" if st.build_info()["cuda_available"] else "cpu"))
    cpu = device.type == "cpu"
    m = args.m or (2048 if cpu else 8192)
    n = args.n or (256 if cpu else 1024)
    measure = timer(device)
    bw, peak = ceilings(device, measure)
    name = torch.cuda.get_device_name(device) if not cpu else f"CPU ({torch.get_num_threads()} threads)"
    print(f"sparsetorch {st.__version__} on {name}: copy {bw / 1e9:.1f} GB/s, fp32 matmul {peak / 1e9:.0f} GFLOP/s")
    rng = np.random.default_rng(0)
    rows = []
    cases = [("graph, 20/row", None)] + [(f"pruned, {d:g}% dense", d / 100) for d in (1, 5, 10, 30)]
    for case, density in cases:
        if density is None:
            r = np.repeat(np.arange(m), 20)
            a = sp.csr_matrix((rng.standard_normal(r.size), (r, rng.integers(0, m, r.size))), shape=(m, m))
        else:
            a = sp.random(m, m, density=density, format="csr", random_state=rng, data_rvs=rng.standard_normal)
        a = a.astype(np.float32)
        a.sort_indices()
        b_np = rng.standard_normal((m, n)).astype(np.float32)
        ref = torch.from_numpy(a.astype(np.float64) @ b_np.astype(np.float64))
        A = st.from_scipy(a, device=device)
        B = torch.from_numpy(b_np).to(device)
        A_dense = A.to_dense()
        A_torch = st.to_torch(A)
        plan = st.SpmmPlan(A)
        impls = {"dense matmul": lambda: A_dense @ B, "sparsetorch": lambda: plan(B),
                 "torch.sparse.mm": lambda: torch.sparse.mm(A_torch, B)}
        if cpu:
            impls["scipy"] = lambda: a @ b_np
        nnz = a.nnz
        floor = max((nnz * 8 + (m + 1) * 4 + 2 * m * n * 4) / bw, 2 * nnz * n / peak)
        times = {}
        for impl, fn in impls.items():
            check(fn(), ref, f"{case}: {impl}")
            times[impl] = measure(fn)
        rows.append({"case": case, "nnz": nnz, "floor_s": floor, **{f"{k}_s": v for k, v in times.items()}})
        extra = f"  scipy {times['scipy'] * 1e3:8.2f} ms" if cpu else ""
        print(f"{case:22s} sparsetorch {times['sparsetorch'] * 1e3:8.2f} ms  dense {times['dense matmul'] * 1e3:8.2f} ms"
              f"  (x{times['dense matmul'] / times['sparsetorch']:5.2f})  torch.sparse.mm "
              f"{times['torch.sparse.mm'] * 1e3:8.2f} ms (x{times['torch.sparse.mm'] / times['sparsetorch']:5.2f})"
              f"{extra}  floor {floor * 1e3:7.3f} ms")
    print("(xN: how many times faster sparsetorch is; floor: bytes/bandwidth or flops/peak, whichever is larger)")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"device": name, "m": m, "n": n, "copy_GBps": bw / 1e9, "matmul_GFLOPs": peak / 1e9,
                       "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
