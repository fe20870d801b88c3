"""A pruned transformer feed-forward block, sparsetorch's SparseLinear against dense nn.Linear.

Block: x (tokens, 4096) -> Linear 4096x4096 -> GELU -> Linear 4096x4096, with both weights
magnitude-pruned per row (the same nnz in every row) to 50/80/90/95% sparsity. Reported per
sparsity: forward and forward+backward time (median of device-event timings on CUDA, of wall
times on the CPU) against the dense block with the unpruned weights in the same dtype (fp32 with
TF32 off unless --tf32), weight memory, and output error: of the sparse kernels against a float64
dense product with the same pruned weights (kernel error) and of the pruned block against the
dense one (pruning error, which depends on the weights; here random init, so it is large).

    python examples/pruned_ffn.py --device cuda --out ffn.json
"""
from __future__ import annotations

import argparse
import json
import torch

import sparsetorch as st
from sparsetorch.bench.timing import make_timer


def rel_err(x, ref):
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def weight_bytes(module):
    return sum(t.numel() * t.element_size() for t in list(module.parameters()) + list(module.buffers()))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    ap.add_argument("--tf32", action="store_true", help="let the dense baseline use TF32 tensor cores")
    ap.add_argument("--features", type=int, default=4096)
    ap.add_argument("--tokens", type=int, default=1024)
    ap.add_argument("--sparsities", default="0.5,0.8,0.9,0.95")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    device, dtype = torch.device(args.device), getattr(torch, args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    torch.manual_seed(0)
    f = args.features
    up, down = torch.nn.Linear(f, f), torch.nn.Linear(f, f)
    dense = torch.nn.Sequential(up, torch.nn.GELU(), down).to(device=device, dtype=dtype)
    x = torch.randn(args.tokens, f, device=device, dtype=dtype)
    xg = x.clone().requires_grad_()

    def fwd_bwd(model):
        def run():
            model.zero_grad(set_to_none=True)
            xg.grad = None
            model(xg).sum().backward()
        return run

    with torch.no_grad():
        y_dense = dense(x)
    bench = make_timer(device, quick=False)  # median of device-event (CUDA) or wall (CPU) times, seconds
    t_dense = bench(lambda: dense(x))
    t_dense_train = bench(fwd_bwd(dense))
    rows = []
    print(f"{device} {dtype} TF32={'on' if args.tf32 else 'off'}: dense block forward {1e3 * t_dense:.3f} ms, "
          f"forward+backward {1e3 * t_dense_train:.3f} ms, weights {weight_bytes(dense) / 2**20:.1f} MiB")
    for s in (float(v) for v in args.sparsities.split(",")):
        sparse_up = st.nn.SparseLinear.from_dense(up, sparsity=s, scheme="row", activation="gelu")
        sparse_down = st.nn.SparseLinear.from_dense(down, sparsity=s, scheme="row")
        model = torch.nn.Sequential(sparse_up, sparse_down)
        with torch.no_grad():
            y = model(x)
            w_up, w_down = sparse_up.to_dense().double(), sparse_down.to_dense().double()
            h = torch.nn.functional.gelu(x.double() @ w_up.t() + sparse_up.bias.double())
            y_ref = h @ w_down.t() + sparse_down.bias.double()
        t_sparse = bench(lambda: model(x))
        t_train = bench(fwd_bwd(model))
        row = {"sparsity": s, "forward_ms": 1e3 * t_sparse, "dense_forward_ms": 1e3 * t_dense,
               "forward_speedup": t_dense / t_sparse, "train_ms": 1e3 * t_train,
               "dense_train_ms": 1e3 * t_dense_train, "train_speedup": t_dense_train / t_train,
               "weight_MiB": weight_bytes(model) / 2**20, "dense_weight_MiB": weight_bytes(dense) / 2**20,
               "kernel_rel_err": rel_err(y, y_ref), "pruning_rel_err": rel_err(y, y_dense)}
        rows.append(row)
        print(f"sparsity {100 * s:4.0f}%: forward {row['forward_ms']:8.3f} ms ({row['forward_speedup']:.2f}x dense), "
              f"forward+backward {row['train_ms']:8.3f} ms ({row['train_speedup']:.2f}x), weights "
              f"{row['weight_MiB']:6.1f} MiB ({row['weight_MiB'] / row['dense_weight_MiB']:.2f}x), "
              f"kernel error {row['kernel_rel_err']:.1e}, pruning error {row['pruning_rel_err']:.2f}")
    if args.out:
        meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                "dtype": args.dtype, "tf32": args.tf32, "features": f, "tokens": args.tokens,
                "torch": torch.__version__}
        with open(args.out, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
