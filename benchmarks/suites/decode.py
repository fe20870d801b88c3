"""The decode suite: decode steps of a Llama-3-8B-shaped decoder stack, Wanda-pruned, with
``SparseLinear(format="auto")`` against the same pruned weights stored dense (``F.linear``, what a user runs
today). Part of the pruned suite (``--suites pruned``), and alone as ``--suites decode``.

Stack: L layers (``--layers``; default 4 on CUDA, 1 on the CPU; Llama-3-8B has 32, so tokens/s are for L
layers and every row also gives the time per layer), each: RMSNorm, q/k/v projections (4096 -> 4096 / 1024 /
1024: 32 query heads, 8 KV heads of 128), RoPE, ``scaled_dot_product_attention`` of the new token against a
KV cache of 512 cached tokens per sequence (the new k/v written into its slot in place), o projection
(4096 -> 4096), residual, RMSNorm, SiLU-gated MLP (gate/up 4096 -> 14336, down 14336 -> 4096), residual;
bfloat16. The seven projections are separate layers (not fused) and the SiLU is not fused into gate, in both
stacks alike, so that the stacks differ only in how the linear layers run. On the CPU: float32, hidden 256,
4 / 2 heads of 64, MLP 896, 64 cached tokens (so CI runs it in seconds).

Weights: Gaussian with heavy-tailed (lognormal) row and column scales, as trained weights have. Calibration:
64 tokens of heavy-tailed activations with a few outlier channels (x20) through the dense, unpruned stack;
``sparsetorch.pruned.input_norms`` collects ||X_j||_2 of every projection's input. Pruned Wanda-style
(|W_ij| * ||X_j||_2) to 50% per row, 2:4 and 70% per row: ``wanda_prune`` gives the dense baseline's weights,
``SparseLinear.from_dense(..., importance=norms)`` the sparse layers (the same mask).

Tokens per step N = 1, 2, 4, 8, 16 (one new token for each of N sequences; ``--widths`` sets them). Every N
is decided up front (``st.nn.prepare`` on the sparse stack, as a server does at load) and warmed up. Each case
times the whole step (all layers) of both stacks, eager (the step timer: host-bound steps) and (CUDA)
replayed from a CUDA graph (a clean L2 before each replay, as the pruned suite times), and the
projections alone (``linear_ms``: their share of the step). Before timing, both stacks' outputs are checked
against the float64 stack (the dense pruned weights in float64): the sparse stack must be within bf16
rounding, i.e. within max(3e-2, 2x the dense bf16 stack's own error).

Rows: ``time_ms`` per step, ``tokens_per_s`` (N / step time), ``per_layer_ms``, ``linear_ms`` and
``linear_share``, ``routes`` (per projection kind, the form SparseLinear chose for this N over the L layers),
``weight_MiB`` (the dense weights, or the sparse layers' ``memory()``: the CSR and every form they hold),
``vs_dense`` (dense time / this time). Floor: the bytes the stack must read per step (weights: dense, or
for the sparse stack an ideal compressed format of values + a bitmap, nnz * value + m*k/8; the KV cache; x
and y) over the copy bandwidth measured at the start of the run, and the useful flops over the GEMM rate.
"""
from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass, replace
from typing import Callable, Dict, List, Optional

import torch
import torch.nn.functional as F
from torch import nn

import sparsetorch as st
from benchmarks.ratios import versus
from benchmarks.suites.common import TOL, Context, Job, warm_gpu
from benchmarks.suites.cpu import time_rounds
from sparsetorch.pruned import input_norms, wanda_prune

KINDS = ("q", "k", "v", "o", "gate", "up", "down")
DENSE = "dense F.linear (pruned weight)"
SPARSITIES = ((0.5, "row"), (0.5, "2:4"), (0.7, "row"))  # the main target (50% per row) first: a run cut short has it


@dataclass(frozen=True)
class Shape:
    hidden: int = 4096
    heads: int = 32
    kv_heads: int = 8
    inner: int = 14336
    layers: int = 4
    context: int = 512  # cached tokens per sequence

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def linear_shapes(self) -> Dict[str, tuple]:
        """kind -> (out_features, in_features)."""
        h, kv = self.hidden, self.kv_heads * self.head_dim
        return {"q": (h, h), "k": (kv, h), "v": (kv, h), "o": (h, h), "gate": (self.inner, h),
                "up": (self.inner, h), "down": (h, self.inner)}


LLAMA3_8B = Shape()
TINY = Shape(hidden=256, heads=4, kv_heads=2, inner=896, layers=1, context=64)


