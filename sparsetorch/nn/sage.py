"""GraphSAGE's convolution (Hamilton et al. 2017) with mean aggregation, a drop-in for
torch_geometric's SAGEConv: ``lin_l(mean_{j -> i} x_j) + lin_r(x_i)``."""
from __future__ import annotations

from typing import Any, Optional, Tuple, Union

import torch
from torch import nn

from sparsetorch import functional as F
from sparsetorch._graph_build import GraphMatrix, build_graph
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR, as_csr
from sparsetorch.graph import (as_adjacency, cached_graph, check_coordinates, csr_edges, edges_of, graph_keys,
                               is_data, is_edge_index, is_sparse_tensor, sparse_edges)
from sparsetorch.nn._pyg import check_pyg_kwargs, dense, is_distributed, propagate, split_data

_AGGREGATIONS = ("mean", "sum", "add")


def mean_norm(graph: Any, num_nodes: Any = None, aggr: str = "mean", dtype: torch.dtype = torch.float32,
              device: Any = None) -> CSR:
    """SAGEConv's aggregation matrix (targets x sources) as a :class:`CSR`, as torch_geometric
    aggregates: ``"mean"`` divides each row by its number of stored entries (repeated edges count;
    a row without entries stays zero), ``"sum"``/``"add"`` keeps A. An ``edge_index`` / ``Data`` /
    ``SparseTensor`` gives ones (SAGEConv takes no edge weights, as in PyG); a torch sparse tensor,
    :class:`CSR` or SciPy matrix keeps its values. ``num_nodes``: (sources, targets) or an int.
    Built by one op without a device sync (sparsetorch/_graph_build.py), with its transpose for the
    backward. ``device``: where a graph held on the host (SciPy, lists) is built."""
    return _mean_graph(graph, num_nodes, aggr, dtype, device).matrix


def _mean_graph(graph, num_nodes, aggr, dtype, device) -> GraphMatrix:
    """:func:`mean_norm` with its transpose (see GraphMatrix)."""
    norm = "mean" if aggr == "mean" else None
    if is_edge_index(graph) or is_data(graph):
        # The builder checks the index range on the device (no sync of its own).
        e = edges_of(graph, None, num_nodes, check_range=False)
        return build_graph(e.cols, e.rows, None, e.shape[1], e.shape[0], norm=norm, dtype=dtype)
    if is_sparse_tensor(graph):
        e = sparse_edges(graph)
        return build_graph(e.cols, e.rows, None, e.shape[1], e.shape[0], norm=norm, dtype=dtype, what="adj_t")
    a = as_csr(as_adjacency(check_coordinates(graph)), device=None if isinstance(graph, torch.Tensor) else device)
    ensure_valid(a)  # the edges below read crow_indices: it must be well-formed first
    if a.batched:
        raise ValueError(f"edge_index: SAGEConv takes one graph (2-D adjacency), got shape {a.shape}")
    a = a.to(dtype=dtype)
    e = csr_edges(a.crow_indices, a.col_indices, a.values, a.shape)
    return build_graph(e.cols, e.rows, e.weights, a.shape[1], a.shape[0], norm=norm, dtype=dtype, what="adj_t")


_PYG_DEFAULTS = {"flow": ("source_to_target",), "node_dim": (-2, 0), "decomposed_layers": (1,),
                 "aggr_kwargs": (None, {})}


