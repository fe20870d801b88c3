"""SpmmPlan: repeated products with one sparsity pattern (GNN layers, pruned weights).

Everything that depends only on A is done once: conversion to components, the O(nnz) validation,
the argument checks of the Python layer, and the choice of route. With ``backend="cusparse"`` and a
different pattern per batch, the block-diagonal matrix that route multiplies is built here once
instead of on every call. Each call is then a single op call; on the cuSPARSE route the op also
reuses its cached descriptors and buffer size (csrc/cuda/spmm_cusparse.cu), so the per-call host
overhead is the op dispatch plus the library call.

With ``backend="auto"`` on CUDA the plan autotunes: the first call with a given width of B (and
dtype / batch layout) times the candidate routes the routing module lists for this matrix
(csrc/common/spmm_routing.cpp; never those its analysis shows to be pathological) on that B -- through
the op's own measuring (csrc/cuda/spmm_autotune.cu), which decides the matrix's signature with the result
(docs/tuning.md) -- plus the blocked layout where it applies, and keeps the fastest for later calls. The
tuning call synchronises; inside CUDA graph capture, or with ``autotune=False``, the plan takes what
``st.spmm`` takes.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from sparsetorch._ops import ops
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import as_csr
from sparsetorch.functional import _activation_name, _prefers_dense, _records_grad, _spmm_op
from sparsetorch.pruned.blocked import BlockedLayout, blocked_applies


SPMM_BACKENDS = ("auto", "cusparse", "native", "balanced", "split", "tiled", "densify")
# Routes only a plan has: "blocked" multiplies a layout of A built once (sparsetorch/pruned/blocked.py).
PLAN_BACKENDS = SPMM_BACKENDS + ("blocked",)


def _autotune_candidates(a, n: int, b_dim: int = 2) -> list:
    """The routes worth timing for A and a B of width n and b_dim dimensions: the routing module's
    list (csrc/common/spmm_routing.cpp, from A's cached analysis), without "blocked" where this GPU
    cannot run it."""
    k = a.shape[-1]
    batch = a.shape[0] if a.batched else 2
    shape = (k, n) if b_dim == 2 else (batch, k, n)
    b = torch.empty((), dtype=a.dtype, device=a.device).expand(shape)  # no storage: only its shape is read
    routes = list(ops.spmm_route_candidates(a.crow_indices, a.col_indices, a.values, b))
    if "blocked" in routes and not blocked_applies(a, b_dim):
        routes.remove("blocked")
    return routes


def _l2_scratch(device: torch.device) -> torch.Tensor:
    """Zeroed bytes, twice the device's L2, for _device_time to overwrite (or read) the L2 with."""
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20)
    return torch.zeros(2 * l2, dtype=torch.int8, device=device)