def label(sparsity, scheme) -> str:
    return "2:4" if scheme == "2:4" else f"{100 * sparsity:g}% per row" if scheme == "row" else f"{100 * sparsity:g}%"


class DecoderLayer(nn.Module):
    """One Llama decoder layer at decode: x (N, hidden), one new token per sequence, against a KV cache
    (k, v: (N, kv_heads, context + 1, head_dim), the last slot written with this step's k/v)."""

    def __init__(self, shape: Shape, linears: Dict[str, nn.Module], norms: torch.Tensor):
        super().__init__()
        self.shape = shape
        for kind in KINDS:
            setattr(self, kind, linears[kind])
        self.register_buffer("norms", norms)  # (2, hidden): the RMSNorm weights before attention and MLP

    def forward(self, x, cache, rope, linear: Optional[Callable] = None):
        s = self.shape
        lin = linear or (lambda module, a: module(a))
        n = x.shape[0]
        h = F.rms_norm(x, (s.hidden,), self.norms[0].to(x.dtype), eps=1e-5)
        q = lin(self.q, h).view(n, s.heads, 1, s.head_dim)
        k = lin(self.k, h).view(n, s.kv_heads, 1, s.head_dim)
        v = lin(self.v, h).view(n, s.kv_heads, 1, s.head_dim)
        cos, sin = rope
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        k_cache, v_cache = cache
        k_cache[:, :, -1:] = k
        v_cache[:, :, -1:] = v
        a = F.scaled_dot_product_attention(q, k_cache, v_cache, enable_gqa=True)
        x = x + lin(self.o, a.reshape(n, s.hidden))
        h = F.rms_norm(x, (s.hidden,), self.norms[1].to(x.dtype), eps=1e-5)
        return x + lin(self.down, F.silu(lin(self.gate, h)) * lin(self.up, h))


def _rotate(t, cos, sin):
    half = t.shape[-1] // 2
    rotated = torch.cat((-t[..., half:], t[..., :half]), dim=-1)
    return t * cos.to(t.dtype) + rotated * sin.to(t.dtype)


class DecoderStack(nn.Module):
    def __init__(self, layers: List[DecoderLayer]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, x, caches, rope, linear=None):
        for layer, cache in zip(self.layers, caches):
            x = layer(x, cache, rope, linear)
        return x


def rope_at(shape: Shape, position: int, device, dtype=torch.float64) -> tuple:
    """cos, sin (head_dim,) of the rotary embedding at one position (Llama-3's base 500000)."""
    inv = 1.0 / (500000.0 ** (torch.arange(0, shape.head_dim, 2, dtype=torch.float64, device=device) / shape.head_dim))
    angle = torch.cat((position * inv, position * inv))
    return angle.cos().to(dtype), angle.sin().to(dtype)


def heavy_tailed_weight(m: int, k: int, device, dtype, g: torch.Generator) -> torch.Tensor:
    """Gaussian with lognormal row and column scales (sigma 0.5 each)."""
    rows = torch.exp(0.5 * torch.randn(m, 1, device=device, generator=g))
    cols = torch.exp(0.5 * torch.randn(1, k, device=device, generator=g))
    return (torch.randn(m, k, device=device, generator=g) * rows * cols / k ** 0.5).to(dtype)


def heavy_tailed_activations(n: int, hidden: int, device, dtype, g: torch.Generator, outliers: int = 0) -> torch.Tensor:
    """Tokens with lognormal channel scales and `outliers` channels 20x larger (as LLM activations have)."""
    scale = torch.exp(0.5 * torch.randn(hidden, device=device, generator=g))
    idx = torch.randperm(hidden, device=device, generator=g)[:outliers]
    scale[idx] *= 20.0
    return (torch.randn(n, hidden, device=device, generator=g) * scale).to(dtype)


def dense_stack(shape: Shape, device, dtype, seed: int = 0) -> DecoderStack:
    """The unpruned stack: nn.Linear(bias=False) projections with heavy-tailed weights."""
    g = torch.Generator(device=device).manual_seed(seed)
    layers = []
    for _ in range(shape.layers):
        linears = {}
        for kind, (m, k) in shape.linear_shapes().items():
            lin = nn.Linear(k, m, bias=False, device=device, dtype=dtype)
            with torch.no_grad():
                lin.weight.copy_(heavy_tailed_weight(m, k, device, dtype, g))
            linears[kind] = lin.requires_grad_(False)
        norms = (1.0 + 0.1 * torch.randn(2, shape.hidden, device=device, generator=g)).to(dtype)
        layers.append(DecoderLayer(shape, linears, norms))
    return DecoderStack(layers)


