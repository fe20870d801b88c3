"""The public operations: sparse x dense products, elementwise ops and the fused bias + activation.

Sparse arguments may be anything :func:`sparsetorch.as_csr` takes (torch sparse CSR tensors,
scipy.sparse matrices, :class:`sparsetorch.CSR`, component tuples, lists of 2-D matrices). Each function
reaches its op one way (sparsetorch/_autograd.py: ``spmm_call``, ``call_op``).

Under ``torch.compile`` every function here traces whole (``fullgraph=True``; a sparse argument is an
:class:`sparsetorch.CSR`: torch sparse tensors cannot enter a compiled graph). What eager checks on the host
-- shapes, dtypes, devices, argument values -- is checked while tracing; each op checks its operands again
when it runs, and an op that takes a sparse matrix checks its structure then (on the matrix's first use, the
verdict cached), so a malformed matrix raises ValueError in a compiled call as in eager. Only the explicit
re-check of ``validate=True`` and :func:`validate_csr` itself run in eager alone.
"""
from __future__ import annotations

import numbers
from typing import Any, Optional, Union

import torch

from sparsetorch._autograd import call_op, records_grad, spmm_call, without_autograd
from sparsetorch._ops import ops
from sparsetorch._transpose import transpose_pattern, transpose_values
from sparsetorch._validate import ensure_valid, validate_csr
from sparsetorch.csr import _FLOAT_DTYPES, CSR, _is_scipy_sparse, as_csr

__all__ = [
    "ACTIVATIONS",
    "spmm",
    "sddmm",
    "transpose",
    "add",
    "sub",
    "mul",
    "div",
    "activation",
    "relu",
    "leaky_relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "bias_act",
    "scale",
    "scale_rows",
    "scale_cols",
    "validate_csr",
    "spmm_route",
    "set_autotune",
    "linear",
    "dense_bmm",
    "DENSE_CROSSOVER",
]

# Density above which multiplying A as a dense matrix beats the sparse kernels (policy="auto"),
# per device type and dtype, where sparse time = dense GEMM time (linear interpolation between
# measured densities).
# CUDA: H100, A 8192 x 8192 (uniform random pattern) @ B 8192 x 1024, sparse = SpmmPlan(auto) vs
#   dense torch.mm (`python benchmarks/elementwise_dense_cuda.py`; the run's record: docs/history.md).
# CPU: 2 cores, A 2048 x 2048 @ 2048 x 256 float32 (`python -m benchmarks --device cpu`: 5% sparse 5.7 ms vs
#   dense 10.8 ms, 10% 11.7 vs 10.5); float64 and the half types were not measured on the CPU and
#   reuse the float32 value.
DENSE_CROSSOVER = {
    "cuda": {"float32": 0.0741, "float32_tf32": 0.0081, "float64": 0.0323, "float16": 0.0063, "bfloat16": 0.0057},
    "cpu": {"float32": 0.090, "float64": 0.090, "float16": 0.090, "bfloat16": 0.090},
}

ACTIVATIONS = ("none", "relu", "leaky_relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh")


def _activation_name(act: Optional[str]) -> str:
    name = "none" if act is None else act
    if name not in ACTIVATIONS:
        raise ValueError(f"activation: unknown activation {act!r}; expected one of {', '.join(ACTIVATIONS)}")
    return name


def _is_sparse(obj: Any) -> bool:
    if isinstance(obj, torch.Tensor):  # first: no SciPy check on the common case (nor while compile traces)
        return obj.layout == torch.sparse_csr
    return isinstance(obj, (CSR, list, tuple)) or _is_scipy_sparse(obj)


def _like(original: Any, result: CSR):
    """Return ``result`` in the kind the caller passed: a torch CSR tensor stays one."""
    if isinstance(original, torch.Tensor):
        return result.to_torch()
    return result


# --- SpMM ------------------------------------------------------------------------------------

