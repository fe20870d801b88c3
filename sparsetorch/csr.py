"""CSR matrices as sparsetorch's ops see them, and conversions from what users hold.

A :class:`CSR` is four things: ``crow_indices``, ``col_indices``, ``values`` and ``shape``.

* Unbatched, shape ``(m, k)``: ``crow_indices (m+1,)``, ``col_indices (nnz,)``, ``values (nnz,)``,
  with ``crow_indices[-1] == nnz``.
* Batched, shape ``(b, m, k)``, one sparsity pattern per batch: ``crow_indices (b, m+1)``,
  ``col_indices (b, L)``, ``values (b, L)``. Batch ``i`` holds the entries
  ``0 .. crow_indices[i, -1]`` of row ``i``; anything after that is padding and is ignored, so
  batches may have different nnz (``crow_indices[i, -1] <= L``). A 3-D torch CSR tensor is the
  special case where every batch has exactly ``L`` entries.
* Batched with one shared pattern: 1-D ``crow_indices``/``col_indices`` and 2-D ``values (b, nnz)``.

Indices are int32 or int64 (both the same dtype). Column indices may be unsorted and may repeat
within a row; repeated entries are summed, as in SciPy. Every conversion here is O(1) in the
number of entries except where it says otherwise (scipy conversion, packing a list).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple, Union

import warnings

import numpy as np
import torch

from sparsetorch._cache import MISS, TensorCache
from sparsetorch._ops import ops
from sparsetorch._transpose import row_indices

__all__ = [
    "CSR",
    "as_csr",
    "from_torch",
    "from_scipy",
    "from_dense",
    "from_list",
    "to_torch",
    "to_scipy",
    "to_dense",
]

_INDEX_DTYPES = (torch.int32, torch.int64)
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def sum_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype in which sums of ``dtype`` values run: float32 for the half types, as the kernels' opmath
    (a bf16 running sum of like-signed terms stops growing past 256 of them), else ``dtype``."""
    return torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype


@dataclass(frozen=True)
class CSR:
    """A (possibly batched) CSR matrix held as component tensors. See the module docstring."""

    crow_indices: torch.Tensor
    col_indices: torch.Tensor
    values: torch.Tensor
    shape: Tuple[int, ...]

    def __post_init__(self):
        # Plain ints; sizes torch.compile keeps symbolic (dynamic=True) stay SymInts: int() would specialise them.
        object.__setattr__(self, "shape", tuple(s if isinstance(s, torch.SymInt) else int(s) for s in self.shape))
        _check_components(self.crow_indices, self.col_indices, self.values, self.shape)

    # --- properties -----------------------------------------------------------------------
    @property
    def batched(self) -> bool:
        return len(self.shape) == 3

    @property
    def batch_size(self) -> int:
        return self.shape[0] if self.batched else 1

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def index_dtype(self) -> torch.dtype:
        return self.crow_indices.dtype

    @property
    def nnz(self) -> Union[int, torch.Tensor]:
        """Stored entries: an int when unbatched, a (b,) tensor of per-batch counts when batched."""
        if self.crow_indices.dim() == 1:
            return int(self.col_indices.numel())
        return self.crow_indices[:, -1].clone()

    # --- derived matrices -------------------------------------------------------------------
    def with_values(self, values: torch.Tensor) -> "CSR":
        """The same pattern with other values (same shape as ``self.values``)."""
        if values.shape != self.values.shape:
            raise ValueError(f"values: expected shape {tuple(self.values.shape)}, got {tuple(values.shape)}")
        return CSR(self.crow_indices, self.col_indices, values, self.shape)

    def to(self, device=None, dtype: Optional[torch.dtype] = None, index_dtype: Optional[torch.dtype] = None,
           non_blocking: bool = False) -> "CSR":
        """A copy on ``device`` with values of ``dtype`` and indices of ``index_dtype`` (each optional); as
        for a tensor, ``A.to(torch.float32)`` casts the values."""
        if isinstance(device, torch.dtype):
            if dtype is not None:
                raise TypeError("to: dtype given twice (positionally and as dtype=)")
            device, dtype = None, device
        crow, col, values = self.crow_indices, self.col_indices, self.values
        if index_dtype is not None:
            if index_dtype not in _INDEX_DTYPES:
                raise TypeError(f"index_dtype: expected torch.int32 or torch.int64, got {index_dtype}")
            if index_dtype == torch.int32 and crow.dtype != torch.int32:
                # A cast would wrap silently; the sizes alone decide it (no device sync).
                largest = max(col.shape[-1], self.shape[-1])
                if largest > 2**31 - 1:
                    raise ValueError(f"index_dtype: int32 cannot index {largest} stored entries or columns "
                                     "(more than 2^31 - 1); keep int64 indices")
            crow, col = crow.to(index_dtype), col.to(index_dtype)
        if dtype is not None:
            values = values.to(dtype)
        if device is not None:
            crow = crow.to(device, non_blocking=non_blocking)
            col = col.to(device, non_blocking=non_blocking)
            values = values.to(device, non_blocking=non_blocking)
        return CSR(crow, col, values, self.shape)

    def to_dense(self) -> torch.Tensor:
        return to_dense(self)

    def to_torch(self) -> torch.Tensor:
        return to_torch(self)

    def to_scipy(self):
        return to_scipy(self)

    def __repr__(self) -> str:
        return (f"CSR(shape={self.shape}, nnz_stride={self.col_indices.shape[-1]}, dtype={self.dtype}, "
                f"index_dtype={self.index_dtype}, device={self.device})")


