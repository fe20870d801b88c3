"""Graph convolution (Kipf & Welling) and its propagation matrix D^-1/2 (A + I) D^-1/2."""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import nn

from sparsetorch import functional as F
from sparsetorch._transpose import row_indices
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR, as_csr


def add_self_loops(A: Any, fill_value: float = 1.0) -> CSR:
    """A + fill_value * I for a square (n, n) or batched (b, n, n) CSR, in O(nnz log nnz) on A's device.

    Every row gets one extra entry at its diagonal (an existing diagonal entry is kept too, and
    repeated entries sum, so A + I exactly as in Kipf & Welling). Each batch's padding is dropped.
    """
    a = as_csr(A)
    m, k = a.shape[-2:]
    if m != k:
        raise ValueError(f"A: expected a square matrix (n, n), got shape {a.shape}")
    crow, col, values = a.crow_indices, a.col_indices, a.values
    length = col.shape[-1]
    rows, valid = row_indices(crow, length)  # (P, L)
    pattern_batches = rows.shape[0]
    diag = torch.arange(m, device=crow.device).expand(pattern_batches, m)
    key = torch.cat([torch.where(valid, rows, torch.full_like(rows, m)), diag], dim=1)  # padding sorts last
    order = torch.sort(key, dim=1, stable=True).indices
    new_col = torch.cat([col.long().reshape(pattern_batches, length), diag], dim=1).gather(1, order)
    counts = torch.zeros(pattern_batches, m + 1, dtype=torch.int64, device=crow.device)
    counts.scatter_add_(1, key, torch.ones_like(key))
    new_crow = torch.zeros(pattern_batches, m + 1, dtype=torch.int64, device=crow.device)
    torch.cumsum(counts[:, :m], dim=1, out=new_crow[:, 1:])
    value_batches = values.shape[0] if values.dim() == 2 else 1
    v2 = values.reshape(value_batches, length)
    fill = torch.full((value_batches, m), fill_value, dtype=values.dtype, device=values.device)
    new_values = torch.cat([v2, fill], dim=1).gather(1, order.expand(value_batches, -1))
    idx = crow.dtype
    if crow.dim() == 1:
        new_crow, new_col = new_crow[0], new_col[0]
    if values.dim() == 1:
        new_values = new_values[0]
    return CSR(new_crow.to(idx), new_col.to(idx), new_values, a.shape)


def gcn_normalize(A: Any, add_loops: bool = True, dtype: Optional[torch.dtype] = None) -> CSR:
    """Kipf & Welling's propagation matrix ``D^-1/2 (A + I) D^-1/2``, D the row sums of A + I.

    ``A``: a square (n, n) or batched (b, n, n) sparse adjacency (stored values are edge weights).
    The scaling runs on sparsetorch's own CSR row/column scaling op (:func:`sparsetorch.scale`).
    Rows with degree 0 (only possible without self loops) get a factor of 0.
    """
    a = as_csr(A)
    if dtype is not None:
        a = a.to(dtype=dtype)
    if add_loops:
        a = add_self_loops(a)
    length = a.col_indices.shape[-1]
    m = a.shape[-2]
    rows, valid = row_indices(a.crow_indices, length)
    value_batches = a.values.shape[0] if a.values.dim() == 2 else 1
    v = torch.where(valid, a.values.reshape(value_batches, length), torch.zeros((), dtype=a.dtype,
                                                                                device=a.device))
    degree = torch.zeros(value_batches, m, dtype=a.dtype, device=a.device).scatter_add_(
        1, rows.expand(value_batches, -1), v)
    d = degree.pow(-0.5)
    d = torch.where(torch.isinf(d), torch.zeros_like(d), d)
    if not a.batched or a.values.dim() == 1:
        d = d[0]
    return F.scale(a, d, d)


class GCNConv(nn.Module):
    """Graph convolution (Kipf & Welling 2017): ``act(Â @ (x @ W) + bias)``, Â = D^-1/2 (A + I) D^-1/2.

    ``forward(x, adjacency)``: ``x`` (n, in_channels) with an (n, n) adjacency, or (b, n, in_channels)
    with a batched (b, n, n) adjacency of per-graph patterns (graphs of different sizes: pad them
    with :func:`batch_graphs`). ``adjacency`` is anything :func:`sparsetorch.as_csr` takes; it is
    normalised on each call unless ``normalize=False`` (then it is used as given, e.g. the output of
    :func:`gcn_normalize`) or ``cached=True`` (normalised on the first call and reused: only for a
    fixed graph). The SpMM runs with the bias and activation fused in its epilogue at inference.
    """

    def __init__(self, in_channels: int, out_channels: int, bias: bool = True, activation: Optional[str] = None,
                 negative_slope: float = 0.01, normalize: bool = True, add_self_loops: bool = True,
                 cached: bool = False, backend: str = "auto"):
        super().__init__()
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.weight = nn.Parameter(torch.empty(in_channels, out_channels))
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self.activation = F._activation_name(activation)
        self.negative_slope = float(negative_slope)
        self.normalize, self.add_self_loops, self.cached = normalize, add_self_loops, cached
        self.backend = backend
        self._cached_adjacency: Optional[CSR] = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = math.sqrt(6.0 / (self.in_channels + self.out_channels))  # Glorot, as in the paper
        nn.init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cached_adjacency = None

    def propagation_matrix(self, adjacency: Any, dtype: torch.dtype) -> CSR:
        if self.cached and self._cached_adjacency is not None:
            return self._cached_adjacency
        a = as_csr(adjacency)
        ensure_valid(a)  # normalising runs torch ops over the indices: they must be in range first
        if self.normalize:
            a = gcn_normalize(a, add_loops=self.add_self_loops, dtype=dtype)
        elif a.dtype != dtype:
            a = a.to(dtype=dtype)
        if self.cached:
            self._cached_adjacency = a
        return a

    def forward(self, x: torch.Tensor, adjacency: Any) -> torch.Tensor:
        if x.shape[-1] != self.in_channels:
            raise ValueError(f"x: expected last dimension {self.in_channels} (in_channels), got shape {tuple(x.shape)}")
        a = self.propagation_matrix(adjacency, x.dtype)
        h = torch.matmul(x, self.weight)
        return F.spmm(a, h, bias=self.bias, activation=self.activation, negative_slope=self.negative_slope,
                      backend=self.backend)

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, bias={self.bias is not None}, "
                f"activation={self.activation!r}, cached={self.cached}")