def spmm(A: Any, B: torch.Tensor, *, alpha: float = 1.0, beta: float = 0.0, c: Optional[torch.Tensor] = None,
         bias: Optional[torch.Tensor] = None, activation: Optional[str] = None, negative_slope: float = 0.01,
         out: Optional[torch.Tensor] = None, validate: Optional[bool] = None, backend: str = "auto",
         policy: str = "sparse") -> torch.Tensor:
    """``act(alpha * (A @ B) + beta * c + bias)`` for sparse (CSR) ``A`` and dense ``B``.

    Shapes (``A`` may be batched with a different sparsity pattern per batch):

    ====================  ==================  ==============
    A                     B                   result
    ====================  ==================  ==============
    (m, k)                (k, n)              (m, n)
    (m, k)                (b, k, n)           (b, m, n)      one A for every batch
    (b, m, k)             (k, n)              (b, m, n)      one B for every batch
    (b, m, k)             (b, k, n)           (b, m, n)
    ====================  ==================  ==============

    ``c`` (the output's shape) is read, never written; ``beta == 0`` ignores it entirely. With
    ``out=`` the result is written into ``out``, which is also the accumulate operand
    (``out = act(alpha*A@B + beta*out + bias)``). ``bias`` has shape ``(n,)``. ``activation`` is
    one of :data:`ACTIVATIONS`. ``B`` may have any strides (a non-row-major ``B`` is copied on the
    CPU).

    ``A`` and ``B`` must have one dtype and device when ``A`` is a torch tensor or an :class:`CSR` (the
    error says which conversion fixes it); a SciPy matrix, NumPy arrays or a list, copied anyway, are
    copied to B's device and dtype.

    ``validate``: by default (``None``) A's structure is checked on its first use (O(nnz) on its
    device, one small device-to-host read) and a malformed A raises ValueError naming the defect; the
    verdict is cached with the matrix (keyed on its index tensors and their in-place version counters),
    so repeated calls with the same A pay nothing. ``True`` re-checks now; ``False`` skips the check for
    a caller who vouches for A: a corrupt A then gives an unspecified result, never a crash (the own
    kernels skip out-of-range entries, and cuSPARSE is only used for a matrix that passed the check).

    Under ``torch.compile`` (a :class:`CSR` A; torch sparse tensors cannot enter a compiled graph):
    the shapes, dtypes and arguments are checked while tracing, as in eager, and the compiled op checks
    A's structure when it runs (on each matrix's first use, the verdict cached as in eager), so a
    malformed A raises ValueError there too; ``validate=True`` checks as the default does (the forced
    re-check runs in eager only), ``validate=False`` skips the check.

    ``backend`` picks the CUDA route (:func:`spmm_route` tells which one "auto" takes): ``"cusparse"``
    (cusparseSpMM; batches as strided batch for one
    shared pattern, else one block-diagonal product; refuses more stored entries than positions),
    ``"native"`` (sparsetorch's row-group kernel, epilogue fused), ``"balanced"`` (sparsetorch's
    kernel for skewed rows: each block splits the entries of its 32 rows evenly among its lanes, so a
    long row is shared instead of serialised; deterministic), ``"split"`` (sparsetorch's kernel
    for skewed rows split by entries over the whole matrix: rows longer than a unit cut across
    blocks, their pieces added in a fixed order by a second kernel; deterministic), ``"tiled"`` (sparsetorch's kernel
    for long rows and wide B: B streamed through shared memory; any column order), ``"densify"`` (A
    expanded to a dense matrix on the GPU, one cuBLAS GEMM with fp32 accumulation and TF32 off: for
    A more than a few percent dense, above all in bf16/fp16 on tensor cores; O(batch*m*k) memory;
    same results as the sparse routes up to rounding, NaN/Inf in B included: a device-side check
    reruns the row-group kernel when B is not finite) or ``"auto"`` (the routing module,
    csrc/common/spmm_routing.cpp, from A's cached analysis -- row-length distribution, density, batch
    layout -- and B's width and dtype; docs/routing.md). The CPU has a single kernel and accepts any.

    ``policy``: ``"sparse"`` (default) always runs a sparse kernel; ``"dense"`` expands A to a dense
    matrix and runs a dense GEMM (cuBLAS on CUDA), for matrices too dense to gain from sparsity;
    ``"auto"`` picks dense when A's stored density exceeds :data:`DENSE_CROSSOVER` for the device and
    dtype. The dense route has dense-product semantics: a NaN/Inf in B reaches every output row, also
    through A's structural zeros (the sparse route follows SciPy and skips them), which is why it is
    opt-in.
    """
    kind = type(A)
    if kind is CSR:  # the common cases first: a small matrix's call is mostly this function
        crow, col, values, shape = A.crow_indices, A.col_indices, A.values, A.shape
    elif kind is torch.Tensor and A.layout == torch.sparse_csr:
        # Straight to the components (torch keeps them consistent), not through a CSR view: 46 -> 16 us
        # for a first call on a new 161 x 161 torch CSR tensor (2-core CPU).
        crow, col, values, shape = A.crow_indices(), A.col_indices(), A.values(), A.shape
        if values.dim() != crow.dim():
            raise ValueError(f"A: hybrid CSR tensors (dense dimensions in values, shape {tuple(values.shape)}) are "
                             "not supported")
    else:
        delegate = getattr(kind, "__sparsetorch_spmm__", None)
        if delegate is not None:  # matrices that run their own product (sparsetorch.distributed)
            return delegate(A, B, alpha=alpha, beta=beta, c=c, bias=bias, activation=activation,
                            negative_slope=negative_slope, out=out, validate=validate, backend=backend, policy=policy)
        _check_dense(B, "B")
        a = _coerce_operand(A, B)
        crow, col, values, shape = a.crow_indices, a.col_indices, a.values, a.shape
    if not isinstance(B, torch.Tensor) or B.layout != torch.strided:
        _check_dense(B, "B")
    b_shape = B.shape
    b_dim = len(b_shape)
    if b_dim != 2 and b_dim != 3:
        raise ValueError(f"B: expected a 2-D (k, n) or 3-D (batch, k, n) tensor, got shape {tuple(b_shape)}")
    if shape[-1] != b_shape[-2]:
        raise ValueError(f"shape mismatch: A has shape {tuple(shape)} but B has shape {tuple(b_shape)} "
                         f"(A's columns {shape[-1]} != B's rows {b_shape[-2]})")
    if b_dim == 3 and len(shape) == 3 and shape[0] != b_shape[0]:
        raise ValueError(f"batch size mismatch: A has shape {tuple(shape)} but B has shape {tuple(b_shape)}")
    act = "none" if activation is None else _activation_name(activation)
    if validate is None and out is None and policy == "sparse":
        return spmm_call(crow, col, values, B, alpha, c, beta, bias, act, negative_slope, backend, True)
    if validate and not torch.compiler.is_compiling():
        ops.csr_validate(crow, col, shape[-1], True)
    check = validate is not False
    if policy != "sparse":
        if policy not in ("auto", "dense"):
            raise ValueError(f"policy: expected 'auto', 'sparse' or 'dense', got {policy!r}")
        a = CSR(crow, col, values, shape)
        if policy == "dense" or _prefers_dense(a):
            ensure_valid(a, False if validate is False else None)  # the dense route expands A with torch ops
            return _spmm_dense(a, B, alpha, beta, c, bias, act, negative_slope, out)
    if out is not None:
        if c is not None:
            raise ValueError("pass either c= or out= (out is itself the accumulate operand), not both")
        if records_grad(values, B, bias, out):
            raise RuntimeError("spmm: out= does not support autograd (an input requires grad); call without out=")
        without_autograd(ops.spmm_out.default, crow, col, values, B, out, float(alpha), float(beta), bias, act,
                         float(negative_slope), backend, check)
        return out
    return spmm_call(crow, col, values, B, alpha, c, beta, bias, act, negative_slope, backend, check)


