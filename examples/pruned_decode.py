"""Wanda-prune a Llama-shaped decoder stack and measure decoding tokens/s: SparseLinear against the same pruned
weights kept dense (what you run today).

No model hub is reachable here, so the weights are random with heavy-tailed row and column scales (as trained
weights have), and the calibration tokens are heavy-tailed with a few outlier channels (as LLM activations
are). With a real model, load it instead and feed it a few hundred calibration tokens: the steps are the same.

  1. ||X_j||_2 of every linear layer's input over the calibration tokens (sparsetorch.pruned.input_norms);
  2. Wanda: drop the weights of the lowest |W_ij| * ||X_j||_2, 50% and 70% of each row and 2:4
     (wanda_prune for the dense copy; SparseLinear.from_dense(..., importance=norms): the same mask, stored sparse);
  3. check the sparse stack's output against the dense pruned stack's; time a decode step (N sequences, one
     new token each, against a KV cache) and print tokens/s and the form SparseLinear chose per projection.

Defaults: Llama-3-8B's shapes (hidden 4096, 32/8 heads, MLP 14336), 4 of its 32 layers, bfloat16 on CUDA; a tiny
float32 stack on the CPU. Tokens/s are for --layers layers.

    python examples/pruned_decode.py [--layers 4] [--tokens 1,2,4,8,16] [--hidden 4096 --inner 14336 ...]
"""
import argparse
import copy
import os
import sys
from dataclasses import replace

import torch

import sparsetorch as st
from sparsetorch.pruned import input_norms, wanda_prune

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # this checkout's benchmarks/
from benchmarks.harness import make_step_timer  # noqa: E402
from benchmarks.ratios import versus  # noqa: E402
from benchmarks.suites.decode import (LLAMA3_8B, TINY, dense_stack, heavy_tailed_activations, kv_caches,  # noqa: E402
                                      rope_at, routes_by_kind)


def pruned_copy(model, norms, sparsity, scheme, sparse):
    """A copy of `model` with every nn.Linear Wanda-pruned: kept dense (sparse=False) or as SparseLinear."""
    model = copy.deepcopy(model)
    for name, lin in list(model.named_modules()):
        if not isinstance(lin, torch.nn.Linear):
            continue
        parent, attr = model.get_submodule(name.rpartition(".")[0]), name.rpartition(".")[2]
        if sparse:  # format="auto": the rule decides each new token count; prepare() below times them up front
            new = st.nn.SparseLinear.from_dense(lin, sparsity=sparsity, scheme=scheme, importance=norms[name])
        else:
            new = copy.deepcopy(lin)
            new.weight.data = wanda_prune(lin.weight, norms[name], sparsity, scheme)
        setattr(parent, attr, new.requires_grad_(False))
    return model


def main():
    cuda = torch.cuda.is_available()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if cuda else "cpu")
    ap.add_argument("--layers", type=int, default=None, help="decoder layers (default 4 on CUDA, 1 on the CPU)")
    for size in ("hidden", "inner", "heads", "kv_heads", "context"):
        ap.add_argument(f"--{size.replace('_', '-')}", type=int, default=None)
    ap.add_argument("--tokens", default="1,2,4,8,16", help="sequences decoded per step (one new token each)")
    args = ap.parse_args()
    device = torch.device(args.device)
    base = LLAMA3_8B if device.type == "cuda" else TINY
    shape = replace(base, **{k: v for k in ("layers", "hidden", "inner", "heads", "kv_heads", "context")
                             if (v := getattr(args, k)) is not None})
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    timer = make_step_timer(device, quick=True)  # whole decode steps: host time included
    g = torch.Generator(device=device).manual_seed(0)
    rope = rope_at(shape, shape.context, device, dtype)
    print(f"{shape.layers} layer(s): hidden {shape.hidden}, {shape.heads}/{shape.kv_heads} heads, MLP {shape.inner}, "
          f"{shape.context} cached tokens per sequence, {str(dtype)[6:]} on {device}")

    dense = dense_stack(shape, device, dtype)  # nn.Linear projections with heavy-tailed random weights
    with torch.no_grad():  # 1. calibration: 64 tokens
        calib = heavy_tailed_activations(64, shape.hidden, device, dtype, g, outliers=max(1, shape.hidden // 512))
        norms = input_norms(dense, [(calib, kv_caches(shape, 64, device, dtype, 1), rope)])

    for sparsity, scheme, name in ((0.5, "row", "50% per row"), (0.7, "row", "70% per row"), (0.5, "2:4", "2:4")):
        base_stack = pruned_copy(dense, norms, sparsity, scheme, sparse=False)  # 2. prune
        sparse_stack = pruned_copy(dense, norms, sparsity, scheme, sparse=True)
        st.nn.prepare(sparse_stack, [int(t) for t in args.tokens.split(",")], progress=False)  # as a server at load
        print(f"\n{name}: {len(norms)} projections pruned")
        for n in (int(t) for t in args.tokens.split(",")):
            x = heavy_tailed_activations(n, shape.hidden, device, dtype, g)
            caches = kv_caches(shape, n, device, dtype, 100 + n)
            with torch.no_grad():  # 3. check, then time
                want, got = base_stack(x, caches, rope), sparse_stack(x, caches, rope)
                err = ((got.double() - want.double()).norm() / want.double().norm()).item()
                t_dense = timer(lambda: base_stack(x, caches, rope))
                t_sparse = timer(lambda: sparse_stack(x, caches, rope))
            routes = routes_by_kind(sparse_stack, n)
            forms = ", ".join(f"{k} {r}" for k, r in routes.items())
            if all(r == "dense" for r in routes.values()):
                verdict = "no sparse form beat dense here, so SparseLinear runs the dense weight (no speedup)"
            elif t_sparse > t_dense:
                verdict = f"the sparse stack is {versus(t_dense / t_sparse)} than dense here"
            else:
                verdict = versus(t_dense / t_sparse, "dense")
            print(f"  N={n:2d}: {n / t_dense:8.0f} tokens/s dense, {n / t_sparse:8.0f} sparse: {verdict} "
                  f"(per layer {1e3 * t_sparse / shape.layers:.3f} vs {1e3 * t_dense / shape.layers:.3f} ms; "
                  f"output differs by {err:.1e}; forms: {forms})")
        held = sum(m.memory()["held"] for m in sparse_stack.modules() if isinstance(m, st.nn.SparseLinear))
        dense_bytes = sum(p.numel() * p.element_size() for p in base_stack.parameters())
        print(f"  weights held: {held / 2**20:.0f} MiB sparse (the CSR and the forms kept) vs "
              f"{dense_bytes / 2**20:.0f} MiB dense")


if __name__ == "__main__":
    main()
