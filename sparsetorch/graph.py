"""Graphs as PyTorch Geometric users hold them: ``edge_index`` (+ ``edge_weight``), torch_sparse's
``SparseTensor``, torch sparse ``adj_t`` and ``Data``; to and from sparsetorch's :class:`CSR`.

Conventions are PyG's. ``edge_index`` is (2, E) with ``edge_index[0]`` the source and
``edge_index[1]`` the target of each edge; ``from_edge_index`` gives the adjacency matrix
``A[edge_index[0], edge_index[1]] = edge_weight`` (as ``torch_geometric.utils.to_torch_csr_tensor``)
and ``transpose=True`` gives ``adj_t`` (rows = targets), which is what message passing
multiplies with: the sum aggregation of PyG is ``spmm(adj_t, x)``. Sparse matrices a layer is
given (torch sparse tensors, ``SparseTensor``, :class:`CSR`, SciPy) are taken as ``adj_t``, as in PyG.
Repeated edges are kept and sum, as PyG's scatter does.

The layers build their propagation matrix from these once per graph: :func:`cached_graph` keys
a result on the input tensors themselves (identity and in-place version counter), so calling a
layer again with the same ``edge_index`` tensor does not rebuild it, and two layers on one graph
share it. An entry lives as long as its key tensors do (and at most 16 graphs are kept). Nothing is
cached while torch.compile traces: a compiled layer builds its graph inside the compiled graph (one
op, sparsetorch/_graph_build.py), or holds it with ``cached=True``.

Under torch.compile the layers take an ``edge_index`` (+ ``edge_weight``), a :class:`CSR`, a
``Data`` or a ``SparseTensor``; a torch sparse tensor cannot enter a compiled graph (torch raises
"Attempted to wrap sparse Tensor"): convert it outside with ``st.from_torch(A)``.
"""
from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

import torch

from sparsetorch._cache import TensorCache
from sparsetorch._graph_build import build_graph
from sparsetorch._ops import ops
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR, _is_scipy_sparse, _torch_csr_notices_off, as_csr

__all__ = ["from_edge_index", "to_edge_index", "is_edge_index", "is_sparse_tensor", "is_data", "Edges",
           "edges_of", "as_adjacency", "cached_graph", "graph_keys", "graph_cache_clear"]


# --- what the user holds -----------------------------------------------------------------------

def is_edge_index(obj: Any) -> bool:
    """A dense integer (2, E) tensor."""
    return (isinstance(obj, torch.Tensor) and obj.layout == torch.strided and obj.dim() == 2
            and obj.shape[0] == 2 and not obj.is_floating_point() and not obj.is_complex()
            and obj.dtype != torch.bool)


def is_sparse_tensor(obj: Any) -> bool:
    """torch_sparse's SparseTensor (recognised without importing torch_sparse)."""
    return type(obj).__name__ == "SparseTensor" and hasattr(obj, "csr") and hasattr(obj, "sparse_sizes")


def is_data(obj: Any) -> bool:
    """A torch_geometric ``Data`` (or anything with ``edge_index`` / ``adj_t`` attributes)."""
    if isinstance(obj, (torch.Tensor, CSR, tuple, list)) or _is_scipy_sparse(obj) or is_sparse_tensor(obj):
        return False
    return getattr(obj, "edge_index", None) is not None or getattr(obj, "adj_t", None) is not None


class Edges:
    """An edge list as the layers see it: ``rows`` are targets (rows of adj_t), ``cols`` sources,
    ``weights`` (E,) or None (all ones), ``shape`` (targets, sources)."""

    def __init__(self, rows, cols, weights, shape):
        self.rows, self.cols, self.weights = rows, cols, weights
        self.shape = (int(shape[0]), int(shape[1]))

    @property
    def device(self) -> torch.device:
        return self.rows.device


