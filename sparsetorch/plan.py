"""SpmmPlan: repeated products with one sparsity pattern (GNN layers, pruned weights).

Everything that depends only on A is done once: conversion to components, the O(nnz) validation,
the argument checks of the Python layer, and the choice of route. With ``backend="cusparse"`` and a
different pattern per batch, the block-diagonal matrix that route multiplies is built here once
instead of on every call. Each call is then a single op call; on the cuSPARSE route the op also
reuses its cached descriptors and buffer size (csrc/cuda/spmm_cusparse.cu), so the per-call host
overhead is the op dispatch plus the library call.

With ``backend="auto"`` on CUDA the op's own route tuner picks among the CSR routes (st.spmm's "spmm"
table, docs/tuning.md), and where the blocked layout applies (sparsetorch/pruned/blocked.py: one
unbatched float32 A, sm_90's shared memory) the plan's calls also sample it against the op's route,
online, as the real calls, without a sync (the "plan" table of sparsetorch/tuning.py): no call times
anything synchronously, and inside CUDA graph capture the decided route, else the op's, is taken.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from sparsetorch._ops import ops
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import as_csr
from sparsetorch._autograd import records_grad, spmm_call
from sparsetorch.functional import _activation_name, _prefers_dense
from sparsetorch.pruned.blocked import BlockedLayout, blocked_applies
from sparsetorch.tuning import tuner


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


class SpmmPlan:
    """``plan = SpmmPlan(A)``; ``plan(B)`` computes ``act(alpha * A @ B + beta * c + bias)``.

    ``values=`` on a call substitutes new values for A's pattern (e.g. trained weights) without
    re-planning; they must have the shape of ``A.values``. The plan keeps references to A's
    component tensors: do not modify them in place while the plan is in use.

    ``autotune`` (default True; CUDA with ``backend="auto"`` only): calls sample the blocked layout
    against the op's route where it applies (module docstring); ``plan.routes`` shows, per width, dtype and
    batch layout of B, the route calls take now. Routes differ only in rounding.
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
        self._keys = {}  # (n, dtype, B batched) -> the "plan" tuner's key (None: no layout to sample)
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
        backend, key, sample = self._route(B, vals)
        if sample is not None:
            sample.start()
        if backend == "blocked":
            res = self._call_blocked(B, vals, beta, c, out)
        elif out is not None:
            ops.spmm_out(a.crow_indices, a.col_indices, vals, B, out, self.alpha, float(beta), self.bias,
                         self.activation, self.negative_slope, backend, self.validate)
            res = out
        else:
            res = spmm_call(a.crow_indices, a.col_indices, vals, B, self.alpha, c, float(beta), self.bias,
                           self.activation, self.negative_slope, backend, self.validate)
        if sample is not None:
            sample.stop()
            tuner("plan").submit(key, backend, sample)
        return res

    @property
    def routes(self) -> dict:
        """(width, dtype, B batched) -> the route calls of that B take now: "blocked", or the op's route
        for this matrix (the "spmm" table's decision, else its rules)."""
        out = {}
        for (n, dtype, batched), key in self._keys.items():
            chosen = tuner("plan").decided(key) if key is not None else None
            if chosen == "blocked" or self.backend != "auto":
                out[(n, dtype, batched)] = chosen if chosen == "blocked" else self.backend
                continue
            a = self.csr
            shape = (a.shape[0] if a.batched else 2, a.shape[-1], n) if batched else (a.shape[-1], n)
            b = torch.empty((), dtype=dtype, device=a.device).expand(shape)  # no storage: only its shape is read
            out[(n, dtype, batched)] = ops.spmm_route(a.crow_indices, a.col_indices, a.values, b, "auto", False)
        return out

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
        split = act != "none" and records_grad(vals, B, accumulate, self.bias)  # as spmm_call
        res = ops.spmm_blocked(a.crow_indices, a.col_indices, vals, layout.run_ptr, layout.block_col, pair_values,
                               B, self.alpha, accumulate, float(beta), self.bias, "none" if split else act,
                               self.negative_slope)
        if split:
            res = ops.activation(res, act, self.negative_slope)
        if out is not None:
            out.copy_(res)
            return out
        return res

    def _route(self, B: torch.Tensor, vals: torch.Tensor):
        """(backend, tuner key, sample or None) for this call."""
        if not self.autotune or not B.is_cuda or B.dtype != vals.dtype:
            return self.backend, None, None  # (a dtype mismatch is reported by the op)
        shape_key = (B.shape[-1], B.dtype, B.dim() == 3)
        if shape_key not in self._keys:
            a = self.csr
            blocked = "blocked" in _autotune_candidates(a, B.shape[-1], B.dim())
            if blocked:
                device, fields = ops.spmm_tuning_signature(a.crow_indices, a.col_indices, a.values.to(B.dtype), B)
                self._keys[shape_key] = (device, *fields)
            else:
                self._keys[shape_key] = None
        key = self._keys[shape_key]
        if key is None:
            return self.backend, None, None
        choice, sample = tuner("plan").choose(key, [self.backend, "blocked"], self.backend, B.device)
        return choice, key, sample

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
