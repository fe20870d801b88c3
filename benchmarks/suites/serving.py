"""The serving suite: pruned layers as a server runs them, a new token count nearly every step, first calls
included, and the memory they hold.

**The sequence** (fixed, seed 2026): 280 decode steps of 1-64 tokens and 20 prefill chunks of 128-2048 tokens
at random places among them; token counts log-uniform in each range (as many steps of 1-2 tokens as of 32-64).
On the CPU: 60 decode steps of 1-16 tokens and 4 prefill chunks of 32-128.

**Models** (bf16 on CUDA, float32 on the CPU at a sixteenth of the sizes): a Llama-3-8B MLP block (gate and up
4096 -> 14336, down 14336 -> 4096; down(silu(gate(x)) * up(x))) pruned to 70% per row, 90% global and 2:4; and
the projections of a 4-layer Llama-3-8B decoder stack (q, k, v, o, gate, up, down of each layer: 28 layers
in sequence, attention left out) at 2:4.

**Implementations**, each on fresh layers and an emptied tuning table (a new process), run over the whole
sequence; every step synchronised and timed (wall clock), each call in it timed by CUDA events (the time it
holds the stream: a first call's builds count). The process's
one-time costs are taken first, untimed: the dense sequence once (cuBLAS's kernels for every shape) and every
form's kernel on a small weight (the code loaded, cuSPARSELt initialised):

* ``dense F.linear``: the pruned weights stored dense, each call a bare ``F.linear`` (the baseline).
* ``dense nn.Linear``: the same weights in ``nn.Linear`` modules (bias-free), as a dense model calls them:
  the module call's host time is the part of a SparseLinear call's overhead that any layer pays (a step whose
  kernels finish before the host has launched the next ones is host-bound: then it shows in the total).
* ``sparsetorch``: ``SparseLinear.from_dense`` layers, default mode (the rule decides each new bucket, samples
  refine it).
* ``sparsetorch, cache file``: the same with the decisions of the run above loaded from a tuning cache file
  (``st.set_tuning_cache``), as a second process starts.
* ``sparsetorch, prepared from a cache file``: a second process as a server would start it: the cache file
  that a first process's ``prepare()`` saved loaded, ``prepare()`` of the sequence's buckets at load (kept
  decisions: builds only, untimed here, its time is ``prepare_cached_ms`` below), then the sequence.
* ``sparsetorch compact``: after ``st.nn.compact``: one stored form per layer, large token counts expanded
  to dense for the call.
* ``sparsetorch compact, cache file``.
* ``prepare``: ``SparseLinear.prepare`` of the sequence's buckets on each layer (the time per 14336 x 4096 layer
  is in ``prepare_ms``; ``prepare_cached_ms``: the same with the cache file that first prepare() saved loaded,
  as a second process loads: the decisions kept, the forms built).

**Repetitions.** Single runs of this 60 ms sequence moved by up to 10% (the dense sequence alone by 11% between
cases of one process, H100): each sparse mode runs ``REPEATS`` times, each time on fresh layers and an
emptied tuning table, between two runs of the dense sequence; its ratio is the dense neighbours' mean over
its time, and the row reports the repetition of median ratio (``vs_dense_runs``: every repetition's ratio,
ascending; ``time_ms_runs``: their totals in the same order, dense's in the order run).

Row fields: ``time_ms`` (the sequence's total; dense: the median of its runs), ``vs_dense``, ``costliest_ms``
(the costliest single call of one layer over every repetition, first calls included) and the call it was,
``held_bytes`` (per layer, after the sequence: the CSR and every form held; compact: the stored form) against
dense (``held_vs_dense``) and against the smallest form (``held_vs_smallest``: the compact stored form's
bytes), ``peak_transient_bytes`` (a compact layer's dense expansion). The floor is not a useful bound for a
sequence of first calls: none is given.

**End to end** (its own suite, ``--suites e2e``, CUDA only; 40 s on an H100, compilation included): a
causal LM with random weights in the Llama-3 layout (2 layers of Llama-3-8B's shapes, vocabulary 32000, a
static KV cache of 512 positions), Wanda-pruned to 2:4 with calibration data, prepared and compacted, decoding
256 tokens greedily at batch sizes 1 and 16, eager and compiled (``torch.compile(mode="reduce-overhead")``),
against the dense model run the same ways: tokens/s and the bytes of the linear layers' weights; the floor:
every weight (the linear layers' stored bytes, the lm_head) and the whole KV cache read once per step at the
measured copy bandwidth.
"""
from __future__ import annotations