def _check_components(crow, col, values, shape) -> None:
    """O(1) checks of a CSR's components against its shape, with messages naming the argument."""
    for name, t in (("crow_indices", crow), ("col_indices", col), ("values", values)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if crow.dtype not in _INDEX_DTYPES or col.dtype not in _INDEX_DTYPES:
        raise TypeError(f"crow_indices/col_indices: expected int32 or int64 indices, got {crow.dtype} and {col.dtype}")
    if crow.dtype != col.dtype:
        raise TypeError(f"crow_indices and col_indices must have the same dtype, got {crow.dtype} and {col.dtype}")
    if values.dtype not in _FLOAT_DTYPES:
        raise TypeError(f"values: expected float16, bfloat16, float32 or float64, got {values.dtype}")
    if not (crow.device == col.device == values.device):
        raise ValueError(f"crow_indices, col_indices and values must be on one device, got "
                         f"{crow.device}, {col.device} and {values.device}")
    if len(shape) not in (2, 3) or any(s < 0 for s in shape):
        raise ValueError(f"shape: expected (m, k) or (batch, m, k) with non-negative sizes, got {shape}")
    m = shape[-2]
    if crow.shape[-1:] != (m + 1,):
        raise ValueError(f"crow_indices: expected last dimension m + 1 = {m + 1} for shape {shape}, "
                         f"got shape {tuple(crow.shape)}")
    if col.dim() != crow.dim():
        raise ValueError(f"col_indices: expected {crow.dim()}-D like crow_indices, got shape {tuple(col.shape)}")
    if values.shape[-1:] != col.shape[-1:] or values.dim() not in (1, 2):
        raise ValueError(f"values: expected shape (nnz,) or (batch, nnz) matching col_indices "
                         f"{tuple(col.shape)}, got {tuple(values.shape)}")
    if len(shape) == 2:
        if crow.dim() != 1 or values.dim() != 1:
            raise ValueError(f"an unbatched CSR of shape {shape} needs 1-D crow_indices and values, got "
                             f"{tuple(crow.shape)} and {tuple(values.shape)}")
    else:
        b = shape[0]
        if crow.dim() == 2 and (crow.shape[0] != b or col.shape[0] != b):
            raise ValueError(f"crow_indices/col_indices: expected batch size {b} for shape {shape}, got "
                             f"{tuple(crow.shape)} and {tuple(col.shape)}")
        if values.dim() != 2 or values.shape[0] != b:
            raise ValueError(f"values: expected shape ({b}, nnz) for a batched CSR of shape {shape}, "
                             f"got {tuple(values.shape)}")


# --- conversions into CSR --------------------------------------------------------------------

def _is_scipy_sparse(obj: Any) -> bool:
    try:
        import scipy.sparse as sp
    except ImportError:  # pragma: no cover - scipy is a dependency
        return False
    return sp.issparse(obj)


def _is_matrix(obj: Any) -> bool:
    """Whether ``obj`` is one sparse matrix by itself (not a component tensor of one)."""
    if isinstance(obj, CSR) or _is_scipy_sparse(obj):
        return True
    return isinstance(obj, torch.Tensor) and obj.layout == torch.sparse_csr


def from_torch(t: torch.Tensor) -> CSR:
    """Wrap a torch sparse CSR tensor, 2-D ``(m, k)`` or 3-D batched ``(b, m, k)``, without copying."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"expected a torch sparse CSR tensor, got {type(t).__name__}")
    if t.layout != torch.sparse_csr:
        hint = " (convert with .to_sparse_csr())" if t.layout in (torch.strided, torch.sparse_coo) else ""
        raise TypeError(f"expected a tensor with layout torch.sparse_csr, got {t.layout}{hint}")
    if t.dim() not in (2, 3):
        raise ValueError(f"expected a 2-D or 3-D (batched) sparse CSR tensor, got {t.dim()}-D with shape "
                         f"{tuple(t.shape)}")
    # A user calls with the same tensor again and again: its checked view is kept while the tensor lives
    # (the view's values are detached, so that they do not keep the tensor alive). Not for tensors that
    # require grad (their values() must stay in the graph) or while tracing.
    cacheable = not t.requires_grad and type(t) is torch.Tensor
    if cacheable:
        hit = _torch_views.lookup((t,))
        if hit is not MISS:
            return hit
    crow, col, values = t.crow_indices(), t.col_indices(), t.values()
    if values.dim() != crow.dim():
        raise ValueError(f"hybrid CSR tensors (dense dimensions in values, shape {tuple(values.shape)}) are "
                         "not supported")
    csr = CSR(crow, col, values.detach() if cacheable else values, tuple(t.shape))
    return _torch_views.store((t,), (), csr) if cacheable else csr


# A torch sparse CSR tensor -> its CSR view (from_torch). Sparse tensors have no version counter: keyed on
# identity alone, the entry dropped with the tensor.
_torch_views = TensorCache("csr.torch_views", max_entries=1024, unversioned=True)


def from_scipy(matrix, device=None, dtype: Optional[torch.dtype] = None,
               index_dtype: Optional[torch.dtype] = None) -> CSR:
    """Copy a ``scipy.sparse`` matrix or array (any format; converted to CSR) into a :class:`CSR`.

    Index dtype: SciPy's (int32 or int64) unless ``index_dtype`` is given. Values keep their
    float dtype unless ``dtype`` is given; integer and bool matrices become float32.
    """
    if not _is_scipy_sparse(matrix):
        raise TypeError(f"expected a scipy.sparse matrix or array, got {type(matrix).__name__}")
    if matrix.ndim != 2:
        raise ValueError(f"expected a 2-D scipy.sparse matrix, got ndim={matrix.ndim}")
    m = matrix.tocsr()
    crow = torch.from_numpy(np.ascontiguousarray(m.indptr))
    col = torch.from_numpy(np.ascontiguousarray(m.indices))
    data = np.ascontiguousarray(m.data)
    if np.iscomplexobj(data):
        raise TypeError("complex scipy matrices are not supported")
    if data.dtype not in (np.float16, np.float32, np.float64):
        data = data.astype(np.float32)
    values = torch.from_numpy(data)
    if index_dtype is None:
        index_dtype = torch.int64 if (crow.dtype == torch.int64 or col.dtype == torch.int64) else torch.int32
    csr = CSR(crow.to(index_dtype), col.to(index_dtype), values, m.shape)
    return csr.to(device=device, dtype=dtype)


def from_dense(t: torch.Tensor, index_dtype: torch.dtype = torch.int64) -> CSR:
    """The nonzeros of a dense 2-D or 3-D tensor as a CSR (3-D: one pattern per batch, padded)."""
    if t.layout != torch.strided:
        raise TypeError(f"expected a dense (strided) tensor, got layout {t.layout}")
    if t.dim() == 2:
        with _torch_csr_notices_off():
            return from_torch(t.to_sparse_csr()).to(index_dtype=index_dtype)
    if t.dim() == 3:
        with _torch_csr_notices_off():
            parts = [from_torch(x.to_sparse_csr()) for x in t.unbind(0)]
        return from_list(parts, shape=tuple(t.shape[1:]), index_dtype=index_dtype, device=t.device, dtype=t.dtype)
    raise ValueError(f"expected a 2-D or 3-D tensor, got shape {tuple(t.shape)}")


def from_list(matrices: Sequence[Any], shape: Optional[Tuple[int, int]] = None, index_dtype=None,
              device=None, dtype=None) -> CSR:
    """Pack 2-D CSR matrices of one shape (and any nnz) into one batched :class:`CSR`.

    Each item may be anything :func:`as_csr` takes. Batch i's entries are copied to the front of
    row i of ``(b, max_nnz)`` component tensors; the rest is zero padding. O(total nnz).
    ``shape`` gives (m, k) when the list may be empty.
    """
    items = [as_csr(x) for x in matrices]
    if not items:
        if shape is None:
            raise ValueError("from_list: an empty list needs shape=(m, k)")
        m, k = shape
        device = torch.device("cpu") if device is None else device
        idx = torch.int64 if index_dtype is None else index_dtype
        return CSR(torch.zeros(0, m + 1, dtype=idx, device=device), torch.zeros(0, 0, dtype=idx, device=device),
                   torch.zeros(0, 0, dtype=dtype or torch.float32, device=device), (0, m, k))
    for i, a in enumerate(items):
        if a.batched:
            raise ValueError(f"from_list: item {i} is batched (shape {a.shape}); expected 2-D matrices")
        if shape is not None and a.shape != tuple(shape):
            raise ValueError(f"from_list: item {i} has shape {a.shape}, expected {tuple(shape)}")
        if a.shape != items[0].shape:
            raise ValueError(f"from_list: item {i} has shape {a.shape} but item 0 has {items[0].shape}; "
                             "every matrix in a batch needs the same (m, k)")
    device = items[0].device if device is None else torch.device(device)
    dtype = dtype or items[0].dtype
    if index_dtype is None:
        index_dtype = torch.int64 if any(a.index_dtype == torch.int64 for a in items) else torch.int32
    nnz = [a.col_indices.numel() for a in items]
    width = max(nnz)
    b, (m, k) = len(items), items[0].shape
    crow = torch.stack([a.crow_indices.to(device=device, dtype=index_dtype) for a in items])
    col = torch.zeros(b, width, dtype=index_dtype, device=device)
    values = torch.zeros(b, width, dtype=dtype, device=device)
    for i, a in enumerate(items):
        col[i, : nnz[i]] = a.col_indices.to(device=device, dtype=index_dtype)
        values[i, : nnz[i]] = a.values.to(device=device, dtype=dtype)
    return CSR(crow, col, values, (b, m, k))


def as_csr(obj: Any, device=None, dtype: Optional[torch.dtype] = None) -> CSR:
    """Turn what users hold into a :class:`CSR`.

    Accepts a :class:`CSR`; a torch sparse CSR tensor (2-D or 3-D); a ``scipy.sparse`` matrix or
    array of any format (copied to ``device``, default CPU); a tuple ``(crow_indices, col_indices,
    values, shape)`` of tensors or NumPy arrays (arrays copied to ``device``, default CPU); or a list
    of 2-D matrices, each any of these (packed into a batch, see :func:`from_list`). Torch tensors
    are never moved between devices or cast implicitly: ``device`` and ``dtype`` (the values' dtype)
    apply to what is copied anyway (SciPy matrices, NumPy arrays, lists).
    """
    if isinstance(obj, CSR):
        return obj
    if isinstance(obj, torch.Tensor):
        return from_torch(obj)
    if _is_scipy_sparse(obj):
        return from_scipy(obj, device=device, dtype=dtype)
    if isinstance(obj, tuple) and len(obj) == 4 and not all(_is_matrix(x) for x in obj):
        crow, col, values, shape = (torch.from_numpy(np.ascontiguousarray(x)).to(device or "cpu")
                                    if isinstance(x, np.ndarray) else x for x in obj)
        if dtype is not None and isinstance(obj[2], np.ndarray):
            values = values.to(dtype)
        if not isinstance(shape, (tuple, list, torch.Size)):
            raise TypeError(f"shape: a (crow_indices, col_indices, values, shape) tuple needs a tuple shape, got "
                            f"{type(shape).__name__}")
        return CSR(crow, col, values, tuple(shape))
    if isinstance(obj, (list, tuple)):
        return from_list(obj, device=device, dtype=dtype)
    raise TypeError(
        "expected a sparse matrix: a torch sparse CSR tensor, a scipy.sparse matrix, a sparsetorch.CSR, "
        f"a (crow_indices, col_indices, values, shape) tuple or a list of 2-D matrices; got {type(obj).__name__}")


# --- conversions out of CSR ------------------------------------------------------------------

def to_dense(a: Any) -> torch.Tensor:
    """Dense tensor of shape ``a.shape``; repeated entries are summed; differentiable in the values. O(nnz + m*k),
    no host sync. The op csr_to_dense: on CUDA one kernel (the densify route's: each row summed in float32 in
    shared memory, then stored once), elsewhere and where deterministic algorithms are on (the kernel's
    shared-memory sums of 3+ repeats of a position have no fixed order) :func:`scatter_to_dense`. Its gradient
    is a gather (_autograd.py)."""
    a = as_csr(a)
    m, k = a.shape[-2], a.shape[-1]
    values = a.values if a.values.dim() == 2 else a.values.unsqueeze(0)  # (b, L)
    if a.device.type == "cuda" and torch.are_deterministic_algorithms_enabled():
        dense = scatter_to_dense(a.crow_indices, a.col_indices, values, m, k)
    else:  # the op's registered autograd (_autograd.py) records the gradient
        dense = ops.csr_to_dense(a.crow_indices, a.col_indices, values, m, k)
    return dense.view(a.shape if a.batched else (m, k))


def scatter_to_dense(crow: torch.Tensor, col: torch.Tensor, values: torch.Tensor, m: int, k: int) -> torch.Tensor:
    """csr_to_dense in torch ops, (b, m, k) from (b, L) values: every slot is scattered to its flat position,
    padding slots and columns outside [0, k) to one spare element past the end (index_add_, or index_put_'s
    sorting accumulate where deterministic algorithms are on)."""
    length = col.shape[-1]
    b = values.shape[0]
    size = b * m * k
    if size == 0:  # nothing to scatter into (no batch, row or column)
        return values.new_zeros(b, m, k)
    # int32 positions where they fit (a 14336 x 4096 weight): every pass over the nnz slots moves half the bytes
    index_dtype = torch.int32 if max(size, length) < 2**31 - 1 else torch.int64
    rows, valid = row_indices(crow, length, index_dtype)  # (patterns, L)
    cols = col.reshape(rows.shape[0], length)
    valid &= (cols >= 0) & (cols < k)  # before the cast: a wild int64 column must not wrap into range
    flat = torch.where(valid, rows * k + cols.to(index_dtype), size)
    if b > 1:
        flat = torch.where(valid, flat + torch.arange(b, device=crow.device, dtype=index_dtype).unsqueeze(1) * (m * k),
                           size)
    flat = flat.reshape(-1)  # padding slots and columns outside [0, k): the spare element, size
    out = torch.zeros(size + 1, dtype=values.dtype, device=values.device)
    if torch.are_deterministic_algorithms_enabled():
        out = out.index_put((flat,), values.reshape(-1), accumulate=True)
    else:
        out = out.index_add(0, flat, values.reshape(-1))
    return out[:size].view(b, m, k)


@torch.library.impl("sparsetorch::csr_to_dense", "CPU")
def _csr_to_dense_cpu(crow, col, values, m, k):
    """The op's CPU version (the CUDA one is a kernel, csrc/cuda/spmm_densify.cu; both check the same)."""
    if crow.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"crow_indices: expected int32 or int64, got {crow.dtype}")
    if col.dtype != crow.dtype:
        raise TypeError(f"col_indices: expected {crow.dtype} (crow_indices' dtype), got {col.dtype}")
    if values.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"values: expected float16, bfloat16, float32 or float64, got {values.dtype}")
    if m < 0 or k < 0:
        raise ValueError(f"m, k: expected non-negative sizes, got {m} and {k}")
    if crow.dim() not in (1, 2) or crow.shape[-1] != m + 1:
        raise ValueError(f"crow_indices: expected shape (m + 1,) or (patterns, m + 1) with m + 1 = {m + 1}, got "
                         f"{tuple(crow.shape)}")
    if col.dim() != crow.dim() or (col.dim() == 2 and col.shape[0] != crow.shape[0]):
        raise ValueError(f"col_indices: expected one row per pattern of crow_indices {tuple(crow.shape)}, got "
                         f"{tuple(col.shape)}")
    if values.dim() not in (1, 2) or values.shape[-1] != col.shape[-1]:
        raise ValueError(f"values: expected shape (L,) or (batch, L) with L = {col.shape[-1]} (col_indices'), got "
                         f"{tuple(values.shape)}")
    batches = values.shape[0] if values.dim() == 2 else 1
    if crow.dim() == 2 and crow.shape[0] not in (1, batches):
        raise ValueError(f"crow_indices: expected 1 pattern or one per batch ({batches}), got {crow.shape[0]}")
    dense = scatter_to_dense(crow, col, values.reshape(batches, col.shape[-1]), m, k)
    return dense if values.dim() == 2 else dense.view(m, k)


