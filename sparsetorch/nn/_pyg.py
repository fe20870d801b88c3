"""What the graph layers share: PyG's constructor keywords, the inputs a PyG user passes, and the
products in the cheaper order with fused epilogues."""
from __future__ import annotations

from typing import Any, Dict, Optional, Tuple

import torch

from sparsetorch import functional as F
from sparsetorch._ops import ops
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


def _training(*tensors) -> bool:
    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


def propagate(a: Any, h: torch.Tensor, bias: Optional[torch.Tensor], activation: str, negative_slope: float,
              backend: str, c: Optional[torch.Tensor] = None, transpose: Optional[CSR] = None) -> torch.Tensor:
    """``act(a @ h + c + bias)``. Inference: bias and activation in the SpMM's epilogue. Training
    with an activation: the SpMM (with c), then one fused bias_act, whose backward gives the input
    and bias gradients in one pass. ``a``: a CSR or a distributed matrix; ``transpose``: A^T where
    it was built with A (GraphMatrix): under torch.compile, training, the backward multiplies by it
    (:class:`_SpmmWithTranspose`)."""
    beta = 0.0 if c is None else 1.0
    # A distributed matrix gets bias and activation with the product: it runs its own epilogue.
    if isinstance(a, CSR) and _training(h, bias, c, a.values):
        inner_bias = bias if activation == "none" else None
        if transpose is not None and torch.compiler.is_compiling():
            t = transpose
            z = _SpmmWithTranspose.apply(a.values, h, c, inner_bias, a.crow_indices, a.col_indices, t.crow_indices,
                                         t.col_indices, t.values, backend)
        else:
            z = F.spmm(a, h, c=c, beta=beta, bias=inner_bias, backend=backend)
        if activation == "none":
            return z
        return F.bias_act(z, bias=bias, activation=activation, negative_slope=negative_slope)
    return F.spmm(a, h, c=c, beta=beta, bias=bias, activation=activation, negative_slope=negative_slope,
                  backend=backend)


class _SpmmWithTranspose(torch.autograd.Function):
    """``A @ h + c + bias`` (A unbatched) whose backward multiplies by a given A^T: the fresh-graph
    builder's, made with A. A compiled graph consults no transpose cache, so spmm's registered
    backward would sort A's pattern on every step; here the backward is one SpMM on A^T (plus an
    SDDMM when A's values need a gradient: learnable edge weights). Used while tracing only; eager
    calls find the same A^T in the transpose cache."""

    @staticmethod
    def forward(ctx, values, h, c, bias, crow, col, crow_t, col_t, values_t, backend):
        out = ops.spmm(crow, col, values, h, 1.0, c, 0.0 if c is None else 1.0, bias, "none", 0.01, backend)
        ctx.save_for_backward(crow, col, h if ctx.needs_input_grad[0] else None, crow_t, col_t, values_t)
        return out

    @staticmethod
    def backward(ctx, grad):
        crow, col, h, crow_t, col_t, values_t = ctx.saved_tensors
        need_values, need_h, need_c, need_bias = ctx.needs_input_grad[:4]
        gz = grad.contiguous()
        g_values = g_h = g_c = g_bias = None
        if need_values:
            g_values = ops.sddmm(crow, col, gz, h.contiguous())
            if g_values.dim() == 2:  # h batched over one A: summed over the batch
                g_values = g_values.sum(0)
        if need_h:
            g_h = ops.spmm(crow_t, col_t, values_t, gz, 1.0, None, 0.0, None, "none", 0.01, "auto")
        if need_c:
            g_c = gz
        if need_bias:
            g_bias = gz.reshape(-1, gz.shape[-1]).sum(0)
        return g_values, g_h, g_c, g_bias, None, None, None, None, None, None


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
