"""The fresh-graph builder: from an edge list to a layer's propagation matrix, its transpose and the
analysis of both, without waiting for the GPU.

Mini-batch GNN training meets a new graph every step (a sampled subgraph), so what it costs to turn
an ``edge_index`` into the matrices the products need is paid every step, and a wait for the GPU
there makes the host's work and the GPU's take turns instead of overlapping. The builder is one op,
``sparsetorch::_build_graph`` (csrc/common/graph_build.h; CPU and CUDA kernels):

1. the index range check (clamped indices are used from here on, so nothing reads out of bounds
   whatever the input holds), the entries per target and per source, and from those counts the
   row-length statistics of A and of A^T in the layout of csrc/common/csr_analysis.h;
2. one stable sort by target (A = adj_t, rows = targets) and one by source (A^T), the values (edge
   weights, GCN's D^-1/2 (A + I) D^-1/2 or the mean's 1/deg), and the slot map of A^T. A dropped self
   loop stays in its row with value 0, so every size is known on the host without reading the data:
   the op's fake kernel (sparsetorch/_ops.py) gives torch.compile the same sizes (E edges + n loops),
   so a compiled layer sees one opaque call, and with ``dynamic=True`` one graph serves every batch size.

On the CPU a bad index raises IndexError at once (also inside a compiled graph). On CUDA the check's
result (with the statistics) is copied to pinned memory behind an event (``PendingCheck``): the
products route the new matrices provisionally until it lands, and a bad index makes every value NaN
and raises IndexError at every use of the graph after the check has landed, and at the next graph built.

Edge weights that require a gradient get the op's pattern, check and analyses, and values computed
from the weights by torch ops (``_differentiable_values``), so that autograd reaches them.

The statistics go to the analysis cache, so the products on the new matrices are neither checked nor
analysed again. In eager mode A^T also goes to the transpose cache (``_transpose.remember_transpose``),
so the backward neither sorts nor gathers; while tracing, where no cache is consulted, the caller
gets A^T with A (:class:`GraphMatrix`) and passes it to the product (sparsetorch/nn/_pyg.py).

Within a row, entries keep the order of the edge list (the sorts are stable): deterministic, and the
products accept any column order.
"""
from __future__ import annotations

from typing import Any, NamedTuple, Optional

import torch

from sparsetorch._ops import ops
from sparsetorch._transpose import remember_transpose
from sparsetorch.csr import CSR, sum_dtype

__all__ = ["build_graph", "GraphMatrix", "LOOP_MODES", "NORMS"]

LOOP_MODES = (None, "remaining", "fill", "add")
NORMS = (None, "gcn", "mean")


class GraphMatrix(NamedTuple):
    """A graph layer's propagation matrix and, where it was built with it, its transpose."""

    matrix: Any                # a CSR, or a distributed matrix (which runs its own product)
    transpose: Optional[CSR]   # A^T, values included; None: the product's backward finds A^T itself


def build_graph(src: torch.Tensor, dst: torch.Tensor, weights: Optional[torch.Tensor], n_src: int, n_dst: int, *,
                loops: Optional[str] = None, fill: float = 1.0, norm: Optional[str] = None,
                dtype: torch.dtype = torch.float32, what: str = "edge_index") -> GraphMatrix:
    """adj_t (n_dst x n_src, rows = targets) of the edges ``src[e] -> dst[e]`` with weights
    ``weights[e]`` (ones when None), and its transpose (see the module docstring).

    ``loops`` (square graphs only): ``"remaining"`` drops the existing self loops and gives every node
    one loop weighing its last existing loop's weight, else ``fill`` (PyG's add_remaining_self_loops);
    ``"fill"`` drops them and adds loops of weight ``fill``; ``"add"`` keeps them and adds loops of
    weight ``fill`` (A + fill * I); None leaves the edges as they are.
    ``norm``: ``"gcn"`` scales every entry by d_target * d_source with d = (row sums of adj_t)^-1/2
    (0 for an empty row); ``"mean"`` divides every entry by its row's number of entries; None keeps
    the weights. Differentiable in ``weights``. Out-of-range indices raise IndexError naming ``what``.
    ``n_src`` and ``n_dst`` may be symbolic (torch.compile with ``dynamic=True``).
    """
    if loops not in LOOP_MODES:
        raise ValueError(f"loops: expected one of {LOOP_MODES}, got {loops!r}")
    if norm not in NORMS:
        raise ValueError(f"norm: expected one of {NORMS}, got {norm!r}")
    if loops is not None and n_src != n_dst:
        raise ValueError(f"{what}: self loops need a square graph, got {n_src} sources and {n_dst} targets")
    edges = src.shape[0]
    if edges and (n_src == 0 or n_dst == 0):
        raise IndexError(f"{what}: {edges} edges given for a graph of {n_src} sources and {n_dst} targets")
    if src.dtype != dst.dtype:
        src, dst = src.long(), dst.long()
    differentiable = weights is not None and weights.requires_grad and torch.is_grad_enabled()
    # The op checks the indices and records both analyses (on CUDA provisional until its check lands).
    # For weights that require a gradient it gives the pattern only: the values come from torch ops.
    w = None if weights is None or differentiable else weights.to(dtype)
    if src.is_cuda and not torch.compiler.is_compiling():
        # The op's check of the indices lands later on CUDA and holds the edges until then (PendingCheck,
        # csrc/common/csr_analysis.h). Views would hold the caller's edge_index itself, the key of the layers'
        # graph cache: it could not die, nor take its cached matrices with it, until the next graph build.
        src, dst = storage_alias(src), storage_alias(dst)
    crow, col, values, crow_t, col_t, values_t, perm, _ = ops._build_graph(
        src, dst, w, n_src, n_dst, LOOP_MODES.index(loops), float(fill), NORMS.index(norm), dtype, what)
    if differentiable:
        steps = _differentiable_values(src, dst, weights, n_src, n_dst, loops, fill, norm, dtype)
        # On CUDA a bad index makes the op's values NaN until its check lands: the same here.
        values = torch.where(torch.isnan(values), values, steps)
        values_t = values[perm]
    a = CSR(crow, col, values, (n_dst, n_src))
    a_t = CSR(crow_t, col_t, values_t, (n_src, n_dst))
    if not torch.compiler.is_compiling():
        remember_transpose(crow, col, n_src, crow_t, col_t, perm, values, values_t)
    return GraphMatrix(a, a_t)


