"""Every public function that takes a sparse matrix takes what ``st.spmm`` takes (``st.as_csr``): a torch
sparse CSR tensor (2-D, 3-D), a scipy.sparse matrix or array of any format, an ``st.CSR``, a ``(crow_indices,
col_indices, values, shape)`` tuple, and, where batches make sense, a list of 2-D matrices. Each function is
called with each kind and checked against a float64 reference computed from the same (float32) values with
SciPy / dense torch, on the CPU and, where present, on CUDA.

SciPy inputs live on the CPU: a function with a dense operand copies them to that operand's device (spmm,
sddmm, scale, the layers), one without (transpose, the elementwise ops, conversions) works where they are.
"""
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
import torch.nn.functional as F

import sparsetorch as st
from conftest import python_env
from _helpers import REL_TOL

M, K, N = 7, 5, 3  # A is M x K, B is K x N; graphs are N_NODES x N_NODES
N_NODES = 6
BATCH = 3
NNZ_PER_BATCH = 12  # equal for every batch, so that a 3-D torch CSR tensor can hold the batch

KINDS_2D = ["st.CSR", "torch", "scipy csr", "scipy coo", "scipy csc", "scipy csr_array", "tuple", "tuple int32",
            "tuple numpy"]
KINDS_3D = ["st.CSR batched", "torch 3-D", "list of scipy", "list of torch", "list of st.CSR", "tuple of scipy"]
# A matrix can be corrupted in place only where its index arrays are the caller's (not for a conversion).
CORRUPTIBLE = ["st.CSR", "torch", "scipy csr", "tuple", "tuple int32", "st.CSR batched", "torch 3-D"]


