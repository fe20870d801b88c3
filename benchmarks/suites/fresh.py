"""Fresh matrices: what a user pays before the steady state.

Three measurements, each against torch.sparse.mm in the same run (wall time with a synchronize before
and after each timed region, since the host decides here):

* ``first calls``: a never-seen matrix (new index tensors, the tuning table emptied: a new process)
  called ten times with one B; per call its wall time. Rows: the first call, the costliest single call
  (the tuning calls included) against the bound max(20 x the steady call, 2 x torch's first call), and
  the ten calls' total. Matrices: the skew suite's (skew, empty rows, one huge row, banded, blocks,
  real graphs) and small ones, where fixed costs decide.
* ``stream``: 300 fresh 5000-node power-law matrices (5 k x 5 k, ~20 entries per row, different
  patterns and sizes), each called 3 times with one 64-column B: the total per matrix.
* ``bounded``: 3000 such matrices (1000 on the CPU): the analysis cache, the tuning table and the
  memory allocated do not grow.

Every route and torch.sparse.mm run once on a small matrix before the first case (``warm_up``): the
process's one-time costs (loading each kernel's code, the libraries' handles) belong to no matrix.

Floor: none applies to a first call (it is latency: launches and one device-to-host copy); the rows
compare against torch's own first call and our own steady call.
"""
from __future__ import annotations

import statistics
from typing import Callable, List, Optional

import numpy as np
import torch

import sparsetorch as st
from benchmarks.harness import once
from benchmarks.suites.common import Context, Job
from benchmarks.suites.skew import cases as skew_cases, power_law_lengths, with_row_lengths
from sparsetorch._ops import ops

CALLS = 10


def _sync(ctx: Context) -> None:
    if ctx.cuda:
        torch.cuda.synchronize(ctx.device)


def _forget_everything() -> None:
    """A new process's state: no analysis, no transpose, no tuning decisions."""
    ops.csr_analysis_cache(True)
    st._transpose.transpose_cache_clear()
    clear = getattr(getattr(st, "tuning", None), "clear_tuning", None)
    if clear is not None:
        clear()


def _copy(A: torch.Tensor) -> torch.Tensor:
    """A never-seen matrix with A's contents: new index and value tensors."""
    return torch.sparse_csr_tensor(A.crow_indices().clone(), A.col_indices().clone(), A.values().clone(), A.shape)


def _device_allocs(ctx: Context) -> int:
    """cudaMalloc calls so far (the caching allocator's count; 0 on the CPU)."""
    return torch.cuda.memory_stats(ctx.device).get("num_device_alloc", 0) if ctx.cuda else 0


def _call_times(ctx: Context, fn: Callable[[], object], calls: int, allocs: Optional[List[int]] = None) -> List[float]:
    """Wall seconds of each of ``calls`` calls; ``allocs`` (if given) gets each call's cudaMalloc count,
    read outside the timed region (a call that grows the caching allocator pays ~0.1-1 ms for it)."""
    times = []
    for _ in range(calls):
        _sync(ctx)
        before = _device_allocs(ctx) if allocs is not None else 0
        times.append(once(fn, ctx.device)[1])
        if allocs is not None:
            allocs.append(_device_allocs(ctx) - before)
    return times


def _small_cases(ctx: Context):
    rng_lengths = [("power-law 5k (the stream's kind)", lambda: with_row_lengths(
                        power_law_lengths(5000, 20, 1.5, 41, 2500), 5000, 42, hub_exponent=1.5)),
                   ("uniform 1k, 8/row", lambda: with_row_lengths(np.full(1000, 8), 1000, 43)),
                   ("power-law 161 rows, ~745 entries", lambda: with_row_lengths(
                       power_law_lengths(161, 4.6, 1.5, 44, 80), 161, 45, hub_exponent=1.5))]
    return rng_lengths