def _check_edge_index(edge_index: torch.Tensor, edge_weight: Optional[torch.Tensor],
                      num_nodes: Optional[int], check_range: bool = True) -> Tuple[int, int]:
    """Checks shapes and (one device sync, skipped while tracing) the index range; returns the
    (source, target) node counts. ``check_range=False``: when both counts are given, the range is
    left to the caller (the fresh-graph builder checks it on the device, without a sync of its own)."""
    if not is_edge_index(edge_index):
        what = (f"a {edge_index.dtype} tensor of shape {tuple(edge_index.shape)}"
                if isinstance(edge_index, torch.Tensor) else type(edge_index).__name__)
        raise TypeError(f"edge_index: expected an integer tensor of shape (2, num_edges), got {what}")
    if edge_weight is not None:
        if not isinstance(edge_weight, torch.Tensor) or not edge_weight.is_floating_point():
            raise TypeError(f"edge_weight: expected a floating-point tensor, got "
                            f"{getattr(edge_weight, 'dtype', type(edge_weight).__name__)}")
        if edge_weight.shape != (edge_index.shape[1],):
            raise ValueError(f"edge_weight: expected shape ({edge_index.shape[1]},) (one weight per edge of "
                             f"edge_index), got {tuple(edge_weight.shape)}")
        if edge_weight.device != edge_index.device:
            raise ValueError(f"edge_weight: expected device {edge_index.device} (edge_index's), got "
                             f"{edge_weight.device}")
    if isinstance(num_nodes, (tuple, list)):  # (sources, targets), either may be None
        sizes = tuple(None if s is None else int(s) for s in num_nodes)
        if len(sizes) != 2:
            raise ValueError(f"num_nodes: expected a count or a (sources, targets) pair, got {num_nodes}")
    else:
        sizes = (None, None) if num_nodes is None else (int(num_nodes), int(num_nodes))
    if any(s is not None and s < 0 for s in sizes):
        raise ValueError(f"num_nodes: expected a non-negative count, got {num_nodes}")
    if edge_index.shape[1] == 0:
        return tuple(0 if s is None else s for s in sizes)
    if not check_range and None not in sizes:
        return sizes
    if torch.compiler.is_compiling():
        if None in sizes:
            raise ValueError("num_nodes: needed while tracing (torch.compile); pass it or the node features")
        return sizes
    low, high = int(edge_index.min()), edge_index.max(dim=1).values.tolist()
    if low < 0:
        raise IndexError(f"edge_index: node indices must be >= 0, found {low}")
    if sizes == (None, None):
        n = max(high) + 1
        return n, n
    sizes = tuple(top + 1 if s is None else s for top, s in zip(high, sizes))
    for side, (top, n) in enumerate(zip(high, sizes)):
        if top >= n:
            raise IndexError(f"edge_index: row {side} holds node index {top}, out of range for {n} nodes"
                             f"{' (num_nodes)' if num_nodes is not None else ''}")
    return sizes


def edges_of(graph: Any, edge_weight: Optional[torch.Tensor] = None, num_nodes: Any = None,
             check_range: bool = True) -> Edges:
    """The edge list of an ``edge_index`` (+ ``edge_weight``) or a ``Data``, rows = targets.
    ``num_nodes``: an int, or (sources, targets) for a bipartite graph (PyG's ``size``).
    ``check_range=False``: see :func:`_check_edge_index` (for callers that build with
    :func:`sparsetorch._graph_build.build_graph`, which checks the range itself)."""
    if is_data(graph):
        edge_weight, graph, num_nodes = _data_parts(graph, edge_weight, num_nodes)
    n_src, n_dst = _check_edge_index(graph, edge_weight, num_nodes, check_range)
    return Edges(graph[1], graph[0], edge_weight, (n_dst, n_src))


def _data_parts(data, edge_weight, num_nodes):
    edge_index = getattr(data, "edge_index", None)
    if edge_index is None:
        raise ValueError("data: has no edge_index (a Data holding adj_t is taken as a sparse matrix)")
    if edge_weight is None:
        edge_weight = getattr(data, "edge_weight", None)
        attr = getattr(data, "edge_attr", None)
        if edge_weight is None and isinstance(attr, torch.Tensor) and attr.is_floating_point():
            if attr.dim() == 1 or (attr.dim() == 2 and attr.shape[1] == 1):
                edge_weight = attr.reshape(-1)
    if num_nodes is None:
        num_nodes = getattr(data, "num_nodes", None)
    return edge_weight, edge_index, num_nodes


