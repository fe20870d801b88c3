"""Pruning a trained model's feed-forward layer: magnitude vs Wanda, unstructured vs 2:4, with SparseLinear.

No model hub is reachable (and no PyPI package ships pretrained transformer weights), so the model is trained
here, in seconds: an MLP 64 -> H -> H -> 10 (GELU) on scikit-learn's handwritten digits (1797 8x8 images that
ship inside the scikit-learn wheel: a real dataset, nothing downloaded; ``bash scripts/install.sh bench``
installs scikit-learn, and without it the script says so and exits). Its H x H hidden layer is then pruned

  * by magnitude (global |w|), and
  * Wanda-style (Sun et al. 2023): score |w_ij| * ||x_j||_2 with x the layer's inputs on 256 calibration
    samples, the lowest scores of each output row removed,

to 50 / 90 / 97 / 99% unstructured sparsity (--sparsities) and to 2:4 (the 2 highest scores of every 4
consecutive inputs), put into a SparseLinear, and the model evaluated on the held-out test set: accuracy without
retraining, after a short fine-tuning of the surviving values (the pattern stays fixed; SparseLinear trains its
values), and the pruned layer's output error against a float64 product. The digits are easy for this MLP: up to
~90% the pruned layer keeps the dense accuracy; past it accuracy falls (to ~0.78 at 99% on the CPU) and the
fine-tuning wins part of it back. Then the pruned layer alone is timed against the dense nn.Linear at N = 1, 16
and 2048 tokens (bf16 on CUDA, float32 on the CPU), with the route SparseLinear chose per token count and the
memory of its forms. Where SparseLinear found its dense form fastest and runs that (never slower than dense is
its promise), the row says "dense fallback" instead of a ratio: the same dense product is timed twice there,
and any difference is noise.

    python examples/pruned_ffn.py --device cuda --out pruned_ffn.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import torch.nn.functional as F

import sparsetorch as st
from sparsetorch.pruned import prune_mask

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's benchmarks/
from benchmarks.harness import make_timer  # noqa: E402
from benchmarks.ratios import versus  # noqa: E402


def load_data(device, seed=0):
    from sklearn.datasets import load_digits

    d = load_digits()
    x, y, source = torch.tensor(d.data, dtype=torch.float32) / 16.0, torch.tensor(d.target), "sklearn digits"
    perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(seed))
    x, y = x[perm].to(device), y[perm].to(device)
    x = (x - x.mean(0)) / (x.std(0) + 1e-3)
    split = int(0.8 * len(y))
    return (x[:split], y[:split]), (x[split:], y[split:]), source


class MLP(torch.nn.Module):
    def __init__(self, hidden):
        super().__init__()
        self.inp, self.ffn, self.out = torch.nn.Linear(64, hidden), torch.nn.Linear(hidden, hidden), torch.nn.Linear(hidden, 10)

    def features(self, x):  # the pruned layer's input
        return F.gelu(self.inp(x))

    def forward(self, x):
        return self.out(F.gelu(self.ffn(self.features(x))))


def train(model, params, data, epochs, lr, seed=0):
    (x, y), _, _ = data
    opt = torch.optim.Adam(params, lr=lr)
    g = torch.Generator(device="cpu").manual_seed(seed)
    for _ in range(epochs):
        for idx in torch.randperm(len(y), generator=g).split(64):
            opt.zero_grad()
            F.cross_entropy(model(x[idx.to(x.device)]), y[idx.to(y.device)]).backward()
            opt.step()


@torch.no_grad()
def accuracy(model, data):
    _, (x, y), _ = data
    return (model(x).argmax(1) == y).float().mean().item()


def mask_of(weight, importance, sparsity):
    """Mask keeping the highest |w| * importance: per output row (Wanda), or 2:4 (sparsetorch's prune_mask)."""
    if sparsity == "2:4":
        return prune_mask(weight, 0.5, "2:4", importance=importance)
    return prune_mask(weight, sparsity, "row", importance=importance)


def pruned_layer(dense, mask, dtype):
    w = torch.where(mask, dense.weight.detach(), torch.zeros_like(dense.weight))
    return st.nn.SparseLinear.from_sparse(st.from_dense(w), bias=dense.bias.detach(), dtype=dtype)


def speed(route, dense_ms, ms):
    """The pruned layer against the dense nn.Linear in words; "dense fallback" where SparseLinear runs its
    dense form (the same product as the baseline: no speed-up to report)."""
    if route == "dense":
        return f"dense fallback ({ms:.3g} ms)"
    return f"{versus(dense_ms / ms)} ({route}, {ms:.3g} vs {dense_ms:.3g} ms)"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--hidden", type=int, default=None, help="width H (default 4096 on CUDA, 512 on the CPU)")
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--finetune-epochs", type=int, default=2)
    ap.add_argument("--tokens", default="1,16,2048")
    ap.add_argument("--sparsities", default="0.5,0.9,0.97,0.99,2:4",
                    help="fractions of the hidden layer's weights removed, and 2:4")
    ap.add_argument("--dtype", default=None, choices=["float32", "bfloat16", "float16"],
                    help="dtype of the timed layer (default bfloat16 on CUDA, float32 on the CPU)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    try:
        import sklearn.datasets  # noqa: F401  (load_data's)
    except ImportError:
        print("examples/pruned_ffn.py trains on scikit-learn's handwritten digits (shipped inside its wheel), and "
              "scikit-learn is not installed: pip install scikit-learn (bash scripts/install.sh bench installs it). "
              "Nothing was run.")
        return
    device = torch.device(args.device)
    hidden = args.hidden or (4096 if device.type == "cuda" else 512)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.manual_seed(0)
    data = load_data(device)
    model = MLP(hidden).to(device)
    train(model, model.parameters(), data, args.epochs, 1e-3)
    dense_acc = accuracy(model, data)
    (x_train, _), _, source = data
    with torch.no_grad():
        calib = model.features(x_train[:256])
    input_norm = calib.norm(dim=0)  # ||x_j||_2 over the calibration samples
    w = model.ffn.weight.detach()
    print(f"{source}: MLP 64-{hidden}-{hidden}-10 trained on {device}, test accuracy {dense_acc:.4f}; pruning the "
          f"{hidden}x{hidden} layer")
    run_dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if device.type == "cuda" else torch.float32)
    timer = make_timer(device, quick=True)
    tokens = [int(t) for t in args.tokens.split(",")]
    dense_ffn = model.ffn.to(run_dtype)
    xs = {n: torch.randn(n, hidden, device=device, dtype=run_dtype) for n in tokens}
    dense_ms = {n: 1e3 * timer(lambda n=n: dense_ffn(xs[n])) for n in tokens}
    model.ffn.float()
    rows = []
    for method in ("magnitude", "wanda"):
        importance = input_norm if method == "wanda" else None
        for sparsity in [float(v) if v != "2:4" else v for v in args.sparsities.split(",")]:
            if method == "magnitude" and sparsity != "2:4":  # global magnitude, as SparseLinear.from_dense
                layer = st.nn.SparseLinear.from_dense(model.ffn, sparsity=sparsity)
            else:
                layer = pruned_layer(model.ffn, mask_of(w, importance, sparsity), torch.float32)
            pruned = MLP(hidden).to(device)
            pruned.load_state_dict(model.state_dict())
            pruned.ffn = layer
            acc = accuracy(pruned, data)
            train(pruned, [layer.values, layer.bias], data, args.finetune_epochs, 3e-4, seed=1)
            acc_ft = accuracy(pruned, data)
            timed = st.nn.SparseLinear(hidden, hidden, layer.crow_indices, layer.col_indices,
                                       layer.values.detach().to(run_dtype), layer.bias.detach().to(run_dtype))
            st.nn.prepare(timed, tokens, progress=False)  # every token count decided and built, as a server at load
            with torch.no_grad():
                x = xs[tokens[-1]]
                ref = x.double() @ timed.to_dense().double().t() + timed.bias.double()
                err = ((timed(x).double() - ref).norm() / ref.norm()).item()
                times = {n: 1e3 * timer(lambda n=n: timed(xs[n])) for n in tokens}
            label = sparsity if isinstance(sparsity, str) else f"{100 * sparsity:g}%"
            row = {"method": method, "sparsity": label, "accuracy": acc, "accuracy_finetuned": acc_ft,
                   "dense_accuracy": dense_acc, "rel_err_vs_float64": err, "time_ms": times, "dense_ms": dense_ms,
                   "routes": {str(b): r for b, r in timed.routes.items()},
                   "memory_MiB": {k: v / 2**20 for k, v in timed.memory().items()}}
            rows.append(row)
            row["vs_dense"] = {n: speed(timed.routes.get(1 << (n - 1).bit_length()), dense_ms[n], times[n])
                               for n in tokens}
            print(f"{method:9s} {label:>4s}: accuracy {acc:.4f} -> {acc_ft:.4f} after {args.finetune_epochs} "
                  f"epochs of fine-tuning (dense {dense_acc:.4f}); error {err:.1e}; against the dense nn.Linear: "
                  + ", ".join(f"N={n} {row['vs_dense'][n]}" for n in tokens))
    if args.out:
        meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "data": source,
                "hidden": hidden, "dtype_timed": str(run_dtype), "torch": torch.__version__}
        with open(args.out, "w") as fh:
            json.dump({"meta": meta, "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