def _check_dense(t: Any, name: str) -> None:
    if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
        raise TypeError(f"{name}: expected a dense torch.Tensor, got "
                        f"{type(t).__name__ if not isinstance(t, torch.Tensor) else t.layout}")


def _coerce_operand(A: Any, like: torch.Tensor) -> CSR:
    """A as the sparse operand of a product with the dense tensor ``like`` (B of spmm, a of sddmm): an
    :class:`CSR` or torch tensor as it is (a dtype or device other than like's then raises, naming both and
    the conversion); a SciPy matrix, NumPy arrays or a list, which are copied anyway, copied to like's
    device and dtype. SpmmPlan and the layers take their operands the same way."""
    if type(A) is CSR:
        return A
    return as_csr(A, device=like.device, dtype=like.dtype if like.dtype in _FLOAT_DTYPES else None)


# The entry helpers (sparsetorch/_autograd.py) under the names plan.py and pruned/bitmap.py import them by.
_spmm_op = spmm_call
_records_grad = records_grad


def spmm_route(A: Any, B: torch.Tensor, backend: str = "auto", validate: Optional[bool] = None) -> str:
    """The route ``st.spmm(A, B, backend=backend)`` takes on these operands ("cpu" on the CPU): for
    "auto", the routing module's answer from A's cached analysis (computed now if A is new)."""
    _check_dense(B, "B")
    a = _coerce_operand(A, B)
    if validate:
        validate_csr(a)
    return ops.spmm_route(a.crow_indices, a.col_indices, a.values, B, backend, validate is not False)


