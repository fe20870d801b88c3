"""The pruned-model suite: SparseLinear (the form it chooses per token count) against dense cuBLAS
``F.linear``, torch's 2:4 (``to_sparse_semi_structured`` through ``F.linear``, and ``torch._cslt_sparse_mm``
on a compressed weight) and block-sparse BSR at the same sparsity, y = x @ W.T.

Weights: 4096 x 4096, 11008 x 4096, 4096 x 11008 (Llama-7B's attention and MLP shapes), magnitude-pruned
(global) to 50/70/90/95% and to 2:4; tokens N = 1, 16, 128, 2048; bfloat16. Then a Llama-style MLP block
(down(silu(gate(x)) * up(x)), 4096 -> 11008 -> 4096) in a decode step (N = 1, 16) and a prefill step
(N = 2048). On the CPU: float32 at a quarter of the sizes (so CI runs it). Last, the decode suite's jobs
(decode.py: decode steps of a Wanda-pruned Llama-3-8B-shaped decoder stack; their rows are suite "decode").

Floors: for dense, the GEMM model (weight + x + y bytes over the copy bandwidth, 2mkN flops at the bf16
tensor-core rate); for the sparse rows, an ideal compressed format (values + a bitmap: nnz * value +
m*k/8 bytes, plus x and y) against the useful flops (2 * nnz * N) at the dense tensor-core rate, which a
2:4 weight's sparse tensor cores reach at most; for the MLP block the sum of its three layers.
Times: device events with the L2 read (clean) before each call, as a layer meets it in a decoder step
(harness.make_clean_l2_timer), not zeroed as do_bench does. Each layer decides its token counts up front
(``SparseLinear.prepare``, as a server does at load: the steady state; the serving suite measures first calls
and the rule alone). Each sparse row records the route the layer chose for that N (``route``), what prepare()
measured for every candidate form (``route_times``),
``vs_dense`` (dense time / this time) and, for the cuSPARSELt paths, the host time per call.
"""
from __future__ import annotations

from typing import List

import torch
import torch.nn.functional as F

import sparsetorch as st
from benchmarks.suites.common import Context, Job, copies, gemm_model, host_time_per_call, measure
from benchmarks.suites.decode import decode_suite

SHAPES_CUDA = ((4096, 4096), (11008, 4096), (4096, 11008))
SHAPES_CPU = ((256, 256), (688, 256), (256, 688))


def _sparse_model(nnz: int, m: int, k: int, n: int, value: int):
    """An ideal compressed format: values + a bitmap, x read, y written; useful flops."""
    return nnz * value + m * k // 8 + (n * k + n * m) * value, 2.0 * nnz * n


