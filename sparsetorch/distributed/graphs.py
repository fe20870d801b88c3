"""Deterministic synthetic graphs and node data, generated on the device, any block of rows alone.

A rank can make its own rows of a graph without ever holding the whole graph: every random number
is a hash of (seed, global index) (or, for node features, comes from a generator seeded per fixed
chunk of rows), so the rows ``[r0, r1)`` of a graph are the same whether they were made alone or as
part of the whole graph, on one rank or many (for one device type: CPU and CUDA round ``pow`` and
``cumsum`` differently in the last bit, which may move a few edges).

Power-law graph: row degrees follow a Pareto(1.5) law scaled to the mean degree (a few rows hold
thousands of entries); each entry's column is drawn with probability proportional to a second
Pareto weight per node (hub columns), as the benchmarks' SciPy generator does
(power_law_graph in benchmarks/suites/graphs.py).
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from sparsetorch.csr import CSR

__all__ = ["uniform_hash", "power_law_degrees", "power_law_block", "power_law_graph", "node_features", "node_labels",
           "node_mask"]

_M32 = 0xFFFFFFFF
_K = 0x45D9F3B  # the multiplier of a well-mixed 32-bit integer hash; < 2^27, so products stay in int64


def _mix(x: torch.Tensor) -> torch.Tensor:
    x = (((x >> 16) ^ x) * _K) & _M32
    x = (((x >> 16) ^ x) * _K) & _M32
    return (x >> 16) ^ x


def _mix_int(x: int) -> int:
    x &= _M32
    x = (((x >> 16) ^ x) * _K) & _M32
    x = (((x >> 16) ^ x) * _K) & _M32
    return (x >> 16) ^ x


def uniform_hash(index: torch.Tensor, seed: int) -> torch.Tensor:
    """float64 numbers in (0, 1), one per non-negative int64 ``index``, a fixed function of (seed, index)."""
    s = _mix_int(seed * 2 + 1)
    lo, hi = index & _M32, index >> 32
    h = _mix(_mix(lo ^ s) ^ _mix(hi ^ _mix_int(s + 0x9E37)))
    return (h.double() + 0.5) / 4294967296.0


def _pareto(index: torch.Tensor, seed: int, alpha: float) -> torch.Tensor:
    return (1.0 - uniform_hash(index, seed)).pow(-1.0 / alpha)


def power_law_degrees(num_nodes: int, mean_degree: float, seed: int = 0, device=None, alpha: float = 1.5) -> torch.Tensor:
    """Entries per row (int64, >= 1, <= max(1, num_nodes // 2)) of the power-law graph."""
    nodes = torch.arange(num_nodes, device=device)
    x = _pareto(nodes, seed * 4 + 0, alpha)
    deg = torch.round(x / x.mean() * mean_degree)
    return deg.clamp(1, max(1, num_nodes // 2)).long()


def power_law_block(num_nodes: int, mean_degree: float, rows: Optional[Tuple[int, int]] = None, seed: int = 0,
                    device=None, dtype: torch.dtype = torch.float32, index_dtype: torch.dtype = torch.int32,
                    weighted: bool = False, degrees: Optional[torch.Tensor] = None, alpha: float = 1.5) -> CSR:
    """Rows ``[r0, r1)`` (default: all) of the power-law graph on ``num_nodes`` nodes, a CSR of shape
    ``(r1 - r0, num_nodes)`` with global columns sorted within each row (repeated columns kept: they
    are repeated edges). Values are ones, or with ``weighted`` uniform in (0.5, 1.5).
    ``degrees``: :func:`power_law_degrees`' result, if already computed (it is for all rows)."""
    r0, r1 = rows if rows is not None else (0, num_nodes)
    if not 0 <= r0 <= r1 <= num_nodes:
        raise ValueError(f"rows: expected 0 <= r0 <= r1 <= {num_nodes}, got {rows}")
    deg = power_law_degrees(num_nodes, mean_degree, seed, device, alpha) if degrees is None else degrees.to(device)
    device = deg.device
    first = torch.zeros(num_nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(deg, 0, out=first[1:])
    e0, e1 = int(first[r0]), int(first[r1])
    nnz = e1 - e0
    if index_dtype == torch.int32 and max(nnz, num_nodes) > 2**31 - 1:
        raise ValueError(f"index_dtype: int32 cannot index {max(nnz, num_nodes)} entries or columns; use torch.int64")
    weight = _pareto(torch.arange(num_nodes, device=device), seed * 4 + 1, alpha)
    cdf = torch.cumsum(weight, 0)
    cdf /= cdf[-1].clone()
    del weight
    edges = torch.arange(e0, e1, device=device)
    col = torch.searchsorted(cdf, uniform_hash(edges, seed * 4 + 2), right=True).clamp_(max=num_nodes - 1)
    del cdf
    counts = deg[r0:r1]
    local_row = torch.repeat_interleave(torch.arange(r1 - r0, device=device), counts, output_size=nnz)
    col = torch.sort(local_row * num_nodes + col).values - local_row * num_nodes  # sort within rows
    del local_row
    values = (uniform_hash(edges, seed * 4 + 3) + 0.5).to(dtype) if weighted else torch.ones(nnz, dtype=dtype,
                                                                                            device=device)
    crow = first[r0:r1 + 1] - e0
    return CSR(crow.to(index_dtype), col.to(index_dtype), values, (r1 - r0, num_nodes))


def power_law_graph(num_nodes: int, mean_degree: float, seed: int = 0, **kwargs) -> CSR:
    """The whole power-law graph (:func:`power_law_block` with every row)."""
    return power_law_block(num_nodes, mean_degree, None, seed, **kwargs)


_CHUNK = 1 << 16


def node_features(rows: Tuple[int, int], num_features: int, seed: int = 0, device=None,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Standard normal features of nodes ``[r0, r1)``: a generator seeded per chunk of 65536 nodes."""
    r0, r1 = rows
    out = torch.empty(r1 - r0, num_features, dtype=dtype, device=device)
    gen = torch.Generator(device=out.device)
    for chunk in range(r0 // _CHUNK, -(-r1 // _CHUNK)):
        gen.manual_seed(seed * 1_000_003 + chunk)
        block = torch.randn(_CHUNK, num_features, generator=gen, device=out.device)
        lo, hi = max(r0, chunk * _CHUNK), min(r1, (chunk + 1) * _CHUNK)
        out[lo - r0:hi - r0] = block[lo - chunk * _CHUNK:hi - chunk * _CHUNK]
    return out


def node_labels(features: torch.Tensor, num_classes: int, seed: int = 0) -> torch.Tensor:
    """A planted labelling: the class whose random direction a node's features point to most."""
    gen = torch.Generator(device=features.device)
    gen.manual_seed(seed)
    directions = torch.randn(features.shape[1], num_classes, generator=gen, device=features.device)
    return (features.float() @ directions).argmax(1)


def node_mask(rows: Tuple[int, int], fraction: float, seed: int = 0, device=None) -> torch.Tensor:
    """A boolean mask over nodes ``[r0, r1)`` holding about ``fraction`` of them (e.g. training nodes)."""
    return uniform_hash(torch.arange(rows[0], rows[1], device=device), seed * 4 + 5) < fraction
