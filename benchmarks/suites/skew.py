"""The skew suite: matrices built to be adversarial to a route chooser (power-law rows at several
exponents, a few rows holding most entries, one dense row, half the rows empty, banded, clustered
blocks, long uniform rows, the real matrices of the data folder), B widths 1 .. 512, float32 and bfloat16.

Each case times the default call exactly as a user makes it (``st.spmm(A, B)`` with a torch sparse
CSR ``A``; its first call is made before timing, so the row is a user's steady state), every route
forced through the op, and torch.sparse.mm, all on the same inputs, each checked against a float64
reference first. The row of the default call records the route it took. Floors: the bytes model of
common.py (A once, each referenced B row once, C once) and the gather bound (every entry gathers a
B row: nnz * n * value bytes, from L2 when B fits in it).

Two times per implementation on CUDA: ``time_ms``, the median device time of one call after an L2 flush
(the run's timer, do_bench's rule), and ``loop_ms``, the time per call of calls made back to back with one
sync at the end (what a user's loop sees: host time included, B warm in L2). A route with a heavy host side (cuSPARSE's
descriptors, densify's GEMM call) can be the fastest by the first and the slowest by the second.
"""
from __future__ import annotations

from typing import Callable, List, Tuple

import numpy as np
import torch

import sparsetorch as st
from benchmarks.harness import host_seconds, once
from benchmarks.ratios import summary
from benchmarks.suites.common import Context, Job, measure, spmm_model
from benchmarks.suites.graphs import real_graphs
from sparsetorch import timing

ROUTES = ("native", "balanced", "split", "tiled", "cusparse", "densify")
# The densify route expands A: only where that stays small.
DENSIFY_MAX_BYTES = 1 << 30


def _csr(rows: np.ndarray, cols: np.ndarray, shape: Tuple[int, int], rng) -> "object":
    import scipy.sparse as sp

    values = rng.standard_normal(rows.size).astype(np.float32)
    a = sp.csr_matrix((values, (rows, cols)), shape=shape)
    a.sum_duplicates()
    return a


def with_row_lengths(lengths: np.ndarray, k: int, seed: int, hub_exponent: float = 0.0):
    """A matrix whose row i holds lengths[i] entries; columns uniform, or drawn with probability
    proportional to a Pareto(hub_exponent) weight (hub columns) when hub_exponent > 0."""
    rng = np.random.default_rng(seed)
    lengths = np.minimum(lengths.astype(np.int64), k)
    rows = np.repeat(np.arange(lengths.size), lengths)
    if hub_exponent > 0:
        weight = rng.pareto(hub_exponent, k) + 1.0
        cols = rng.choice(k, size=rows.size, p=weight / weight.sum())
    else:
        cols = rng.integers(0, k, rows.size)
    return _csr(rows, cols, (lengths.size, k), rng)


def power_law_lengths(m: int, mean: float, exponent: float, seed: int, cap: int) -> np.ndarray:
    """Row lengths from a Pareto(exponent) law scaled to the given mean: the smaller the exponent, the
    heavier the tail (1.2: a few rows hold a large share of all entries)."""
    rng = np.random.default_rng(seed)
    raw = rng.pareto(exponent, m) + 1.0
    return np.clip(np.round(raw / raw.mean() * mean), 1, cap).astype(np.int64)


def top_share_lengths(m: int, mean: float, top_fraction: float, share: float) -> np.ndarray:
    """The first top_fraction of rows hold `share` of all entries, the rest split the remainder."""
    total = int(m * mean)
    top = max(1, int(m * top_fraction))
    lengths = np.full(m, max(1, int(total * (1 - share) / (m - top))), dtype=np.int64)
    lengths[:top] = int(total * share / top)
    return lengths


def banded(m: int, half_width: int, seed: int):
    rng = np.random.default_rng(seed)
    offsets = np.arange(-half_width, half_width + 1)
    rows = np.repeat(np.arange(m), offsets.size)
    cols = rows + np.tile(offsets, m)
    keep = (cols >= 0) & (cols < m)
    return _csr(rows[keep], cols[keep], (m, m), rng)