def set_autotune(enabled: bool) -> bool:
    """Whether "auto" tunes: while a matrix signature (shape and entry buckets, the row-length
    histogram's shape, dtype, B's width and layout) is undecided, its calls run the candidate routes
    in turn as the real calls and are timed without a sync, until the fastest is known for every
    matrix of that signature (docs/tuning.md). On by default; SPARSETORCH_AUTOTUNE=0 in the environment
    turns it off. Off, every call takes the routing module's rules or a decision already made.
    Returns the previous setting."""
    return bool(ops.set_autotune(bool(enabled)))


def sddmm(A: Any, a: torch.Tensor, b: torch.Tensor, *, alpha: float = 1.0, backend: str = "auto",
          validate: Optional[bool] = None):
    """Sampled dense-dense product: ``alpha * (a @ b.T)`` at the stored entries of ``A`` (A's values
    are not used), returned with A's pattern, in the kind of ``A`` (a torch CSR tensor stays one).

    ``a`` is (m, n) or (batch, m, n), ``b`` (k, n) or (batch, k, n); the result is batched when any
    operand is. This is the gradient of ``spmm`` with respect to A's values. ``backend``: "native"
    (every dtype and batch layout; skips entries whose column is out of range; "balanced" and
    "tiled" run it too) or "cusparse" (cusparseSDDMM, for one unbatched float32/float64 matrix;
    other cases run native; like cuSPARSE SpMM, undefined on malformed indices: validate first).
    "auto" takes native for n <= 256 and cuSPARSE above where it applies (measured on the H100).
    ``validate`` as for :func:`spmm`, and under ``torch.compile`` too. A SciPy ``A`` (or a list) is copied to
    a's device and dtype; an :class:`CSR` or torch tensor must match them.
    """
    _check_dense(a, "a")
    _check_dense(b, "b")
    csr = _coerce_operand(A, a)
    if b.dim() >= 2 and csr.shape[-1] != b.shape[-2]:
        raise ValueError(f"shape mismatch: A has shape {csr.shape} but b has shape {tuple(b.shape)} "
                         f"(A's columns {csr.shape[-1]} != b's rows {b.shape[-2]})")
    if validate and not torch.compiler.is_compiling():
        ops.csr_validate(csr.crow_indices, csr.col_indices, csr.shape[-1], True)
    values = call_op(ops.sddmm, (a, b), csr.crow_indices, csr.col_indices, a, b, float(alpha), backend,
                     validate is not False)
    m, k = csr.shape[-2:]
    shape = (values.shape[0], m, k) if values.dim() == 2 else (m, k)
    result = CSR(csr.crow_indices, csr.col_indices, values, shape)
    return result.to_torch() if isinstance(A, torch.Tensor) else result


def transpose(A: Any, validate: Optional[bool] = None):
    """A^T (per batch), with A's values; in the kind of ``A``. The pattern's transpose is computed
    once per pattern and cached (sparsetorch/_transpose.py); O(nnz log nnz) the first time.
    ``validate`` as for :func:`spmm`."""
    csr = as_csr(A)
    ensure_valid(csr, validate)
    crow_t, col_t, perm = transpose_pattern(csr.crow_indices, csr.col_indices, csr.shape[-1])
    shape = csr.shape[:-2] + (csr.shape[-1], csr.shape[-2])
    result = CSR(crow_t, col_t, transpose_values(csr.values, perm), shape)
    return result.to_torch() if isinstance(A, torch.Tensor) else result


def _density(a: CSR) -> float:
    m, k = a.shape[-2:]
    stored = a.col_indices.shape[-1] * (a.shape[0] if a.batched else 1)  # O(1): counts padding as stored
    return stored / max(1, m * k * (a.shape[0] if a.batched else 1))


def _crossover(device: torch.device, dtype: torch.dtype) -> float:
    table = DENSE_CROSSOVER["cuda" if device.type == "cuda" else "cpu"]
    key = str(dtype).replace("torch.", "")
    if key == "float32" and device.type == "cuda" and torch.backends.cuda.matmul.allow_tf32:
        key = "float32_tf32"
    return table.get(key, 1.0)