def storage_alias(t: torch.Tensor) -> torch.Tensor:
    """``t``'s elements as a tensor that shares its storage but is no view of it: holding it keeps the
    memory alive, not the tensor ``t`` is a view of (nor weak references to that tensor from firing)."""
    return torch.empty(0, dtype=t.dtype, device=t.device).set_(t.untyped_storage(), t.storage_offset(), t.shape,
                                                               t.stride())


def _differentiable_values(src, dst, weights, n_src, n_dst, loops, fill, norm, dtype) -> torch.Tensor:
    """The op's values, in A's slot order, as torch ops of ``weights`` (for autograd). The indices are
    clamped: the op has checked them (on CUDA its check is still in flight, see build_graph)."""
    device = src.device
    edges = src.shape[0]
    nodes = n_dst if loops is not None else 0
    long = torch.int64
    src_c, dst_c = src.long().clamp(0, max(n_src - 1, 0)), dst.long().clamp(0, max(n_dst - 1, 0))
    drop_loops = loops in ("remaining", "fill")
    is_loop = (src_c == dst_c) if drop_loops else torch.zeros(edges, dtype=torch.bool, device=device)
    w_in = weights.to(dtype)
    w = torch.where(is_loop, torch.zeros((), dtype=dtype, device=device), w_in)  # a dropped loop: value 0
    if nodes:
        node = torch.arange(nodes, device=device)
        all_src, all_dst = torch.cat([src_c, node]), torch.cat([dst_c, node])
        if loops == "remaining" and edges:
            # the weight of each node's last existing loop (deterministic: the largest edge number)
            slot = torch.where(is_loop, dst_c, nodes)
            last = torch.full((nodes + 1,), -1, dtype=long, device=device).scatter_reduce_(
                0, slot, torch.arange(edges, device=device), "amax")[:nodes]
            loop_w = torch.where(last >= 0, w_in[last.clamp(min=0)], torch.full_like(w_in[:1], fill))
        else:
            loop_w = torch.full((nodes,), fill, dtype=dtype, device=device)
        w_all = torch.cat([w, loop_w])
        kept = torch.cat([~is_loop, torch.ones(nodes, dtype=torch.bool, device=device)])
    else:
        all_src, all_dst, w_all, kept = src_c, dst_c, w, ~is_loop
    # A's slots in the op's order: entries stably sorted by target.
    order = torch.sort(all_dst, stable=True).indices
    # Sums and scales in sum_dtype, as the op's kernels, and each value rounded once, at the end.
    acc = sum_dtype(dtype)
    if norm == "gcn":
        w_acc = w_all.to(acc)
        degree = torch.zeros(n_dst, dtype=acc, device=device).scatter_add(0, all_dst, w_acc)
        d = degree.pow(-0.5)
        d = torch.where(torch.isinf(d), torch.zeros((), dtype=acc, device=device), d)
        value_all = (d[all_dst] * w_acc * d[all_src]).to(dtype)
    elif norm == "mean":
        count = torch.zeros(n_dst, dtype=long, device=device).scatter_add(0, all_dst, kept.long())
        value_all = (w_all.to(acc) / count.clamp(min=1).to(acc)[all_dst]).to(dtype)
    else:
        value_all = w_all
    return value_all[order]