def _device_time(call, scratch: torch.Tensor, clean: bool = False, budget_ms: float = 1.0,
                 max_reps: int = 40) -> float:
    """Median device milliseconds of one call with a cold L2, measured as triton's do_bench and the
    benchmark harness measure: the L2 is overwritten (`scratch`, twice its size, is zeroed) before
    each call, each call has its own pair of events. A sleep kernel is queued first so the host
    enqueues everything before the device reaches it: on small graphs (~10 us per call) the host's
    launch time would otherwise be timed. Short calls get more repetitions (5 to max_reps, about
    budget_ms in all): 5 were too few to separate routes 20% apart at ~20 us (G51 in the H200 harness
    run).

    ``clean``: `scratch` is read instead of zeroed, so the call meets a clean L2, as a layer does in a
    decoder step (the layer before it streamed its weights). After the zeroing the call also writes
    ~L2-size dirty lines back, which slows a memory-bound call more than a compute-bound one (H100,
    14336 x 4096 bf16, N = 1: F.linear 54 us after the zeroing, 44 us after a read, 42 us per call in
    a CUDA graph over 8 distinct weights; a bitmap weight at 50% 46 / 41 / 40 us)."""
    call()  # warm-up: workspaces, descriptors

    def timed(reps):
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        # ~150 us per call at 2 GHz: longer than enqueuing it (a SparseLinear candidate through Python
        # takes 40-80 us of host time; with ~50 us per call, a slow host moment was timed as the call)
        torch.cuda._sleep(300_000 * reps)
        for start, end in events:
            if clean:
                scratch.sum(dtype=torch.int32)
            else:
                scratch.zero_()
            start.record()
            call()
            end.record()
        events[-1][1].synchronize()
        return sorted(start.elapsed_time(end) for start, end in events)[reps // 2]

    first = timed(5)
    reps = int(min(max_reps, max(5, budget_ms / max(first, 1e-3))))
    return first if reps == 5 else timed(reps)


class SpmmPlan:
    """``plan = SpmmPlan(A)``; ``plan(B)`` computes ``act(alpha * A @ B + beta * c + bias)``.

    ``values=`` on a call substitutes new values for A's pattern (e.g. trained weights) without
    re-planning; they must have the shape of ``A.values``. The plan keeps references to A's
    component tensors: do not modify them in place while the plan is in use.

    ``autotune`` (default True; CUDA with ``backend="auto"`` only): the first call for each width,
    dtype and batch layout of B times the candidate routes (the op's own measuring, which keeps the
    result for the matrix's signature; the blocked layout where it applies) and remembers the fastest;
    ``plan.routes`` shows what was chosen. Routes differ only in rounding.
    """

    def __init__(self, A: Any, *, alpha: float = 1.0, bias: Optional[torch.Tensor] = None,
                 activation: Optional[str] = None, negative_slope: float = 0.01, backend: str = "auto",
                 validate: Optional[bool] = None, device=None, policy: str = "sparse", autotune: bool = True):
        a = as_csr(A, device=device)
        ensure_valid(a, validate)  # once per pattern; each call's op then finds the verdict cached
        self.validate = validate is not False
        if backend not in PLAN_BACKENDS:
            raise ValueError(f"backend: unknown SpMM backend {backend!r}; expected one of "
                             f"{', '.join(PLAN_BACKENDS)}")
        if backend == "blocked" and not blocked_applies(a, 2):
            raise ValueError(f"backend 'blocked': needs one unbatched float32 matrix A (and a GPU with 204 KB of "
                             f"shared memory per block, Hopper); got A of shape {a.shape}, dtype {a.dtype} on "
                             f"{a.device}")
        self.csr = a
        self.shape = a.shape
        self.alpha = float(alpha)
        self.bias = bias
        self.activation = _activation_name(activation)
        self.negative_slope = float(negative_slope)
        self.backend = backend
        self.autotune = bool(autotune) and backend == "auto" and a.device.type == "cuda"
        self.routes = {}  # (n, dtype, B batched) -> the route autotuning chose
        if policy not in ("auto", "sparse", "dense"):
            raise ValueError(f"policy: expected 'auto', 'sparse' or 'dense', got {policy!r}")
        # Dense policy (see st.spmm): A is expanded once here; each call is one GEMM.
        self._dense = a.to_dense() if policy == "dense" or (policy == "auto" and _prefers_dense(a)) else None
        self._block_diagonal = None
        self._blocked = None          # BlockedLayout, built when the blocked route is first timed or taken
        self._blocked_values = None   # its pair values for A's own values
        if backend == "cusparse" and a.crow_indices.dim() == 2 and a.crow_indices.is_cuda:
            self._block_diagonal = _BlockDiagonal(a)

    def __call__(self, B: torch.Tensor, *, beta: float = 0.0, c: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None, values: Optional[torch.Tensor] = None) -> torch.Tensor:
        a = self.csr
        vals = a.values if values is None else values
        if values is not None and values.shape != a.values.shape:
            raise ValueError(f"values: expected shape {tuple(a.values.shape)} (the plan's pattern), got "
                             f"{tuple(values.shape)}")
        if B.shape[-2] != self.shape[-1]:
            raise ValueError(f"shape mismatch: the plan's A has shape {self.shape} but B has shape {tuple(B.shape)}")
        if self._dense is not None:
            return self._call_dense(B, beta, c, out, values)
        if self._block_diagonal is not None and (out is None or out.is_contiguous()):
            return self._block_diagonal(self, B, vals if values is not None else None, beta, c, out)
        backend = self._route(B, vals)
        if backend == "blocked":
            return self._call_blocked(B, vals, beta, c, out)
        if out is not None:
            ops.spmm_out(a.crow_indices, a.col_indices, vals, B, out, self.alpha, float(beta), self.bias,
                         self.activation, self.negative_slope, backend, self.validate)
            return out
        return _spmm_op(a.crow_indices, a.col_indices, vals, B, self.alpha, c, float(beta), self.bias,
                        self.activation, self.negative_slope, backend, self.validate)

    def _blocked_operands(self, vals):
        """(layout, pair values for vals): the layout built once; the pair values of A's own
        values kept, substituted values scattered per call."""
        if self._blocked is None:
            self._blocked = BlockedLayout(self.csr)
        if vals is not self.csr.values:
            return self._blocked, self._blocked.pair_values(vals)
        if self._blocked_values is None:
            self._blocked_values = self._blocked.pair_values(vals)
        return self._blocked, self._blocked_values

    def _call_blocked(self, B, vals, beta, c, out):
        if B.dim() != 2:
            raise ValueError(f"backend 'blocked': expected a 2-D B, got shape {tuple(B.shape)}")
        layout, pair_values = self._blocked_operands(vals)
        a = self.csr
        accumulate = out if out is not None and beta != 0.0 else c
        act = self.activation
        split = act != "none" and _records_grad(vals, B, accumulate, self.bias)  # as _spmm_op
        res = ops.spmm_blocked(a.crow_indices, a.col_indices, vals, layout.run_ptr, layout.block_col, pair_values,
                               B, self.alpha, accumulate, float(beta), self.bias, "none" if split else act,
                               self.negative_slope)
        if split:
            res = ops.activation(res, act, self.negative_slope)
        if out is not None:
            out.copy_(res)
            return out
        return res

    def _route(self, B: torch.Tensor, vals: torch.Tensor) -> str:
        if not self.autotune or not B.is_cuda or B.dtype != vals.dtype:
            return self.backend  # (a dtype mismatch is reported by the op)
        key = (B.shape[-1], B.dtype, B.dim() == 3)
        route = self.routes.get(key)
        if route is None:
            if torch.cuda.is_current_stream_capturing() or torch.compiler.is_compiling():
                return self.backend  # no timing (a sync) inside a capture or a traced graph: the op decides
            route = self.routes[key] = self._fastest(B, vals)
        return route

    def _fastest(self, B: torch.Tensor, vals: torch.Tensor) -> str:
        """The fastest route on this B: the CSR routes are timed by the op's own measuring
        (ops.spmm_tune, csrc/cuda/spmm_autotune.cu: the result decides the signature of this matrix and B,
        so st.spmm and the backward on matrices of that signature take it too, docs/tuning.md); where the
        blocked layout is a candidate it is timed against that route here."""
        a = self.csr
        with torch.no_grad():
            route = ops.spmm_tune(a.crow_indices, a.col_indices, vals, B)
            if "blocked" not in _autotune_candidates(a, B.shape[-1], B.dim()):
                return route
            scratch = _l2_scratch(B.device)
            layout, pair_values = self._blocked_operands(vals)
            blocked = _device_time(lambda: ops.spmm_blocked(a.crow_indices, a.col_indices, vals, layout.run_ptr,
                                                            layout.block_col, pair_values, B), scratch)
            csr = _device_time(lambda: ops.spmm(a.crow_indices, a.col_indices, vals, B, 1.0, None, 0.0, None, "none",
                                                0.01, route, self.validate), scratch)
        return "blocked" if blocked < csr else route

    def _call_dense(self, B, beta, c, out, values):
        from sparsetorch.functional import _spmm_dense

        a = self.csr if values is None else self.csr.with_values(values)
        return _spmm_dense(a, B, self.alpha, beta, c, self.bias, self.activation, self.negative_slope, out,
                           dense_a=self._dense if values is None else None)

    def __repr__(self) -> str:
        route = "dense" if self._dense is not None else ("autotuned" if self.autotune else self.backend)
        return f"SpmmPlan({self.csr!r}, activation={self.activation!r}, route={route!r})"


class _BlockDiagonal:
    """A batch with one pattern per batch as one block-diagonal CSR, built once: rows b*m, columns b*k
    (batch i's columns shifted by i*k) for a batched B, or k for one shared B. Padding after
    crow[i, -1] is dropped, so a NaN in B under a structural zero cannot leak in."""

    def __init__(self, a):
        b, m, k = a.shape
        crow = a.crow_indices.long()
        nnz = crow[:, -1]
        first = torch.cumsum(nnz, 0) - nnz
        total = int(nnz.sum())
        self.keep = torch.arange(a.col_indices.shape[-1], device=crow.device).unsqueeze(0) < nnz.unsqueeze(1)
        fits32 = max(b * m, b * k, total) < 2**31 - 1
        idx = torch.int32 if fits32 else torch.int64
        self.crow = torch.cat([(crow[:, :-1] + first.unsqueeze(1)).reshape(-1),
                               torch.tensor([total], device=crow.device)]).to(idx)
        cols = a.col_indices.long()
        self.col_shared_b = cols.masked_select(self.keep).to(idx)
        self.col_batched_b = (cols + (torch.arange(b, device=crow.device) * k).unsqueeze(1)).masked_select(
            self.keep).to(idx)
        self.values = a.values.masked_select(self.keep)
        self.shape = (b, m, k)

    def __call__(self, plan, B, new_values, beta, c, out):
        b, m, k = self.shape
        n = B.shape[-1]
        values = self.values if new_values is None else new_values.masked_select(self.keep)
        if B.dim() == 3:
            if B.shape[0] != b:
                raise ValueError(f"batch size mismatch: the plan's A has shape {self.shape} but B has shape "
                                 f"{tuple(B.shape)}")
            col, dense = self.col_batched_b, B.reshape(b * k, n)
        else:
            col, dense = self.col_shared_b, B
        c2 = None if c is None else c.reshape(b * m, n)
        if out is not None:
            ops.spmm_out(self.crow, col, values, dense, out.view(b * m, n), plan.alpha, float(beta), plan.bias,
                         plan.activation, plan.negative_slope, "cusparse")
            return out
        res = ops.spmm(self.crow, col, values, dense, plan.alpha, c2, float(beta), plan.bias, plan.activation,
                       plan.negative_slope, "cusparse")
        return res.view(b, m, n)
