"""Autograd for every differentiable sparsetorch op, and the one way each op is called.

**Calling an op** (:func:`call_op`, and :func:`spmm_call` for the product): every Python caller --
st.spmm, SpmmPlan, the layers, the backward formulas below -- reaches an op through these two, which pick
how the call records autograd:

* nothing requires grad (eager): the op's dispatcher entry below the Autograd key
  (``_compat.BelowAutograd``, ``_compat.op_entry``). torch.library's Python autograd wrapper would
  only find that nothing requires grad and redispatch; below it a 1 x 1 product costs ~4 us of host time
  instead of ~10 us (2-core CPU, torch 2.13);
* the product records a gradient (eager): :class:`SpmmFunction`, a ``torch.autograd.Function`` with the
  same backward as the op's registered autograd: the registered one goes through the Python wrapper that
  torch.library puts around a custom op, 65-80 us per forward against 17 us (same machine);
* while torch.compile traces: the op itself, so that compile sees one opaque call with its fake kernel and
  the registered autograd below. ``tests/test_autograd.py`` checks that both autograds give the same
  gradients.

With an activation and a recorded gradient, the product and the activation are two ops: the backward then
has the pre-activation without recomputing the product (the fused epilogue is for inference).

**Gradients** (torch.library.register_autograd). Each backward computes only the gradients that are needed
(``ctx.needs_input_grad``) and runs on sparsetorch's own kernels where there is one:

* spmm ``y = act(alpha * A @ B + beta * C + bias)``: ``gz = grad * act'(z)`` (fused
  bias_act_backward); ``grad_B = alpha * A^T @ gz`` (spmm with A's transpose, whose pattern is
  made once and cached, see _transpose.py); ``grad_values = alpha * sddmm(gz, B)`` on A's pattern;
  ``grad_C = beta * gz``; ``grad_bias = gz`` summed over rows. With an activation fused into the op,
  z is recomputed by one more spmm (:func:`spmm_call` avoids that, see above).
* spmm_blocked (SpmmPlan's "blocked" route): as spmm, A's CSR is among its inputs.
* sddmm ``v = alpha * (a @ b^T)`` at A's entries: ``grad_a = alpha * A(v') @ b`` and
  ``grad_b = alpha * A(v')^T @ a``, both spmm.
* linear, dense_bmm, binary, binary_scalar, csr_scale; bias_act and activation through the fused
  bias_act_backward kernel; csr_to_dense (each slot's gradient gathered from the output's).

Operands that were broadcast over a batch get their gradient summed over it.
"""
from __future__ import annotations

import torch

from sparsetorch._compat import BelowAutograd, op_entry
from sparsetorch._ops import ops
from sparsetorch._transpose import row_indices, transpose_pattern, transpose_values
from sparsetorch.csr import sum_dtype

_is_compiling = torch.compiler.is_compiling
_grad_enabled = torch.is_grad_enabled
_spmm_entry = op_entry(ops.spmm.default)


def records_grad(*tensors) -> bool:
    """Whether autograd records a call on these arguments (non-tensors are ignored)."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:  # a loop, not any(generator): this runs on every call (~1 us saved)
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def without_autograd(overload, *args):
    """``overload(*args)`` for a call that records no gradient: below the Autograd key in eager (see the
    module docstring), the plain call while torch.compile traces."""
    if _is_compiling():
        return overload(*args)
    with BelowAutograd():
        return op_entry(overload)(*args)  # the overload's own callable: one Python frame less (~0.35 us)


def call_op(op, grad_inputs, *args):
    """``op(*args)`` (``op`` an op packet, e.g. ``ops.bias_act``): through its registered autograd when one
    of ``grad_inputs`` records a gradient, else :func:`without_autograd`. Even the memory-bound
    elementwise ops pay for the wrapper: add on 2^22 float32 measured 1.84 ms through it against 1.77 ms
    below it and 1.76 ms for torch.add (2-core CPU, interleaved medians)."""
    if records_grad(*grad_inputs):
        return op(*args)
    return without_autograd(op.default, *args)


def spmm_call(crow, col, values, dense, alpha=1.0, accumulate=None, beta=0.0, bias=None, activation="none",
              negative_slope=0.01, backend="auto", validate=True):
    """The spmm op, ``act(alpha * A @ dense + beta * accumulate + bias)``, called the one way (module
    docstring). Arguments as the op's schema (csrc/ops.cpp); the op checks them all and validates A."""
    # records_grad, inlined (this function is most of a small product's host time: ~0.3 us saved), grad mode
    # asked last: nothing requires grad in the common inference call.
    grad = (values.requires_grad or dense.requires_grad or (accumulate is not None and accumulate.requires_grad)
            or (bias is not None and bias.requires_grad)) and _grad_enabled()
    if _is_compiling():
        if activation != "none" and grad:
            z = ops.spmm(crow, col, values, dense, alpha, accumulate, beta, bias, "none", negative_slope, backend,
                         validate)
            return ops.activation(z, activation, negative_slope)
        return ops.spmm(crow, col, values, dense, alpha, accumulate, beta, bias, activation, negative_slope, backend,
                        validate)
    if not grad:
        with BelowAutograd():
            if (alpha == 1.0 and accumulate is None and bias is None and activation == "none" and backend == "auto"
                    and validate):
                # The schema's defaults are filled in by the dispatcher: parsing them here cost ~1.2 us.
                return _spmm_entry(crow, col, values, dense)
            return _spmm_entry(crow, col, values, dense, alpha, accumulate, beta, bias, activation, negative_slope,
                               backend, validate)
    z = SpmmFunction.apply(values, dense, accumulate, bias, crow, col, alpha, beta, backend, validate)
    return ops.activation(z, activation, negative_slope) if activation != "none" else z


