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
   loop stays in its row with value 0, so every size is known on the host without reading the data.

On the CPU a bad index raises IndexError at once. On CUDA the check's result (with the statistics)
is copied to pinned memory behind an event (``PendingCheck``): the products route the new matrices
provisionally until it lands, and a bad index makes every value NaN and raises IndexError at every
use of the graph after the check has landed, and at the next graph built.

Edge weights that require a gradient take the same steps as torch ops here (``_build_differentiable``,
one sync), so autograd reaches them.

The statistics go to the analysis cache, so the products on the new matrices are neither checked nor
analysed again, and A^T goes to the transpose cache (``_transpose.remember_transpose``), so the
backward neither sorts nor gathers. Both caches key on the new tensors and drop the entries with them.

Within a row, entries keep the order of the edge list (the sorts are stable): deterministic, and the
products accept any column order.
"""
from __future__ import annotations

from typing import Optional

import torch

from sparsetorch._ops import ops
from sparsetorch._transpose import remember_transpose
from sparsetorch.csr import CSR, sum_dtype

__all__ = ["build_graph", "LOOP_MODES", "NORMS"]

LOOP_MODES = (None, "remaining", "fill", "add")
NORMS = (None, "gcn", "mean")

_HIST_BINS = 32  # csr_stats::kHistBins
_STATS_LENGTH = 8 + 2 * _HIST_BINS  # csr_stats::kLength


def _row_stats(lengths: torch.Tensor) -> torch.Tensor:
    """The csr_stats vector (csrc/common/csr_analysis.h) of a valid pattern with these row lengths
    (int64, on the device), without leaving the device."""
    device = lengths.device
    if lengths.numel() == 0:
        return torch.zeros(_STATS_LENGTH, dtype=torch.int64, device=device)
    filled = lengths > 0
    # bin of a length l >= 1: floor(log2(l)), read off frexp's exponent (l = mantissa * 2^e, mantissa
    # in [0.5, 1)): exact for every int64 length a double holds exactly (< 2^53).
    bins = (torch.frexp(lengths.double()).exponent.long() - 1).clamp_(0, _HIST_BINS - 1)
    bins = torch.where(filled, bins, _HIST_BINS)  # empty rows go to a bin that is cut off
    hist = torch.zeros(2, _HIST_BINS + 1, dtype=torch.int64, device=device)
    hist[0].scatter_add_(0, bins, torch.ones_like(lengths))
    hist[1].scatter_add_(0, bins, lengths)
    squares = (lengths.double() ** 2).sum().reshape(1).view(torch.int64)
    head = torch.stack([lengths.sum(), lengths.max(), (~filled).sum()])
    return torch.cat([torch.zeros(4, dtype=torch.int64, device=device), head, squares,
                      hist[:, :_HIST_BINS].reshape(-1)])


def _index_dtype(n_src: int, n_dst: int, entries: int) -> torch.dtype:
    """As the op (common/graph_build.cpp): the counts and row pointers reach ``entries``."""
    return torch.int32 if max(n_src, n_dst, entries) < 2**31 - 2 else torch.int64


def build_graph(src: torch.Tensor, dst: torch.Tensor, weights: Optional[torch.Tensor], n_src: int, n_dst: int, *,
                loops: Optional[str] = None, fill: float = 1.0, norm: Optional[str] = None,
                dtype: torch.dtype = torch.float32, what: str = "edge_index") -> CSR:
    """adj_t (n_dst x n_src, rows = targets) of the edges ``src[e] -> dst[e]`` with weights
    ``weights[e]`` (ones when None), its transpose and the analysis of both (see the module docstring).

    ``loops`` (square graphs only): ``"remaining"`` drops the existing self loops and gives every node
    one loop weighing its last existing loop's weight, else ``fill`` (PyG's add_remaining_self_loops);
    ``"fill"`` drops them and adds loops of weight ``fill``; ``"add"`` keeps them and adds loops of
    weight ``fill`` (A + fill * I); None leaves the edges as they are.
    ``norm``: ``"gcn"`` scales every entry by d_target * d_source with d = (row sums of adj_t)^-1/2
    (0 for an empty row); ``"mean"`` divides every entry by its row's number of entries; None keeps
    the weights. Differentiable in ``weights``. Out-of-range indices raise IndexError naming ``what``.
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
    if weights is not None and weights.requires_grad and torch.is_grad_enabled():
        return _build_differentiable(src, dst, weights, n_src, n_dst, loops, fill, norm, dtype, what)
    if src.dtype != dst.dtype:
        src, dst = src.long(), dst.long()
    w = None if weights is None else weights.to(dtype)
    # The op records both analyses (on CUDA provisional until its check lands; a bad index raises then).
    crow, col, values, crow_t, col_t, values_t, perm, _ = ops._build_graph(
        src, dst, w, n_src, n_dst, LOOP_MODES.index(loops), float(fill), NORMS.index(norm), dtype, what)
    return _keep(crow, col, values, crow_t, col_t, values_t, perm, n_src, n_dst)


