"""SpmmPlan and the cuSPARSE descriptor cache: reuse must never return stale results."""
import numpy as np
import pytest
import torch

import sparsetorch as st
from _helpers import assert_matches, randn, random_csr
from conftest import CUDA_READY

TARGETS = [("cpu", "auto")] + ([("cuda", "cusparse"), ("cuda", "native")] if CUDA_READY else [])


@pytest.fixture(params=TARGETS, ids=lambda t: f"{t[0]}-{t[1]}")
def target(request):
    return request.param


def test_plan_matches_spmm(target, rng):
    device, backend = target
    a = random_csr(rng, 40, 30, 0.2)
    A = st.from_scipy(a, device=device, dtype=torch.float32)
    bias = randn(rng, 8, device=device)
    plan = st.SpmmPlan(A, alpha=0.5, bias=bias, activation="tanh", backend=backend)
    for _ in range(3):  # fresh B each call
        b = randn(rng, 30, 8, device=device)
        c = randn(rng, 40, 8, device=device)
        ref = torch.tanh(0.5 * torch.from_numpy(a @ b.double().cpu().numpy()) + 2.0 * c.double().cpu()
                         + bias.double().cpu())
        assert_matches(plan(b, beta=2.0, c=c), ref, torch.float32)


def test_plan_new_values(target, rng):
    device, backend = target
    a = random_csr(rng, 25, 20, 0.3)
    A = st.from_scipy(a, device=device)
    plan = st.SpmmPlan(A, backend=backend)
    b = randn(rng, 20, 6, dtype=torch.float64, device=device)
    for _ in range(3):
        values = randn(rng, a.nnz, dtype=torch.float64, device=device)
        x = a.copy()
        x.data = values.cpu().numpy()
        assert_matches(plan(b, values=values), x @ b.cpu().numpy(), torch.float64)
    with pytest.raises(ValueError, match="the plan's pattern"):
        plan(b, values=values[:-1])


@pytest.mark.parametrize("shared_b", [False, True])
def test_plan_batched_per_batch_patterns(target, rng, shared_b):
    device, backend = target
    mats = [random_csr(rng, 12, 9, d) for d in (0.0, 0.2, 0.9, 0.05)]
    A = st.from_list(mats, device=device, dtype=torch.float64)
    plan = st.SpmmPlan(A, backend=backend, activation="relu")
    b = randn(rng, 9, 5, dtype=torch.float64, device=device) if shared_b else \
        randn(rng, 4, 9, 5, dtype=torch.float64, device=device)
    ref = torch.stack([torch.from_numpy(m @ (b if shared_b else b[i]).cpu().numpy()) for i, m in enumerate(mats)])
    assert_matches(plan(b), torch.relu(ref), torch.float64)
    out = torch.full((4, 12, 5), float("nan"), dtype=torch.float64, device=device)
    assert plan(b, out=out) is out
    assert_matches(out, torch.relu(ref), torch.float64)
    new_values = A.values * 2
    assert_matches(plan(b, values=new_values), torch.relu(2 * ref), torch.float64)


def test_plan_validates_once(rng):
    crow = torch.tensor([0, 2, 1])
    with pytest.raises(ValueError, match="not non-decreasing"):
        st.SpmmPlan((crow, torch.tensor([0, 1]), torch.ones(2), (2, 2)))
    with pytest.raises(ValueError, match="unknown SpMM backend"):
        st.SpmmPlan(st.from_scipy(random_csr(rng, 3, 3, 0.5)), backend="fast")


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_descriptor_cache_never_stale(rng):
    """Same shapes, new tensors (often at recycled addresses), new data: every result is fresh."""
    m, k, n = 64, 48, 16
    for i in range(20):
        a = random_csr(rng, m, k, 0.1 + 0.02 * (i % 5))
        A = st.from_scipy(a, device="cuda", dtype=torch.float32)
        b = randn(rng, k, n, device="cuda")
        out = st.spmm(A, b, backend="cusparse")
        assert_matches(out, a @ b.double().cpu().numpy(), torch.float32)
        del A, b, out
    # Shared pattern, strided batch route, values replaced between calls.
    a = random_csr(rng, m, k, 0.2)
    crow = torch.from_numpy(a.indptr).cuda()
    col = torch.from_numpy(a.indices).cuda()
    for _ in range(5):
        values = randn(rng, 3, a.nnz, device="cuda")
        b = randn(rng, 3, k, n, device="cuda")
        out = st.spmm((crow, col, values, (3, m, k)), b, backend="cusparse")
        for j in range(3):
            x = a.copy()
            x.data = values[j].double().cpu().numpy()
            assert_matches(out[j], x @ b[j].double().cpu().numpy(), torch.float32)