import contextlib
import gc
import os
import tempfile
import time
from typing import Callable, Dict, List

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

import sparsetorch as st
from sparsetorch.timing import Sample
from benchmarks.suites.common import Context, Job
from benchmarks.suites.decode import LLAMA3_8B, TINY, calibrate, dense_stack, heavy_tailed_weight
from sparsetorch.pruned import wanda_prune

DENSE = "dense F.linear"
DENSE_MODULES = "dense nn.Linear"
PREPARED = "sparsetorch, prepared from a cache file"
REPEATS = 3  # runs of each sparse mode, each between two dense runs (module docstring)
# The MLP block's prunings: short name -> (case name, weights' seed, sparsity, scheme); also
# benchmarks/serving_profile.py's cases.
MLP_CASES = {"2:4": ("MLP block 2:4", 3, 0.5, "2:4"), "90%": ("MLP block 90%", 2, 0.9, "global"),
             "70%": ("MLP block 70% per row", 1, 0.7, "row")}


def serving_sequence(cuda: bool, seed: int = 2026) -> List[int]:
    """Token counts of the sequence (module docstring)."""
    rng = np.random.default_rng(seed)
    decode, dec_max, prefill, (pre_lo, pre_hi) = (280, 64, 20, (128, 2048)) if cuda else (60, 16, 4, (32, 128))
    steps = np.floor(np.exp(rng.uniform(0.0, np.log(dec_max + 1), decode))).astype(int).clip(1, dec_max).tolist()
    chunks = np.floor(np.exp(rng.uniform(np.log(pre_lo), np.log(pre_hi + 1), prefill))).astype(int)
    for size in chunks.clip(pre_lo, pre_hi):
        steps.insert(int(rng.integers(0, len(steps) + 1)), int(size))
    return steps


def _dense_linear(w: torch.Tensor) -> Callable:
    return lambda a: F.linear(a, w)