def first_call_job(ctx: Context, name: str, make, widths) -> Job:
    def run():
        a_sp = make()
        m, k = a_sp.shape
        A = st.to_torch(st.from_scipy(a_sp, device=ctx.device, index_dtype=torch.int32))
        rows = []
        for n in widths:
            B = torch.randn(k, n, device=ctx.device)
            ref = torch.from_numpy(a_sp.astype(np.float64) @ B.double().cpu().numpy())
            ours, theirs, our_allocs = [], [], []
            for _ in range(3):
                _forget_everything()
                fresh = _copy(A)
                out = st.spmm(fresh, B)
                err = float((out.double().cpu() - ref).norm() / max(ref.norm(), 1e-30))
                if err > 1e-4:
                    raise AssertionError(f"fresh {name}, n={n}: st.spmm's first call is off by {err:.2e}")
                _forget_everything()
                fresh = _copy(A)
                our_allocs.append([])
                ours.append(_call_times(ctx, lambda: st.spmm(fresh, B), CALLS, our_allocs[-1]))
                fresh_t = _copy(A)
                theirs.append(_call_times(ctx, lambda: torch.sparse.mm(fresh_t, B), CALLS))
            steady = ctx.timer(lambda: st.spmm(A, B))
            steady_torch = ctx.timer(lambda: torch.sparse.mm(A, B))
            first = statistics.median(t[0] for t in ours)
            first_torch = statistics.median(t[0] for t in theirs)
            # The costliest call over the repetitions: which repetition (0: the first time this process runs
            # this matrix's routes) and which of its calls (0: the first; later ones may be tuning samples).
            worst_rep = int(np.argmax([max(t) for t in ours]))
            worst_call = int(np.argmax(ours[worst_rep]))
            worst = ours[worst_rep][worst_call]
            total = statistics.median(sum(t) for t in ours)
            total_torch = statistics.median(sum(t) for t in theirs)
            bound = max(20 * steady, 2 * first_torch)
            base = {"suite": "fresh", "matrix": name, "n": n, "m": m, "k": k, "nnz": int(a_sp.nnz), "dtype": "float32",
                    "GBps": 0.0, "GFLOPs": 0.0, "floor_ms": 0.0, "of_floor": 0.0}
            rows += [
                {**base, "case": f"first call, {name}, n={n}", "impl": "st.spmm", "time_ms": first * 1e3,
                 "vs_torch_first": first / first_torch, "steady_ms": steady * 1e3},
                {**base, "case": f"first call, {name}, n={n}", "impl": "torch.sparse.mm", "time_ms": first_torch * 1e3,
                 "steady_ms": steady_torch * 1e3},
                {**base, "case": f"costliest of {CALLS} calls, {name}, n={n}", "impl": "st.spmm",
                 "time_ms": worst * 1e3, "bound_ms": bound * 1e3, "within_bound": worst <= bound,
                 "worst_rep": worst_rep, "worst_call": worst_call,
                 "worst_call_device_allocs": our_allocs[worst_rep][worst_call]},
                {**base, "case": f"{CALLS} calls from new, {name}, n={n}", "impl": "st.spmm", "time_ms": total * 1e3,
                 "vs_torch": total / total_torch},
                {**base, "case": f"{CALLS} calls from new, {name}, n={n}", "impl": "torch.sparse.mm",
                 "time_ms": total_torch * 1e3},
            ]
        return rows

    return run


