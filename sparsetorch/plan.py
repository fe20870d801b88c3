"""SpmmPlan: repeated products with one sparsity pattern (GNN layers, pruned weights).

Everything that depends only on A is done once: conversion to components, the O(nnz) validation,
the argument checks of the Python layer, and the choice of route. Each call is then a single op
call, so the per-call host overhead is the op dispatch plus the kernel launch.
"""
from __future__ import annotations

from typing import Any, Optional

import torch

from sparsetorch._ops import ops
from sparsetorch._validate import validate_csr
from sparsetorch.csr import as_csr
from sparsetorch.functional import _activation_name


class SpmmPlan:
    """``plan = SpmmPlan(A)``; ``plan(B)`` computes ``act(alpha * A @ B + beta * c + bias)``.

    ``values=`` on a call substitutes new values for A's pattern (e.g. trained weights) without
    re-planning; they must have the shape of ``A.values``. The plan keeps references to A's
    component tensors: do not modify them in place while the plan is in use.
    """

    def __init__(self, A: Any, *, alpha: float = 1.0, bias: Optional[torch.Tensor] = None,
                 activation: Optional[str] = None, negative_slope: float = 0.01, backend: str = "auto",
                 validate: bool = True, device=None):
        a = as_csr(A, device=device)
        if validate:
            validate_csr(a)
        if backend not in ("auto", "cusparse", "native"):
            raise ValueError(f"backend: unknown SpMM backend {backend!r}; expected one of auto, cusparse, native")
        self.csr = a
        self.shape = a.shape
        self.alpha = float(alpha)
        self.bias = bias
        self.activation = _activation_name(activation)
        self.negative_slope = float(negative_slope)
        self.backend = backend

    def __call__(self, B: torch.Tensor, *, beta: float = 0.0, c: Optional[torch.Tensor] = None,
                 out: Optional[torch.Tensor] = None, values: Optional[torch.Tensor] = None) -> torch.Tensor:
        a = self.csr
        vals = a.values if values is None else values
        if values is not None and values.shape != a.values.shape:
            raise ValueError(f"values: expected shape {tuple(a.values.shape)} (the plan's pattern), got "
                             f"{tuple(values.shape)}")
        if B.shape[-2] != self.shape[-1]:
            raise ValueError(f"shape mismatch: the plan's A has shape {self.shape} but B has shape {tuple(B.shape)}")
        if out is not None:
            ops.spmm_out(a.crow_indices, a.col_indices, vals, B, out, self.alpha, float(beta), self.bias,
                         self.activation, self.negative_slope, self.backend)
            return out
        return ops.spmm(a.crow_indices, a.col_indices, vals, B, self.alpha, c, float(beta), self.bias,
                        self.activation, self.negative_slope, self.backend)

    def __repr__(self) -> str:
        return f"SpmmPlan({self.csr!r}, activation={self.activation!r}, backend={self.backend!r})"
