"""Graphs of different sizes packed into one batched SpMM, and back."""
from __future__ import annotations

from typing import Any, List, Optional, Sequence, Tuple

import torch

from sparsetorch.csr import CSR, as_csr, from_list


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
