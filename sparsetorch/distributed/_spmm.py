"""The distributed product of a row-partitioned matrix and its autograd.

Forward on rank r (B_r: the rows of B this rank owns, halo: the rows it receives):

    start the all-to-all that brings the halo rows      (async)
    z  = alpha * A_local  @ B_r  + beta * c             (runs while the rows are in flight)
    wait
    z += alpha * A_remote @ halo, then + bias, act      (the epilogue fused in this last product)

With the copy engines, each sender's rows are waited for and multiplied on their own (the remote
part split by sender, once per matrix), so the first senders' products run while the last rows move.

Backward, for grad z = g (the halo gradient first, so its exchange overlaps the larger product):

    g_halo = alpha * A_remote^T @ g ; start sending it back to the rows' owners      (async)
    grad B_r = alpha * A_local^T @ g
    wait; grad B_r[rows sent in the forward] += the gradient rows received (summed per row)
    grad values = alpha * sddmm(g, B_r) on A_local, alpha * sddmm(g, halo) on A_remote

Each product is sparsetorch's single-device ``st.spmm`` (the transposes' patterns are built once and
cached, sparsetorch/_transpose.py). With ``backend="auto"`` on CUDA each part's route is the one
an :class:`~sparsetorch.SpmmPlan` of that part autotunes for the width of B (once per width).
"""
from __future__ import annotations

from typing import Optional

import torch
from torch.autograd.function import once_differentiable

from sparsetorch import functional as F
from sparsetorch._transpose import transpose_pattern, transpose_values
from sparsetorch.csr import CSR
from sparsetorch.plan import SPMM_BACKENDS, SpmmPlan

__all__ = ["product", "DistributedSpmm"]


def _route(matrix, key: str, part: CSR, B: torch.Tensor, backend: str) -> str:
    """The route for one part: ``backend`` as given, or on CUDA with "auto" the route a plan of
    this part autotuned for B's width (routes only a plan has fall back to "auto")."""
    if backend != "auto" or not B.is_cuda or part.values.numel() == 0 or B.shape[-1] == 0:
        return backend
    plan = matrix._route_plans.get(key)
    if plan is None:
        plan = matrix._route_plans[key] = SpmmPlan(part, validate=False)
    route = plan._route(B, part.values)
    return route if route in SPMM_BACKENDS else "auto"


def _transposed(matrix, key: str, part: CSR, values: torch.Tensor) -> CSR:
    """part^T with ``values`` (the pattern cached per part; the values when they are the part's own)."""
    m, k = part.shape
    if part.col_indices.numel() == 0:  # (transpose_pattern cannot reshape an empty pattern)
        return CSR(part.crow_indices.new_zeros(k + 1), part.col_indices, values, (k, m))
    crow_t, col_t, perm = transpose_pattern(part.crow_indices, part.col_indices, k)
    if values is part.values:
        cached = matrix._transposed_values.get(key)
        if cached is None or cached[0] is not values or cached[1] != values._version:
            cached = matrix._transposed_values[key] = (values, values._version, transpose_values(values, perm))
        vt = cached[2]
    else:
        vt = transpose_values(values, perm)
    return CSR(crow_t, col_t, vt, (k, m))


def product(matrix, B: torch.Tensor, v_local: torch.Tensor, v_remote: torch.Tensor, alpha: float, beta: float,
            c: Optional[torch.Tensor], bias: Optional[torch.Tensor], act: str, negative_slope: float, backend: str,
            policy: str):
    """``(z, halo)``: z = act(alpha * A_r @ B + beta * c + bias) for this rank's rows (see the module
    docstring); halo: the B rows received (kept for the gradient of the remote values)."""
    plan = matrix.halo_plan
    exchanging = plan.active and B.shape[1] > 0
    if exchanging:
        halo, pending = plan.start(B, plan.exchange_dtype)
    local = matrix.local if v_local is matrix.local.values else matrix.local.with_values(v_local)
    remote = matrix.remote if v_remote is matrix.remote.values else matrix.remote.with_values(v_remote)
    has_remote = remote.col_indices.numel() > 0
    z = F.spmm(local, B, alpha=alpha, beta=beta, c=c, bias=None if has_remote else bias,
               activation="none" if has_remote else act, negative_slope=negative_slope,
               backend=_route(matrix, "local", local, B, backend), policy=policy)
    if not exchanging:
        return z, None
    parts = _sender_parts(matrix) if has_remote and len(plan.senders) > 1 and plan.per_sender else None
    if parts is None:
        plan.finish(pending)
        halo = halo.to(B.dtype)  # rows moved in a narrower exchange_dtype back to B's (else the same tensor)
        if has_remote:
            F.spmm(remote, halo, alpha=alpha, beta=1.0, out=z, bias=bias, activation=act,
                   negative_slope=negative_slope, backend=_route(matrix, "remote", remote, halo, backend),
                   policy=policy)
        return z, halo
    for i, (p, lo, hi, entries, crow_p, col_p) in enumerate(parts):  # each sender's rows as they land
        plan.finish_from(pending, p)
        last = i == len(parts) - 1
        part = CSR(crow_p, col_p, remote.values.index_select(0, entries), (z.shape[0], hi - lo))
        rows = halo[lo:hi].to(B.dtype)
        F.spmm(part, rows, alpha=alpha, beta=1.0, out=z, bias=bias if last else None,
               activation=act if last else "none", negative_slope=negative_slope,
               backend=_route(matrix, f"remote from {p}", part, rows, backend), policy=policy)
    plan.finish(pending)
    return z, halo  # in the exchange dtype (DistributedSpmm.forward converts what it keeps)