def _prefers_dense(a: CSR) -> bool:
    return _density(a) > _crossover(a.device, a.dtype)


def _spmm_dense(a: CSR, B, alpha, beta, c, bias, act, negative_slope, out, dense_a=None):
    """The dense policy: A expanded (O(m*k) memory; `dense_a` if already expanded) and multiplied by
    cuBLAS / the CPU BLAS, then the same epilogue as the sparse route."""
    A = a.to_dense() if dense_a is None else dense_a
    if A.dim() == 2 and B.dim() == 2:
        y = A @ B
    else:
        y = dense_bmm(A, B)
    if alpha != 1.0:
        y = y * alpha
    acc = out if out is not None else c
    if acc is not None and beta != 0.0:
        y = y + beta * acc.to(y.dtype)
    if bias is not None or act != "none":
        y = call_op(ops.bias_act, (y, bias), y, None, bias, act, float(negative_slope))
    if out is not None:
        out.copy_(y)
        return out
    return y


def linear(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor] = None,
           activation: Optional[str] = None, negative_slope: float = 0.01) -> torch.Tensor:
    """``act(x @ weight.T + bias)`` for dense tensors: cuBLASLt with its bias/ReLU/GELU(tanh) epilogues on
    CUDA (other activations as one extra elementwise pass), ATen's matmul on the CPU."""
    act = _activation_name(activation)
    if act != "none" and records_grad(x, weight, bias):  # the pre-activation kept for the backward (see spmm)
        return ops.activation(ops.linear(x, weight, bias, "none", float(negative_slope)), act, float(negative_slope))
    return call_op(ops.linear, (x, weight, bias), x, weight, bias, act, float(negative_slope))


def dense_bmm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """``a @ b`` with a (batch, m, k) or (m, k) and b (batch, k, n) or (k, n), at least one batched:
    one strided-batched GEMM on cuBLAS (an unbatched operand is broadcast with batch stride 0)."""
    return call_op(ops.dense_bmm, (a, b), a, b)


# --- elementwise -----------------------------------------------------------------------------

def _same_pattern(a: CSR, b: CSR) -> None:
    if a.shape != b.shape or a.values.shape != b.values.shape:
        raise ValueError(f"sparse operands need the same shape and pattern, got {a.shape} with "
                         f"{tuple(a.values.shape)} values and {b.shape} with {tuple(b.values.shape)} values")
    same = (a.crow_indices is b.crow_indices or torch.equal(a.crow_indices, b.crow_indices)) and (
        a.col_indices is b.col_indices or torch.equal(a.col_indices, b.col_indices))
    if not same:
        raise ValueError("sparse operands must share one sparsity pattern (equal crow_indices and col_indices)")


def _binary(x: Any, y: Any, op: str, alpha: float = 1.0):
    """Dispatches dense/sparse x tensor/scalar/sparse for add, sub, mul, div."""
    if _is_sparse(x):
        a = as_csr(x)
        ensure_valid(a)
        if isinstance(y, numbers.Number):
            values = _binary_dense(a.values, y, op, alpha)
        elif _is_sparse(y):
            b = as_csr(y)
            ensure_valid(b)
            _same_pattern(a, b)
            values = _binary_dense(a.values, b.values, op, alpha)
        else:
            raise TypeError(f"y: a sparse x takes a scalar or a sparse y of the same pattern, got "
                            f"{type(y).__name__}")
        return _like(x, a.with_values(values))
    if _is_sparse(y):
        raise TypeError("x: a sparse y needs a sparse x of the same pattern (dense op sparse is not supported)")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a tensor or a sparse matrix, got {type(x).__name__}")
    return _binary_dense(x, y, op, alpha)


def _binary_dense(x: torch.Tensor, y: Any, op: str, alpha: float) -> torch.Tensor:
    if isinstance(y, numbers.Number):
        if op in ("add", "sub"):
            y = alpha * y
        return call_op(ops.binary_scalar, (x,), x, float(y), op)
    if not isinstance(y, torch.Tensor):
        raise TypeError(f"y: expected a tensor or a number, got {type(y).__name__}")
    if y.shape != x.shape:
        try:
            y = y.expand(x.shape)  # broadcasting y onto x; the kernel reads a contiguous copy
        except RuntimeError:
            raise ValueError(f"y: shape {tuple(y.shape)} does not broadcast to x's shape {tuple(x.shape)}") from None
    return call_op(ops.binary, (x, y), x, y, op, float(alpha))


