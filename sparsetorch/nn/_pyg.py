"""What the graph layers share: PyG's constructor keywords, the inputs a PyG user passes, the
transpose mark of a propagation matrix, and the products in the cheaper order with fused epilogues."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from sparsetorch import functional as F
from sparsetorch._transpose import mark_symmetric, symmetric_slots
from sparsetorch.csr import CSR
from sparsetorch.graph import is_data


def check_pyg_kwargs(layer: str, kwargs: Dict[str, Any], defaults: Dict[str, tuple]) -> None:
    """PyG's MessagePassing keywords are accepted at the values that mean what this layer does;
    anything else is an error naming the argument, never a silent difference."""
    for name, value in kwargs.items():
        if name in defaults and value in defaults[name]:
            continue
        if name in defaults:
            raise ValueError(f"{layer}: torch_geometric's argument {name}={value!r} is not supported "
                             f"(supported: {', '.join(repr(v) for v in defaults[name])})")
        raise TypeError(f"{layer}: torch_geometric's argument {name}={value!r} is not supported")


def is_distributed(adjacency: Any) -> bool:
    """A matrix that runs its own product (sparsetorch.distributed) and its own normalisation."""
    return getattr(type(adjacency), "__sparsetorch_spmm__", None) is not None


def split_data(x: Any, graph: Any) -> Tuple[Any, Any]:
    """``layer(data)`` and ``layer(x, data)``: node features and graph out of a ``Data``."""
    if is_data(x):
        data = x
        x = getattr(data, "x", None)
        if x is None:
            raise ValueError("x: the Data passed has no node features (data.x)")
        if graph is None:
            graph = data
    if is_data(graph) and getattr(graph, "edge_index", None) is None:
        graph = graph.adj_t
    return x, graph


def mark_transpose(a: CSR) -> CSR:
    """Mark a propagation matrix whose pattern is symmetric (an undirected graph) so that the
    backward's A^T @ grad runs on A's own indices, with A's values when A is symmetric (GCN) or
    with the transposed values computed here once (mean aggregation): no transpose built, no
    gather per step. One check per graph (two sorts, a device sync); nothing while tracing or
    when the values require grad (they change every call)."""
    if (torch.compiler.is_compiling() or a.batched or a.shape[0] != a.shape[1] or a.values.requires_grad
            or a.values.is_inference()):
        return a
    slots = symmetric_slots(a.crow_indices, a.col_indices, a.shape[1])
    if slots is None:
        return a
    transposed = a.values[slots]
    # Symmetric up to the rounding of the normalisation ((w * d_i) * d_j against (w * d_j) * d_i):
    # then A serves as its own transpose and nothing more is kept.
    eps = torch.finfo(a.dtype).eps
    same = torch.allclose(transposed, a.values, rtol=4 * eps, atol=0.0)
    mark_symmetric(a.crow_indices, a.col_indices, a.values, None if same else transposed)
    return a


def _training(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def propagate(a: Any, h: torch.Tensor, bias: Optional[torch.Tensor], activation: str, negative_slope: float,
              backend: str, c: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``act(a @ h + c + bias)``. Inference: bias and activation in the SpMM's epilogue. Training
    with an activation: the SpMM (with c), then one fused bias_act, whose backward gives the input
    and bias gradients in one pass."""
    beta = 0.0 if c is None else 1.0
    # A distributed matrix gets bias and activation with the product: it runs its own epilogue.
    if isinstance(a, CSR) and activation != "none" and _training(h, bias, c, a.values):
        z = F.spmm(a, h, c=c, beta=beta, backend=backend)
        return F.bias_act(z, bias=bias, activation=activation, negative_slope=negative_slope)
    return F.spmm(a, h, c=c, beta=beta, bias=bias, activation=activation, negative_slope=negative_slope,
                  backend=backend)


def dense(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: str = "none",
          negative_slope: float = 0.01) -> torch.Tensor:
    """``act(x @ weight.T + bias)``. Without an activation, ATen's linear (cuBLAS, its bias in the
    GEMM, a C++ backward: no custom-op dispatch on the host); at inference with an activation,
    sparsetorch's linear with cuBLASLt's fused epilogue; in training with one, the GEMM, then one
    fused bias_act."""
    if activation == "none":
        return torch.nn.functional.linear(x, weight, bias)
    if _training(x, weight, bias):
        return F.bias_act(torch.nn.functional.linear(x, weight), bias=bias, activation=activation,
                          negative_slope=negative_slope)
    return F.linear(x, weight, bias, activation, negative_slope)