def _weight(m: int, k: int, device, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    return (torch.randn(m, k, device=device, generator=g) / k ** 0.5).to(dtype)


def _block_sparse(m: int, k: int, sparsity: float, block: int, device, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator(device=device).manual_seed(seed)
    keep = torch.rand(m // block, k // block, device=device, generator=g) >= sparsity
    mask = keep.repeat_interleave(block, 0).repeat_interleave(block, 1)
    return torch.where(mask, _weight(m, k, device, dtype, seed + 1), torch.zeros((), dtype=dtype, device=device))


def _layer(w: torch.Tensor, label, activation=None) -> st.nn.SparseLinear:
    if label == "2:4":
        return st.nn.SparseLinear.from_dense(w, scheme="2:4", activation=activation)
    return st.nn.SparseLinear.from_dense(w, sparsity=label, scheme="global", activation=activation)


def _label(s) -> str:
    return s if isinstance(s, str) else f"{100 * s:g}%"


def pruned_suite(ctx: Context) -> List[Job]:
    if ctx.cuda:
        shapes, tokens, dtype, label, block = SHAPES_CUDA, (1, 16, 128, 2048), torch.bfloat16, "bfloat16", 64
        mlp = (4096, 11008, (1, 16, 2048))
    else:
        shapes, dtype, label, block = SHAPES_CPU, torch.float32, "float32", 16
        tokens = (1, 16) if ctx.quick else (1, 16, 128)
        mlp = (256, 688, (1, 16) if ctx.quick else (1, 16, 128))
        if ctx.quick:
            shapes = shapes[1:2]
    # The main targets first (2:4 and 90%), so a run cut short still has them.
    sparsities = ("2:4", 0.9, 0.5, 0.7, 0.95) if ctx.cuda or not ctx.quick else ("2:4", 0.9)
    rate = "bfloat16" if ctx.cuda else "float32"
    value = torch.tensor([], dtype=dtype).element_size()

    def layer_job(m, k, s, seed):
        def run():
            w = _weight(m, k, ctx.device, dtype, seed)
            layer = _layer(w, s).to(ctx.device)
            layer.prepare(tokens)  # every token count decided up front, as a server does at load
            wp = layer.to_dense().detach()
            nnz = layer.nnz
            rows = []
            torch_24 = torch_cslt = forced = None
            if ctx.cuda and s == "2:4":
                try:
                    torch_24 = torch.sparse.to_sparse_semi_structured(wp)
                    torch_cslt = torch._cslt_compress(wp)
                except (RuntimeError, AttributeError) as e:  # torch built without it
                    ctx.leave_out("pruned: torch's 2:4 baselines", f"unavailable in this torch ({type(e).__name__}: "
                                  f"{str(e)[:100]})")
            bsr_w = _block_sparse(m, k, 0.5 if s == "2:4" else s, block, ctx.device, dtype, seed + 7)
            bsr = bsr_w.to_sparse_bsr((block, block))
            for n in tokens:
                g = torch.Generator(device=ctx.device).manual_seed(seed + n)
                x64 = torch.randn(n, k, device=ctx.device, generator=g, dtype=torch.float64)
                x = x64.to(dtype)
                ref = x.double() @ wp.double().t()
                sb, sf = _sparse_model(nnz, m, k, n, value)
                gb, gf = gemm_model(n, k, m, value)
                xs = copies(ctx, x, gb)
                impls = {
                    "sparsetorch": (lambda a: layer(a), xs, sb, sf, rate, label),
                    "dense F.linear": (lambda a: F.linear(a, wp), xs, gb, gf, rate, label),
                }
                if torch_24 is not None:
                    impls["torch to_sparse_semi_structured"] = (lambda a: F.linear(a, torch_24), xs, sb, sf, rate,
                                                                label)
                    impls["torch._cslt_sparse_mm"] = (lambda a: torch._cslt_sparse_mm(torch_cslt, a.t()).t(), xs,
                                                      sb, sf, rate, label)
                base = {"suite": "pruned", "case": f"{m}x{k} {_label(s)}, N={n}", "shape": f"{m}x{k}",
                        "sparsity": _label(s), "n": n, "m": m, "k": k, "nnz": nnz}
                with torch.no_grad():
                    got = measure(ctx, base, impls, ref, gb, ctx.weights_timer)
                    if ctx.cuda and "2:4" in layer.route_times.get(_bucket(n), {}):
                        forced = forced or st.nn.SparseLinear(k, m, layer.crow_indices, layer.col_indices,
                                                              layer.values.detach(), format="2:4")
                        got += _forced_24(ctx, base, forced, xs, ref, sb, sf, rate, label, n)
                    if not ctx.cuda or (s == 0.9 and n in (16, 2048)):  # torch's BSR JIT-compiles per shape
                        bsr_ref = x.double() @ bsr_w.double().t()
                        got += measure(ctx, {**base, "bsr_block": block}, {
                            f"torch BSR {block}x{block}": (lambda a: F.linear(a, bsr), xs, sb, sf, rate, label)},
                            bsr_ref, gb, ctx.weights_timer)
                _annotate(got, layer, n)
                if ctx.cuda:  # the call that was timed: inference, no gradient recorded
                    with torch.no_grad():
                        for r in got:
                            if r["impl"] == "sparsetorch":
                                r["host_us_per_call"] = 1e6 * host_time_per_call(layer, x)
                            elif r["impl"] == "torch._cslt_sparse_mm":
                                r["host_us_per_call"] = 1e6 * host_time_per_call(
                                    lambda a: torch._cslt_sparse_mm(torch_cslt, a.t()), x)
                rows += got
            return rows

        return run

    def mlp_job(s, seed):
        hidden, inner, ns = mlp

        def run():
            ws = [_weight(inner, hidden, ctx.device, dtype, seed), _weight(inner, hidden, ctx.device, dtype, seed + 1),
                  _weight(hidden, inner, ctx.device, dtype, seed + 2)]
            gate, up, down = (_layer(ws[0], s, "silu"), _layer(ws[1], s), _layer(ws[2], s))
            for layer in (gate, up, down):
                layer.prepare(ns)
            wg, wu, wd = (layer.to_dense().detach() for layer in (gate, up, down))
            rows = []
            for n in ns:
                g = torch.Generator(device=ctx.device).manual_seed(seed + n)
                x = torch.randn(n, hidden, device=ctx.device, generator=g, dtype=torch.float64).to(dtype)
                x64 = x.double()
                ref = F.linear(F.silu(F.linear(x64, wg.double())) * F.linear(x64, wu.double()), wd.double())
                sb = sf = gb = gf = 0
                for layer, (m, k) in ((gate, (inner, hidden)), (up, (inner, hidden)), (down, (hidden, inner))):
                    b, f = _sparse_model(layer.nnz, m, k, n, value)
                    sb, sf = sb + b, sf + f
                    b, f = gemm_model(n, k, m, value)
                    gb, gf = gb + b, gf + f
                xs = copies(ctx, x, gb)
                impls = {
                    "sparsetorch": (lambda a: down(gate(a) * up(a)), xs, sb, sf, rate, label),
                    "dense F.linear": (lambda a: F.linear(F.silu(F.linear(a, wg)) * F.linear(a, wu), wd), xs, gb, gf,
                                       rate, label),
                }
                step = "decode" if n <= 16 else "prefill"
                base = {"suite": "pruned", "case": f"MLP {hidden}-{inner}-{hidden} {_label(s)}, {step} N={n}",
                        "shape": f"MLP {hidden}-{inner}", "sparsity": _label(s), "n": n, "m": inner, "k": hidden,
                        "nnz": gate.nnz + up.nnz + down.nnz}
                with torch.no_grad():
                    got = measure(ctx, base, impls, ref, gb, ctx.weights_timer)
                for r in got:
                    if r["impl"] == "sparsetorch":
                        r["route"] = "/".join(layer.routes.get(_bucket(n), "?") for layer in (gate, up, down))
                _vs_dense(got)
                rows += got
            return rows

        return run

    jobs = []
    for group in (sparsities[:2], sparsities[2:]):
        jobs += [layer_job(m, k, s, 1000 * i + j) for j, s in enumerate(group) for i, (m, k) in enumerate(shapes)]
        jobs += [mlp_job(s, 77 + j) for j, s in enumerate(group)]
    return jobs + decode_suite(ctx)  # the decoder stack's decode steps (rows of suite "decode")


def _bucket(n: int) -> int:
    return 1 << (n - 1).bit_length()


def _forced_24(ctx, base, forced, xs, ref, sb, sf, rate, label, n):
    """The 2:4 (+ residual) form alone (a layer forced to it), whether or not the chosen route is 2:4, as a user
    gets it after prepare() (its algorithm searched for the bucket), and its host time per call."""
    forced.prepare([n])
    got = measure(ctx, base, {"sparsetorch 2:4 form": (lambda a: forced(a), xs, sb, sf, rate, label)}, ref, 0,
                  ctx.weights_timer)
    pattern = forced._pattern()
    for r in got:
        r["host_us_per_call"] = 1e6 * host_time_per_call(forced, xs[0][0])
        r["residual_nnz"] = pattern.residual24
        r["forced_route"] = forced.routes.get(_bucket(n))
    return got


def _annotate(rows, layer, n):
    bucket = _bucket(n)
    for r in rows:
        if r["impl"] == "sparsetorch":
            r["route"] = layer.routes.get(bucket)
            r["route_times"] = layer.route_times.get(bucket)
            r["memory_bytes"] = layer.memory()
    _vs_dense(rows)


def _vs_dense(rows):
    dense = next((r["time_ms"] for r in rows if r["impl"] == "dense F.linear"), None)
    for r in rows:
        r["vs_dense"] = dense / r["time_ms"] if dense else None