class _torch_csr_notices_off(warnings.catch_warnings):
    """torch's one-time notices about its beta sparse CSR support, provoked by sparsetorch building a torch CSR
    tensor for the caller: about torch, not about the caller's input, so they stay quiet."""

    def __enter__(self):
        super().__enter__()
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        warnings.filterwarnings("ignore", message="Sparse invariant checks are implicitly disabled")


def _sparse_csr_tensor(crow, col, values, shape):
    with _torch_csr_notices_off():
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def to_torch(a: Any) -> torch.Tensor:
    """A torch sparse CSR tensor. Batches of different nnz are padded with explicit zeros at
    column 0 of each batch's last row (torch needs one nnz for every batch); a shared pattern is
    repeated per batch. Torch assumes sorted, unique columns per row, which is not checked here."""
    a = as_csr(a)
    if not a.batched:
        return _sparse_csr_tensor(a.crow_indices, a.col_indices, a.values, a.shape)
    crow, col, values = a.crow_indices, a.col_indices, a.values
    b = a.shape[0]
    if crow.dim() == 1:
        crow = crow.unsqueeze(0).expand(b, -1).contiguous()
        col = col.unsqueeze(0).expand(b, -1).contiguous()
    width = col.shape[-1]
    last = crow[:, -1]
    if b > 0 and a.shape[-2] > 0 and bool((last != width).any()):
        pad = torch.arange(width, device=crow.device).unsqueeze(0) >= last.unsqueeze(1)
        col = col.masked_fill(pad, 0)
        values = values.masked_fill(pad, 0)
        crow = crow.clone()
        crow[:, -1] = width
    return _sparse_csr_tensor(crow, col, values, a.shape)


def to_scipy(a: Any):
    """``scipy.sparse.csr_matrix`` (a list of them when batched), on the CPU. float16/bfloat16
    values become float32 (NumPy has no bfloat16)."""
    import scipy.sparse as sp

    a = as_csr(a).to(device="cpu")
    values = a.values if a.dtype in (torch.float32, torch.float64) else a.values.float()

    def one(crow, col, vals):
        nnz = int(crow[-1])
        return sp.csr_matrix((vals[:nnz].numpy(), col[:nnz].numpy(), crow.numpy()), shape=a.shape[-2:])

    if not a.batched:
        return one(a.crow_indices, a.col_indices, values)
    crow, col = a.crow_indices, a.col_indices
    if crow.dim() == 1:
        return [one(crow, col, values[i]) for i in range(a.shape[0])]
    return [one(crow[i], col[i], values[i]) for i in range(a.shape[0])]