def sparse_parts(adj: Any) -> Tuple[torch.Tensor, torch.Tensor, Optional[torch.Tensor], Tuple[int, int], tuple]:
    """(crow, col, values or None, shape, key tensors) of a 2-D sparse matrix in any form a layer
    takes (torch sparse CSR/COO, SparseTensor, CSR, SciPy, component tuple). No copy for CSR forms."""
    if is_sparse_tensor(adj):
        rowptr, col, value = adj.csr()
        shape = tuple(int(s) for s in adj.sparse_sizes())
        if value is not None and value.dim() != 1:
            raise ValueError(f"adj_t: SparseTensor values must be 1-D edge weights, got shape {tuple(value.shape)}")
        keys = tuple(t for t in (rowptr, col, value) if t is not None)
        ensure_valid(CSR(rowptr, col, value if value is not None else torch.ones(col.shape, device=col.device), shape))
        return rowptr, col, value, shape, keys
    if isinstance(adj, torch.Tensor) and adj.layout != torch.sparse_csr and adj.layout != torch.strided:
        check_coordinates(adj)
        csr = as_adjacency(adj)
        return csr.crow_indices(), csr.col_indices(), csr.values(), tuple(adj.shape), (adj,)
    a = as_csr(adj)
    if a.batched:
        raise ValueError(f"adj_t: expected a 2-D matrix here, got shape {a.shape}")
    ensure_valid(a)  # normalising runs torch ops over the indices: they must be in range first
    keys = (adj,) if isinstance(adj, torch.Tensor) else (a.crow_indices, a.col_indices, a.values)
    return a.crow_indices, a.col_indices, a.values, a.shape, keys


def check_coordinates(adj: Any) -> Any:
    """``adj``, after checking that a torch sparse COO tensor's indices are within its shape (torch
    converts it to CSR with kernels that assert on the device otherwise). Other inputs pass as they are."""
    if (not isinstance(adj, torch.Tensor) or adj.layout != torch.sparse_coo or torch.compiler.is_compiling()
            or adj._nnz() == 0):
        return adj
    idx = adj._indices()
    low, high = int(idx.min()), idx.max(dim=1).values.tolist()
    if low < 0 or any(h >= s for h, s in zip(high, adj.shape)):
        raise IndexError(f"adj_t: a COO index is out of range for shape {tuple(adj.shape)} (min {low}, max {high})")
    return adj


def as_adjacency(adj: Any):
    """``adj`` with a torch sparse COO/CSC/BSR/BSC tensor converted to CSR (as PyG converts it);
    anything else unchanged."""
    if isinstance(adj, torch.Tensor) and adj.layout in (torch.sparse_coo, torch.sparse_csc, torch.sparse_bsr,
                                                          torch.sparse_bsc):
        if adj.dim() != 2:
            raise ValueError(f"adj_t: expected a 2-D sparse tensor, got shape {tuple(adj.shape)}")
        with _torch_csr_notices_off():  # torch's "beta" notice concerns no input of the caller's
            return adj.to_sparse_csr()
    return adj


def sparse_edges(adj: Any) -> Edges:
    """The edge list of a sparse ``adj_t`` (rows = targets)."""
    crow, col, values, shape, _ = sparse_parts(adj)
    return csr_edges(crow, col, values, shape)


def csr_edges(crow: torch.Tensor, col: torch.Tensor, values: Optional[torch.Tensor], shape) -> Edges:
    """The edge list of an unbatched CSR (rows = targets), without a device sync. The rows come from
    an op that checks the matrix first: sddmm of the row numbers (m, 1) with ones (k, 1) is row(e) at
    entry e, exact in float64, and the op validates A (ValueError naming the defect; the verdict is
    cached with A). So the check also runs inside a compiled graph, which drops a check that has no
    output, and no kernel here reads a malformed row pointer."""
    m, k = shape
    float64 = torch.float64
    rows = ops.sddmm(crow, col, torch.arange(m, dtype=float64, device=crow.device).unsqueeze(1),
                     torch.ones(k, 1, dtype=float64, device=crow.device))
    return Edges(rows.long(), col.long(), values, shape)


# --- building a CSR ----------------------------------------------------------------------------

