"""Random inputs and float64 reference checks shared by the tests."""

import numpy as np
import scipy.sparse as sp
import torch
import torch.nn.functional as F

import sparsetorch as st
from sparsetorch.datasets import data_roots, matrix_files, planetoid_available

# The real data, where sparsetorch.datasets finds it ($SPARSETORCH_DATA, which conftest.py sets when a data
# folder sits beside the checkout); tests that need it skip, naming the folder, when it holds none.
DATA_DIR = next((r for r in data_roots() if matrix_files(r) or planetoid_available("cora", r)), data_roots()[0])
HAS_PLANETOID = planetoid_available("cora", DATA_DIR)

# Relative Frobenius error allowed against a float64 reference computed from the same (rounded)
# inputs; half types round every output to 8 or 11 bits.
REL_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}
# Elementwise tolerance, relative to the largest reference magnitude.
ABS_TOL = {torch.float64: 1e-12, torch.float32: 1e-5, torch.float16: 4e-3, torch.bfloat16: 3e-2}


def random_csr(rng, m, k, density, *, unsorted=False, duplicates=False, empty_rows=0.0):
    """A float64 scipy CSR with about density*m*k entries; optionally unsorted columns, repeated
    columns within rows, and a fraction of rows forced empty."""
    indptr = [0]
    indices, data = [], []
    for _ in range(m):
        cnt = rng.binomial(k, density) if k > 0 else 0
        if empty_rows and rng.random() < empty_rows:
            cnt = 0
        cols = rng.choice(k, size=cnt, replace=False) if cnt else np.zeros(0, dtype=np.int64)
        if duplicates and cnt:
            cols = np.concatenate([cols, rng.choice(cols, size=max(1, cnt // 3))])
        if unsorted:
            rng.shuffle(cols)
        else:
            cols = np.sort(cols)
        indices.append(cols)
        data.append(rng.standard_normal(cols.size))
        indptr.append(indptr[-1] + cols.size)
    indices = np.concatenate(indices) if indices else np.zeros(0, dtype=np.int64)
    data = np.concatenate(data) if data else np.zeros(0)
    return sp.csr_matrix((data, indices.astype(np.int64), np.asarray(indptr, dtype=np.int64)), shape=(m, k))


def rounded(a, dtype):
    """The scipy matrix with its values rounded through `dtype` (so references see what the kernel sees)."""
    a = a.copy()
    a.data = torch.from_numpy(a.data).to(dtype).double().numpy()
    return a


def to_st(a, dtype, index_dtype, device):
    return st.from_scipy(a, device=device, dtype=dtype, index_dtype=index_dtype)


def randn(rng, *shape, dtype=torch.float32, device="cpu"):
    return torch.from_numpy(rng.standard_normal(shape)).to(dtype=dtype, device=device)


def assert_matches(out, ref, dtype, input_scale=None):
    """out (any device, `dtype`) against a float64 reference (torch or numpy). Errors are measured
    against the reference's magnitude (max |ref| and its norm), or against the input's when
    `input_scale` (the float64 tensor an activation was applied to) is given and larger: an
    activation is evaluated to an absolute error proportional to its input, not to its output (GELU
    in float32 is 0.5 z (1 + tanh u), which cancels for z below about -3, in torch and in cuBLASLt's
    GELU epilogue alike; seen: 1.7e-5 of max |ref| on a 2 x 2 output of linear + gelu_tanh)."""
    ref = torch.as_tensor(np.asarray(ref) if not isinstance(ref, torch.Tensor) else ref).double().cpu()
    assert out.dtype == dtype, f"dtype {out.dtype}, expected {dtype}"
    got = out.detach().double().cpu()
    assert got.shape == ref.shape, f"shape {tuple(got.shape)}, expected {tuple(ref.shape)}"
    if ref.numel() == 0:
        return
    assert torch.equal(torch.isnan(got), torch.isnan(ref)), "NaN pattern differs from the reference"
    finite = torch.isfinite(ref)
    g, r = got[finite], ref[finite]
    scale = r.abs().max().item() if r.numel() else 0.0
    norm = r.norm().item()
    if input_scale is not None and input_scale.numel():
        z = input_scale.detach().double().cpu()[finite]
        scale, norm = max(scale, z.abs().max().item()), max(norm, z.norm().item())
    if scale == 0.0:
        assert g.abs().max().item() <= ABS_TOL[dtype], "expected all zeros"
        return
    rel = ((g - r).norm() / norm).item() if norm > 0 else 0.0
    assert rel <= REL_TOL[dtype], f"relative error {rel:.3g} > {REL_TOL[dtype]:.1g} for {dtype}"
    worst = (g - r).abs().max().item() / scale
    assert worst <= ABS_TOL[dtype], f"max elementwise error {worst:.3g} (of max |ref|) > {ABS_TOL[dtype]:.1g}"


def activation_refs(negative_slope):
    """Float64 torch references for every activation name sparsetorch accepts."""
    return {
        "none": lambda x: x,
        "relu": F.relu,
        "leaky_relu": lambda x: F.leaky_relu(x, negative_slope),
        "gelu": F.gelu,
        "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
        "silu": F.silu,
        "sigmoid": torch.sigmoid,
        "tanh": torch.tanh,
    }


def packed_weight(cls, rng, m, k, density, dtype, device, options=None, **kw):
    """A random SciPy CSR (random_csr's options) and the packed pruned weight cls (SlotWeight, Csr16Weight)
    built from it in dtype with the form's options (SlotWeight: banded); the SciPy values are set to the
    ones stored (rounded to the half type), so the float64 reference multiplies what the kernel does.
    Repeated positions are summed in float32 and rounded once by the packed layouts, as their sum is here."""
    a = random_csr(rng, m, k, density, **kw)
    crow = torch.from_numpy(a.indptr.astype(np.int64)).to(device)
    col = torch.from_numpy(a.indices.astype(np.int64)).to(device)
    values = torch.from_numpy(a.data).to(dtype=dtype, device=device)
    a.data = values.double().cpu().numpy()
    return a, cls(crow, col, values, (m, k), **(options or {}))


def linear_reference(a, x, bias=None, act=None):
    """act(x @ a.T + bias) in float64 on the CPU for a SciPy matrix a (out, in) and x (..., in)."""
    z = torch.from_numpy(np.asarray(a @ x.double().reshape(-1, a.shape[1]).cpu().numpy().T).T.copy())
    if bias is not None:
        z = z + bias.double().cpu()
    if act is not None:
        z = getattr(torch.nn.functional, act)(z)
    return z.reshape(*x.shape[:-1], a.shape[0])