def add(x, y, *, alpha: float = 1.0):
    """``x + alpha * y``. x dense (y: same-shape/broadcastable tensor or number) or sparse (y: number or
    a sparse matrix of the same pattern); on a sparse x only the stored values change."""
    return _binary(x, y, "add", alpha)


def sub(x, y, *, alpha: float = 1.0):
    """``x - alpha * y``; operands as in :func:`add`."""
    return _binary(x, y, "sub", alpha)


def mul(x, y):
    """``x * y``; operands as in :func:`add`."""
    return _binary(x, y, "mul")


def div(x, y):
    """``x / y``; operands as in :func:`add`."""
    return _binary(x, y, "div")


def activation(x, name: Optional[str], negative_slope: float = 0.01):
    """Apply an activation (one of :data:`ACTIVATIONS`) elementwise. On a sparse x it acts on the
    stored values only (structural zeros stay zero even where act(0) != 0)."""
    act = _activation_name(name)
    if _is_sparse(x):
        a = as_csr(x)
        ensure_valid(a)
        return _like(x, a.with_values(call_op(ops.activation, (a.values,), a.values, act, float(negative_slope))))
    return call_op(ops.activation, (x,), x, act, float(negative_slope))


def relu(x):
    return activation(x, "relu")


def leaky_relu(x, negative_slope: float = 0.01):
    return activation(x, "leaky_relu", negative_slope)


def gelu(x, approximate: str = "none"):
    if approximate not in ("none", "tanh"):
        raise ValueError(f"approximate: expected 'none' or 'tanh', got {approximate!r}")
    return activation(x, "gelu" if approximate == "none" else "gelu_tanh")


def silu(x):
    return activation(x, "silu")


def sigmoid(x):
    return activation(x, "sigmoid")


def tanh(x):
    return activation(x, "tanh")


def bias_act(x: torch.Tensor, bias: Optional[torch.Tensor] = None,
             scale: Union[None, float, torch.Tensor] = None, activation: Optional[str] = None,
             negative_slope: float = 0.01) -> torch.Tensor:
    """Fused ``act(x * scale + bias)`` over the last dimension of ``x``, in one pass.

    ``bias`` and ``scale`` have shape ``(x.shape[-1],)``; ``scale`` may also be a number.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if isinstance(scale, numbers.Number):
        if x.dim() == 0:
            raise ValueError("x: expected at least 1 dimension (features last), got a 0-D tensor")
        scale = torch.full((x.shape[-1],), float(scale), dtype=x.dtype, device=x.device)
    return call_op(ops.bias_act, (x, scale, bias), x, scale, bias, _activation_name(activation), float(negative_slope))


# --- CSR scaling -----------------------------------------------------------------------------

def scale(A: Any, row: Optional[torch.Tensor] = None, col: Optional[torch.Tensor] = None):
    """``diag(row) @ A @ diag(col)``: each stored value times its row's and its column's factor, in one
    pass (GCN's ``D^-1/2 A D^-1/2`` is ``scale(A, d, d)`` with ``d = deg ** -0.5``). ``row`` has
    shape (m,) and ``col`` (k,); with a batched A either may also be (b, m) / (b, k). A is checked as
    by :func:`spmm` (once per pattern). A SciPy ``A`` is copied to the factors' device and dtype."""
    factor = row if row is not None else col
    a = _coerce_operand(A, factor) if isinstance(factor, torch.Tensor) else as_csr(A)
    ensure_valid(a)
    if col is not None and col.shape[-1] != a.shape[-1]:
        raise ValueError(f"col: expected {a.shape[-1]} entries (A's columns, shape {a.shape}), got shape "
                         f"{tuple(col.shape)}")
    values = call_op(ops.csr_scale, (a.values, row, col), a.crow_indices, a.col_indices, a.values, row, col)
    return _like(A, a.with_values(values))


def scale_rows(A: Any, row: torch.Tensor):
    """``diag(row) @ A``; see :func:`scale`."""
    return scale(A, row=row)


def scale_cols(A: Any, col: torch.Tensor):
    """``A @ diag(col)``; see :func:`scale`."""
    return scale(A, col=col)