def clustered_blocks(blocks: int, size: int, density: float, seed: int):
    """Block-diagonal: `blocks` dense-ish size x size blocks at the given density (communities)."""
    rng = np.random.default_rng(seed)
    per_block = int(size * size * density)
    b = np.repeat(np.arange(blocks), per_block)
    r = rng.integers(0, size, b.size) + b * size
    c = rng.integers(0, size, b.size) + b * size
    return _csr(r, c, (blocks * size, blocks * size), rng)


def one_dense_row(m: int, per_row: int, seed: int):
    lengths = np.full(m, per_row, dtype=np.int64)
    lengths[m // 2] = m  # one row with every column
    return with_row_lengths(lengths, m, seed)


def half_empty(m: int, per_row: int, seed: int):
    lengths = np.where(np.arange(m) % 2 == 0, 0, per_row)
    return with_row_lengths(lengths, m, seed)


def cases(ctx: Context) -> List[Tuple[str, Callable]]:
    big = ctx.cuda
    m = 100_000 if big else 5_000
    out = [
        (f"uniform {m // 1000}k, 16/row", lambda: with_row_lengths(np.full(2 * m, 16), 2 * m, 11)),
        *[(f"power-law {m // 1000}k, exponent {e:g}",
           lambda e=e: with_row_lengths(power_law_lengths(m, 20, e, 12, m // 2), m, 13, hub_exponent=1.5))
          for e in (1.2, 1.5, 2.0, 2.5)],
        (f"1% of rows hold 50%, {m // 1000}k", lambda: with_row_lengths(top_share_lengths(m, 20, 0.01, 0.5), m, 14)),
        (f"one dense row, {m // 1000}k", lambda: one_dense_row(m, 10, 15)),
        (f"half the rows empty, {2 * m // 1000}k", lambda: half_empty(2 * m, 20, 16)),
        (f"banded {2 * m // 1000}k, 17/row", lambda: banded(2 * m, 8, 17)),
        ("clustered 64x64 blocks at 25%" if big else "clustered 32x32 blocks at 25%",
         lambda: clustered_blocks(2048 if big else 128, 64 if big else 32, 0.25, 18)),
        ("pruned 4096x4096 at 10%" if big else "pruned 1024x1024 at 10%",
         lambda: with_row_lengths(np.full(4096 if big else 1024, 410 if big else 102), 4096 if big else 1024, 19)),
    ]
    if big and not ctx.quick:
        out.append(("power-law 1M, exponent 1.5",
                    lambda: with_row_lengths(power_law_lengths(1_000_000, 20, 1.5, 20, 500_000), 1_000_000, 21,
                                             hub_exponent=1.5)))
    out += real_graphs(ctx.data_root)
    return out


def _route_of_default(A: torch.Tensor, B: torch.Tensor) -> str:
    route = getattr(st, "spmm_route", None)  # the routing brain's answer, where this build has one
    return route(A, B) if route is not None else "auto (C++ rule)"


def skew_suite(ctx: Context) -> List[Job]:
    widths = (1, 8, 32, 128, 512) if ctx.cuda else (1, 32)
    dtypes = (torch.float32, torch.bfloat16) if ctx.cuda else (torch.float32,)
    if ctx.quick and ctx.cuda:
        widths = (1, 32, 128)
    widths = ctx.widths or widths
    dtypes = ctx.dtypes or dtypes

    def job(name, make):
        def run():
            a_sp = make()
            m, k, nnz = a_sp.shape[0], a_sp.shape[1], a_sp.nnz
            rows = []
            for dtype in dtypes:
                label = str(dtype).replace("torch.", "")
                size = torch.tensor([], dtype=dtype).element_size()
                A = st.from_scipy(a_sp, device=ctx.device, dtype=dtype, index_dtype=torch.int32)
                A_torch = st.to_torch(A)
                A64 = st.to_torch(A.to(dtype=torch.float64)) if ctx.cuda else None
                for n in widths:
                    g = torch.Generator(device=ctx.device).manual_seed(n)
                    B = torch.randn(k, n, device=ctx.device, generator=g).to(dtype)
                    if ctx.cuda:
                        ref = torch.sparse.mm(A64, B.double())
                    else:
                        ref = torch.from_numpy(a_sp.astype(np.float64) @ B.double().numpy())
                    sb, sf = spmm_model(nnz, m, k, n, size, 4)
                    st.spmm(A_torch, B)  # the first call: a user's steady state starts after it
                    impls = {"st.spmm (default)": (lambda b: st.spmm(A_torch, b), [(B,)], sb, sf, "float32", label),
                             "torch.sparse.mm": (lambda b: torch.sparse.mm(A_torch, b), [(B,)], sb, sf, "float32",
                                                 label)}
                    if ctx.cuda:
                        for route in ROUTES:
                            if route == "densify" and m * k * size > DENSIFY_MAX_BYTES:
                                continue
                            if route == "tiled" and dtype == torch.float64:
                                continue
                            impls[f"route {route}"] = (
                                lambda b, route=route: st.spmm(A, b, backend=route), [(B,)], sb, sf, "float32", label)
                    base = {"suite": "skew", "case": f"{name}, n={n}, {label}", "matrix": name, "n": n, "m": m,
                            "k": k, "nnz": nnz, "dtype_case": label}
                    measured = measure(ctx, base, impls, ref, sb)
                    gather = nnz * n * size
                    gather_floor = gather / ctx.ceilings.bandwidth if k * n * size > timing.l2_bytes(ctx.device) else None
                    for r in measured:
                        r["gather_floor_ms"] = gather_floor * 1e3 if gather_floor else None
                        if r["impl"] == "st.spmm (default)":
                            r["route"] = _route_of_default(A_torch, B)
                        if ctx.cuda:
                            fn = impls[r["impl"]][0]
                            r["loop_ms"] = loop_ms(lambda fn=fn: fn(B), r["time_ms"], ctx.device)
                    rows += measured
            return rows

        return run

    return [job(name, make) for name, make in cases(ctx)] + [overhead_job(ctx)]


def overhead_job(ctx: Context) -> Job:
    """What validation and routing cost a user: host time per call of the plan-less st.spmm on a small
    problem (1000 x 1000, 10 per row, n = 16: the device work is a few microseconds, so the host decides);
    device time of the default call against validate=False on a large one (the steady-state cost of the
    cached check); and the first call on a new matrix (the O(nnz) analysis and its one sync)."""
    def run():
        rows = []
        small = with_row_lengths(np.full(1000, 10), 1000, 31)
        A = st.to_torch(st.from_scipy(small, device=ctx.device, index_dtype=torch.int32))
        B = torch.randn(1000, 16, device=ctx.device)

        def host_us(fn):
            return host_per_call(fn, 2000 if ctx.cuda else 200, ctx.device) * 1e6

        for name, fn in (("st.spmm (default)", lambda: st.spmm(A, B)),
                         ("st.spmm validate=False", lambda: st.spmm(A, B, validate=False)),
                         ("torch.sparse.mm", lambda: torch.sparse.mm(A, B))):
            us = min(host_us(fn) for _ in range(3))
            rows.append({"suite": "overhead", "case": "host time per call, 1000x1000, 10/row, n=16", "impl": name,
                         "dtype": "float32", "time_ms": us * 1e-3, "GBps": 0.0, "GFLOPs": 0.0, "floor_ms": 0.0,
                         "of_floor": 0.0, "host_us_per_call": us})
        m = 200_000 if ctx.cuda else 20_000
        big = with_row_lengths(np.full(m, 16), m, 32)
        Ab = st.to_torch(st.from_scipy(big, device=ctx.device, index_dtype=torch.int32))
        Bb = torch.randn(m, 32, device=ctx.device)
        sb, sf = spmm_model(big.nnz, m, m, 32, 4, 4)
        ref = torch.from_numpy(big.astype(np.float64) @ Bb.double().cpu().numpy()).to(ctx.device)
        base = {"suite": "overhead", "case": f"steady state, uniform {m // 1000}k, 16/row, n=32", "n": 32}
        rows += measure(ctx, base, {
            "st.spmm (default)": (lambda b: st.spmm(Ab, b), [(Bb,)], sb, sf, "float32", "float32"),
            "st.spmm validate=False": (lambda b: st.spmm(Ab, b, validate=False), [(Bb,)], sb, sf, "float32", "float32"),
        }, ref, sb)
        # The first call on a new matrix: a fresh copy of the index tensors (a new cache key) each time.
        firsts = []
        for _ in range(5):
            fresh = torch.sparse_csr_tensor(Ab.crow_indices().clone(), Ab.col_indices().clone(), Ab.values(),
                                            Ab.shape)
            firsts.append(once(lambda: st.spmm(fresh, Bb), ctx.device)[1])
        first = sorted(firsts)[2]
        rows.append({**base, "case": f"first call on a new matrix, uniform {m // 1000}k, 16/row, n=32",
                     "impl": "st.spmm (default), first call", "dtype": "float32", "time_ms": first * 1e3,
                     "GBps": 0.0, "GFLOPs": 0.0, "floor_ms": 0.0, "of_floor": 0.0})
        return rows

    return run


def _loop(fn: Callable[[], object], calls: int) -> Callable[[], None]:
    def loop():
        for _ in range(calls):
            fn()

    return loop


def host_per_call(fn: Callable[[], object], calls: int, device: torch.device) -> float:
    """Host seconds per call of ``fn`` called ``calls`` times back to back after one warm call: the time
    to issue them (no sync inside)."""
    fn()
    return host_seconds(_loop(fn, calls), device) / calls


def loop_ms(fn: Callable[[], object], per_call_ms: float, device: torch.device, repeats: int = 2,
            budget_ms: float = 10.0) -> float:
    """Milliseconds per call of ``fn`` called back to back, about ``budget_ms`` of calls (5 to 200) and
    one synchronisation at the end, after one warm call; the median of ``repeats`` such loops."""
    calls = max(5, min(200, int(budget_ms / max(per_call_ms, 1e-3))))
    fn()
    return timing.wall_time(_loop(fn, calls), device=device, reps=repeats, warmup=0) / calls


def summarize(rows: List[dict]) -> List[str]:
    """The default call against the best of (torch.sparse.mm, every route) per case, and its geometric
    mean over torch.sparse.mm, by the device time and (CUDA) by the loop time; the overhead rows."""
    lines = []
    for key, how in (("time_ms", ""), ("loop_ms", " in a loop (calls back to back, host time included)")):
        by_case = {}
        for r in rows:
            if r["suite"] == "skew" and not r.get("cpu") and r.get(key) is not None:
                by_case.setdefault(r["case"], {})[r["impl"]] = r[key]
        worst, ratios, below = None, [], 0
        for case, t in by_case.items():
            default = t.get("st.spmm (default)")
            if default is None or len(t) < 2:
                continue
            best = min(v for kk, v in t.items() if kk != "st.spmm (default)")
            of_best = best / default
            below += of_best < 0.9
            if worst is None or of_best < worst[0]:
                worst = (of_best, case)
            if "torch.sparse.mm" in t:
                ratios.append(t["torch.sparse.mm"] / default)
        if ratios:
            lines.append(f"skew suite{how}: the default st.spmm is {summary(ratios, 'torch.sparse.mm')}; "
                         f"{below} cases below 0.9x the speed of the best of torch.sparse.mm and every route, the "
                         f"worst at {worst[0]:.2f}x ({worst[1]})")
    over = {(r["case"], r["impl"]): r for r in rows if r["suite"] == "overhead" and not r.get("cpu")}
    host = {impl: r["host_us_per_call"] for (case, impl), r in over.items() if "host_us_per_call" in r}
    if host:
        lines.append("host time per call (1000x1000, 10/row, n=16): " +
                     ", ".join(f"{impl} {us:.1f} us" for impl, us in host.items()))
    steady = {impl: r["time_ms"] for (case, impl), r in over.items() if case.startswith("steady state")}
    if len(steady) == 2:
        cost = steady["st.spmm (default)"] / steady["st.spmm validate=False"] - 1
        first = next((r["time_ms"] for (case, _), r in over.items() if case.startswith("first call")), None)
        lines.append(f"default validation: {100 * cost:+.1f}% steady-state time against validate=False"
                     + (f"; first call on a new matrix {first:.3g} ms (steady state "
                        f"{steady['st.spmm (default)']:.3g} ms)" if first else ""))
    return lines
