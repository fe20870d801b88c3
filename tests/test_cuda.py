"""CUDA-only cases: streams, devices, both routes agreeing, huge batch counts, a 1M-row graph."""
import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from _helpers import assert_matches, randn, random_csr
from conftest import CUDA_READY, FLOAT_DTYPES

pytestmark = pytest.mark.skipif(not CUDA_READY, reason="needs a CUDA device and a CUDA build of sparsetorch")


def test_non_default_stream(rng):
    a = random_csr(rng, 300, 200, 0.05)
    b = randn(rng, 200, 64, dtype=torch.float32, device="cuda")
    ref = torch.from_numpy(a @ b.double().cpu().numpy())
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        outs = {be: st.spmm(A, b, backend=be, bias=torch.zeros(64, device="cuda"), activation="none")
                for be in ("cusparse", "native")}
        batched = st.spmm(st.from_list([a, a], device="cuda", dtype=torch.float32), b, backend="cusparse")
    side.synchronize()
    for out in outs.values():
        assert_matches(out, ref, torch.float32)
    assert_matches(batched, torch.stack([ref, ref]), torch.float32)


def test_non_current_device():
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs to place the operands off the current device")
    a = sp.random(50, 40, density=0.2, format="csr", random_state=0)
    A = st.from_scipy(a, device="cuda:1", dtype=torch.float32)
    b = torch.randn(40, 8, device="cuda:1")
    with torch.cuda.device(0):
        for be in ("cusparse", "native"):
            out = st.spmm(A, b, backend=be)
            assert out.device == torch.device("cuda:1")
            assert_matches(out, a @ b.double().cpu().numpy(), torch.float32)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES)
@pytest.mark.parametrize("layout", ["single", "per_batch", "shared_A", "shared_B", "shared_pattern"])
def test_backends_agree(rng, layout, dtype):
    m, k, n, batch = 70, 50, 40, 5
    mats = [random_csr(rng, m, k, d) for d in (0.05, 0.3, 0.0, 0.6, 0.1)]
    if layout == "single":
        A, b = st.from_scipy(mats[0], device="cuda", dtype=dtype), randn(rng, k, n, dtype=dtype, device="cuda")
    elif layout == "per_batch":
        A, b = st.from_list(mats, device="cuda", dtype=dtype), randn(rng, batch, k, n, dtype=dtype, device="cuda")
    elif layout == "shared_A":
        A, b = st.from_scipy(mats[1], device="cuda", dtype=dtype), randn(rng, batch, k, n, dtype=dtype, device="cuda")
    elif layout == "shared_B":
        A, b = st.from_list(mats, device="cuda", dtype=dtype), randn(rng, k, n, dtype=dtype, device="cuda")
    else:
        a = st.from_scipy(mats[1], device="cuda", dtype=dtype)
        values = randn(rng, batch, a.values.numel(), dtype=dtype, device="cuda")
        A = st.CSR(a.crow_indices, a.col_indices, values, (batch, m, k))
        b = randn(rng, batch, k, n, dtype=dtype, device="cuda")
    ref = st.spmm(A.to(device="cpu", dtype=torch.float64), b.double().cpu())
    for be in ("cusparse", "native", "auto"):
        assert_matches(st.spmm(A, b, backend=be), ref, dtype)


@pytest.mark.parametrize("backend", ["cusparse", "native"])
def test_batch_count_above_65535(rng, backend):
    batch, m, k, n = 70_000, 3, 4, 4
    crow = torch.tensor([0, 1, 3, 4]).repeat(batch, 1)
    col = torch.from_numpy(rng.integers(0, k, size=(batch, 4)))
    values = torch.from_numpy(rng.standard_normal((batch, 4)))
    b = torch.from_numpy(rng.standard_normal((batch, k, n)))
    A = st.CSR(crow, col, values, (batch, m, k))
    ref = st.spmm(A, b)  # CPU float64, itself checked against SciPy in test_spmm
    out = st.spmm(A.to(device="cuda"), b.cuda(), backend=backend)
    assert_matches(out, ref, torch.float64)


def test_graph_with_a_million_rows(rng):
    n_nodes, per_row, n = 1_000_000, 8, 16
    rows = np.repeat(np.arange(n_nodes), per_row)
    cols = rng.integers(0, n_nodes, size=rows.size)
    a = sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(n_nodes, n_nodes))
    b = randn(rng, n_nodes, n, dtype=torch.float32, device="cuda")
    ref = a @ b.double().cpu().numpy()
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    for be in ("cusparse", "native"):
        assert_matches(st.spmm(A, b, backend=be), ref, torch.float32)


def test_native_kernel_survives_malformed_indices():
    """Without validate=True the native kernel skips out-of-range entries instead of faulting; the
    CUDA context stays usable."""
    crow = torch.tensor([0, 2, 9], device="cuda")          # last row claims entries past nnz
    col = torch.tensor([0, 1 << 40, -5], device="cuda")    # far out of range both ways
    values = torch.ones(3, device="cuda")
    out = st.spmm((crow, col, values, (2, 3)), torch.ones(3, 2, device="cuda"), backend="native")
    torch.cuda.synchronize()
    assert out.shape == (2, 2)
    with pytest.raises(ValueError, match="col_indices\\[1\\] = 1099511627776 is out of range"):
        st.spmm((torch.tensor([0, 2, 3], device="cuda"), col, values, (2, 3)), torch.ones(3, 2, device="cuda"),
                validate=True)
    good = st.spmm(st.from_scipy(sp.eye(3, format="csr"), device="cuda", dtype=torch.float32),
                   torch.ones(3, 2, device="cuda"))
    assert good.cpu().tolist() == [[1.0, 1.0]] * 3
