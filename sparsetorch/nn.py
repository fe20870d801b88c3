"""Sparse layers: a pruned linear layer stored in CSR, and Kipf & Welling's graph convolution.

    import sparsetorch as st
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(4096, 4096), sparsity=0.9)
    conv = st.nn.GCNConv(1433, 16, activation="relu")
    h = conv(x, adjacency)            # adjacency: anything st.as_csr takes, (n, n) or batched (b, n, n)

Both train with autograd through sparsetorch's ops (SpMM backward = transposed SpMM + SDDMM) and
trace with torch.compile(fullgraph=True).
"""
from __future__ import annotations

import math
from typing import Any, List, Optional, Sequence, Tuple

import torch
from torch import nn

from sparsetorch import functional as F
from sparsetorch._transpose import row_indices
from sparsetorch.csr import CSR, as_csr, from_list

__all__ = ["SparseLinear", "GCNConv", "gcn_normalize", "add_self_loops", "batch_graphs", "unbatch"]


def _index_dtype_for(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) < 2**31 - 1 else torch.int64


# --- SparseLinear --------------------------------------------------------------------------------

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


# --- graph convolution ---------------------------------------------------------------------------

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


def batch_graphs(adjacencies: Sequence[Any], features: Optional[Sequence[torch.Tensor]] = None
                 ) -> Tuple[CSR, Optional[torch.Tensor], List[int]]:
    """Pack graphs of different sizes for one batched SpMM: each (n_i, n_i) adjacency is padded to
    (N, N), N = max n_i (the extra rows are empty), then packed into a (b, N, N) batch with one
    pattern per graph; features (n_i, f) are zero-padded into (b, N, f). Returns (adjacency,
    features or None, sizes); :func:`unbatch` cuts the outputs back to the graphs' sizes."""
    items = [as_csr(a) for a in adjacencies]
    sizes = []
    for i, a in enumerate(items):
        if a.batched or a.shape[0] != a.shape[1]:
            raise ValueError(f"adjacencies[{i}]: expected a square 2-D matrix, got shape {a.shape}")
        sizes.append(a.shape[0])
    n_max = max(sizes, default=0)
    padded = []
    for a, n in zip(items, sizes):
        tail = a.crow_indices[-1:].expand(n_max - n)
        padded.append(CSR(torch.cat([a.crow_indices, tail]), a.col_indices, a.values, (n_max, n_max)))
    batch = from_list(padded, shape=(n_max, n_max))
    x = None
    if features is not None:
        if len(features) != len(items):
            raise ValueError(f"features: expected {len(items)} tensors (one per graph), got {len(features)}")
        f = features[0].shape[-1] if features else 0
        x = torch.zeros(len(items), n_max, f, dtype=features[0].dtype, device=features[0].device)
        for i, (feat, n) in enumerate(zip(features, sizes)):
            if feat.shape != (n, f):
                raise ValueError(f"features[{i}]: expected shape ({n}, {f}), got {tuple(feat.shape)}")
            x[i, :n] = feat
    return batch, x, sizes


def unbatch(x: torch.Tensor, sizes: Sequence[int]) -> List[torch.Tensor]:
    """The per-graph rows of a (b, N, f) output of a batched layer: a list of (n_i, f) tensors."""
    return [x[i, :n] for i, n in enumerate(sizes)]