def kv_caches(shape: Shape, n: int, device, dtype, seed: int) -> List[tuple]:
    g = torch.Generator(device=device).manual_seed(seed)
    size = (n, shape.kv_heads, shape.context + 1, shape.head_dim)
    return [tuple(torch.randn(size, device=device, generator=g).to(dtype) for _ in range(2))
            for _ in range(shape.layers)]


def calibrate(stack: DecoderStack, shape: Shape, device, dtype, tokens: int = 64,
              seed: int = 1) -> Dict[str, torch.Tensor]:
    """||X_j||_2 of every projection's input over `tokens` calibration tokens through the dense stack."""
    g = torch.Generator(device=device).manual_seed(seed)
    x = heavy_tailed_activations(tokens, shape.hidden, device, dtype, g, outliers=max(1, shape.hidden // 512))
    caches = kv_caches(shape, tokens, device, dtype, seed)
    rope = rope_at(shape, shape.context, device, dtype)
    with torch.no_grad():
        return input_norms(stack, [(x, caches, rope)])


def pruned_stacks(stack: DecoderStack, norms: Dict[str, torch.Tensor], sparsity, scheme: str):
    """(the dense stack with Wanda-pruned weights, the same with SparseLinear(format="auto") projections)."""
    dense_layers, sparse_layers = [], []
    for i, layer in enumerate(stack.layers):
        dense, sparse = {}, {}
        for kind in KINDS:
            lin, imp = getattr(layer, kind), norms[f"layers.{i}.{kind}"]
            w = wanda_prune(lin.weight, imp, sparsity, scheme)
            dense[kind] = nn.Linear(w.shape[1], w.shape[0], bias=False, device=w.device, dtype=w.dtype)
            with torch.no_grad():
                dense[kind].weight.copy_(w)
            dense[kind].requires_grad_(False)
            sparse[kind] = st.nn.SparseLinear.from_dense(lin.weight, sparsity=sparsity, scheme=scheme,
                                                         importance=imp).requires_grad_(False)
        dense_layers.append(DecoderLayer(layer.shape, dense, layer.norms.clone()))
        sparse_layers.append(DecoderLayer(layer.shape, sparse, layer.norms.clone()))
    return DecoderStack(dense_layers), DecoderStack(sparse_layers)


def reference(dense: DecoderStack, x, caches, rope):
    """The dense pruned stack in float64 (its weights converted one projection at a time)."""
    with torch.no_grad():
        c64 = [(k.double(), v.double()) for k, v in caches]
        rope64 = tuple(t.double() for t in rope)
        return dense(x.double(), c64, rope64, linear=lambda module, a: F.linear(a, module.weight.double()))


def linears_only(stack: DecoderStack, xh: torch.Tensor, xi: torch.Tensor):
    """A step's projections alone, on inputs of their shapes (for their share of the step)."""
    def run():
        for layer in stack.layers:
            for kind in KINDS:
                getattr(layer, kind)(xi if kind == "down" else xh)
    return run


def weight_bytes(stack: DecoderStack, sparse: bool) -> int:
    total = 0
    for layer in stack.layers:
        for kind in KINDS:
            lin = getattr(layer, kind)
            total += lin.memory()["held"] if sparse else lin.weight.numel() * lin.weight.element_size()
    return total


def step_model(stack: DecoderStack, shape: Shape, n: int, value: int, sparse: bool):
    """(bytes, flops) a step must move / compute: weights (dense, or values + bitmap), KV cache, x and y."""
    nbytes = flops = 0
    for layer in stack.layers:
        for kind, (m, k) in shape.linear_shapes().items():
            nnz = getattr(layer, kind).nnz if sparse else m * k
            nbytes += (nnz * value + m * k // 8 if sparse else m * k * value) + n * (m + k) * value
            flops += 2.0 * nnz * n
        nbytes += 2 * n * shape.kv_heads * (shape.context + 1) * shape.head_dim * value
        flops += 4.0 * n * shape.heads * (shape.context + 1) * shape.head_dim
    return nbytes, flops


def routes_by_kind(stack: DecoderStack, n: int) -> Dict[str, str]:
    """kind -> the form chosen for bucket(n), over the layers ("bitmap" or "bitmap x3, dense x1")."""
    bucket = 1 << (n - 1).bit_length()
    out = {}
    for kind in KINDS:
        got = Counter(getattr(layer, kind).routes.get(bucket, "?") for layer in stack.layers)
        out[kind] = ", ".join(r if len(got) == 1 else f"{r} x{c}" for r, c in got.most_common())
    return out


def _graphed(fn):
    """fn captured into a CUDA graph (after warm-up on a side stream): (replay, the output tensor)."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def decode_suite(ctx: Context) -> List[Job]:
    shape = LLAMA3_8B if ctx.cuda else TINY
    if ctx.layers:
        shape = replace(shape, layers=ctx.layers)
    tokens = ctx.widths or ((1, 2, 4, 8, 16) if ctx.cuda or not ctx.quick else (1, 16))
    dtype, dlabel = (torch.bfloat16, "bfloat16") if ctx.cuda else (torch.float32, "float32")
    rate = dlabel  # the GEMM rate of the floor: the stack's dtype
    value = torch.tensor([], dtype=dtype).element_size()
    stack_name = f"{shape.layers}-layer stack {shape.hidden}/{shape.inner}"

    def job(sparsity, scheme, seed):
        def run():
            stack = dense_stack(shape, ctx.device, dtype, seed)
            norms = calibrate(stack, shape, ctx.device, dtype, seed=seed + 1)
            dense, sparse = pruned_stacks(stack, norms, sparsity, scheme)
            del stack
            st.nn.prepare(sparse, tokens, progress=False)  # every token count decided up front, as a server does
            rope = rope_at(shape, shape.context, ctx.device, dtype)
            rows = []
            for n in tokens:
                g = torch.Generator(device=ctx.device).manual_seed(seed + n)
                x = heavy_tailed_activations(n, shape.hidden, ctx.device, dtype, g,
                                             outliers=max(1, shape.hidden // 512))
                caches = kv_caches(shape, n, ctx.device, dtype, seed + 100 + n)
                xh = torch.randn(n, shape.hidden, device=ctx.device, generator=g).to(dtype)
                xi = torch.randn(n, shape.inner, device=ctx.device, generator=g).to(dtype)
                with torch.no_grad():
                    sparse(x, caches, rope)  # warm-up
                    ref = reference(dense, x, caches, rope)
                    err_dense = _rel_err(dense(x, caches, rope), ref)
                    err_sparse = _rel_err(sparse(x, caches, rope), ref)
                    tol = max(TOL[dlabel], 2 * err_dense)
                    if not err_sparse <= tol:
                        raise AssertionError(f"decode {label(sparsity, scheme)}, N={n}: the sparse stack's relative "
                                             f"error {err_sparse:.2e} > {tol:.1e} (the dense stack's: {err_dense:.2e})")
                    steps = {DENSE: (dense, err_dense), "sparsetorch": (sparse, err_sparse)}
                    warm_gpu(ctx, {DENSE: (lambda: dense(x, caches, rope), None)})  # clocks up after the set-up
                    step_s = _time(ctx, {impl: (lambda m=m: m(x, caches, rope)) for impl, (m, _) in steps.items()})
                    lin_s = _time(ctx, {impl: linears_only(m, xh, xi) for impl, (m, _) in steps.items()})
                    name = f"{stack_name} {label(sparsity, scheme)}"
                    base = {"suite": "decode", "sparsity": label(sparsity, scheme), "n": n, "layers": shape.layers,
                            "hidden": shape.hidden, "inner": shape.inner, "context": shape.context}
                    got = []
                    for impl, (model, err) in steps.items():
                        nbytes, flops = step_model(model, shape, n, value, impl == "sparsetorch")
                        got.append(_row(ctx, {**base, "case": f"{name}, N={n}"}, impl, dlabel, step_s[impl],
                                        nbytes, flops, rate, err, lin_s[impl], model, n, shape))
                    if ctx.cuda:
                        got += _graph_rows(ctx, steps, base, name, n, x, caches, rope, ref, tol,
                                           dlabel, rate, value, shape)
                _vs_dense(got)
                rows += got
            return rows

        return run

    return [job(s, scheme, 48 + 10 * i) for i, (s, scheme) in enumerate(SPARSITIES)]


def _graph_rows(ctx, steps, base, name, n, x, caches, rope, ref, tol, dlabel, rate, value, shape):
    rows = []
    for impl, (model, _) in steps.items():
        try:
            graph, out = _graphed(lambda: model(x, caches, rope))
        except RuntimeError as e:  # reported, not fatal: the eager rows stand
            ctx.leave_out(f"decode {name}, N={n}: CUDA graph of {impl}", f"capture failed ({str(e)[:120]})")
            return rows
        graph.replay()
        err = _rel_err(out, ref)
        if not err <= tol:
            raise AssertionError(f"decode {name}, N={n}, CUDA graph of {impl}: relative error {err:.2e} > {tol:.1e}")
        nbytes, flops = step_model(model, shape, n, value, impl == "sparsetorch")
        rows.append(_row(ctx, {**base, "case": f"{name}, N={n}, CUDA graph", "graph": True}, impl, dlabel,
                         ctx.weights_timer(graph.replay), nbytes, flops, rate, err, None, model, n, shape))
        del graph
    return rows


def _time(ctx: Context, fns: Dict[str, Callable]) -> Dict[str, float]:
    """Median seconds per call: the step timer on CUDA (wall time with a synchronize: eager steps are
    host-bound, and no queued wait may hide the host's time, as the device timers' would); on the CPU the
    implementations interleaved in rounds (cpu.py's time_rounds), so that a change of load on a shared
    machine hits them alike."""
    if ctx.cuda:
        return {k: ctx.step_timer(f) for k, f in fns.items()}
    return {k: statistics.median(v) for k, v in time_rounds(fns, rounds=5, budget_s=1.0).items()}


def _rel_err(out, ref) -> float:
    d = ref.norm().item()
    return (out.double() - ref).norm().item() / (d if d > 0 else 1.0)


def _row(ctx, base, impl, dlabel, seconds, nbytes, flops, rate, err, lin_s, model, n, shape) -> dict:
    floor = ctx.ceilings.floor(nbytes, flops, rate)
    sparse = impl == "sparsetorch"
    row = {**base, "impl": impl, "dtype": dlabel, "time_ms": seconds * 1e3, "GBps": nbytes / seconds / 1e9,
           "GFLOPs": flops / seconds / 1e9, "floor_ms": floor * 1e3, "of_floor": floor / seconds, "rel_err": err,
           "tokens_per_s": n / seconds, "floor_tokens_per_s": n / floor, "per_layer_ms": seconds * 1e3 / shape.layers,
           "weight_MiB": weight_bytes(model, sparse) / 2**20}
    if lin_s is not None:
        row["linear_ms"], row["linear_share"] = lin_s * 1e3, min(1.0, lin_s / seconds)
    if sparse:
        row["routes"] = routes_by_kind(model, n)
    return row


def _vs_dense(rows: List[dict]) -> None:
    dense = {r["case"]: r["time_ms"] for r in rows if r["impl"] == DENSE}
    for r in rows:
        t = dense.get(r["case"])
        r["vs_dense"] = t / r["time_ms"] if t else None


def headlines(rows: List[dict]) -> List[str]:
    """Per sparsity (and eager / CUDA graph): the sparse stack's tokens/s against the dense stack's at each N."""
    dec = [r for r in rows if r["suite"] == "decode" and r["impl"] == "sparsetorch" and r.get("vs_dense")]
    groups: Dict[tuple, List[dict]] = {}
    for r in dec:
        groups.setdefault((r["sparsity"], bool(r.get("graph")), bool(r.get("cpu"))), []).append(r)
    lines = []
    for (sparsity, graph, cpu), rs in groups.items():
        r0 = rs[0]
        parts = []
        for r in sorted(rs, key=lambda r: r["n"]):
            dense_tps = r["tokens_per_s"] / r["vs_dense"]
            if all(route == "dense" for route in r.get("routes", {}).values()):
                parts.append(f"N={r['n']} dense fallback (every projection chose its dense form; "
                             f"{r['tokens_per_s']:.0f} vs {dense_tps:.0f} tokens/s)")
            else:
                parts.append(f"N={r['n']} {versus(r['vs_dense'])} ({r['tokens_per_s']:.0f} vs {dense_tps:.0f} "
                             "tokens/s)")
        layers = f"{r0['layers']} layer{'s' if r0['layers'] > 1 else ''}"
        lines.append(f"decode {sparsity}{' (cuda graph)' if graph else ''}{' (cpu)' if cpu else ''}, {layers} of "
                     f"hidden {r0['hidden']}: the SparseLinear stack against the pruned weights stored dense: "
                     + "; ".join(parts))
    return lines


__all__ = ["DecoderLayer", "DecoderStack", "LLAMA3_8B", "Shape", "TINY", "calibrate", "decode_suite", "dense_stack",
           "headlines", "kv_caches", "pruned_stacks", "reference", "rope_at", "routes_by_kind"]
