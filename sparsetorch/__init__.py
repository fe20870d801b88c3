"""sparsetorch: sparse (CSR) and dense linear algebra for PyTorch, on NVIDIA GPUs and CPUs.

    import sparsetorch as st
    C = st.spmm(A, B)          # A: torch sparse CSR, scipy.sparse, st.CSR, ... ; B dense
"""
import torch  # noqa: F401  (loads libtorch before the extension)

from sparsetorch import _ops  # noqa: F401  (loads the native ops and their fake kernels)
from sparsetorch import _autograd  # noqa: F401  (registers the backward of every op)
from sparsetorch._build_info import build_info, cuda_features
from sparsetorch._cache import cache_info, clear_caches
from sparsetorch.csr import (
    CSR,
    as_csr,
    from_dense,
    from_list,
    from_scipy,
    from_torch,
    to_dense,
    to_scipy,
    to_torch,
)
from sparsetorch.plan import SpmmPlan
from sparsetorch._validate import MatrixInfo, analyze as _analyze
from sparsetorch.pruned import (  # pruned-weight formats (also their ops' fake kernels)
    BitmapWeight,
    Csr16Weight,
    SlotWeight,
    Sparse24DecodeWeight,
    bitmap_linear,
    csr16_linear,
    slot_linear,
    sparse24_decode_linear,
)
from sparsetorch.graph import from_edge_index, to_edge_index
from sparsetorch.functional import (
    ACTIVATIONS,
    DENSE_CROSSOVER,
    dense_bmm,
    linear,
    activation,
    add,
    bias_act,
    div,
    gelu,
    leaky_relu,
    mul,
    relu,
    scale,
    scale_cols,
    scale_rows,
    sigmoid,
    silu,
    spmm,
    spmm_route,
    set_autotune,
    sddmm,
    transpose,
    sub,
    tanh,
    validate_csr,
)

from sparsetorch._version import __version__  # noqa: E402

# The tuning tables and their opt-in cache file.
from sparsetorch.tuning import clear_tuning, save_tuning_cache, set_tuning_cache, tuning_signature, tuning_table  # noqa: E402,E501

__all__ = [
    "ACTIVATIONS", "BitmapWeight", "CSR", "Csr16Weight", "DENSE_CROSSOVER", "MatrixInfo", "SlotWeight", "SpmmPlan", "analyze", "bitmap_linear",
    "set_autotune", "spmm_route", "dense_bmm", "linear", "activation", "add", "as_csr", "bias_act", "build_info", "cuda_features", "csr16_linear", "slot_linear",
    "Sparse24DecodeWeight", "sparse24_decode_linear",
    "div", "from_dense", "from_edge_index", "from_list", "from_scipy", "from_torch", "gelu", "leaky_relu", "mul", "relu",
    "scale", "scale_cols", "scale_rows", "sigmoid", "silu", "spmm", "sddmm", "sub", "tanh", "to_dense", "to_edge_index",
    "to_scipy", "to_torch", "transpose", "validate_csr", "cache_info", "clear_caches",
    "clear_tuning", "save_tuning_cache", "set_tuning_cache", "tuning_signature", "tuning_table",
]


def analyze(A, force: bool = False) -> MatrixInfo:
    """What sparsetorch knows about the sparse matrix ``A`` (anything :func:`as_csr` takes): validity
    and the row-length distribution the routing module decides from. Computed on A's device on first
    use and cached with the matrix, as every op does; ``force`` recomputes."""
    return _analyze(as_csr(A), force)


from sparsetorch import nn  # noqa: E402  (layers: st.nn.SparseLinear, GCNConv, SAGEConv)
