"""Graph convolution (Kipf & Welling), a drop-in for torch_geometric's GCNConv, and its
propagation matrix D^-1/2 (A + I) D^-1/2."""
from __future__ import annotations

import math
import warnings
from typing import Any, Optional

import torch
from torch import nn

from sparsetorch import functional as F
from sparsetorch._graph_build import GraphMatrix, build_graph
from sparsetorch._transpose import row_indices
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR, as_csr, sum_dtype
from sparsetorch.graph import (as_adjacency, cached_graph, check_coordinates, csr_edges, edges_of, graph_keys,
                               is_data, is_edge_index, is_sparse_tensor, sparse_edges)
from sparsetorch.nn._pyg import check_pyg_kwargs, dense, is_distributed, propagate, split_data


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


def gcn_normalize(A: Any, add_loops: bool = True, dtype: Optional[torch.dtype] = None,
                  fill_value: float = 1.0) -> CSR:
    """Kipf & Welling's propagation matrix ``D^-1/2 (A + fill_value * I) D^-1/2``, D the row sums
    of A + fill_value * I (``fill_value=2``: PyG's ``improved=True``).

    ``A``: a square (n, n) or batched (b, n, n) sparse adjacency (stored values are edge weights).
    The scaling runs on sparsetorch's own CSR row/column scaling op (:func:`sparsetorch.scale`).
    Rows with degree 0 (only possible without self loops) get a factor of 0.
    """
    a = as_csr(A)
    if dtype is not None:
        a = a.to(dtype=dtype)
    if add_loops:
        a = add_self_loops(a, fill_value)
    return _symmetric_scale(a)


def _symmetric_scale(a: CSR) -> CSR:
    """D^-1/2 A D^-1/2 with D = A's row sums (a zero row sum gives a factor of 0), summed and scaled
    in sum_dtype and rounded once, as the fresh-graph builder does."""
    dtype = a.dtype
    acc = sum_dtype(dtype)
    a = a.to(dtype=acc)
    length = a.col_indices.shape[-1]
    m = a.shape[-2]
    rows, valid = row_indices(a.crow_indices, length)
    value_batches = a.values.shape[0] if a.values.dim() == 2 else 1
    v = torch.where(valid, a.values.reshape(value_batches, length), torch.zeros((), dtype=acc, device=a.device))
    degree = torch.zeros(value_batches, m, dtype=acc, device=a.device).scatter_add(
        1, rows.expand(value_batches, -1), v)
    d = degree.pow(-0.5)
    d = torch.where(torch.isinf(d), torch.zeros_like(d), d)
    if not a.batched or a.values.dim() == 1:
        d = d[0]
    return F.scale(a, d, d).to(dtype=dtype)


_warned_improved = False


def gcn_norm(graph: Any, edge_weight: Optional[torch.Tensor] = None, num_nodes: Optional[int] = None,
             improved: bool = False, add_self_loops: bool = True, normalize: bool = True,
             dtype: torch.dtype = torch.float32, device: Any = None) -> CSR:
    """GCNConv's propagation matrix ``D^-1/2 (A + I) D^-1/2`` as a :class:`CSR` (rows = targets),
    for any graph a PyG user holds, computed exactly as torch_geometric's ``gcn_norm``: from an
    ``edge_index`` (+ ``edge_weight``) or a ``Data`` with "remaining" self loops; from a torch
    sparse / SciPy / :class:`CSR` adj_t with ``A + fill * I``; from a ``SparseTensor`` with the
    diagonal set to ``fill``; ``fill = 2`` when ``improved``. ``normalize=False``: A as given.
    ``device``: where a graph held on the host (SciPy, lists) is built (the layers pass x's device).
    Built by one op without a device sync (sparsetorch/_graph_build.py), with its transpose for the
    backward."""
    return _gcn_graph(graph, edge_weight, num_nodes, improved, add_self_loops, normalize, dtype, device).matrix