def test_plan_never_routes_skewed_rows_to_the_row_group_kernel(device):
    """The routing module sees the row lengths (the cached analysis): a matrix with one row of n
    entries among rows of one never goes to the row-group kernel, which walks a row per group of
    lanes; a plan without autotuning takes what st.spmm takes."""
    n = 256
    dense = torch.zeros(n, n, device=device)
    dense[0] = 1.0  # one row with n entries
    dense[1:, 0] = 1.0
    A = st.from_dense(dense)
    b = torch.randn(n, 8, device=device)
    route = st.spmm_route(A, b)
    assert route == "cpu" if device == "cpu" else route not in ("native", "tiled")
    assert st.spmm_route(st.from_dense(torch.eye(n, device=device)), b) in ("cpu", "native")
    plan = st.SpmmPlan(A, autotune=False)
    assert plan.backend == "auto"
    torch.testing.assert_close(plan(b), dense @ b)
    assert st.SpmmPlan(A, backend="native").backend == "native"


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_plan_autotunes_once_per_width(rng, monkeypatch):
    """backend="auto" on CUDA: no call synchronises to time routes (the op's route tuner samples online);
    each width, dtype and batch layout shows the route its calls take, and every result is the product."""
    from sparsetorch.plan import _autotune_candidates

    a = random_csr(rng, 300, 200, 0.05)
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    plan = st.SpmmPlan(A, bias=torch.ones(16, device="cuda"), activation="relu")
    assert plan.autotune and plan.routes == {}
    b = randn(rng, 200, 16, device="cuda")
    assert_matches(plan(b), torch.relu(torch.from_numpy(a @ b.double().cpu().numpy()) + 1.0), torch.float32)
    assert list(plan.routes) == [(16, torch.float32, False)]
    assert plan.routes[(16, torch.float32, False)] in _autotune_candidates(A, 16)
    # 5% dense fp32 at n = 16: densify stays out (a candidate from a quarter of its threshold, 6.25% here)
    assert set(_autotune_candidates(A, 16)) == {"native", "balanced", "split", "cusparse"}

    def no_sync(*args, **kwargs):
        raise AssertionError("a plan call synchronised")

    monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    for _ in range(20):
        b2 = randn(rng, 200, 16, device="cuda")
        expected = torch.relu(torch.from_numpy(a @ b2.double().cpu().numpy()) + 1.0)
        y = plan(b2)
        monkeypatch.undo()
        assert_matches(y, expected, torch.float32)
        monkeypatch.setattr(torch.cuda, "synchronize", no_sync)
    monkeypatch.undo()
    plan.bias = None
    plan.activation = "none"
    b3 = randn(rng, 200, 40, device="cuda")
    assert_matches(plan(b3), a @ b3.double().cpu().numpy(), torch.float32)
    assert (40, torch.float32, False) in plan.routes


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_plan_autotune_off_in_capture_and_on_request(rng):
    """autotune=False keeps the rules; during CUDA graph capture an untuned width uses the rules
    instead of timing (a sync would break the capture), and the replay is correct."""
    a = random_csr(rng, 128, 96, 0.1)
    A = st.from_scipy(a, device="cuda", dtype=torch.float32)
    assert st.SpmmPlan(A, autotune=False).autotune is False
    assert st.SpmmPlan(A, backend="native").autotune is False
    plan = st.SpmmPlan(A)
    plan.backend = "native"  # the rule's route inside the capture (cuSPARSE is not claimed capturable)
    b = randn(rng, 96, 32, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        st.spmm(A, b, backend="native")  # warm-up on the capture stream
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = plan(b)
    assert not st.tuning_table(kind="plan")  # nothing sampled in the capture
    b.copy_(randn(rng, 96, 32, device="cuda"))
    graph.replay()
    torch.cuda.synchronize()
    assert_matches(y, a @ b.double().cpu().numpy(), torch.float32)


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_plan_autotune_candidates():
    """cuSPARSE only for one validated matrix with at most one entry per position (half types too: on
    long rows it sums in float, cusparse_sums_in_float); tiled only for long rows and n >= 256 (not
    fp64); blocked for one fp32 matrix of >= 2% density and a 2-D B."""
    from sparsetorch.plan import _autotune_candidates

    long_rows = st.from_dense(torch.ones(64, 64, device="cuda"))
    assert set(_autotune_candidates(long_rows, 256)) == {"native", "balanced", "split", "tiled", "cusparse",
                                                         "densify", "blocked"}
    assert "blocked" not in _autotune_candidates(long_rows, 256, 3)
    assert "tiled" not in _autotune_candidates(long_rows, 128)
    assert "tiled" not in _autotune_candidates(long_rows.to(dtype=torch.float64), 256)
    assert "cusparse" in _autotune_candidates(long_rows.to(dtype=torch.bfloat16), 256)
    one_long_row = st.CSR(torch.tensor([0, 4096, 4096]), torch.arange(4096), torch.ones(4096), (2, 4096))
    assert "cusparse" in _autotune_candidates(one_long_row.to(device="cuda", dtype=torch.bfloat16), 32)
    assert "cusparse" in _autotune_candidates(one_long_row.to(device="cuda"), 32)
    batch = st.from_list([random_csr(np.random.default_rng(0), 8, 8, 0.5)] * 2, device="cuda")
    assert "cusparse" not in _autotune_candidates(batch, 32)
    repeats = st.CSR(torch.tensor([0, 3]), torch.tensor([0, 0, 0]), torch.ones(3), (1, 2)).to(device="cuda")
    assert "cusparse" not in _autotune_candidates(repeats, 32)