def _sender_parts(matrix):
    """The remote part split by the rank its columns' rows come from, in the order they land (for
    an exchange whose senders arrive one by one): per sender p, ``(p, lo, hi, entries, crow, col)``,
    the halo rows [lo, hi) from p and the remote entries whose columns lie there (columns shifted
    to start at 0). Built once per matrix; a part's values are gathered per product."""
    if matrix._sender_parts is None:
        plan, remote = matrix.halo_plan, matrix.remote
        crow, col = remote.crow_indices, remote.col_indices
        m = crow.numel() - 1
        rows = torch.repeat_interleave(torch.arange(m, device=col.device), (crow[1:] - crow[:-1]).long(),
                                       output_size=col.numel())  # the size known: no device sync
        first = [0]
        for c in plan.recv_counts:
            first.append(first[-1] + c)
        parts = []
        for p in plan.senders:
            lo, hi = first[p], first[p + 1]
            entries = ((col >= lo) & (col < hi)).nonzero().squeeze(1)
            crow_p = torch.zeros(m + 1, dtype=crow.dtype, device=crow.device)
            crow_p[1:] = torch.bincount(rows[entries], minlength=m).cumsum(0)
            parts.append((p, lo, hi, entries, crow_p, (col[entries] - lo).to(col.dtype)))
        matrix._sender_parts = parts
    return matrix._sender_parts


class DistributedSpmm(torch.autograd.Function):
    """z = alpha * A_r @ B + beta * c + bias on this rank's rows, differentiable in B (this rank's
    rows), both parts' values, c and bias. The activation is applied outside (its own op)."""

    @staticmethod
    def forward(ctx, B, v_local, v_remote, c, bias, matrix, alpha, beta, backend, policy):
        z, halo = product(matrix, B, v_local, v_remote, alpha, beta, c, bias, "none", 0.01, backend, policy)
        need_b, need_vl, need_vr = ctx.needs_input_grad[:3]
        ctx.matrix, ctx.alpha, ctx.beta, ctx.backend = matrix, alpha, beta, backend
        ctx.exchanging = halo is not None
        if need_vr and halo is not None:
            if halo.dtype != B.dtype:
                halo = halo.to(B.dtype)  # rows moved in a narrower exchange_dtype: a tensor of its own
            elif matrix.halo_plan.halo_is_transient:
                halo = halo.clone()  # the transport's buffer is reused by the next exchange
        ctx.save_for_backward(B if need_vl else None, halo if need_vr else None,
                              v_local if need_b else None, v_remote if need_b else None)
        return z

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        matrix, alpha, backend = ctx.matrix, ctx.alpha, ctx.backend
        B, halo, v_local, v_remote = ctx.saved_tensors
        need_b, need_vl, need_vr, need_c, need_bias = ctx.needs_input_grad[:5]
        g = grad.contiguous()
        g_b = g_vl = g_vr = g_c = g_bias = None
        if need_b:
            plan = matrix.halo_plan
            if ctx.exchanging:
                if matrix.remote.col_indices.numel() > 0:
                    remote_t = _transposed(matrix, "remote", matrix.remote, v_remote)
                    g_halo = F.spmm(remote_t, g, alpha=alpha, backend=_route(matrix, "remote_t", remote_t, g, backend))
                else:
                    g_halo = g.new_zeros((plan.halo_size, g.shape[1]))
                back, pending = plan.start_reverse(g_halo, plan.exchange_dtype)
            local_t = _transposed(matrix, "local", matrix.local, v_local)
            g_b = F.spmm(local_t, g, alpha=alpha, backend=_route(matrix, "local_t", local_t, g, backend))
            if ctx.exchanging:
                plan.finish(pending)
                back = back.to(g_b.dtype)
                if plan.sends_whole_block:
                    g_b += back  # every row came back, in order: a dense add
                elif plan.send_size:
                    g_b.index_add_(0, plan.send_index, back)
        if need_vl:
            g_vl = F.sddmm(matrix.local, g, B.contiguous(), alpha=alpha).values
        if need_vr:
            g_vr = (F.sddmm(matrix.remote, g, halo, alpha=alpha).values if halo is not None
                    else torch.zeros(matrix.remote.values.shape, dtype=g.dtype, device=g.device))
        if need_c:
            g_c = g * ctx.beta
        if need_bias:
            g_bias = g.sum(0)
        return g_b, g_vl, g_vr, g_c, g_bias, None, None, None, None, None