class SAGEConv(nn.Module):
    """``out = lin_l(mean_{j in N(i)} x_j) + lin_r(x_i)`` (GraphSAGE), with torch_geometric's
    constructor, forward signature and parameters (``lin_l.weight``, ``lin_l.bias``,
    ``lin_r.weight``, and ``lin`` with ``project=True``), so state dicts load both ways.

    ``SAGEConv(in_channels, out_channels, aggr="mean", normalize=False, root_weight=True,
    project=False, bias=True, *, activation=None, negative_slope=0.01, backend="auto")``;
    ``forward(x, edge_index, size=None)``: ``x`` a tensor or a (source, target) pair for a
    bipartite graph (``in_channels`` then may be a pair), the graph an ``edge_index``, a torch
    sparse tensor / ``SparseTensor`` / :class:`sparsetorch.CSR` adj_t (targets x sources), a
    ``Data``, or a distributed matrix (normalised through its ``mean_normalized()``).
    ``aggr``: "mean" or "sum"; any other aggregation (max, lstm, lists, modules) raises.
    ``normalize=True`` L2-normalises each output row, as in PyG.

    The aggregation matrix (rows divided by their entry counts) is built once per graph (on the
    layer with ``cached=True``, otherwise keyed on the graph's tensors). The dense products run
    on the cheaper side: ``(M x) W_l^T`` when ``in_channels <= out_channels`` (as PyG), else
    ``M (x W_l^T)`` with the root term ``x W_r^T + b`` added in the SpMM's epilogue (its ``c``).
    ``activation`` (beyond PyG) is applied to the output inside the layer, fused where possible.

    ``torch.compile``: as :class:`GCNConv` (one graph, no break; torch sparse tensors cannot enter a
    compiled function: pass ``st.from_torch(adj_t)`` converted outside, or the ``edge_index``;
    ``dynamic=True`` for mini-batches; ``cached=True`` for a fixed graph and for CUDA graphs).
    """

    def __init__(self, in_channels: Union[int, Tuple[int, int]], out_channels: int, aggr: Any = "mean",
                 normalize: bool = False, root_weight: bool = True, project: bool = False, bias: bool = True, *,
                 activation: Optional[str] = None, negative_slope: float = 0.01, cached: bool = False,
                 backend: str = "auto", **kwargs):
        super().__init__()
        name = type(self).__name__
        check_pyg_kwargs(name, kwargs, _PYG_DEFAULTS)
        if not isinstance(aggr, str) or aggr not in _AGGREGATIONS:
            raise ValueError(f"{name}: torch_geometric's argument aggr={aggr!r} is not supported (supported: "
                             f"'mean', 'sum')")
        pair = tuple(in_channels) if isinstance(in_channels, (tuple, list)) else (in_channels, in_channels)
        if len(pair) != 2 or any(not isinstance(c, int) or c <= 0 for c in pair):
            raise ValueError(f"in_channels: expected a positive int or a pair of them, got {in_channels!r} "
                             "(lazy initialisation with -1 is not supported)")
        self.in_channels, self.out_channels = in_channels, int(out_channels)
        self.aggr, self.normalize, self.root_weight, self.project = aggr, bool(normalize), bool(root_weight), project
        self.activation = F._activation_name(activation)
        if self.activation != "none" and self.normalize:
            raise ValueError(f"{name}: activation= and normalize=True together are ambiguous; apply the "
                             "activation outside the layer")
        self.negative_slope = float(negative_slope)
        self.cached, self.backend = bool(cached), backend
        if project:
            self.lin = nn.Linear(pair[0], pair[0], bias=True)
        self.lin_l = nn.Linear(pair[0], out_channels, bias=bias)
        if root_weight:
            self.lin_r = nn.Linear(pair[1], out_channels, bias=False)
        self._cached_adjacency: Any = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """As PyG's Linear: Kaiming-uniform weights, biases uniform in +-1/sqrt(fan_in)."""
        for lin in (getattr(self, "lin", None), self.lin_l, getattr(self, "lin_r", None)):
            if lin is not None:
                lin.reset_parameters()
        self._cached_adjacency = None

    def aggregation_matrix(self, graph: Any, dtype: torch.dtype, num_nodes: Tuple[int, Optional[int]],
                           device: Any = None) -> GraphMatrix:
        if self.cached and self._cached_adjacency is not None:
            return self._cached_adjacency
        if graph is None:
            raise ValueError("edge_index: a graph is needed (an edge_index, a sparse adjacency or a Data)")
        if is_distributed(graph):
            g = GraphMatrix(graph.mean_normalized() if self.aggr == "mean" else graph, None)
        else:
            def build():
                return _mean_graph(graph, num_nodes, self.aggr, dtype, device)

            # While tracing nothing is cached: the compiled graph holds the build (one op).
            keys = None if torch.compiler.is_compiling() else graph_keys(graph)
            g = build() if keys is None else cached_graph(keys, ("sage", self.aggr, num_nodes, dtype), build)
        if self.cached:
            self._cached_adjacency = g
        return g

    def forward(self, x: Any, edge_index: Any = None, size: Optional[Tuple[int, int]] = None) -> torch.Tensor:
        x, graph = split_data(x, edge_index)
        if isinstance(x, torch.Tensor):
            x_src = x_dst = x
        elif isinstance(x, (tuple, list)) and len(x) == 2:
            x_src, x_dst = x
        else:
            raise TypeError(f"x: expected a tensor or a (source, target) pair of tensors, got {type(x).__name__}")
        w_l, b_l = self.lin_l.weight, self.lin_l.bias
        in_src = self.lin.in_features if self.project else self.lin_l.in_features
        if not isinstance(x_src, torch.Tensor) or x_src.dim() < 2 or x_src.shape[-1] != in_src:
            raise ValueError(f"x: expected source node features (..., {in_src}), got "
                             f"{tuple(x_src.shape) if isinstance(x_src, torch.Tensor) else type(x_src).__name__}")
        root = self.root_weight and x_dst is not None
        if root and (x_dst.dim() < 2 or x_dst.shape[-1] != self.lin_r.in_features):
            raise ValueError(f"x: expected target node features (..., {self.lin_r.in_features}), got "
                             f"{tuple(x_dst.shape)}")
        if self.project:
            x_src = dense(x_src, self.lin.weight, self.lin.bias, "relu")
        if size is None:
            size = (x_src.shape[-2], x_dst.shape[-2] if x_dst is not None else None)
        m = self.aggregation_matrix(graph, x_src.dtype, tuple(size), x_src.device)
        act, slope = self.activation, self.negative_slope
        if is_distributed(m.matrix) or x_src.shape[-1] > self.out_channels:
            # M (x W_l^T): the SpMM on the narrower side, the root term as its accumulate operand.
            r = dense(x_dst, self.lin_r.weight, b_l) if root else None
            out = propagate(m.matrix, dense(x_src, w_l), None if root else b_l, act, slope, self.backend, c=r,
                            transpose=m.transpose)
        else:
            out = dense(propagate(m.matrix, x_src, None, "none", 0.0, self.backend, transpose=m.transpose), w_l,
                        b_l, "none" if root else act, slope)
            if root:  # the root GEMM accumulates into the output (beta = 1): no extra temporary
                w_r = self.lin_r.weight
                out = (torch.addmm(out, x_dst, w_r.t()) if out.dim() == 2 and x_dst.dim() == 2
                       else out + torch.nn.functional.linear(x_dst, w_r))
                if act != "none":
                    out = F.activation(out, act, slope)
        if self.normalize:
            out = torch.nn.functional.normalize(out, p=2.0, dim=-1)
        return out

    def extra_repr(self) -> str:
        return (f"{self.in_channels}, {self.out_channels}, aggr={self.aggr!r}, normalize={self.normalize}, "
                f"root_weight={self.root_weight}, project={self.project}")