def from_edge_index(edge_index: Any, num_nodes: Any = None, edge_weight: Optional[torch.Tensor] = None, *,
                    transpose: bool = False, dtype: Optional[torch.dtype] = None,
                    index_dtype: Optional[torch.dtype] = None) -> CSR:
    """The adjacency matrix of an ``edge_index`` as a :class:`CSR`: ``A[src, dst] = edge_weight``
    (ones without weights), shape (num_nodes, num_nodes), repeated edges kept (they sum).

    ``edge_index`` may also be a ``Data`` (its ``edge_index``, ``edge_weight`` or 1-D ``edge_attr``
    and ``num_nodes`` are used). ``num_nodes``: default ``edge_index.max() + 1`` (not while
    torch.compile traces: pass it); a (sources, targets) pair gives a bipartite (sources, targets)
    matrix. ``transpose=True`` returns ``adj_t`` (targets x sources), the matrix that message passing
    multiplies node features with. Within a row, entries keep the order of the edge list. Index dtype
    int32 unless a count needs int64. Built by the fresh-graph builder (one op, O(E); its transpose is
    kept for the backward); differentiable in ``edge_weight``.
    """
    e = edges_of(edge_index, edge_weight, num_nodes)
    weights = e.weights
    if weights is not None and dtype is not None:
        weights = weights.to(dtype)
    dtype = weights.dtype if weights is not None else (dtype or torch.float32)
    built = build_graph(e.cols, e.rows, weights, e.shape[1], e.shape[0], dtype=dtype)
    a = built.matrix if transpose else built.transpose
    return a if index_dtype is None else a.to(index_dtype=index_dtype)


def to_edge_index(A: Any) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(edge_index, edge_weight)`` of a 2-D sparse matrix (anything :func:`as_csr` takes, torch
    sparse COO, SparseTensor): ``edge_index[0]`` the rows, ``edge_index[1]`` the columns (int64),
    as ``torch_geometric.utils.to_edge_index``; the inverse of :func:`from_edge_index`."""
    e = sparse_edges(A)
    weights = e.weights if e.weights is not None else torch.ones(e.rows.shape[0], device=e.device)
    return torch.stack([e.rows, e.cols.long()]), weights


# --- the per-graph cache -----------------------------------------------------------------------
def graph_keys(graph: Any, edge_weight: Optional[torch.Tensor] = None):
    """The user's tensors a propagation matrix is keyed on, or None when the input is copied on
    each call anyway (SciPy, lists) and caching it would only hold memory."""
    if is_edge_index(graph):
        return (graph,) if edge_weight is None else (graph, edge_weight)
    if is_data(graph):
        edge_index = graph.edge_index
        w = edge_weight if edge_weight is not None else getattr(graph, "edge_weight", None)
        if w is None and isinstance(getattr(graph, "edge_attr", None), torch.Tensor):
            w = graph.edge_attr
        return (edge_index,) if w is None else (edge_index, w)
    if isinstance(graph, torch.Tensor):
        return (graph,)
    if isinstance(graph, CSR):
        return (graph.crow_indices, graph.col_indices, graph.values)
    if is_sparse_tensor(graph):
        return sparse_parts(graph)[4]
    if isinstance(graph, tuple) and len(graph) == 4 and all(isinstance(t, torch.Tensor) for t in graph[:3]):
        return tuple(graph[:3])
    return None


_graphs = TensorCache("graph.propagation", max_entries=16, unversioned=True)


def cached_graph(keys: tuple, extra: tuple, build: Callable[[], Any]):
    """``build()``, reused while the same ``keys`` tensors (identity and version counter) come
    back with the same ``extra``. Not cached while tracing, in inference mode (the result would be an
    inference tensor), or when a key tensor requires grad (its result would carry one step's
    autograd graph into the next). Torch sparse tensors, which have no version counter, are keyed on
    their identity alone."""
    if torch.is_inference_mode_enabled() or any(t.requires_grad for t in keys):
        return build()
    return _graphs.get(tuple(keys), tuple(extra), build)


def graph_cache_clear() -> None:
    """Forget every cached propagation matrix (``st.clear_caches()`` clears it with every other cache)."""
    _graphs.clear()