def _gcn_graph(graph, edge_weight, num_nodes, improved, add_self_loops, normalize, dtype, device) -> GraphMatrix:
    """:func:`gcn_norm` with A^T where the builder made it (see GraphMatrix)."""
    global _warned_improved
    fill = 2.0 if improved else 1.0
    what = "adj_t"
    if is_edge_index(graph) or is_data(graph):
        # The builder checks the index range on the device (no sync of its own).
        e = edges_of(graph, edge_weight, num_nodes, check_range=False)
        if improved and add_self_loops and normalize and e.weights is None and not _warned_improved:
            _warned_improved = True
            warnings.warn("GCNConv(improved=True) with an edge_index and no edge_weight: self loops get weight 1, "
                          "as in torch_geometric 2.8's gcn_norm (pass edge_weight=torch.ones(E) for A + 2I)")
        loops = "remaining" if add_self_loops and normalize else None
        fill = fill if e.weights is not None else 1.0  # torch_geometric 2.8: unweighted loops weigh 1
        what = "edge_index"
    elif edge_weight is not None:
        raise ValueError("edge_weight: only with an edge_index (a sparse adjacency carries its weights as its "
                         "values)")
    elif is_sparse_tensor(graph):
        e = sparse_edges(graph)
        loops = "fill" if add_self_loops and normalize else None
    else:
        a = as_csr(as_adjacency(check_coordinates(graph)), device=None if isinstance(graph, torch.Tensor) else device)
        ensure_valid(a)  # normalising reads the indices: they must be in range first
        if a.batched:
            return GraphMatrix(gcn_normalize(a, add_self_loops, dtype, fill) if normalize else a.to(dtype=dtype), None)
        a = a.to(dtype=dtype)
        if not normalize:
            return GraphMatrix(a, None)
        if a.shape[0] != a.shape[1]:
            raise ValueError(f"A: expected a square matrix (n, n), got shape {a.shape}")
        e = csr_edges(a.crow_indices, a.col_indices, a.values, a.shape)
        loops = "add" if add_self_loops else None
    if e.shape[0] != e.shape[1]:
        raise ValueError(f"{what}: GCNConv needs a square adjacency (one node set), got {e.shape[1]} sources and "
                         f"{e.shape[0]} targets")
    return build_graph(e.cols, e.rows, e.weights, e.shape[1], e.shape[0], loops=loops, fill=fill,
                       norm="gcn" if normalize else None, dtype=dtype, what=what)


def graph_linear(a: Any, x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], activation: str,
                 negative_slope: float, backend: str, transpose: Optional[CSR] = None) -> torch.Tensor:
    """``act(a @ x @ weight.T + bias)`` (weight (out, in)) with the dense product on the cheaper side:
    ``(a @ x) @ weight.T`` when in < out (the SpMM on the narrower side; a first layer's x needs no
    gradient, so neither does its SpMM), else ``a @ (x @ weight.T)``. ``a``: a CSR or a
    distributed matrix; ``transpose``: A^T where it was built with A (see :func:`propagate`)."""
    if weight.shape[1] < weight.shape[0]:
        return dense(propagate(a, x, None, "none", 0.0, backend, transpose=transpose), weight, bias, activation,
                     negative_slope)
    return propagate(a, dense(x, weight), bias, activation, negative_slope, backend, transpose=transpose)


_PYG_DEFAULTS = {"aggr": ("add", "sum"), "flow": ("source_to_target",), "node_dim": (-2, 0),
                 "decomposed_layers": (1,)}