@contextlib.contextmanager
def _collected_and_frozen():
    """Python's full collections scan every live object: the garbage and survivors of earlier cases would land
    a 50-100 ms pause on whichever call triggers one (on the CPU machine: 72 ms inside one call). Collected
    first and frozen, a collection during the sequence scans only what the sequence made."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _run_sequence(ctx: Context, layers: List[Callable], mlp: bool, steps: List[int], pool: torch.Tensor,
                  pool_inner: torch.Tensor):
    """(total seconds, per-layer call seconds of every step). Each step ends in a synchronize, as a server's
    does (its next step needs this one's output), and its wall time counts in the total; the calls inside a
    step are timed without a synchronize between them (``st.timing.Sample``: CUDA events around each call,
    the time it holds the stream, host stalls included where the GPU waits for them, so a first call's builds
    are charged to it; the wall clock on the CPU). The MLP's silu product counts in the step, not in a call."""
    sync = torch.cuda.synchronize if ctx.cuda else (lambda *a: None)
    costs = []
    total = 0.0

    def timed(call, *args):
        sample = Sample(ctx.device)
        sample.start()
        out = call(*args)
        sample.stop()
        return out, sample

    with _collected_and_frozen(), torch.no_grad():
        sync()
        for n in steps:
            x = pool[:n]
            t0 = time.perf_counter()
            if mlp:
                gate, up, down = layers
                g, s_gate = timed(gate, x)
                u, s_up = timed(up, x)
                _, s_down = timed(down, F.silu(g) * u)
                samples = [s_gate, s_up, s_down]
            else:
                samples = [timed(layer, pool_inner[:n] if k_in == "inner" else x)[1] for layer, k_in in layers]
            sync()
            total += time.perf_counter() - t0
            costs.append([1e-3 * s.ms() for s in samples])
    return total, costs


def _worst_of_runs(runs) -> List[List[float]]:
    """Per step and layer, the largest cost over several runs' per-call costs (_run_sequence's)."""
    return [[max(c) for c in zip(*per)] for per in zip(*runs)]


def _held(layers: List[nn.Module]) -> List[int]:
    return [m.memory()["held"] if isinstance(m, st.nn.SparseLinear) else m.numel() * m.element_size()
            for m in layers]


def fresh_layers(weights: Dict[str, torch.Tensor], sparsity, scheme: str) -> List[st.nn.SparseLinear]:
    """The pruned layers of ``weights`` (kind -> dense weight) as a server loads them: inference only."""
    return [st.nn.SparseLinear.from_dense(w, sparsity=sparsity, scheme=scheme).requires_grad_(False)
            for w in weights.values()]


def input_pools(ctx: Context, steps: List[int], weights: Dict[str, torch.Tensor], inner_kinds=("down",)):
    """The inputs each step slices: (tokens, hidden) rows for the layers reading the hidden state, (tokens,
    inner) rows for ``inner_kinds`` (a stack's layers called alone; the MLP block feeds down its own product)."""
    dtype = next(iter(weights.values())).dtype
    hidden = next(w.shape[1] for k, w in weights.items() if k not in inner_kinds)
    inner = max(w.shape[1] for w in weights.values())
    g = torch.Generator(device=ctx.device).manual_seed(7)
    pool = torch.randn(max(steps), hidden, device=ctx.device, generator=g).to(dtype)
    return pool, torch.randn(max(steps), inner, device=ctx.device, generator=g).to(dtype)


def _serving_job(ctx: Context, name: str, weights: Dict[str, torch.Tensor], sparsity, scheme: str, mlp: bool,
                 inner_kinds=("down",)) -> Job:
    def run():
        steps = serving_sequence(ctx.cuda)
        dtype = next(iter(weights.values())).dtype
        pool, pool_inner = input_pools(ctx, steps, weights, inner_kinds)
        kinds = list(weights)
        new_layers = lambda: fresh_layers(weights, sparsity, scheme)  # noqa: E731

        def as_calls(layers):
            if mlp:
                return layers
            return [(layer, "inner" if kind in inner_kinds else "hidden") for layer, kind in zip(layers, kinds)]

        rows = []
        base = {"suite": "serving", "case": name, "sparsity": sparsity if scheme != "2:4" else "2:4",
                "steps": len(steps), "tokens": int(sum(steps)), "dtype": str(dtype).replace("torch.", "")}
        dense_w = {kind: layer.to_dense().detach() for kind, layer in zip(kinds, new_layers())}
        masks = {k: w.numel() * w.element_size() for k, w in dense_w.items()}
        dense_calls = [_dense_linear(dense_w[k]) for k in kinds]
        # The process's one-time costs are no layer's (the rule: the first cuBLAS and cuSPARSELt calls,
        # which initialise those libraries, aside): the dense sequence once untimed (cuBLAS's kernels for every
        # shape loaded), and every form's kernel once on a small weight.
        _warm_libraries(ctx, dtype)
        _run_sequence(ctx, as_calls(dense_calls), mlp, steps, pool, pool_inner)
        dense_runs = []  # (total, costs) of every dense run, in order

        def dense_once():
            dense_runs.append(_run_sequence(ctx, as_calls(dense_calls), mlp, steps, pool, pool_inner))
            return dense_runs[-1][0]

        results = {}  # label -> (total, costs, held, peak, ratio, every repetition's ratio, their totals)
        folder = tempfile.mkdtemp(prefix="st-serving-")
        cache, compact_cache = os.path.join(folder, "tuning.json"), os.path.join(folder, "tuning-compact.json")

        def sparse_once(make_layers, path, load_cache, save_cache, prepare_at_load):
            st.clear_tuning()
            st.clear_caches()
            layers = make_layers()
            if load_cache:
                st.set_tuning_cache(path)
            if prepare_at_load:  # a server's load: untimed here, its cost is the prepare row's prepare_cached_ms
                for layer in layers:
                    layer.prepare(steps)
            total, costs = _run_sequence(ctx, as_calls(layers), mlp, steps, pool, pool_inner)
            if save_cache:
                st.save_tuning_cache(path)
            st.set_tuning_cache(None)
            peak = max(m.memory()["peak_transient"] for m in layers)
            return total, costs, _held(layers), peak

        def interleaved(label, run_once):
            """REPEATS runs of ``run_once(rep) -> (total, costs, held, peak)``, each between two dense runs."""
            reps = []
            for rep in range(REPEATS):
                before = dense_once()
                total, costs, held, peak = run_once(rep)
                reps.append(((before + dense_once()) / 2 / total, total, costs, held, peak))
            reps.sort(key=lambda r: r[0])
            median = reps[len(reps) // 2]
            results[label] = (median[1], _worst_of_runs(r[2] for r in reps), median[3], max(r[4] for r in reps),
                              median[0], [r[0] for r in reps], [r[1] for r in reps])

        def sparse_run(label, make_layers, path, load_cache, save_cache, prepare_at_load=False):
            """Fresh layers in every repetition; the first saves the cache file."""
            interleaved(label, lambda rep: sparse_once(make_layers, path, load_cache, save_cache and rep == 0,
                                                       prepare_at_load))

        def modules_run():
            """The dense weights in nn.Linear modules."""
            modules = []
            for k in kinds:  # the very tensors F.linear multiplies (no copy: the same memory, the same GEMM)
                w = dense_w[k]
                module = nn.Linear(w.shape[1], w.shape[0], bias=False, device="meta", dtype=w.dtype)
                module.weight = nn.Parameter(w, requires_grad=False)
                modules.append(module)
            interleaved(DENSE_MODULES, lambda rep: (*_run_sequence(ctx, as_calls(modules), mlp, steps, pool,
                                                                   pool_inner), [masks[k] for k in kinds], 0))

        modules_run()
        sparse_run("sparsetorch", new_layers, cache, False, True)
        sparse_run("sparsetorch, cache file", new_layers, cache, True, False)
        compact_layers = lambda: [m.compact() for m in new_layers()]  # noqa: E731
        smallest = [m.memory()["stored"] for m in compact_layers()]
        sparse_run("sparsetorch compact", compact_layers, compact_cache, False, True)
        sparse_run("sparsetorch compact, cache file", compact_layers, compact_cache, True, False)
        # prepare(): every bucket decided up front, by timing (a first process, which saves its decisions) and
        # again with that cache file loaded (a second process: the decisions kept, the forms built)
        prepared_cache = os.path.join(folder, "tuning-prepared.json")

        def timed_prepare(load_cache):
            st.clear_tuning()
            if load_cache:
                st.set_tuning_cache(prepared_cache)
            layers = new_layers()
            if ctx.cuda:
                torch.cuda.synchronize()
            per_layer = []
            for layer in layers:
                t = time.perf_counter()
                layer.prepare(steps)  # the sequence's buckets (on CUDA 1..2048, every default one)
                if ctx.cuda:
                    torch.cuda.synchronize()
                per_layer.append(time.perf_counter() - t)
            if not load_cache:
                st.save_tuning_cache(prepared_cache)
            st.set_tuning_cache(None)
            st.clear_tuning()
            return per_layer

        per_layer, per_layer_cached = timed_prepare(False), timed_prepare(True)
        sparse_run(PREPARED, new_layers, prepared_cache, True, False, prepare_at_load=True)
        dense_totals = sorted(t for t, _ in dense_runs)
        dense_total = dense_totals[len(dense_totals) // 2]
        dense_row = (dense_total, _worst_of_runs(c for _, c in dense_runs), [masks[k] for k in kinds], 0, 1.0, [1.0],
                     [t for t, _ in dense_runs])
        results = {DENSE: dense_row, **results}

        for impl, (total, costs, held, peak, ratio, ratios, totals) in results.items():
            worst = max(((c, i, n) for n, per in zip(steps, costs) for i, c in enumerate(per)), key=lambda t: t[0])
            row = {**base, "impl": impl, "time_ms": total * 1e3, "vs_dense": ratio,
                   "vs_dense_runs": [round(r, 3) for r in ratios], "repeats": len(ratios) if impl != DENSE
                   else len(dense_runs), "time_ms_runs": [round(t * 1e3, 3) for t in totals],
                   "costliest_ms": worst[0] * 1e3, "costliest_call": f"{kinds[worst[1]]} at N={worst[2]}",
                   "held_bytes": int(np.mean(held)), "held_vs_dense": float(np.mean([h / masks[k] for h, k in
                                                                                     zip(held, kinds)])),
                   "held_vs_smallest": float(np.mean([h / s for h, s in zip(held, smallest)])),
                   "peak_transient_bytes": int(peak)}
            rows.append(row)
        largest = [i for i, k in enumerate(kinds) if weights[k].numel() == max(w.numel() for w in weights.values())]
        rows.append({**base, "impl": "prepare", "time_ms": sum(per_layer) * 1e3,
                     "prepare_ms": 1e3 * max(per_layer[i] for i in largest), "layers": len(per_layer),
                     "prepare_cached_ms": 1e3 * max(per_layer_cached[i] for i in largest)})
        return rows

    return run


def _warm_libraries(ctx: Context, dtype: torch.dtype) -> None:
    """Every form's kernel (and cuSPARSELt) run once on a small weight, so that loading code is not timed."""
    torch.manual_seed(0)
    w = torch.randn(128, 256, device=ctx.device, dtype=dtype)
    with torch.no_grad():
        for fmt, scheme in (("2:4", "2:4"), ("bitmap", "global"), ("slots", "global"), ("csr16", "global"),
                            ("csr", "global"), ("dense", "global")):
            try:
                layer = st.nn.SparseLinear.from_dense(w, sparsity=0.5 if scheme == "2:4" else 0.8, scheme=scheme,
                                                      format=fmt)
                for n in (1, 16, 512):
                    layer(torch.randn(n, 256, device=ctx.device, dtype=dtype))
                layer.compact() if fmt == "2:4" else None
            except (RuntimeError, ValueError, TypeError):  # a form this build or GPU cannot run
                pass
    st.clear_tuning()


def _mlp_weights(ctx: Context, seed: int) -> Dict[str, torch.Tensor]:
    shape = LLAMA3_8B if ctx.cuda else TINY
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    g = torch.Generator(device=ctx.device).manual_seed(seed)
    h, i = shape.hidden, shape.inner
    return {"gate": heavy_tailed_weight(i, h, ctx.device, dtype, g), "up": heavy_tailed_weight(i, h, ctx.device, dtype, g),
            "down": heavy_tailed_weight(h, i, ctx.device, dtype, g)}


def _stack_weights(ctx: Context, seed: int) -> Dict[str, torch.Tensor]:
    shape = LLAMA3_8B if ctx.cuda else TINY
    dtype = torch.bfloat16 if ctx.cuda else torch.float32
    stack = dense_stack(shape, ctx.device, dtype, seed)
    out = {}
    for li, layer in enumerate(stack.layers):
        for kind in ("q", "k", "v", "o", "gate", "up", "down"):
            out[f"{kind}{li}"] = getattr(layer, kind).weight.detach()
    return out


# --- end to end: a small causal LM ---------------------------------------------------------------------------

class _Attention(nn.Module):
    def __init__(self, shape, linears, max_len, batch, device, dtype):
        super().__init__()
        self.shape = shape
        for kind in ("q", "k", "v", "o"):
            setattr(self, kind, linears[kind])
        size = (batch, shape.kv_heads, max_len, shape.head_dim)
        self.register_buffer("k_cache", torch.zeros(size, device=device, dtype=dtype))
        self.register_buffer("v_cache", torch.zeros(size, device=device, dtype=dtype))

    def forward(self, x, pos, mask, cos, sin):
        s = self.shape
        n = x.shape[0]
        q = self.q(x).view(n, s.heads, 1, s.head_dim)
        k = self.k(x).view(n, s.kv_heads, 1, s.head_dim)
        v = self.v(x).view(n, s.kv_heads, 1, s.head_dim)
        q, k = _rope(q, cos, sin), _rope(k, cos, sin)
        self.k_cache.index_copy_(2, pos, k)
        self.v_cache.index_copy_(2, pos, v)
        a = F.scaled_dot_product_attention(q, self.k_cache, self.v_cache, attn_mask=mask, enable_gqa=True)
        return self.o(a.reshape(n, s.hidden))


def _rope(t, cos, sin):
    half = t.shape[-1] // 2
    return t * cos + torch.cat((-t[..., half:], t[..., :half]), dim=-1) * sin


class CausalLM(nn.Module):
    """Embedding, L decoder layers (RMSNorm, attention with a static KV cache, SiLU-gated MLP), final norm and a
    dense lm_head: one decode step maps (batch,) tokens at position ``pos`` to (batch, vocab) logits."""

    def __init__(self, shape, linears: List[Dict[str, nn.Module]], vocab: int, max_len: int, batch: int, device,
                 dtype, seed: int):
        super().__init__()
        g = torch.Generator(device=device).manual_seed(seed)
        self.shape, self.max_len = shape, max_len
        self.embed = nn.Parameter((0.02 * torch.randn(vocab, shape.hidden, device=device, generator=g)).to(dtype),
                                  requires_grad=False)
        self.head = nn.Parameter((0.02 * torch.randn(vocab, shape.hidden, device=device, generator=g)).to(dtype),
                                 requires_grad=False)
        self.attn = nn.ModuleList(_Attention(shape, lin, max_len, batch, device, dtype) for lin in linears)
        self.mlp = nn.ModuleList(nn.ModuleDict({k: lin[k] for k in ("gate", "up", "down")}) for lin in linears)
        inv = 1.0 / (500000.0 ** (torch.arange(0, shape.head_dim, 2, device=device, dtype=torch.float64)
                                  / shape.head_dim))
        angle = torch.arange(max_len, device=device, dtype=torch.float64)[:, None] * inv
        angle = torch.cat((angle, angle), dim=-1)
        self.register_buffer("cos", angle.cos().to(dtype))
        self.register_buffer("sin", angle.sin().to(dtype))

    def forward(self, tokens, pos):
        s = self.shape
        x = self.embed[tokens]
        mask = (torch.arange(self.max_len, device=tokens.device) <= pos).view(1, self.max_len)  # (query, key)
        cos, sin = self.cos[pos], self.sin[pos]
        for attn, mlp in zip(self.attn, self.mlp):
            x = x + attn(F.rms_norm(x, (s.hidden,), eps=1e-5), pos, mask, cos, sin)
            h = F.rms_norm(x, (s.hidden,), eps=1e-5)
            x = x + mlp["down"](F.silu(mlp["gate"](h)) * mlp["up"](h))
        return F.linear(F.rms_norm(x, (s.hidden,), eps=1e-5), self.head)


def _decode(model: CausalLM, batch: int, tokens: int, device, step=None) -> float:
    """Seconds to decode ``tokens`` tokens greedily from token 1 at position 0 (caches zeroed first)."""
    step = model if step is None else step  # (a compiled module has no truth value: OptimizedModule.__len__)
    for attn in model.attn:
        attn.k_cache.zero_()
        attn.v_cache.zero_()
    tok = torch.ones(batch, dtype=torch.long, device=device)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    with torch.no_grad():
        sync()
        t0 = time.perf_counter()
        for p in range(tokens):
            pos = torch.full((1,), p, dtype=torch.long, device=device)
            tok = step(tok, pos).argmax(-1)
        sync()
    return time.perf_counter() - t0


def _decode_step_bytes(model: CausalLM, linear_bytes: int) -> float:
    """The bytes one decode step reads at least: every weight once (the linear layers' stored bytes, the
    lm_head) and the whole KV cache (attention reads every position, masked). Norms, activations and the
    embedding rows are under 0.1% of it; the flops (2 per weight and token: 18 GFLOP a dense step at batch 16)
    take under 6% of the bytes' time on an H100, so the floor is the bytes'."""
    head = model.head.numel() * model.head.element_size()
    cache = sum(b.numel() * b.element_size() for a in model.attn for b in (a.k_cache, a.v_cache))
    return float(linear_bytes + head + cache)


def _e2e_job(ctx: Context, shape=LLAMA3_8B, name: str = "Llama-3-8B", layers: int = 2, vocab: int = 32000,
             max_len: int = 512, tokens: int = 256, batches=(1, 16), modes=("eager", "compiled")) -> Job:
    """The suite's model (module docstring); the arguments shrink it for the CPU test of its plumbing."""
    def run():
        dtype = torch.bfloat16
        from dataclasses import replace

        model_shape = replace(shape, layers=layers)
        stack = dense_stack(model_shape, ctx.device, dtype, seed=5)
        norms = calibrate(stack, model_shape, ctx.device, dtype, seed=6)
        dense_lin, sparse_lin = [], []
        for i, layer in enumerate(stack.layers):
            d, s = {}, {}
            for kind in ("q", "k", "v", "o", "gate", "up", "down"):
                w, imp = getattr(layer, kind).weight, norms[f"layers.{i}.{kind}"]
                d[kind] = nn.Linear(w.shape[1], w.shape[0], bias=False, device=ctx.device, dtype=dtype)
                with torch.no_grad():
                    d[kind].weight.copy_(wanda_prune(w, imp, 0.5, "2:4"))
                d[kind].requires_grad_(False)
                s[kind] = st.nn.SparseLinear.from_dense(w, scheme="2:4", importance=imp).requires_grad_(False)
            dense_lin.append(d)
            sparse_lin.append(s)
        del stack
        rows = []
        for batch in batches:
            dense = CausalLM(model_shape, dense_lin, vocab, max_len, batch, ctx.device, dtype, seed=9)
            sparse = CausalLM(model_shape, sparse_lin, vocab, max_len, batch, ctx.device, dtype, seed=9)
            st.nn.prepare(sparse, [batch], progress=False)
            st.nn.compact(sparse)
            dense_bytes = sum(m.weight.numel() * m.weight.element_size() for d in dense_lin for m in d.values())
            sparse_bytes = sum(m.memory()["held"] for s in sparse_lin for m in s.values())
            for mode in modes:
                for impl, model in (("dense", dense), ("sparsetorch compact", sparse)):
                    step = model if mode == "eager" else torch.compile(model, mode="reduce-overhead", fullgraph=True)
                    t_compile = time.perf_counter()
                    _decode(model, batch, 3, ctx.device, step)  # warm-up (and compilation)
                    compile_s = time.perf_counter() - t_compile
                    seconds = _decode(model, batch, tokens, ctx.device, step)
                    linear_bytes = dense_bytes if impl == "dense" else sparse_bytes
                    row = {"suite": "e2e", "case": f"e2e causal LM, {layers} {name} layers 2:4, batch {batch}, "
                           f"{mode}", "impl": impl, "dtype": "bfloat16", "batch": batch, "mode": mode,
                           "time_ms": seconds * 1e3, "tokens_per_s": batch * tokens / seconds, "warmup_s": compile_s,
                           "linear_weight_bytes": linear_bytes}
                    if ctx.ceilings is not None:
                        floor = tokens * ctx.ceilings.floor(_decode_step_bytes(model, linear_bytes), 0.0, "bfloat16")
                        row.update(floor_ms=floor * 1e3, of_floor=floor / seconds,
                                   floor_tokens_per_s=batch * tokens / floor)
                    rows.append(row)
            torch._dynamo.reset()
        dense_rows = {r["case"]: r["time_ms"] for r in rows if r["impl"] == "dense"}
        for r in rows:
            r["vs_dense"] = dense_rows[r["case"]] / r["time_ms"]
        return rows

    return run


def serving_suite(ctx: Context) -> List[Job]:
    jobs = [_serving_job(ctx, name, _mlp_weights(ctx, seed), sparsity, scheme, mlp=True)
            for name, seed, sparsity, scheme in MLP_CASES.values()]
    if not ctx.quick:  # --full: the stack's 28 projections
        jobs.append(_serving_job(ctx, "4-layer decoder stack projections 2:4", _stack_weights(ctx, 4), 0.5, "2:4",
                                 mlp=False, inner_kinds=tuple(f"down{i}" for i in range(8))))
    return jobs


def e2e_suite(ctx: Context) -> List[Job]:
    """The end-to-end pruned causal LM (module docstring), on CUDA."""
    if not ctx.cuda:
        ctx.leave_out("e2e (the whole suite)", "CUDA only: Llama-3-8B's layer shapes in bf16, decoding under CUDA "
                      "graphs")
        return []
    return [_e2e_job(ctx, batches=(batch,)) for batch in (1, 16)]  # a job each: a run cut short keeps the first


def headlines(rows: List[dict]) -> List[str]:
    lines = []
    for case in dict.fromkeys(r["case"] for r in rows if r.get("suite") == "e2e"):
        got = {r["impl"]: r for r in rows if r.get("case") == case}
        dense, sparse = got.get("dense"), got.get("sparsetorch compact")
        if dense and sparse:
            mib = {impl: r["linear_weight_bytes"] / 2**20 for impl, r in (("dense", dense), ("sparse", sparse))}
            lines.append(f"{case}: sparsetorch compact {sparse['tokens_per_s']:.0f} tokens/s against dense "
                         f"{dense['tokens_per_s']:.0f} ({sparse['vs_dense']:.2f}x); linear weights "
                         f"{mib['sparse']:.0f} MiB against {mib['dense']:.0f} MiB"
                         + (f"; {sparse['of_floor']:.0%} / {dense['of_floor']:.0%} of their byte floors"
                            if "of_floor" in sparse and "of_floor" in dense else ""))
    for case in dict.fromkeys(r["case"] for r in rows if r.get("suite") == "serving"):
        got = {r["impl"]: r for r in rows if r.get("case") == case}
        parts = []
        modules = got.get(DENSE_MODULES)
        if modules:
            parts.append(f"{DENSE_MODULES} {modules['vs_dense']:.2f}x F.linear")
        for impl in ("sparsetorch", "sparsetorch, cache file", PREPARED, "sparsetorch compact",
                     "sparsetorch compact, cache file"):
            r = got.get(impl)
            if r:
                runs = r.get("vs_dense_runs") or [r["vs_dense"]]
                parts.append(f"{impl} {r['vs_dense']:.2f}x dense (runs {min(runs):.2f}-{max(runs):.2f}; "
                             f"costliest call {r['costliest_ms']:.1f} ms, holds {r['held_vs_dense']:.2f}x dense)")
        prep = got.get("prepare")
        if prep and prep.get("prepare_ms"):
            cached = prep.get("prepare_cached_ms")
            parts.append(f"prepare {prep['prepare_ms']:.0f} ms per largest layer"
                         + (f" ({cached:.1f} ms with the cache file)" if cached is not None else ""))
        lines.append(f"serving {case}: " + "; ".join(parts))
    return lines
