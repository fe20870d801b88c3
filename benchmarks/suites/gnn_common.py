"""What the gnn suite and its mini-batch cases share: the power-law graph generator, torch_geometric's
layers where installed, the layers with their aggregation removed (the dense part of a step), and the
memory release between implementations.
"""
from __future__ import annotations

import functools
import gc

import numpy as np
import torch

import sparsetorch as st
from sparsetorch import _compat


@functools.lru_cache(maxsize=1)  # the GCN and SAGE cases of one graph share it
def power_law_edge_index(nodes: int, entries: int, seed: int, exponent: float = 1.5,
                         device: str = "cpu") -> torch.Tensor:
    """An undirected graph with power-law degrees (Chung-Lu: both ends of each edge drawn with
    probability proportional to a Pareto(``exponent``) node weight), no self loops, no repeated
    edges, both directions stored: an int64 (2, ~entries) edge_index. Deterministic: the weights
    and uniforms come from NumPy's generator, the draws are an exact search in their float64 CDF,
    so every device gives the same graph."""
    rng = np.random.default_rng(seed)
    w = rng.pareto(exponent, nodes) + 1.0
    cdf = torch.from_numpy(np.cumsum(w / w.sum())).to(device)
    u = torch.from_numpy(rng.random((2, entries // 2))).to(device)
    ends = torch.searchsorted(cdf, u).clamp_(max=nodes - 1)
    lo, hi = ends.min(0).values, ends.max(0).values
    keep = lo != hi
    key = torch.unique(lo[keep] * nodes + hi[keep])
    lo, hi = key // nodes, key % nodes
    return torch.cat([torch.stack([lo, hi]), torch.stack([hi, lo])], 1)


def pyg_layers():
    """(torch_geometric.nn, its to_torch_csr_tensor), or (None, None) where torch_geometric is not installed."""
    try:
        import torch_geometric.nn as pyg_nn
        from torch_geometric.utils import to_torch_csr_tensor

        return pyg_nn, to_torch_csr_tensor
    except ImportError:
        return None, None


def release_memory(device: torch.device) -> None:
    """Frees what the previous variant left behind, cuBLAS's workspaces included: torch keeps one per
    (handle, stream), and the autograd engine's thread has its own handle, so the variant timed first
    would otherwise pay 32 MiB per workspace (H100) that the later ones find already allocated."""
    gc.collect()
    st.graph.graph_cache_clear()
    st._transpose.transpose_cache_clear()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        _compat.clear_cublas_workspaces()
        torch.cuda.empty_cache()


class _GCNDensePart(torch.nn.Module):
    """GCNConv without its aggregation: ``lin(x)`` (PyG's GCNConv computes it before propagating)."""

    def __init__(self, in_channels: int, out_channels: int, **_):
        super().__init__()
        self.lin = torch.nn.Linear(in_channels, out_channels)

    def forward(self, x, graph):
        return self.lin(x)


class _SAGEDensePart(torch.nn.Module):
    """SAGEConv without its aggregation: ``lin_l(x) + lin_r(x)``, PyG's two GEMMs."""

    def __init__(self, in_channels: int, out_channels: int, **_):
        super().__init__()
        self.lin_l = torch.nn.Linear(in_channels, out_channels)
        self.lin_r = torch.nn.Linear(in_channels, out_channels, bias=False)

    def forward(self, x, graph):
        return torch.addmm(self.lin_l(x), x, self.lin_r.weight.t())


class DENSE_PART:
    """The layers with the aggregation removed, for the step's dense part: the same model, loss and
    optimiser as the libraries' steps with every layer's sparse work taken out. Both libraries run this
    work too, so torch_geometric's time / this one's about bounds the ratio a step can reach, whatever
    the aggregation costs (separate timings; fusing SAGE's two GEMMs aside)."""
    GCNConv = _GCNDensePart
    SAGEConv = _SAGEDensePart


def dense_part_ms(device: torch.device, model: torch.nn.Module, time_step) -> float:
    """Milliseconds per step of ``model`` (a DENSE_PART network) under ``time_step(model, opt)``."""
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    try:
        return time_step(model, opt) * 1e3
    finally:
        model = opt = None
        release_memory(device)