def _needs(ctx, index: int) -> bool:
    """ctx.needs_input_grad[index]; the dispatcher drops trailing arguments equal to their defaults,
    so the tuple may be shorter than the schema."""
    return index < len(ctx.needs_input_grad) and ctx.needs_input_grad[index]


def _sum_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """Sum a batched gradient over the batch dimension when the input was not batched."""
    if grad.dim() == len(shape) + 1:
        return grad.sum(0)
    return grad


def _activation_grad(grad, z, activation, negative_slope):
    gz, _, _ = ops.bias_act_backward(grad, z, None, None, activation, negative_slope, [True, False, False])
    return gz


# --- spmm --------------------------------------------------------------------------------------

def _spmm_save(ctx, crow, col, values, dense, accumulate, bias, alpha, beta, activation, negative_slope, backend,
               need_values):
    """What the backward of a product keeps (the registered autograd's setup and SpmmFunction alike)."""
    # B is read by the backward only for A's values' gradient (SDDMM) and to recompute the
    # pre-activation: a graph layer's adjacency needs no gradient, and its B is not kept.
    ctx.dense_shape = tuple(dense.shape)
    if activation == "none" and not need_values:
        dense = None
    # c's gradient is beta * grad: c itself is needed only to recompute the pre-activation.
    ctx.acc_like = None if accumulate is None else (accumulate.shape, accumulate.dtype, accumulate.device)
    if activation == "none":
        accumulate = None
    ctx.save_for_backward(crow, col, values, dense, accumulate, bias)
    ctx.alpha, ctx.beta, ctx.activation, ctx.negative_slope, ctx.backend = (alpha, beta, activation,
                                                                            negative_slope, backend)


def _spmm_setup(ctx, inputs, output):
    crow, col, values, dense, alpha, accumulate, beta, bias, activation, negative_slope, backend = inputs[:11]
    needs = getattr(ctx, "needs_input_grad", None)
    _spmm_save(ctx, crow, col, values, dense, accumulate, bias, alpha, beta, activation, negative_slope, backend,
               needs is None or _needs(ctx, 2))


def _spmm_grads(ctx, grad, need_values, need_dense, need_acc, need_bias):
    """(grad_values, grad_dense, grad_accumulate, grad_bias) of spmm, each None unless needed."""
    crow, col, values, dense, accumulate, bias = ctx.saved_tensors
    alpha, beta = ctx.alpha, ctx.beta
    gz = grad.contiguous()
    if ctx.activation != "none":
        z = spmm_call(crow, col, values, dense, alpha, accumulate, beta, bias, "none", ctx.negative_slope,
                      ctx.backend)
        gz = _activation_grad(gz, z, ctx.activation, ctx.negative_slope)
    g_values = g_dense = g_acc = g_bias = None
    if need_values:
        g_values = _sum_to(call_op(ops.sddmm, (gz, dense), crow, col, gz, dense.contiguous(), alpha, ctx.backend),
                           values.shape)
    if need_dense:
        k = ctx.dense_shape[-2]
        crow_t, col_t, perm = transpose_pattern(crow, col, k)
        # A^T has other row lengths than A (a power-law graph's in-degrees): the routing module decides
        # for it from its own cached analysis, whatever route the forward product was given.
        g_dense = spmm_call(crow_t, col_t, transpose_values(values, perm), gz, alpha)
        g_dense = _sum_to(g_dense, ctx.dense_shape)
    if need_acc:  # beta * gz: gz itself at beta = 1 (a layer's root term), no copy and no launch
        shape, dtype, device = ctx.acc_like
        g_acc = (gz if beta == 1.0 else gz * beta) if beta != 0.0 else torch.zeros(shape, dtype=dtype, device=device)
    if need_bias:
        g_bias = gz.reshape(-1, gz.shape[-1]).sum(0)
    return g_values, g_dense, g_acc, g_bias