def _scipy_matrix(rng, m, k, nnz=None, density=0.4, symmetric=False):
    """A float32 SciPy CSR with sorted, unique columns (values float32: every kind sees the same numbers) and
    at least one empty row."""
    if nnz is None:
        nnz = max(1, int(density * m * k))
    if symmetric:
        upper = [(i, j) for i in range(m) for j in range(i + 1, k)]
        pick = rng.choice(len(upper), size=nnz // 2, replace=False)
        pos = [upper[p] for p in pick]
        pos = pos + [(j, i) for i, j in pos]
        vals = rng.uniform(0.5, 1.5, len(pos) // 2)
        vals = np.concatenate([vals, vals])
        rows, cols = np.array([p[0] for p in pos]), np.array([p[1] for p in pos])
    else:
        cells = rng.choice((m - 1) * k, size=nnz, replace=False) + k  # row 0 stays empty
        rows, cols = cells // k, cells % k
        vals = rng.standard_normal(nnz)
    a = sp.csr_matrix((vals.astype(np.float32), (rows, cols)), shape=(m, k))
    a.sort_indices()
    return a


def _components(a, device, index_dtype=torch.int64):
    crow = torch.from_numpy(a.indptr.astype(np.int64)).to(device=device, dtype=index_dtype)
    col = torch.from_numpy(a.indices.astype(np.int64)).to(device=device, dtype=index_dtype)
    return crow, col, torch.from_numpy(a.data).to(device)


def _torch_csr(crow, col, values, shape, check_invariants=False):
    with warnings.catch_warnings():  # torch's one-time notice about its beta CSR support, provoked here
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=check_invariants)


def make_2d(kind, a, device):
    """The SciPy float32 matrix `a` as the input kind `kind` (on `device` where the kind has one)."""
    if kind == "st.CSR":
        return st.CSR(*_components(a, device), a.shape)
    if kind == "torch":
        return _torch_csr(*_components(a, device), a.shape, check_invariants=False)
    if kind == "scipy csr":
        return a.copy()
    if kind == "scipy coo":
        return a.tocoo()
    if kind == "scipy csc":
        return a.tocsc()
    if kind == "scipy csr_array":
        if not hasattr(sp, "csr_array"):
            pytest.skip("this SciPy has no sparse arrays")
        return sp.csr_array(a)
    if kind == "tuple":
        return (*_components(a, device), a.shape)
    if kind == "tuple int32":
        return (*_components(a, device, torch.int32), list(a.shape))
    if kind == "tuple numpy":
        return (a.indptr.copy(), a.indices.copy(), a.data.copy(), a.shape)
    raise AssertionError(kind)


def make_3d(kind, mats, device):
    """The list of SciPy matrices `mats` (one shape, NNZ_PER_BATCH entries each) as the batched kind `kind`."""
    if kind == "st.CSR batched":
        return st.from_list([st.CSR(*_components(a, device), a.shape) for a in mats])
    if kind == "torch 3-D":
        parts = [_components(a, device) for a in mats]
        return _torch_csr(*(torch.stack([p[i] for p in parts]) for i in range(3)),
                                       (len(mats),) + mats[0].shape, check_invariants=False)
    if kind == "list of scipy":
        return [a.copy() for a in mats]
    if kind == "list of torch":
        return [_torch_csr(*_components(a, device), a.shape, check_invariants=False) for a in mats]
    if kind == "list of st.CSR":
        return [st.CSR(*_components(a, device), a.shape) for a in mats]
    if kind == "tuple of scipy":
        return tuple(a.tocoo() for a in mats)
    raise AssertionError(kind)


def dense_of(x):
    """A float64 CPU dense tensor of any result: torch sparse/dense, st.CSR, SciPy matrix or a list of them."""
    if isinstance(x, (list, tuple)):
        return torch.stack([dense_of(t) for t in x])
    if sp.issparse(x):
        return torch.from_numpy(x.toarray()).double()
    if isinstance(x, st.CSR):
        return x.to_dense().double().cpu()
    if isinstance(x, torch.Tensor) and x.layout != torch.strided:
        return x.to_dense().double().cpu()
    return torch.as_tensor(x).double().cpu()


def close(out, ref, dtype=torch.float32):
    got = dense_of(out)
    ref = torch.as_tensor(ref).double()
    assert got.shape == ref.shape, f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    scale = max(ref.norm().item(), 1e-30)
    err = (got - ref).norm().item() / scale
    assert err <= REL_TOL[dtype], f"relative error {err:.3g} > {REL_TOL[dtype]:.1g}"


@pytest.fixture
def a2(rng):
    return _scipy_matrix(rng, M, K)


@pytest.fixture
def mats(rng):
    return [_scipy_matrix(rng, M, K, nnz=NNZ_PER_BATCH) for _ in range(BATCH)]


@pytest.fixture
def graph(rng):
    return _scipy_matrix(rng, N_NODES, N_NODES, nnz=12, symmetric=True)


def _operand(kind, mats_or_a, device):
    """(the input of kind `kind`, its float64 dense reference (m, k) or (b, m, k))."""
    if kind in KINDS_3D:
        return make_3d(kind, mats_or_a, device), torch.stack([torch.from_numpy(a.toarray()).double()
                                                               for a in mats_or_a])
    return make_2d(kind, mats_or_a, device), torch.from_numpy(mats_or_a.toarray()).double()


@pytest.fixture(params=KINDS_2D + KINDS_3D)
def sparse(request, a2, mats, device):
    """(kind, input, float64 dense reference) for every kind, 2-D and batched."""
    kind = request.param
    return (kind, *_operand(kind, mats if kind in KINDS_3D else a2, device))


@pytest.fixture(params=KINDS_2D)
def sparse2d(request, a2, device):
    return (request.param, *_operand(request.param, a2, device))


def _randn(rng, *shape, device="cpu"):
    return torch.from_numpy(rng.standard_normal(shape)).float().to(device)


# --- checks and analysis ------------------------------------------------------------------------------------

def test_validate_csr(sparse):
    _, A, _ = sparse
    st.validate_csr(A)
    st.validate_csr(A, force=False)


@pytest.mark.parametrize("kind", CORRUPTIBLE)
def test_validate_csr_names_the_defect(kind, a2, mats, device):
    A, _ = _operand(kind, mats if kind in KINDS_3D else a2, device)
    col = (A.col_indices if isinstance(A, st.CSR) else A.col_indices() if isinstance(A, torch.Tensor)
           else A.indices if sp.issparse(A) else A[1])
    col.reshape(-1)[-1] = K + 3  # a column out of range (in place: reshape of a contiguous array is a view)
    with pytest.raises(ValueError, match="column"):
        st.validate_csr(A)


def test_analyze(sparse):
    _, A, ref = sparse
    info = st.analyze(A)
    assert info.valid
    assert info.entries == int((ref != 0).sum())
    assert tuple(info.shape) == tuple(ref.shape)


# --- products -----------------------------------------------------------------------------------------------

def test_spmm(sparse, rng, device):
    _, A, ref = sparse
    B = _randn(rng, K, N, device=device)
    out = st.spmm(A, B)
    assert out.device.type == B.device.type
    close(out, ref @ B.double().cpu())


def test_spmm_epilogue(sparse, rng, device):
    _, A, ref = sparse
    B = _randn(rng, K, N, device=device)
    bias = _randn(rng, N, device=device)
    out = st.spmm(A, B, alpha=0.5, bias=bias, activation="relu")
    close(out, F.relu(0.5 * (ref @ B.double().cpu()) + bias.double().cpu()))


# The routes of docs/routing.md, and the kernel each runs first (cuSPARSE's kernels have cuSPARSE's names).
ROUTE_KERNELS = {"native": "spmm_row_group_kernel", "balanced": "spmm_balanced_kernel", "split": "spmm_split_kernel",
                 "tiled": "spmm_tiled_kernel", "densify": "densify_kernel", "cusparse": None}


def test_spmm_route(sparse, rng, device):
    """The route st.spmm_route names is a documented one and the one st.spmm(A, B) then runs (its kernel
    in the profile; with autotuning off: a tuning call may sample another route on purpose)."""
    _, A, ref = sparse
    B = _randn(rng, K, N, device=device)
    previous = st.set_autotune(False)
    try:
        route = st.spmm_route(A, B)
        if device == "cpu":  # one kernel, whatever the backend asks
            assert route == "cpu" and st.spmm_route(A, B, backend="balanced") == "cpu"
            close(st.spmm(A, B), ref @ B.double())
            return
        assert route in ROUTE_KERNELS
        assert st.spmm_route(A, B, backend="balanced") == "balanced"
        from torch.profiler import ProfilerActivity, profile

        st.spmm(A, B)  # the analysis's own kernels run on the first call
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            out = st.spmm(A, B)
            torch.cuda.synchronize()
        names = [e.name for e in prof.events()]
        if not names:
            pytest.skip("no CUDA activity recorded (CUPTI unavailable, e.g. under compute-sanitizer)")
        ran = {r for r, kernel in ROUTE_KERNELS.items() if kernel and any(kernel in name for name in names)}
        assert ran == ({route} if ROUTE_KERNELS[route] else set()), (route, names)
        close(out, ref @ B.double().cpu())
    finally:
        st.set_autotune(previous)


def test_spmm_plan(sparse, rng, device):
    _, A, ref = sparse
    plan = st.SpmmPlan(A, device=device)
    B = _randn(rng, K, N, device=device)
    close(plan(B), ref @ B.double().cpu())


def test_sddmm(sparse, rng, device):
    _, A, ref = sparse
    x, y = _randn(rng, M, N, device=device), _randn(rng, K, N, device=device)
    out = st.sddmm(A, x, y, alpha=2.0)
    close(out, (ref != 0) * (2.0 * x.double().cpu() @ y.double().cpu().T))


def test_transpose(sparse):
    _, A, ref = sparse
    close(st.transpose(A), ref.transpose(-1, -2))


# --- elementwise --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("op, scalar, fn", [("add", 1.5, lambda v: v + 1.5), ("sub", 1.5, lambda v: v - 1.5),
                                            ("mul", -2.0, lambda v: -2.0 * v), ("div", 4.0, lambda v: v / 4.0)])
