"""SparseLinear: a pruned linear layer whose weight is stored sparse (CSR)."""
from __future__ import annotations

from typing import Any, Optional

import torch
from torch import nn

from sparsetorch import functional as F
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR, as_csr


def _index_dtype_for(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) < 2**31 - 1 else torch.int64


class SparseLinear(nn.Module):
    """``y = act(x @ W.T + bias)`` with the weight ``W`` (out_features, in_features) stored in CSR.

    The pattern (``crow_indices``, ``col_indices``) is a buffer; the stored values are the trainable
    parameter ``values``. Build one from a dense layer with :meth:`from_dense` (magnitude pruning) or
    from any sparse matrix with :meth:`from_sparse`. ``x`` is (..., in_features).

    The product runs as ``(W @ x.T).T``: one SpMM with x's rows as the dense columns, then one fused
    pass that adds the bias, applies the activation and restores the row-major layout.
    """

    def __init__(self, in_features: int, out_features: int, crow_indices: torch.Tensor,
                 col_indices: torch.Tensor, values: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 activation: Optional[str] = None, negative_slope: float = 0.01, backend: str = "auto"):
        super().__init__()
        CSR(crow_indices, col_indices, values, (out_features, in_features))  # checks the components
        if bias is not None and (bias.shape != (out_features,) or bias.dtype != values.dtype
                                 or bias.device != values.device):
            raise ValueError(f"bias: expected shape ({out_features},) with the values' dtype {values.dtype} and "
                             f"device {values.device}, got {tuple(bias.shape)} {bias.dtype} on {bias.device}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.register_buffer("crow_indices", crow_indices)
        self.register_buffer("col_indices", col_indices)
        self.values = nn.Parameter(values)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.activation = F._activation_name(activation)
        self.negative_slope = float(negative_slope)
        self.backend = backend

    @classmethod
    def from_sparse(cls, weight: Any, bias: Optional[torch.Tensor] = None, dtype: Optional[torch.dtype] = None,
                    **kwargs) -> "SparseLinear":
        """From a sparse (out_features, in_features) weight: anything :func:`sparsetorch.as_csr` takes
        (``dtype`` converts the values; the bias is converted to the values' dtype)."""
        w = as_csr(weight)
        ensure_valid(w)
        if dtype is not None:
            w = w.to(dtype=dtype)
        if bias is not None:
            bias = bias.to(dtype=w.dtype, device=w.device)
        if w.batched:
            raise ValueError(f"weight: expected a 2-D (out_features, in_features) matrix, got shape {w.shape}")
        out_f, in_f = w.shape
        return cls(in_f, out_f, w.crow_indices, w.col_indices, w.values.detach().clone(),
                   None if bias is None else bias.detach().clone(), **kwargs)

    @classmethod
    def from_dense(cls, linear: Any, sparsity: float = 0.9, scheme: str = "global",
                   bias: Optional[torch.Tensor] = None, **kwargs) -> "SparseLinear":
        """Magnitude-prune a dense layer (an ``nn.Linear`` or an (out, in) weight tensor).

        ``sparsity`` is the fraction of weights removed. ``scheme="global"`` keeps the
        ``round((1 - sparsity) * out * in)`` largest |w| of the whole matrix; ``"row"`` keeps the
        ``round((1 - sparsity) * in)`` largest of each row (the same nnz per row, which balances
        the SpMM's work). Ties are broken by position. The bias (of the ``nn.Linear``, or ``bias=``)
        is copied.
        """
        if isinstance(linear, nn.Linear):
            weight = linear.weight.detach()
            bias = linear.bias.detach() if linear.bias is not None else None
        elif isinstance(linear, torch.Tensor) and linear.dim() == 2 and linear.layout == torch.strided:
            weight = linear.detach()
        else:
            raise TypeError(f"linear: expected an nn.Linear or a 2-D dense weight tensor, got {type(linear).__name__}")
        if not 0.0 <= float(sparsity) <= 1.0:
            raise ValueError(f"sparsity: expected a fraction in [0, 1], got {sparsity}")
        out_f, in_f = weight.shape
        mask = torch.zeros_like(weight, dtype=torch.bool)
        magnitude = weight.abs()
        if scheme == "global":
            keep = int(round((1.0 - sparsity) * weight.numel()))
            if keep > 0:
                idx = torch.topk(magnitude.reshape(-1), keep, sorted=False).indices
                mask.view(-1)[idx] = True
        elif scheme == "row":
            keep = int(round((1.0 - sparsity) * in_f))
            if keep > 0:
                idx = torch.topk(magnitude, keep, dim=1, sorted=False).indices
                mask.scatter_(1, idx, True)
        else:
            raise ValueError(f"scheme: expected 'global' or 'row', got {scheme!r}")
        rows, cols = mask.nonzero(as_tuple=True)  # row-major order: sorted columns per row
        counts = torch.bincount(rows, minlength=out_f)
        index_dtype = _index_dtype_for(out_f, in_f, int(rows.numel()))
        crow = torch.zeros(out_f + 1, dtype=torch.int64, device=weight.device)
        torch.cumsum(counts, 0, out=crow[1:])
        return cls(in_f, out_f, crow.to(index_dtype), cols.to(index_dtype), weight[rows, cols].clone(),
                   None if bias is None else bias.clone(), **kwargs)

    @property
    def weight(self) -> CSR:
        """The weight as a :class:`sparsetorch.CSR` (sharing this layer's tensors)."""
        return CSR(self.crow_indices, self.col_indices, self.values, (self.out_features, self.in_features))

    @property
    def nnz(self) -> int:
        return int(self.col_indices.numel())

    @property
    def density(self) -> float:
        return self.nnz / max(1, self.in_features * self.out_features)

    def to_dense(self) -> torch.Tensor:
        """The dense (out_features, in_features) weight (differentiable w.r.t. ``values``)."""
        return self.weight.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected last dimension {self.in_features} (in_features), got shape {tuple(x.shape)}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        y_t = F.spmm(self.weight, x2.t(), backend=self.backend)  # (out, N)
        y = y_t.t()
        if self.bias is not None or self.activation != "none":
            y = F.bias_act(y, bias=self.bias, activation=self.activation, negative_slope=self.negative_slope)
        else:
            y = y.contiguous()
        return y.reshape(*lead, self.out_features)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A different sparsity means different nnz: take the incoming shapes so that any
        # SparseLinear of the same in/out features loads any other's state_dict.
        for name in ("crow_indices", "col_indices"):
            t = state_dict.get(prefix + name)
            if t is not None and t.shape != getattr(self, name).shape:
                setattr(self, name, torch.empty_like(t, device=getattr(self, name).device))
        t = state_dict.get(prefix + "values")
        if t is not None and t.shape != self.values.shape:
            self.values = nn.Parameter(torch.empty_like(t, device=self.values.device),
                                       requires_grad=self.values.requires_grad)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, nnz={self.nnz} "
                f"(density {self.density:.3g}), bias={self.bias is not None}, activation={self.activation!r}")