def _spmm_backward(ctx, grad):
    g_values, g_dense, g_acc, g_bias = _spmm_grads(ctx, grad, _needs(ctx, 2), _needs(ctx, 3), _needs(ctx, 5),
                                                   _needs(ctx, 7))
    return None, None, g_values, g_dense, None, g_acc, None, g_bias, None, None, None, None


torch.library.register_autograd("sparsetorch::spmm", _spmm_backward, setup_context=_spmm_setup)


class SpmmFunction(torch.autograd.Function):
    """The product without an activation, for eager calls that record a gradient (:func:`spmm_call`):
    the same kernels, saved tensors and backward as the op's registered autograd, without torch.library's
    Python wrapper around the op (see the module docstring)."""

    @staticmethod
    def forward(ctx, values, dense, accumulate, bias, crow, col, alpha, beta, backend, validate):
        with BelowAutograd():
            out = _spmm_entry(crow, col, values, dense, alpha, accumulate, beta, bias, "none", 0.01, backend, validate)
        _spmm_save(ctx, crow, col, values, dense, accumulate, bias, alpha, beta, "none", 0.01, backend,
                   ctx.needs_input_grad[0])
        return out

    @staticmethod
    def backward(ctx, grad):
        needs = ctx.needs_input_grad
        g_values, g_dense, g_acc, g_bias = _spmm_grads(ctx, grad, needs[0], needs[1], needs[2], needs[3])
        return g_values, g_dense, g_acc, g_bias, None, None, None, None, None, None


# spmm_blocked: the same product (A also given as CSR), so the same gradients; the blocked layout
# (run_ptr, block_col, pair_values) is derived from the CSR values and gets none.
def _spmm_blocked_setup(ctx, inputs, output):
    crow, col, values, _, _, _, dense, alpha, accumulate, beta, bias, activation, negative_slope = inputs
    _spmm_setup(ctx, (crow, col, values, dense, alpha, accumulate, beta, bias, activation, negative_slope, "auto"),
                output)


def _spmm_blocked_backward(ctx, grad):
    g_values, g_dense, g_acc, g_bias = _spmm_grads(ctx, grad, _needs(ctx, 2), _needs(ctx, 6), _needs(ctx, 8),
                                                   _needs(ctx, 10))
    return None, None, g_values, None, None, None, g_dense, None, g_acc, None, g_bias, None, None


torch.library.register_autograd("sparsetorch::spmm_blocked", _spmm_blocked_backward,
                                setup_context=_spmm_blocked_setup)


# --- sddmm -------------------------------------------------------------------------------------

def _sddmm_setup(ctx, inputs, output):
    crow, col, a, b, alpha, backend = inputs[:6]
    ctx.save_for_backward(crow, col, a, b)
    ctx.alpha, ctx.backend = alpha, backend


def _sddmm_backward(ctx, grad):
    crow, col, a, b = ctx.saved_tensors
    g_a = g_b = None
    grad = grad.contiguous()
    if _needs(ctx, 2):
        g_a = _sum_to(spmm_call(crow, col, grad, b, ctx.alpha), a.shape)
    if _needs(ctx, 3):
        crow_t, col_t, perm = transpose_pattern(crow, col, b.shape[-2])
        g_b = spmm_call(crow_t, col_t, transpose_values(grad, perm), a, ctx.alpha)
        g_b = _sum_to(g_b, b.shape)
    return None, None, g_a, g_b, None, None, None


torch.library.register_autograd("sparsetorch::sddmm", _sddmm_backward, setup_context=_sddmm_setup)


# --- bias_act and activation -------------------------------------------------------------------