def _build_differentiable(src, dst, weights, n_src, n_dst, loops, fill, norm, dtype, what) -> CSR:
    """build_graph's steps as torch ops, for edge weights that require a gradient (autograd reaches
    them through the values): the op's matrices, with one sync (the range check and the statistics)."""
    device = src.device
    edges = src.shape[0]
    nodes = n_dst if loops is not None else 0
    long = torch.int64

    # --- 1. on the device: range check, loops to drop, counts and both analyses ----------------------
    src_l, dst_l = src.long(), dst.long()
    if edges:
        src_lo, src_hi = torch.aminmax(src_l)
        dst_lo, dst_hi = torch.aminmax(dst_l)
        bad = (torch.minimum(src_lo, dst_lo) < 0) | (src_hi >= n_src) | (dst_hi >= n_dst)
        src_c, dst_c = src_l.clamp(0, n_src - 1), dst_l.clamp(0, n_dst - 1)
    else:
        bad = torch.zeros((), dtype=torch.bool, device=device)
        src_c, dst_c = src_l, dst_l
    drop_loops = loops in ("remaining", "fill")
    is_loop = (src_c == dst_c) if drop_loops else torch.zeros(edges, dtype=torch.bool, device=device)
    start = 1 if nodes else 0  # the self loop of every node
    # A dropped loop stays in its row with value 0 (as the op: every size is edges + nodes).
    per_target = torch.full((n_dst,), start, dtype=long, device=device).scatter_add_(
        0, dst_c, torch.ones((), dtype=long, device=device).expand(edges))
    per_source = torch.full((n_src,), start, dtype=long, device=device).scatter_add_(
        0, src_c, torch.ones((), dtype=long, device=device).expand(edges))
    summary = torch.cat([bad.long().reshape(1), _row_stats(per_target), _row_stats(per_source)]).cpu()  # the sync
    if summary[0]:
        _raise_out_of_range(src_l, dst_l, n_src, n_dst, what)
    entries = edges + nodes

    index_dtype = _index_dtype(n_src, n_dst, entries)
    w_in = weights.to(dtype)
    w = torch.where(is_loop, torch.zeros((), dtype=dtype, device=device), w_in)
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
    else:
        all_src, all_dst, w_all = src_c, dst_c, w
    sort_dtype = torch.int32 if max(n_src, n_dst) < 2**31 - 1 else long
    order = torch.sort(all_dst.to(sort_dtype), stable=True).indices
    order_t = torch.sort(all_src.to(sort_dtype), stable=True).indices

    # Sums and scales in sum_dtype, as the op's kernels, and each value rounded once, at the end.
    acc = sum_dtype(dtype)
    if norm == "gcn":
        w_acc = w_all.to(acc)
        degree = torch.zeros(n_dst, dtype=acc, device=device).scatter_add(0, all_dst, w_acc)
        d = degree.pow(-0.5)
        d = torch.where(torch.isinf(d), torch.zeros((), dtype=acc, device=device), d)
        value_all = (d[all_dst] * w_acc * d[all_src]).to(dtype)
    elif norm == "mean":
        kept = per_target - torch.zeros(n_dst, dtype=long, device=device).scatter_add_(0, dst_c, is_loop.long())
        value_all = (w_all.to(acc) / kept.clamp(min=1).to(acc)[all_dst]).to(dtype)
    else:
        value_all = w_all

    crow, crow_t = _crows(per_target, per_source, index_dtype)
    col = all_src[order].to(index_dtype)
    col_t = all_dst[order_t].to(index_dtype)
    values, values_t = value_all[order], value_all[order_t]
    # A^T's slot t holds the entry order_t[t]; that entry sits in A's slot inverse[order_t[t]].
    inverse = torch.empty(entries, dtype=long, device=device)
    inverse[order] = torch.arange(entries, device=device)
    perm = inverse[order_t].to(index_dtype)  # 1-D values are indexed with it: int32 serves
    if not torch.compiler.is_compiling():
        ops._csr_analysis_store(crow, col, n_src, summary[1:1 + _STATS_LENGTH])
        ops._csr_analysis_store(crow_t, col_t, n_dst, summary[1 + _STATS_LENGTH:])
    return _keep(crow, col, values, crow_t, col_t, values_t, perm, n_src, n_dst)


def _crows(per_target: torch.Tensor, per_source: torch.Tensor, index_dtype: torch.dtype):
    out = []
    for counts in (per_target, per_source):
        crow = torch.zeros(counts.shape[0] + 1, dtype=torch.int64, device=counts.device)
        torch.cumsum(counts, 0, out=crow[1:])
        out.append(crow.to(index_dtype))
    return out


def _keep(crow, col, values, crow_t, col_t, values_t, perm, n_src, n_dst) -> CSR:
    """A^T into the transpose cache; A."""
    if not torch.compiler.is_compiling():
        remember_transpose(crow, col, n_src, crow_t, col_t, perm, values, values_t)
    return CSR(crow, col, values, (n_dst, n_src))


def _raise_out_of_range(src: torch.Tensor, dst: torch.Tensor, n_src: int, n_dst: int, what: str):
    """The error for out-of-range indices, naming the side and value (graph.py's check of an
    edge_index, whose few syncs are paid only when raising)."""
    from sparsetorch.graph import _check_edge_index

    _check_edge_index(torch.stack([src, dst]), None, (n_src, n_dst))
    raise IndexError(f"{what}: a node index is out of range")  # not reached: the check above raises
