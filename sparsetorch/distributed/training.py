"""Full-graph training over a row-partitioned graph: a two-layer GCN, the loss over all ranks' nodes
and the gradient sum.

Each rank holds its nodes' features, labels and rows of the adjacency, and a full copy of the
weights. The loss is the mean over every rank's training nodes (each rank sums its own and divides
by the global count), so the weight gradient is the sum of the ranks' gradients:
:func:`sync_gradients` all-reduces them, and every rank then takes the same optimizer step.
"""
from __future__ import annotations

import math
from typing import Iterable, Optional

import torch
import torch.distributed as dist
from torch import nn

from sparsetorch.nn.gcn import graph_linear

__all__ = ["GCN", "sync_gradients", "masked_cross_entropy"]


class GCN(nn.Module):
    """``A_hat relu(A_hat (x W1) + b1) W2 + b2`` with ``A_hat = adjacency.gcn_normalized()``
    (Kipf & Welling's D^-1/2 (A + I) D^-1/2, computed once per adjacency and cached on it), for any
    adjacency that has ``gcn_normalized`` and that ``st.spmm`` multiplies: a :class:`DistributedCSR`
    (this rank's rows of ``x`` in, this rank's rows of the logits out). Each layer is
    :func:`sparsetorch.nn.gcn.graph_linear`, as in ``st.nn.GCNConv``: the dense product on the cheaper
    side of the SpMM (the first layer ``(A_hat x) W1`` when in < hidden: no SpMM in its backward),
    bias and activation fused."""

    def __init__(self, in_channels: int, hidden_channels: int, out_channels: int, backend: str = "auto"):
        super().__init__()
        self.w1 = nn.Parameter(torch.empty(in_channels, hidden_channels))
        self.b1 = nn.Parameter(torch.zeros(hidden_channels))
        self.w2 = nn.Parameter(torch.empty(hidden_channels, out_channels))
        self.b2 = nn.Parameter(torch.zeros(out_channels))
        self.backend = backend
        self.reset_parameters()

    def reset_parameters(self, generator: Optional[torch.Generator] = None) -> None:
        for w in (self.w1, self.w2):
            bound = math.sqrt(6.0 / (w.shape[0] + w.shape[1]))  # Glorot, as in the paper
            with torch.no_grad():
                w.copy_(torch.rand(w.shape, generator=generator, dtype=w.dtype, device=w.device) * 2 * bound - bound)
        nn.init.zeros_(self.b1)
        nn.init.zeros_(self.b2)

    def forward(self, x: torch.Tensor, adjacency) -> torch.Tensor:
        a = adjacency.gcn_normalized(add_self_loops=True, improved=False)
        h = graph_linear(a, x, self.w1.t(), self.b1, "relu", 0.0, self.backend)
        return graph_linear(a, h, self.w2.t(), self.b2, "none", 0.0, self.backend)


def masked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, mask: torch.Tensor, group=None) -> torch.Tensor:
    """This rank's share of the mean cross-entropy over the masked nodes of every rank: the sum over
    its own masked nodes divided by the global count (one all-reduce of the count, no host sync)."""
    count = mask.sum().to(logits.dtype)
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(count, group=group)
    per_node = nn.functional.cross_entropy(logits, labels, reduction="none")  # masked by weight: no host sync
    return (per_node * mask.to(per_node.dtype)).sum() / count.clamp(min=1)


def sync_gradients(parameters: Iterable[nn.Parameter], group=None) -> None:
    """Sum every parameter's gradient over the ranks (one all-reduce of the flattened gradients)."""
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads or not dist.is_initialized() or dist.get_world_size(group) == 1:
        return
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, group=group)
    offset = 0
    for g in grads:
        g.copy_(flat[offset:offset + g.numel()].view_as(g))
        offset += g.numel()