def _bias_act_setup(ctx, inputs, output):
    x, scale, bias, activation, negative_slope = inputs
    ctx.save_for_backward(x, scale, bias)
    ctx.activation, ctx.negative_slope = activation, negative_slope


def _bias_act_backward(ctx, grad):
    x, scale, bias = ctx.saved_tensors
    mask = [_needs(ctx, 0), scale is not None and _needs(ctx, 1),
            bias is not None and _needs(ctx, 2)]
    gx, gs, gb = ops.bias_act_backward(grad, x, scale, bias, ctx.activation, ctx.negative_slope, mask)
    return gx if mask[0] else None, gs if mask[1] else None, gb if mask[2] else None, None, None


torch.library.register_autograd("sparsetorch::bias_act", _bias_act_backward, setup_context=_bias_act_setup)


def _activation_setup(ctx, inputs, output):
    x, activation, negative_slope = inputs
    ctx.save_for_backward(x)
    ctx.activation, ctx.negative_slope = activation, negative_slope


def _activation_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    shape = x.shape
    x1 = x.reshape(1) if x.dim() == 0 else x
    gx = _activation_grad(grad.reshape(x1.shape), x1, ctx.activation, ctx.negative_slope)
    return gx.reshape(shape), None, None


torch.library.register_autograd("sparsetorch::activation", _activation_backward, setup_context=_activation_setup)


# --- dense path --------------------------------------------------------------------------------

def _linear_setup(ctx, inputs, output):
    x, weight, bias, activation, negative_slope = inputs
    ctx.save_for_backward(x, weight, bias)
    ctx.activation, ctx.negative_slope = activation, negative_slope


def _linear_backward(ctx, grad):
    x, weight, bias = ctx.saved_tensors
    gz = grad
    if ctx.activation != "none":
        z = ops.linear(x, weight, bias, "none", ctx.negative_slope)
        gz = _activation_grad(grad.contiguous(), z, ctx.activation, ctx.negative_slope)
    gz2 = gz.reshape(-1, weight.shape[0])
    g_x = g_w = g_b = None
    if _needs(ctx, 0):
        g_x = (gz2 @ weight).reshape(x.shape)
    if _needs(ctx, 1):
        g_w = gz2.t() @ x.reshape(-1, weight.shape[1])
    if bias is not None and _needs(ctx, 2):
        g_b = gz2.sum(0)
    return g_x, g_w, g_b, None, None


torch.library.register_autograd("sparsetorch::linear", _linear_backward, setup_context=_linear_setup)


def _dense_bmm_setup(ctx, inputs, output):
    a, b = inputs
    ctx.save_for_backward(a, b)


def _dense_bmm_backward(ctx, grad):
    a, b = ctx.saved_tensors
    g_a = g_b = None
    if _needs(ctx, 0):
        g_a = _sum_to(torch.matmul(grad, b.transpose(-1, -2)), a.shape)
    if _needs(ctx, 1):
        g_b = _sum_to(torch.matmul(a.transpose(-1, -2), grad), b.shape)
    return g_a, g_b


torch.library.register_autograd("sparsetorch::dense_bmm", _dense_bmm_backward, setup_context=_dense_bmm_setup)


# --- elementwise -------------------------------------------------------------------------------

def _binary_setup(ctx, inputs, output):
    x, y, op, alpha = inputs
    ctx.save_for_backward(x if op in ("mul", "div") else None, y if op in ("mul", "div") else None)
    ctx.op, ctx.alpha = op, alpha


def _binary_backward(ctx, grad):
    x, y = ctx.saved_tensors
    op = ctx.op
    if op == "add":
        gx, gy = grad, grad * ctx.alpha
    elif op == "sub":
        gx, gy = grad, grad * -ctx.alpha
    elif op == "mul":
        gx, gy = grad * y, grad * x
    else:  # div
        gx = grad / y
        gy = -gx * x / y
    return (gx if _needs(ctx, 0) else None, gy if _needs(ctx, 1) else None, None, None)


torch.library.register_autograd("sparsetorch::binary", _binary_backward, setup_context=_binary_setup)


def _binary_scalar_setup(ctx, inputs, output):
    x, other, op = inputs
    ctx.other, ctx.op = other, op


def _binary_scalar_backward(ctx, grad):
    op, other = ctx.op, ctx.other
    if op in ("add", "sub"):
        gx = grad
    elif op == "rsub":
        gx = -grad
    elif op == "mul":
        gx = grad * other
    else:  # div
        gx = grad / other
    return gx, None, None