def test_elementwise_with_a_scalar(sparse, op, scalar, fn):
    """On a sparse x only the stored values change."""
    _, A, ref = sparse
    close(getattr(st, op)(A, scalar), torch.where(ref != 0, fn(ref), 0.0))


def test_elementwise_sparse_with_sparse(sparse):
    """Two operands of one pattern, each of the same kind (converted separately)."""
    _, A, ref = sparse
    close(st.add(A, A, alpha=2.0), 3 * ref)
    close(st.mul(A, A), ref * ref)


@pytest.mark.parametrize("name", ["relu", "gelu", "silu", "sigmoid", "tanh", "leaky_relu"])
def test_activations(sparse, name):
    _, A, ref = sparse
    fn = {"relu": F.relu, "gelu": F.gelu, "silu": F.silu, "sigmoid": torch.sigmoid, "tanh": torch.tanh,
          "leaky_relu": F.leaky_relu}[name]
    close(getattr(st, name)(A), torch.where(ref != 0, fn(ref), 0.0))
    close(st.activation(A, name), torch.where(ref != 0, fn(ref), 0.0))


def test_scale(sparse, rng, device):
    _, A, ref = sparse
    row, col = _randn(rng, M, device=device), _randn(rng, K, device=device)
    r64, c64 = row.double().cpu(), col.double().cpu()
    close(st.scale(A, row, col), r64[:, None] * ref * c64[None, :])
    close(st.scale_rows(A, row), r64[:, None] * ref)
    close(st.scale_cols(A, col), ref * c64[None, :])


# --- conversions --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("convert", ["as_csr", "to_dense", "to_torch", "to_scipy"])
def test_conversions(sparse, convert):
    _, A, ref = sparse
    close(getattr(st, convert)(A), ref)


def test_from_list(sparse2d):
    _, A, ref = sparse2d
    close(st.from_list([A, A]), torch.stack([ref, ref]))


def test_to_edge_index(sparse2d):
    _, A, ref = sparse2d
    edge_index, weight = st.to_edge_index(A)
    dense = torch.zeros(M, K, dtype=torch.float64)
    dense.index_put_((edge_index[0].cpu(), edge_index[1].cpu()), weight.double().cpu(), accumulate=True)
    close(dense, ref)


# --- pruned weights -----------------------------------------------------------------------------------------