class GCNConv(nn.Module):
    """Graph convolution (Kipf & Welling 2017): ``act(Â @ x @ W.T + bias)``, Â = D^-1/2 (A + I) D^-1/2,
    with torch_geometric's constructor, forward signature and parameters (a drop-in for
    ``torch_geometric.nn.GCNConv``: ``lin.weight`` (out, in) and ``bias``, so state dicts load both
    ways).

    ``GCNConv(in_channels, out_channels, improved=False, cached=False, add_self_loops=None,
    normalize=True, bias=True, *, activation=None, negative_slope=0.01, backend="auto")``;
    ``forward(x, edge_index, edge_weight=None)``. The graph may be an ``edge_index`` (2, E) with
    optional ``edge_weight`` (E,), a torch sparse tensor or ``SparseTensor`` (adj_t, rows =
    targets), a :class:`sparsetorch.CSR` or anything :func:`sparsetorch.as_csr` takes (batched
    (b, n, n) too, with x (b, n, in)), a ``Data`` (``conv(x, data)`` or ``conv(data)``), or a
    distributed matrix (``type(A).__sparsetorch_spmm__``: it normalises itself through
    ``A.gcn_normalized(add_self_loops=, improved=)``). Self loops and normalisation follow PyG's
    ``gcn_norm`` for each kind of input (see :func:`gcn_norm`).

    The propagation matrix is built once per graph: on the layer with ``cached=True`` (then the
    graph argument is not read again: only for a fixed graph), otherwise keyed on the graph's
    tensors (identity + version counter), shared by all layers. PyG keywords of MessagePassing are
    accepted at their defaults; others (``flow="target_to_source"``, ``aggr="mean"``, lazy
    ``in_channels=-1``) raise naming the argument.

    ``torch.compile``: one graph, no break, for every graph input above but torch sparse tensors,
    which torch cannot wrap in a compiled function: convert them outside (``st.from_torch(adj_t)``)
    or pass the ``edge_index``. With ``dynamic=True`` one graph serves mini-batches of every size.
    Only ``cached=True`` keeps a graph across compiled calls (for a fixed graph; needed for CUDA
    graphs, ``mode="reduce-overhead"``); otherwise each compiled call builds its graph (one op, no
    host sync). docs/api.md ("Under torch.compile") has the details.

    Beyond PyG: ``activation`` (one of :data:`sparsetorch.ACTIVATIONS`) is applied inside the layer,
    fused into the SpMM or GEMM epilogue at inference and as one fused bias + activation pass in
    training. The dense product runs on the cheaper side: ``Â @ (x @ W.T)`` when ``in_channels >=
    out_channels``, ``(Â @ x) @ W.T`` otherwise (a first layer on raw features then needs no SpMM
    in its backward). ``weight`` is the (in, out) view ``lin.weight.T`` of earlier versions, and
    their state dicts (key ``weight``, (in, out)) still load.
    """

    def __init__(self, in_channels: int, out_channels: int, improved: bool = False, cached: bool = False,
                 add_self_loops: Optional[bool] = None, normalize: bool = True, bias: bool = True, *,
                 activation: Optional[str] = None, negative_slope: float = 0.01, backend: str = "auto", **kwargs):
        super().__init__()
        name = type(self).__name__
        check_pyg_kwargs(name, kwargs, _PYG_DEFAULTS)
        if not isinstance(in_channels, int) or in_channels <= 0:
            raise ValueError(f"in_channels: expected a positive int, got {in_channels!r} (lazy initialisation "
                             "with -1 and bipartite (tuple) channels are not supported by GCNConv)")
        if add_self_loops is None:
            add_self_loops = normalize
        if add_self_loops and not normalize:
            raise ValueError(f"{name}: add_self_loops=True needs normalize=True (as in torch_geometric)")
        self.in_channels, self.out_channels = int(in_channels), int(out_channels)
        self.improved, self.cached = bool(improved), bool(cached)
        self.add_self_loops, self.normalize = bool(add_self_loops), bool(normalize)
        self.activation = F._activation_name(activation)
        self.negative_slope = float(negative_slope)
        self.backend = backend
        self.lin = nn.Linear(in_channels, out_channels, bias=False)
        self.bias = nn.Parameter(torch.empty(out_channels)) if bias else None
        self._cached_adjacency: Any = None
        self.reset_parameters()

    @property
    def weight(self) -> torch.Tensor:
        """The weight as (in_channels, out_channels): a view of ``lin.weight`` (earlier layout)."""
        return self.lin.weight.t()

    def reset_parameters(self) -> None:
        bound = math.sqrt(6.0 / (self.in_channels + self.out_channels))  # Glorot, as in the paper and PyG
        nn.init.uniform_(self.lin.weight, -bound, bound)
        if self.bias is not None:
            nn.init.zeros_(self.bias)
        self._cached_adjacency = None

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # The earlier layout, ``weight`` (in, out): renamed in place (load_state_dict passes its own
        # copy, and the child ``lin`` reads its key after this).
        if prefix + "weight" in state_dict and prefix + "lin.weight" not in state_dict:
            state_dict[prefix + "lin.weight"] = state_dict.pop(prefix + "weight").t()
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def propagation_matrix(self, graph: Any, dtype: torch.dtype, num_nodes: Optional[int] = None,
                           edge_weight: Optional[torch.Tensor] = None, device: Any = None) -> GraphMatrix:
        """Â for ``graph`` (cached as described in the class docstring), with Â^T where it was built."""
        if self.cached and self._cached_adjacency is not None:
            return self._cached_adjacency
        if graph is None:
            raise ValueError("edge_index: a graph is needed (an edge_index, a sparse adjacency or a Data)")
        if is_distributed(graph):
            g = GraphMatrix(graph.gcn_normalized(add_self_loops=self.add_self_loops, improved=self.improved)
                            if self.normalize else graph, None)
        else:
            def build():
                return _gcn_graph(graph, edge_weight, num_nodes, self.improved, self.add_self_loops, self.normalize,
                                  dtype, device)

            # While tracing nothing is cached: the compiled graph holds the build (one op).
            keys = None if torch.compiler.is_compiling() else graph_keys(graph, edge_weight)
            g = build() if keys is None else cached_graph(
                keys, ("gcn", num_nodes, self.improved, self.add_self_loops, self.normalize, dtype), build)
        if self.cached:
            self._cached_adjacency = g
        return g

    def forward(self, x: Any, edge_index: Any = None, edge_weight: Optional[torch.Tensor] = None) -> torch.Tensor:
        x, graph = split_data(x, edge_index)
        if isinstance(x, (tuple, list)):
            raise ValueError(f"x: {type(self).__name__} does not support bipartite message passing (a tuple of "
                             "node features), as in torch_geometric; use SAGEConv")
        if not isinstance(x, torch.Tensor) or x.dim() < 2 or x.shape[-1] != self.in_channels:
            raise ValueError(f"x: expected (num_nodes, {self.in_channels}) node features (in_channels), got "
                             f"{tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__}")
        g = self.propagation_matrix(graph, x.dtype, x.shape[-2], edge_weight, x.device)
        return graph_linear(g.matrix, x, self.lin.weight, self.bias, self.activation, self.negative_slope,
                            self.backend, g.transpose)

    def extra_repr(self) -> str:
        extra = f", activation={self.activation!r}" if self.activation != "none" else ""
        return (f"{self.in_channels}, {self.out_channels}, improved={self.improved}, cached={self.cached}, "
                f"normalize={self.normalize}, bias={self.bias is not None}{extra}")