torch.library.register_autograd("sparsetorch::binary_scalar", _binary_scalar_backward,
                                setup_context=_binary_scalar_setup)


# --- csr_scale ---------------------------------------------------------------------------------

def _csr_scale_setup(ctx, inputs, output):
    crow, col, values, row_scale, col_scale = inputs
    ctx.save_for_backward(crow, col, values, row_scale, col_scale)


def _csr_scale_backward(ctx, grad):
    """values' = values * row_scale[row] * col_scale[col]; the factors' gradients are segment sums of
    grad * values * (the other factor) over rows / columns, summed in sum_dtype and rounded once."""
    crow, col, values, row_scale, col_scale = ctx.saved_tensors
    g_values = g_row = g_col = None
    if _needs(ctx, 2):
        g_values = ops.csr_scale(crow, col, grad, row_scale, col_scale)
    need_row = row_scale is not None and _needs(ctx, 3)
    need_col = col_scale is not None and _needs(ctx, 4)
    if need_row or need_col:
        length = col.shape[-1]
        rows, valid = row_indices(crow, length)  # (P, L), P = pattern batches
        cols = col.long().reshape(rows.shape[0], length)  # explicit P: length may be 0
        batch = values.shape[0] if values.dim() == 2 else 1
        acc = sum_dtype(values.dtype)
        gv = (grad.to(acc) * values.to(acc)).reshape(batch, length)
        rows = rows.expand(batch, length)
        valid = valid.expand(batch, length)
        cols = cols.expand(batch, length)

        def factor(scale, index):  # scale[index] per slot, (batch, L), in acc
            s = scale.to(acc).reshape(-1, scale.shape[-1]).expand(batch, scale.shape[-1])
            return s.gather(1, index.clamp(0, scale.shape[-1] - 1))

        in_range = valid
        if col_scale is not None:
            in_range = valid & (cols >= 0) & (cols < col_scale.shape[-1])
        if need_row:
            t = gv * factor(col_scale, cols) if col_scale is not None else gv
            t = torch.where(in_range, t, torch.zeros_like(t))
            m = row_scale.shape[-1]
            g_row = torch.zeros(batch, m, dtype=acc, device=t.device).scatter_add_(1, rows, t)
            g_row = (g_row.sum(0) if row_scale.dim() == 1 else g_row).to(row_scale.dtype)
        if need_col:
            t = gv * factor(row_scale, rows) if row_scale is not None else gv
            t = torch.where(in_range, t, torch.zeros_like(t))
            k = col_scale.shape[-1]
            g_col = torch.zeros(batch, k, dtype=acc, device=t.device).scatter_add_(
                1, cols.clamp(0, max(k - 1, 0)), t)
            g_col = (g_col.sum(0) if col_scale.dim() == 1 else g_col).to(col_scale.dtype)
    return None, None, g_values, g_row, g_col


torch.library.register_autograd("sparsetorch::csr_scale", _csr_scale_backward, setup_context=_csr_scale_setup)


# --- csr_to_dense ------------------------------------------------------------------------------

def _csr_to_dense_setup(ctx, inputs, output):
    crow, col, values, m, k = inputs
    ctx.save_for_backward(crow, col)
    ctx.shape = (values.shape, m, k)


def _csr_to_dense_backward(ctx, grad):
    """dense[b, row, col] += values[b, slot]: each slot's gradient is the output's gradient at its position
    (repeats each get it whole); padding slots and columns outside [0, k) get 0."""
    crow, col = ctx.saved_tensors
    values_shape, m, k = ctx.shape
    if not _needs(ctx, 2):
        return None, None, None, None, None
    length = col.shape[-1]
    batch = values_shape[0] if len(values_shape) == 2 else 1
    rows, valid = row_indices(crow, length)  # (P, L)
    cols = col.long().reshape(rows.shape[0], length)
    valid &= (cols >= 0) & (cols < k)
    flat = torch.where(valid, rows * k + cols, torch.zeros_like(cols)).expand(batch, length)
    g = grad.reshape(batch, m * k)
    g = g.gather(1, flat) if g.shape[1] > 0 else g.new_zeros(batch, length)
    g = torch.where(valid.expand(batch, length), g, torch.zeros_like(g))
    return None, None, g.reshape(values_shape), None, None


torch.library.register_autograd("sparsetorch::csr_to_dense", _csr_to_dense_backward, setup_context=_csr_to_dense_setup)