def _stream_matrices(ctx: Context, count: int, seed: int) -> List[torch.Tensor]:
    rng = np.random.default_rng(seed)
    out = []
    for i in range(count):
        m = int(rng.integers(4000, 6000))
        lengths = power_law_lengths(m, 20, float(rng.uniform(1.3, 2.5)), int(rng.integers(1 << 30)), m // 2)
        a_sp = with_row_lengths(lengths, m, int(rng.integers(1 << 30)), hub_exponent=1.5)
        out.append(st.to_torch(st.from_scipy(a_sp, device=ctx.device, index_dtype=torch.int32)))
    return out


def stream_job(ctx: Context) -> Job:
    count = 300 if ctx.cuda else 60

    def run():
        mats = _stream_matrices(ctx, count, 51)
        B = torch.randn(6000, 64, device=ctx.device)
        ref = torch.sparse.mm(mats[0].to(torch.float64), B[:mats[0].shape[1]].double())
        got = st.spmm(_copy(mats[0]), B[:mats[0].shape[1]])
        err = float((got.double() - ref).norm() / ref.norm())
        if err > 1e-4:
            raise AssertionError(f"fresh stream: st.spmm is off by {err:.2e}")
        rows = []
        for impl, fn in (("st.spmm", st.spmm), ("torch.sparse.mm", torch.sparse.mm)):
            _forget_everything()
            copies = [_copy(a) for a in mats]

            def stream(fn=fn, copies=copies):
                for a in copies:
                    b = B[:a.shape[1]]
                    for _ in range(3):
                        fn(a, b)

            per = once(stream, ctx.device)[1] / count
            rows.append({"suite": "fresh", "case": f"stream of {count} fresh power-law 5k matrices, 3 calls each, n=64",
                         "impl": impl, "dtype": "float32", "time_ms": per * 1e3, "GBps": 0.0, "GFLOPs": 0.0,
                         "floor_ms": 0.0, "of_floor": 0.0})
        rows[0]["vs_torch"] = rows[0]["time_ms"] / rows[1]["time_ms"]
        return rows

    return run


def bounded_job(ctx: Context) -> Job:
    count = 3000 if ctx.cuda else 1000

    def run():
        _forget_everything()
        B = torch.randn(300, 16, device=ctx.device)
        rng = np.random.default_rng(61)
        _sync(ctx)
        before = torch.cuda.memory_allocated(ctx.device) if ctx.cuda else 0
        for i in range(count):
            m = int(rng.integers(100, 300))
            nnz = int(rng.integers(m, 8 * m))
            crow = torch.from_numpy(np.concatenate([[0], np.sort(rng.integers(0, nnz + 1, m - 1)), [nnz]])).int()
            col = torch.from_numpy(rng.integers(0, 300, nnz)).int()
            a = torch.sparse_csr_tensor(crow.to(ctx.device), col.to(ctx.device), torch.rand(nnz, device=ctx.device),
                                        (m, 300))
            for _ in range(3):
                st.spmm(a, B)
        _sync(ctx)
        after = torch.cuda.memory_allocated(ctx.device) if ctx.cuda else 0
        table = getattr(getattr(st, "tuning", None), "tuning_table", None)
        signatures = len(table()) if table is not None else None
        return [{"suite": "fresh", "case": f"{count} fresh matrices, 3 calls each: what stays behind",
                 "impl": "st.spmm", "dtype": "float32", "time_ms": 0.0, "GBps": 0.0, "GFLOPs": 0.0,
                 "floor_ms": 0.0, "of_floor": 0.0, "analysis_cache_entries": int(ops.csr_analysis_cache(False)),
                 "tuning_signatures": signatures, "allocated_growth_MiB": (after - before) / 2**20}]

    return run


def warm_up(ctx: Context) -> None:
    """Run every route and torch.sparse.mm once on a small matrix: the process's one-time costs (CUDA
    loads each kernel's code on its first launch, cuSPARSE's and cuBLAS's handles) are not a new
    matrix's, and would otherwise fall on whichever case runs first."""
    a_sp = with_row_lengths(power_law_lengths(2000, 10, 1.5, 71, 1000), 2000, 72, hub_exponent=1.5)
    A = st.to_torch(st.from_scipy(a_sp, device=ctx.device, index_dtype=torch.int32))
    for n in (1, 32, 128):
        B = torch.randn(2000, n, device=ctx.device)
        torch.sparse.mm(A, B)
        for route in (("auto", "native", "balanced", "split", "cusparse", "tiled", "densify") if ctx.cuda
                      else ("auto",)):
            st.spmm(A, B, backend=route)
    _sync(ctx)
    _forget_everything()


def fresh_suite(ctx: Context) -> List[Job]:
    widths = ctx.widths or ((32, 128) if ctx.cuda else (32,))
    matrices = list(_small_cases(ctx))
    if ctx.cuda:
        matrices += skew_cases(ctx)
    jobs = [first_call_job(ctx, name, make, widths) for name, make in matrices]
    return [lambda: (warm_up(ctx), [])[1]] + jobs + [stream_job(ctx), bounded_job(ctx)]
