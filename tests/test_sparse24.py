"""2:4 semi-structured sparsity: pruning, the 2:4 + residual split of any CSR weight, and the cuSPARSELt ops
(CUDA with cuSPARSELt only; the CPU runs the same split through a dense reference path)."""
import pytest
import torch

import sparsetorch as st
from sparsetorch.pruned.sparse24 import Sparse24Split, Sparse24Weight, available, prune_2to4_mask, sparse24_applies
from _helpers import random_csr

ops = torch.ops.sparsetorch
LT = available()
needs_lt = pytest.mark.skipif(not LT, reason="needs a GPU and a build with cuSPARSELt")


def _groups(dense):
    out_f, in_f = dense.shape
    pad = torch.zeros(out_f, -(-in_f // 4) * 4, dtype=dense.dtype, device=dense.device)
    pad[:, :in_f] = dense
    return pad.view(out_f, -1, 4)


def _is_2to4(dense) -> bool:
    return bool(((_groups(dense) != 0).sum(-1) <= 2).all())


def _rel(y, ref):
    return ((y.double() - ref).norm() / ref.norm()).item()


# --- pruning ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("in_features", [16, 18, 3])
def test_prune_2to4_keeps_the_two_largest_of_each_group(in_features):
    torch.manual_seed(0)
    w = torch.randn(5, in_features, dtype=torch.float64)
    mask = prune_2to4_mask(w)
    assert mask.shape == w.shape
    g_mask, g_mag = _groups(mask.double()), _groups(w.abs())
    sizes = _groups(torch.ones_like(w)).sum(-1)
    assert torch.equal(g_mask.sum(-1), torch.clamp(sizes, max=2))
    kept_min = torch.where(g_mask.bool(), g_mag, torch.full_like(g_mag, float("inf"))).min(-1).values
    dropped_max = torch.where(g_mask.bool() | (_groups(torch.ones_like(w)) == 0), torch.full_like(g_mag, -1.0),
                              g_mag).max(-1).values
    assert torch.all(kept_min >= dropped_max)


def test_prune_2to4_breaks_ties_by_position_and_keeps_nan():
    w = torch.tensor([[1.0, 1.0, 1.0, 1.0, float("nan"), 0.0, 0.0, 5.0]])
    assert prune_2to4_mask(w).tolist() == [[True, True, False, False, True, False, False, True]]


@pytest.mark.parametrize("sparsity", [None, 0.5, 0.75])
def test_from_dense_2to4_scheme(device, sparsity):
    torch.manual_seed(1)
    lin = torch.nn.Linear(32, 24, device=device, dtype=torch.float64)
    layer = st.nn.SparseLinear.from_dense(lin, sparsity=sparsity, scheme="2:4")
    w = layer.to_dense().detach()
    assert _is_2to4(w)
    assert layer.nnz == round((1 - (sparsity or 0.5)) * w.numel())
    kept = w != 0
    torch.testing.assert_close(w, torch.where(kept, lin.weight.detach(), torch.zeros_like(w)))
    if sparsity is None:  # exactly the two largest of each group
        assert torch.equal(kept, prune_2to4_mask(lin.weight))
    with pytest.raises(ValueError, match="at least half"):
        st.nn.SparseLinear.from_dense(lin, sparsity=0.3, scheme="2:4")


# --- the split --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sorted", "unsorted_duplicates", "empty_rows", "all_2to4", "empty"])
def test_split_is_exact(device, rng, kind):
    m, k = 12, 22
    if kind == "all_2to4":
        w = torch.randn(m, k, dtype=torch.float64)
        w = torch.where(prune_2to4_mask(w), w, torch.zeros_like(w))
        a = st.from_dense(w.to(device))
    else:
        density = 0.0 if kind == "empty" else 0.6
        a = st.from_scipy(random_csr(rng, m, k, density, unsorted=kind != "sorted", duplicates=kind != "sorted",
                                     empty_rows=0.3 if kind == "empty_rows" else 0.0), device=device)
    split = Sparse24Split(a.crow_indices, a.col_indices, (m, k))
    w24 = split.dense24(a.values)
    res = st.CSR(split.res_crow, split.res_col, split.residual_values(a.values), (m, k)).to_dense()
    assert _is_2to4(w24)
    torch.testing.assert_close(w24 + res, a.to_dense(), rtol=1e-12, atol=1e-12)
    if kind == "all_2to4":
        assert split.residual_nnz == 0 and split.in24 is None
    # the residual's pattern is a valid CSR with sorted columns per row
    st.validate_csr(st.CSR(split.res_crow, split.res_col, split.residual_values(a.values), (m, k)))


@pytest.mark.parametrize("activation", [None, "relu", "silu"])
def test_cpu_reference_path_matches_float64(rng, activation):
    """format="2:4" on the CPU: W24 expanded + the residual through the SpMM, forward and backward."""
    torch.manual_seed(2)
    lin = torch.nn.Linear(40, 16, dtype=torch.float64)
    layer = st.nn.SparseLinear.from_dense(lin, sparsity=0.6, activation=activation, format="2:4")
    x = torch.randn(3, 5, 40, dtype=torch.float64, requires_grad=True)
    w = layer.to_dense().detach().clone().requires_grad_()
    y = layer(x)
    ref = torch.nn.functional.linear(x, w, layer.bias)
    ref = getattr(torch.nn.functional, activation)(ref) if activation else ref
    torch.testing.assert_close(y, ref)
    assert layer._derived.forms["2:4"].weight.residual_nnz > 0
    g = torch.randn_like(y)
    gx, gv = torch.autograd.grad(y, (x, layer.values), g)
    gx_ref, gw_ref = torch.autograd.grad(ref, (x, w), g)
    torch.testing.assert_close(gx, gx_ref)
    rows = torch.repeat_interleave(torch.arange(16), torch.diff(layer.crow_indices.long()))
    torch.testing.assert_close(gv, gw_ref[rows, layer.col_indices.long()])


def test_weight_from_a_dense_2to4_weight(device):
    """Sparse24Weight.from_dense: a weight already 2:4 compressed as it is (no split, no residual), the same
    product as the split-built weight; a weight that is not 2:4 is refused; no values to set."""
    if device == "cuda" and not LT:
        pytest.skip("needs a GPU and a build with cuSPARSELt")
    torch.manual_seed(5)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    w = torch.randn(48, 64, device=device)
    w = (w * prune_2to4_mask(w)).to(dtype)
    x = torch.randn(7, 64, device=device).to(dtype)
    made = Sparse24Weight.from_dense(w)
    a = st.from_dense(w)
    split = Sparse24Weight(Sparse24Split(a.crow_indices, a.col_indices, w.shape), a.values)
    ref = x.double() @ w.double().t()
    assert made.residual_nnz == 0 and made.split is None
    assert _rel(made(x), ref) < 1e-2 and torch.allclose(made(x).float(), split(x).float(), atol=1e-2, rtol=1e-2)
    with pytest.raises(ValueError, match="not 2:4"):
        Sparse24Weight.from_dense(torch.ones(16, 16, device=device, dtype=dtype))
    with pytest.raises(ValueError, match="no CSR order"):
        made.set_values(a.values)


def test_inference_2to4_forms_build_from_the_dense_weight(device):
    """Without refresh maps (an inference layer), a 2:4 pattern's cuSPARSELt form is made from the dense
    weight with no split; it is not refreshable, and the layer rebuilds it with maps once it trains."""
    from sparsetorch.pruned import forms

    if device == "cuda" and not LT:
        pytest.skip("needs a GPU and a build with cuSPARSELt")
    torch.manual_seed(6)
    dtype = torch.bfloat16  # the pattern's distance from 2:4 is measured for half types
    w = torch.randn(32, 64, device=device)
    a = st.from_dense((w * prune_2to4_mask(w)).to(dtype))
    pattern = forms.Pattern(a.crow_indices, a.col_indices, (32, 64), dtype, torch.device(device))
    bare = forms.build("2:4", pattern, a.crow_indices, a.col_indices, a.values, keep_maps=False)
    kept = forms.build("2:4", pattern, a.crow_indices, a.col_indices, a.values, keep_maps=True)
    assert not bare.refreshable and kept.refreshable and pattern._split is not None
    x = torch.randn(5, 64, device=device).to(dtype)
    assert torch.allclose(bare(x).float(), kept(x).float(), atol=1e-2, rtol=1e-2)
    assert _rel(bare(x), x.double() @ a.to_dense().double().t()) < 1e-2


def test_applies_says_why_not():
    assert "CUDA-only" in sparse24_applies((32, 32), torch.bfloat16, torch.device("cpu"))
    assert "float16/bfloat16" in sparse24_applies((32, 32), torch.float32, torch.device("cuda"))
    assert "multiples of 16" in sparse24_applies((30, 32), torch.bfloat16, torch.device("cuda"))


def test_forced_2to4_needs_cusparselt_on_cuda_message():
    if not torch.cuda.is_available() or LT:
        pytest.skip("only where CUDA runs without cuSPARSELt")
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(32, 32), scheme="2:4", format="2:4").cuda().bfloat16()
    with pytest.raises(ValueError, match="cuSPARSELt"):
        layer(torch.randn(4, 32, device="cuda", dtype=torch.bfloat16))


# --- cuSPARSELt (CUDA) ------------------------------------------------------------------------------------

def _pruned(m, k, dtype, sparsity=None, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    w = torch.randn(m, k, device="cuda", generator=g, dtype=torch.float32)
    if sparsity is None:
        w = torch.where(prune_2to4_mask(w), w, torch.zeros_like(w))
    else:
        w = torch.where(torch.rand(m, k, device="cuda", generator=g) >= sparsity, w, torch.zeros_like(w))
    return w.to(dtype)


@needs_lt
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_compress_check_and_linear(dtype):
    m, k = 64, 128
    w = _pruned(m, k, dtype)
    assert int(ops.sparse24_check(w)[0]) == 0
    dense = torch.randn(m, k, device="cuda", dtype=dtype)
    assert int(ops.sparse24_check(dense)[0]) != 0
    comp = ops.sparse24_compress(w)
    assert comp.dtype == torch.uint8 and comp.numel() < w.numel() * w.element_size()
    bias = torch.randn(m, device="cuda", dtype=dtype)
    for n in (1, 7, 8, 33, 130):
        x = torch.randn(n, k, device="cuda", dtype=dtype)
        ref = x.double() @ w.double().t() + bias.double()
        y = ops.sparse24_linear(x, comp, m, None, None, None, bias)
        assert y.shape == (n, m) and y.dtype == dtype
        assert _rel(y, ref) < 1e-2
        y = ops.sparse24_linear(x, comp, m, activation="gelu")
        assert _rel(y, torch.nn.functional.gelu(x.double() @ w.double().t())) < 1e-2
    assert ops.sparse24_linear(torch.randn(0, k, device="cuda", dtype=dtype), comp, m).shape == (0, m)


@needs_lt
@pytest.mark.parametrize("sparsity", [0.9, 0.6])
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
# k = 4128: x tiles of 8 tokens (66 KB, above the 48 KB default); 8208: of at most 4 (66 KB); 60016: a row of x
# (120 KB) is more than two blocks per SM may hold, so the kernel reads x from global memory.
@pytest.mark.parametrize("k", [4128, 8208, 60016])
def test_residual_split_on_cuda(sparsity, index_dtype, k):
    m = 96 if k < 60000 else 16
    w = _pruned(m, k, torch.bfloat16, sparsity, seed=3)
    a = st.from_dense(w).to(index_dtype=index_dtype)
    form = Sparse24Weight(Sparse24Split(a.crow_indices, a.col_indices, (m, k)), a.values)
    assert form.residual_nnz > 0 and form.split.res_crow.dtype == torch.int32
    bias = torch.randn(m, device="cuda", dtype=torch.bfloat16)
    for n in (1, 2, 3, 5, 64, 200):  # tiles of 1, 2, 4 and 8 tokens, padding rows (N % 8 != 0)
        x = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
        ref = x.double() @ w.double().t() + bias.double()
        assert _rel(form(x, bias), ref) < 1e-2
    code = form.search(x, bias, bucket=256)
    assert form.alg_for(x, bias, 256) == code  # kept for the bucket: its calls run it, no second search
    assert _rel(form(x, bias, bucket=256), ref) < 1e-2
    x = torch.randn(130, k, device="cuda", dtype=torch.bfloat16)  # another N of the bucket: same code
    assert _rel(form(x, bias, bucket=256), x.double() @ w.double().t() + bias.double()) < 1e-2


@needs_lt
def test_residual_layers_of_growing_in_features_in_one_process():
    """The residual kernel's x tile (8 tokens x in_features) passes 48 KB of shared memory from k = 3072 on;
    layers of k = 3200 (51 KB), 4096 (64 KB) and 6144 (96 KB) one after another: each launch may use what
    it needs (the limit was once raised per instantiation to the first call's size, so the later, larger
    layers failed their launch)."""
    m = 32
    for k in (3200, 4096, 6144):
        w = _pruned(m, k, torch.bfloat16, 0.9, seed=k)
        a = st.from_dense(w)
        form = Sparse24Weight(Sparse24Split(a.crow_indices, a.col_indices, (m, k)), a.values)
        assert form.residual_nnz > 0
        x = torch.randn(8, k, device="cuda", dtype=torch.bfloat16)
        assert _rel(form(x), x.double() @ w.double().t()) < 1e-2


@needs_lt
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_residual_with_one_long_row_and_empty_rows(dtype):
    """Row 3 dense (a residual row of k / 2 entries), rows 8.. a 2:4 pattern (no residual), the rest 90% sparse:
    the residual's rows are as uneven as they come; every token count from 1 to 17 and 1000."""
    m, k = 64, 512
    w = _pruned(m, k, torch.float32, 0.9, seed=11)
    w[3] = torch.randn(k, device="cuda")
    w[8:] = _pruned(m - 8, k, torch.float32, None, seed=12)
    w = w.to(dtype)
    a = st.from_dense(w)
    form = Sparse24Weight(Sparse24Split(a.crow_indices, a.col_indices, (m, k)), a.values)
    counts = form.split.res_crow.diff()
    assert int(counts[3]) == k // 2 and int(counts[8:].sum()) == 0
    for n in list(range(1, 18)) + [1000]:
        x = torch.randn(n, k, device="cuda", dtype=dtype)
        assert _rel(form(x), x.double() @ w.double().t()) < 1e-2, n


@needs_lt
def test_prepare_searches_the_2to4_algorithm_per_bucket():
    """A first call runs cuSPARSELt's default algorithm (its search costs tens of calls: never on a call);
    prepare() searches each bucket's (the default took 2.2x the searched one's time on an H100 at
    11008 x 4096, N = 2048), for format="2:4" as for "auto", and the calls then run it, also with autograd."""
    torch.manual_seed(7)
    w = torch.randn(64, 256, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(64, device="cuda", dtype=torch.bfloat16)
    layer = st.nn.SparseLinear.from_dense(w, sparsity=0.9, scheme="global", bias=bias, format="2:4")
    x = torch.randn(16, 256, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y = layer(x)
    assert not layer._derived.algs
    assert _rel(y, x.double() @ layer.to_dense().double().t() + bias.double()) < 1e-2
    layer.prepare([16, 100])
    algs = layer._derived.algs
    assert layer._derived.forms["2:4"].weight.residual_nnz > 0 and set(algs) == {16, 128} and min(algs.values()) >= 0
    with torch.no_grad():
        assert _rel(layer(x), x.double() @ layer.to_dense().double().t() + bias.double()) < 1e-2
    x2 = torch.randn(100, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    layer(x2).float().sum().backward()
    ones = torch.ones(100, 64, device="cuda", dtype=torch.float64)
    assert _rel(x2.grad, ones @ layer.to_dense().double()) < 1e-2


@needs_lt
def test_ops_reject_bad_arguments():
    w = _pruned(32, 64, torch.bfloat16)
    comp = ops.sparse24_compress(w)
    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="compresses to"):
        ops.sparse24_linear(x, comp, 48)
    with pytest.raises(TypeError, match="float16 or bfloat16"):
        ops.sparse24_linear(x.float(), comp, 32)
    with pytest.raises(ValueError, match="multiples of 16"):
        ops.sparse24_compress(torch.zeros(30, 64, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="bias"):
        ops.sparse24_linear(x, comp, 32, bias=torch.zeros(31, device="cuda", dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="residual"):
        ops.sparse24_linear(x, comp, 32, torch.zeros(33, dtype=torch.int32, device="cuda"))


@needs_lt
def test_opcheck_sparse24_linear():
    w = _pruned(32, 64, torch.bfloat16)
    comp = ops.sparse24_compress(w)
    x = torch.randn(5, 64, device="cuda", dtype=torch.bfloat16)
    torch.library.opcheck(ops.sparse24_linear, (x, comp, 32), test_utils=("test_schema", "test_faketensor"))


@needs_lt
@pytest.mark.parametrize("scheme", ["2:4", "global"])
def test_layer_on_cuda_chooses_and_matches(scheme):
    torch.manual_seed(4)
    lin = torch.nn.Linear(256, 128, device="cuda", dtype=torch.bfloat16)
    layer = st.nn.SparseLinear.from_dense(lin, sparsity=0.5 if scheme == "2:4" else 0.9, scheme=scheme,
                                          activation="relu")
    w = layer.to_dense().detach().double()
    for n in (1, 16, 300):
        x = torch.randn(n, 256, device="cuda", dtype=torch.bfloat16)
        ref = torch.relu(x.double() @ w.t() + layer.bias.double())
        with torch.no_grad():
            assert _rel(layer(x), ref) < 1e-2
    assert set(layer.routes) == {1, 16, 512}
    layer.prepare([1, 16, 300, 1024])
    # a 2:4 form is timed in every bucket of a 2:4 pattern (the decode kernel, cuSPARSELt from 64 tokens), and
    # cuSPARSELt with a residual from 1024 tokens (rule.timed_forms)
    timed_24 = {b for b, t in layer.route_times.items() if any(r.startswith("2:4") for r in t)}
    assert timed_24 == ({1, 16, 512, 1024} if scheme == "2:4" else {1024})
    forced = st.nn.SparseLinear(256, 128, layer.crow_indices, layer.col_indices, layer.values.detach(),
                                layer.bias.detach(), activation="relu", format="2:4")
    with torch.no_grad():
        assert _rel(forced(x), ref) < 1e-2


@needs_lt
def test_layer_2to4_trains_and_rebuilds_after_step():
    torch.manual_seed(5)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32, device="cuda", dtype=torch.bfloat16),
                                          scheme="2:4", format="2:4")
    x = torch.randn(48, 64, device="cuda", dtype=torch.bfloat16)
    opt = torch.optim.SGD(layer.parameters(), lr=0.1)
    layer(x).float().square().mean().backward()
    assert layer.values.grad is not None and torch.isfinite(layer.values.grad.float()).all()
    opt.step()
    with torch.no_grad():
        ref = x.double() @ layer.to_dense().double().t() + layer.bias.double()
        assert _rel(layer(x), ref) < 1e-2  # the compressed weight was rebuilt from the stepped values


@needs_lt
def test_layer_in_cuda_graph_uses_the_decided_route():
    torch.manual_seed(6)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64, device="cuda", dtype=torch.bfloat16),
                                          scheme="2:4")
    x = torch.randn(16, 128, device="cuda", dtype=torch.bfloat16)
    layer.prepare([16])
    with torch.no_grad():
        eager = layer(x)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            layer(x)
        torch.cuda.current_stream().wait_stream(s)
        held = set(layer._derived.forms)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = layer(x)
            out32 = layer(torch.randn(32, 128, device="cuda", dtype=torch.bfloat16))  # undecided: a held form
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager)
    assert out32.shape == (32, 64) and set(layer._derived.forms) == held


def test_pruned_suite_runs_on_cpu(tmp_path):
    """The pruned-model suite end to end on the CPU (its small sizes), as CI runs it."""
    import json

    from benchmarks.run import main

    out = tmp_path / "pruned"
    main(["--device", "cpu", "--suites", "pruned", "--no-plots", "--out", str(out)])
    rows = json.loads((out / "results.json").read_text())["rows"]
    impls = {r["impl"] for r in rows}
    assert {"sparsetorch", "dense F.linear"} <= impls
    ours = [r for r in rows if r["impl"] == "sparsetorch" and r["suite"] == "pruned"]
    assert ours and all(r["rel_err"] < 1e-4 and r["vs_dense"] > 0 for r in ours)
    assert any(r["case"].startswith("MLP") for r in ours)
    assert all(r.get("route") for r in ours)
    decode = [r for r in rows if r["impl"] == "sparsetorch" and r["suite"] == "decode"]  # the decode stack's rows
    assert decode and all(r.get("routes") and r["rel_err"] < 1e-4 for r in decode)