def test_sparse_linear_from_sparse(sparse2d, rng, device):
    _, W, ref = sparse2d
    bias = _randn(rng, M, device=device)
    layer = st.nn.SparseLinear.from_sparse(W, bias=bias).to(device)
    x = _randn(rng, 4, K, device=device)
    close(layer(x), x.double().cpu() @ ref.T + bias.double().cpu())


def test_bitmap_weight_from_csr(sparse2d, rng, device):
    _, W, ref = sparse2d
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = st.BitmapWeight.from_csr(W, dtype=dtype, device=device)
    x = _randn(rng, 4, K, device=device).to(dtype)
    ref = torch.from_numpy(ref.numpy()).to(dtype).double()  # the values the kernel multiplies
    close(st.bitmap_linear(x, w), x.double().cpu() @ ref.T, dtype)


@pytest.mark.parametrize("form", ["Csr16Weight", "SlotWeight"])
def test_packed_weight_from_csr(sparse2d, rng, device, form):
    _, W, ref = sparse2d
    cls, op = {"Csr16Weight": (st.Csr16Weight, st.csr16_linear), "SlotWeight": (st.SlotWeight, st.slot_linear)}[form]
    w = cls.from_csr(W, dtype=torch.bfloat16, device=device)
    x = _randn(rng, 4, K, device=device).bfloat16()
    ref = ref.to(torch.bfloat16).double()
    close(op(x, w), x.double().cpu() @ ref.T, torch.bfloat16)


# --- graphs (square, symmetric, positive weights) -----------------------------------------------------------

GRAPH_KINDS = ["st.CSR", "torch", "scipy csr", "scipy coo", "scipy csc", "tuple"]


def _gcn_reference(a):
    a_hat = a + torch.eye(a.shape[0], dtype=torch.float64)
    d = a_hat.sum(1).rsqrt()
    return d[:, None] * a_hat * d[None, :]


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_gcn_normalize_and_self_loops(kind, graph, device):
    A, ref = _operand(kind, graph, device)
    close(st.nn.add_self_loops(A), ref + torch.eye(N_NODES, dtype=torch.float64))
    close(st.nn.gcn_normalize(A), _gcn_reference(ref))
    close(st.nn.gcn_norm(A), _gcn_reference(ref))


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_mean_norm(kind, graph, device):
    A, ref = _operand(kind, graph, device)
    count = (ref != 0).sum(1, keepdim=True).double()
    close(st.nn.mean_norm(A), torch.where(count > 0, ref / count.clamp(min=1), 0.0))


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_gcn_conv(kind, graph, rng, device):
    A, ref = _operand(kind, graph, device)
    conv = st.nn.GCNConv(4, 2).to(device)
    x = _randn(rng, N_NODES, 4, device=device)
    w, b = conv.lin.weight.detach().double().cpu(), conv.bias.detach().double().cpu()
    close(conv(x, A), _gcn_reference(ref) @ (x.double().cpu() @ w.T) + b)


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_sage_conv(kind, graph, rng, device):
    A, ref = _operand(kind, graph, device)
    conv = st.nn.SAGEConv(4, 2).to(device)
    x = _randn(rng, N_NODES, 4, device=device)
    count = (ref != 0).sum(1, keepdim=True).double()
    mean = torch.where(count > 0, ref / count.clamp(min=1), 0.0)
    wl, bl = conv.lin_l.weight.detach().double().cpu(), conv.lin_l.bias.detach().double().cpu()
    wr = conv.lin_r.weight.detach().double().cpu()
    x64 = x.double().cpu()
    close(conv(x, A), mean @ x64 @ wl.T + bl + x64 @ wr.T)


@pytest.mark.parametrize("kind", GRAPH_KINDS)
def test_batch_graphs(kind, graph, rng, device):
    A, ref = _operand(kind, graph, device)
    x = _randn(rng, N_NODES, 4, device=device)
    adj, xb, sizes = st.nn.batch_graphs([A, A], [x, x])
    close(adj, torch.stack([ref, ref]))
    assert sizes == [N_NODES, N_NODES] and torch.equal(xb[1], x)


# --- no notices of torch's own reach the caller -------------------------------------------------------------

def test_conversions_raise_no_torch_notice():
    """torch says once per process that its sparse CSR support is in beta: the conversions that build torch CSR
    tensors for the caller keep that notice (about torch, not the caller's input) to themselves. A fresh
    process, since the notice comes only once."""
    import subprocess
    import sys

    code = ("import torch, sparsetorch as st\n"
            "a = st.from_dense(torch.eye(3)); st.from_dense(torch.eye(3).expand(2, 3, 3).contiguous())\n"
            "st.to_torch(a); st.to_torch(st.from_list([a, a]))\n")
    proc = subprocess.run([sys.executable, "-W", "error::UserWarning", "-c", code], capture_output=True, text=True,
                          timeout=120, env=python_env())
    assert proc.returncode == 0, proc.stderr
