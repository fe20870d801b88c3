"""Fake (meta) kernels for every sparsetorch op, so torch.compile and opcheck can trace them, and the
native caches listed with the Python ones (sparsetorch/_cache.py), so that ``st.clear_caches()`` resets both.

The native kernels live in csrc/; importing sparsetorch._C registers them. Autograd formulas are
in _autograd.py (imported by the package).
"""
import torch

from sparsetorch import _C  # noqa: F401  (defines torch.ops.sparsetorch.*)
from sparsetorch._cache import register_clear
from sparsetorch._stats import GRAPH_SUMMARY_LENGTH, LENGTH as CSR_STATS_LENGTH, graph_index_dtype

ops = torch.ops.sparsetorch


def _native_cache_size(name: str) -> int:
    names, sizes = ops._native_cache_sizes()
    return int(sizes[names.index(name)])


# Each native cache (csrc/common/native_caches.h) by its own name in st.cache_info().
for _name in ops._native_cache_sizes()[0]:
    register_clear(f"native.{_name}", lambda name=_name: ops._clear_native_caches(name),
                   lambda name=_name: _native_cache_size(name))


def _spmm_out_shape(crow, values, dense):
    m, n = crow.shape[-1] - 1, dense.shape[-1]
    for t, batched_dim in ((crow, 2), (values, 2), (dense, 3)):
        if t.dim() == batched_dim:
            return (t.shape[0], m, n)
    return (m, n)


@torch.library.register_fake("sparsetorch::spmm")
def _spmm_fake(crow_indices, col_indices, values, dense, alpha=1.0, accumulate=None, beta=0.0, bias=None,
               activation="none", negative_slope=0.01, backend="auto", validate=True):
    torch._check(values.dtype == dense.dtype,
                 lambda: f"expected A and B of the same dtype, got A {values.dtype} and B {dense.dtype}")
    return values.new_empty(_spmm_out_shape(crow_indices, values, dense))


@torch.library.register_fake("sparsetorch::spmm_out")
def _spmm_out_fake(crow_indices, col_indices, values, dense, out, alpha=1.0, beta=0.0, bias=None,
                   activation="none", negative_slope=0.01, backend="auto", validate=True):
    return None


@torch.library.register_fake("sparsetorch::spmm_blocked")
def _spmm_blocked_fake(crow_indices, col_indices, values, run_ptr, block_col, pair_values, dense, alpha=1.0,
                       accumulate=None, beta=0.0, bias=None, activation="none", negative_slope=0.01):
    torch._check(values.dtype == dense.dtype,
                 lambda: f"expected A and B of the same dtype, got A {values.dtype} and B {dense.dtype}")
    return dense.new_empty((crow_indices.shape[-1] - 1, dense.shape[-1]))


@torch.library.register_fake("sparsetorch::sddmm")
def _sddmm_fake(crow_indices, col_indices, a, b, alpha=1.0, backend="auto", validate=True):
    torch._check(a.dtype == b.dtype, lambda: f"expected a and b of the same dtype, got a {a.dtype} and b {b.dtype}")
    length = col_indices.shape[-1]
    for t, batched_dim in ((crow_indices, 2), (a, 3), (b, 3)):
        if t.dim() == batched_dim:
            return a.new_empty((t.shape[0], length))
    return a.new_empty((length,))


@torch.library.register_fake("sparsetorch::binary")
def _binary_fake(x, y, op, alpha=1.0):
    return x.new_empty(x.shape)


@torch.library.register_fake("sparsetorch::binary_scalar")
def _binary_scalar_fake(x, other, op):
    return x.new_empty(x.shape)


@torch.library.register_fake("sparsetorch::activation")
def _activation_fake(x, activation, negative_slope=0.01):
    return x.new_empty(x.shape)


@torch.library.register_fake("sparsetorch::bias_act")
def _bias_act_fake(x, scale, bias, activation="none", negative_slope=0.01):
    return x.new_empty(x.shape)


@torch.library.register_fake("sparsetorch::csr_scale")
def _csr_scale_fake(crow_indices, col_indices, values, row_scale, col_scale):
    return values.new_empty(values.shape)


# The analysis ops read data (one device sync) and keep a cache: under tracing they are not run
# (sparsetorch's Python layer skips them while compiling; the compiled ops validate at run time).
@torch.library.register_fake("sparsetorch::csr_stats")
def _csr_stats_fake(crow_indices, col_indices, ncols):
    return crow_indices.new_empty((CSR_STATS_LENGTH,), dtype=torch.int64)


@torch.library.register_fake("sparsetorch::csr_analysis")
def _csr_analysis_fake(crow_indices, col_indices, ncols, force=False):
    return torch.empty((CSR_STATS_LENGTH,), dtype=torch.int64, device="cpu")


@torch.library.register_fake("sparsetorch::_build_graph")
def _build_graph_fake(src, dst, weights, n_src, n_dst, loops, fill, norm, dtype, what):
    # Every size is known from the arguments (a dropped self loop stays in its row): csrc/common/graph_build.h.
    entries = src.shape[0] + (n_dst if loops else 0)
    index_dtype = graph_index_dtype(n_src, n_dst, entries)
    crow, crow_t = src.new_empty((n_dst + 1,), dtype=index_dtype), src.new_empty((n_src + 1,), dtype=index_dtype)
    col, col_t, perm = (src.new_empty((entries,), dtype=index_dtype) for _ in range(3))
    values, values_t = (src.new_empty((entries,), dtype=dtype) for _ in range(2))
    summary = torch.empty((GRAPH_SUMMARY_LENGTH,), dtype=torch.int64, device="cpu")
    return [crow, col, values, crow_t, col_t, values_t, perm, summary]


@torch.library.register_fake("sparsetorch::spmm_tune")
def _spmm_tune_fake(crow_indices, col_indices, values, dense):
    return "auto"


@torch.library.register_fake("sparsetorch::csr_validate")
def _csr_validate_fake(crow_indices, col_indices, ncols, force=False):
    return None


@torch.library.register_fake("sparsetorch::bias_act_backward")
def _bias_act_backward_fake(grad, x, scale, bias, activation, negative_slope, output_mask):
    n = x.shape[-1]
    return (x.new_empty(x.shape) if output_mask[0] else x.new_empty((0,)),
            x.new_empty((n,)) if output_mask[1] else x.new_empty((0,)),
            x.new_empty((n,)) if output_mask[2] else x.new_empty((0,)))


@torch.library.register_fake("sparsetorch::linear")
def _linear_fake(x, weight, bias=None, activation="none", negative_slope=0.01):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


@torch.library.register_fake("sparsetorch::csr_to_dense")
def _csr_to_dense_fake(crow, col, values, m, k):
    return values.new_empty((values.shape[0], m, k) if values.dim() == 2 else (m, k))


@torch.library.register_fake("sparsetorch::dense_bmm")
def _dense_bmm_fake(a, b):
    batch = a.shape[0] if a.dim() == 3 else b.shape[0]
    return a.new_empty((batch, a.shape[-2], b.shape[-1]))
