"""SparseLinear as it deploys (sparsetorch/nn/linear.py): the rule decides a new bucket without timing, the
tuner samples held forms on later calls and decides, decisions are shared and persist in the cache file,
prepare() decides buckets up front, compact() keeps one stored form (with a transient dense expansion),
its state_dict round-trips and is checked, and the op that torch.compile sees runs the chosen form.
The kernels of each form are tested in their own files (test_slots, test_csr16, test_bitmap, ...)."""
import copy
import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounter

import sparsetorch as st
from sparsetorch import tuning
from sparsetorch.nn import linear as lin
from sparsetorch.pruned import forms, rule, sparse24
from conftest import CUDA_MMA, CUDA_READY, python_env

needs_cuda = pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
needs_mma = pytest.mark.skipif(not CUDA_MMA, reason="needs a GPU and this build's tensor-core (sm_80) code")


@pytest.fixture(autouse=True)
def no_cache_file():
    yield
    st.set_tuning_cache(None)


def _ref(layer, x, weight=None):
    w = (layer.to_dense() if weight is None else weight).detach().double()
    z = x.double() @ w.t()
    if layer.bias is not None:
        z = z + layer.bias.detach().double()
    act = layer.activation
    return z if act == "none" else getattr(F, act)(z)


def _rel(y, ref):
    return float((y.double() - ref).norm() / ref.norm().clamp_min(1e-30))


# --- the rule ------------------------------------------------------------------------------------

class _P:
    """A stand-in for forms.Pattern: what the rule reads."""

    def __init__(self, shape, density, is_24=False, dtype=torch.bfloat16, device="cuda"):
        self.shape, self.density, self.is_24, self.dtype = shape, density, is_24, dtype
        self.device = torch.device(device)


ALL = {name: None for name in forms.FORM_NAMES}


@pytest.mark.parametrize("shape, density, is_24, n, expected", [
    ((14336, 4096), 0.5, True, 1, "2:4 decode"),
    ((14336, 4096), 0.5, True, 16, "2:4 decode"),
    ((14336, 4096), 0.5, True, 32, "2:4 decode"),   # tall: the decode kernel still wins at 32
    ((4096, 14336), 0.5, True, 32, "dense"),        # wide: 0.77x there
    ((4096, 14336), 0.5, True, 128, "dense"),
    ((4096, 14336), 0.5, True, 2048, "dense"),     # cuSPARSELt only where prepare() searched its algorithm
    ((4096, 4096), 0.1, False, 1, "csr16"),
    ((4096, 4096), 0.3, False, 2, "csr16"),
    ((4096, 4096), 0.3, False, 4, "slots"),
    ((4096, 4096), 0.1, False, 16, "slots"),
    ((4096, 4096), 0.3, False, 16, "dense"),
    ((4096, 4096), 0.1, False, 64, "dense"),
    ((4096, 4096), 0.5, False, 1, "dense"),         # bitmap at 50% is within noise of dense: not by rule
])
def test_rule_follows_the_measured_crossovers(shape, density, is_24, n, expected):
    assert rule.first_choice(_P(shape, density, is_24), n, ALL) == expected


def test_rule_never_takes_a_form_that_does_not_apply():
    p = _P((4096, 4096), 0.1)
    assert rule.first_choice(p, 1, dict(ALL, csr16="no")) == "slots"
    assert rule.first_choice(p, 1, dict(ALL, csr16="no", slots="no")) == "dense"
    assert rule.first_choice(_P((4096, 4096), 0.5, True), 1, dict(ALL, **{"2:4 decode": "no"})) == "dense"
    # float32 / the CPU: the CSR routes against the dense GEMM, by density
    assert rule.first_choice(_P((512, 512), 0.01, dtype=torch.float32), 8, ALL) == "csr"
    assert rule.first_choice(_P((512, 512), 0.5, dtype=torch.float32), 8, ALL) == "dense"
    assert rule.first_choice(_P((512, 512), 0.01, device="cpu"), 8, ALL) == "csr"


def test_prepare_times_every_form_but_the_csr_spmm_and_a_24_patterns_wider_layouts():
    names = ["csr", "dense", "slots", "csr16"]
    assert rule.timed_forms(_P((4096, 4096), 0.1), 1, names) == ["dense", "slots", "csr16"]
    assert rule.timed_forms(_P((4096, 4096), 0.1), 1024, ["csr", "dense"]) == ["dense"]
    assert rule.timed_forms(_P((4096, 4096), 0.1), 16, ["csr", "dense"]) == ["csr", "dense"]  # no packed form
    assert rule.timed_forms(_P((4096, 4096), 0.1, dtype=torch.float32), 1, names) == names
    assert rule.timed_forms(_P((4096, 4096), 0.1, device="cpu"), 1024, names) == names
    assert rule.timed_forms(_P((4096, 4096), 0.1), 1024, ["csr"]) == ["csr"]  # the only form: still decided
    # a 2:4 pattern with the decode layout: the rule's three forms only (by bytes; rule.timed_forms says why)
    every = ["csr", "dense", "2:4", "2:4 decode", "bitmap", "slots", "csr16"]
    for n in (64, 2048):
        assert rule.timed_forms(_P((4096, 4096), 0.5, True), n, every) == ["dense", "2:4", "2:4 decode"]
    for n in (1, 32):  # cuSPARSELt from 64 tokens only
        assert rule.timed_forms(_P((4096, 4096), 0.5, True), n, every) == ["dense", "2:4 decode"]
    without_decode = [name for name in every if name != "2:4 decode"]
    assert rule.timed_forms(_P((4096, 4096), 0.5, True), 1, without_decode) == [n for n in without_decode if n != "csr"]
    # a pattern with a residual: cuSPARSELt from 1024 tokens only
    near = ["csr", "dense", "2:4", "bitmap", "slots", "csr16"]
    assert rule.timed_forms(_P((4096, 4096), 0.1), 512, near) == ["dense", "bitmap", "slots", "csr16"]
    assert rule.timed_forms(_P((4096, 4096), 0.1), 1024, near) == ["dense", "2:4", "bitmap", "slots", "csr16"]


def test_compact_form_and_routes():
    assert rule.compact_form(_P((64, 64), 0.5, True), ALL) == "2:4 decode"
    assert rule.compact_form(_P((64, 64), 0.3), ALL) == "slots"
    assert rule.compact_form(_P((64, 64), 0.3, dtype=torch.float32), ALL) == "csr"
    assert rule.compact_choice("slots", _P((64, 64), 0.3), 16) == "slots"
    assert rule.compact_choice("slots", _P((64, 64), 0.3), 2048) == "expand"
    limit = rule.COMPACT_STORED_MAX_TOKENS["2:4 decode"]
    assert rule.compact_choice("2:4 decode", _P((64, 64), 0.5, True), limit) == "2:4 decode"
    assert rule.compact_choice("2:4 decode", _P((64, 64), 0.5, True), limit + 1) == "expand"


@pytest.mark.parametrize("order", ["sorted", "unsorted", "repeated"])
def test_residual_24_counts_as_a_per_group_count_does(order):
    """The adjacent-entry count (columns not decreasing in a row) and the histogram (any order) agree with
    counting each group's entries one by one, on random patterns with empty rows, shuffled rows and
    repeated columns."""
    import numpy as np
    import scipy.sparse as sp

    rng = np.random.default_rng({"sorted": 0, "unsorted": 1, "repeated": 2}[order])
    for _ in range(60):
        m, k = int(rng.integers(1, 20)), int(rng.integers(1, 40))
        a = sp.random(m, k, density=rng.random(), format="csr", random_state=rng)
        crow, col = torch.tensor(a.indptr), torch.tensor(a.indices)
        if order == "unsorted":
            for r in range(m):  # shuffle within each row
                s, e = a.indptr[r], a.indptr[r + 1]
                col[s:e] = col[s:e][torch.randperm(e - s)]
        if order == "repeated" and col.numel() > 1:
            col[1] = col[0]
        counts = {}
        for r in range(m):
            for j in col[a.indptr[r]:a.indptr[r + 1]].tolist():
                counts[(r, j // 4)] = counts.get((r, j // 4), 0) + 1
        assert forms.residual_24(crow, col, (m, k)) == sum(max(0, c - 2) for c in counts.values())


def test_pattern_counts_entries_beyond_two_per_group_of_four():
    # row 0: columns 0, 1 (one group, 2 entries); row 1: 0, 1, 2 (3 in a group: 1 beyond), 5; row 2: 4..7 (2 beyond)
    crow = torch.tensor([0, 2, 6, 10])
    col = torch.tensor([0, 1, 0, 1, 2, 5, 4, 5, 6, 7])
    assert forms.residual_24(crow, col, (3, 8)) == 3
    assert forms.residual_24(crow[:2], col[:2], (1, 8)) == 0
    p = forms.Pattern(crow, col, (3, 8), torch.bfloat16, "cpu")
    assert p.residual24 == 3 and not p.is_24 and p.split.residual_nnz == 3  # the split agrees


def test_a_2to4_pruned_layer_skips_counting_its_pattern_until_its_indices_change(monkeypatch):
    """from_dense(scheme="2:4") knows its pattern is 2:4 (residual 0) without the counting pass; a layer whose
    index tensors were written, replaced or loaded counts again (a stale "2:4" would let cuSPARSELt prune)."""
    counted = []
    original = forms.residual_24
    monkeypatch.setattr(forms, "residual_24", lambda *a: counted.append(1) or original(*a))
    torch.manual_seed(3)
    lin = torch.nn.Linear(64, 32).bfloat16()
    layer = st.nn.SparseLinear.from_dense(lin, scheme="2:4", sparsity=0.6)
    p = layer._pattern()
    assert p.is_24 and p.residual24 == 0 and not counted
    assert copy.deepcopy(layer)._pattern().is_24  # a copy's tensors are new: it counts (and agrees)
    counted.clear()
    moved = st.nn.SparseLinear.from_dense(lin, scheme="2:4").to(torch.float32).to("cpu")  # _apply keeps it
    assert moved._known_residual[0][1][0] is moved.col_indices and moved._pattern().residual24 is None  # float32
    assert not counted
    with torch.no_grad():
        layer.col_indices[0] = (layer.col_indices[1] // 4) * 4 + (layer.col_indices[1] + 1) % 4  # in place
    layer._pattern()
    assert counted  # counted again after the in-place write
    other = st.nn.SparseLinear.from_dense(lin, scheme="row", sparsity=0.25)  # 3 of 4 kept: not 2:4
    loaded = st.nn.SparseLinear.from_dense(lin, scheme="2:4")
    loaded.load_state_dict(other.state_dict())
    assert not loaded._pattern().is_24 and loaded._pattern().residual24 > 0
    assert "_known_residual" not in st.nn.SparseLinear.from_dense(lin, scheme="2:4").compact().__dict__


@pytest.mark.parametrize("scheme, sparsity", [("row", 0.7), ("global", 0.9), ("global", 0.3), ("row", 0.5),
                                              ("2:4", 0.5), ("2:4", 0.8)])
@pytest.mark.parametrize("in_features", [64, 70])
def test_from_dense_reads_the_patterns_residual_off_its_mask(monkeypatch, scheme, sparsity, in_features):
    """A pruning's entries beyond 2 per group of 4 are read off its mask at construction, equal to counting them
    on the CSR (the last group shorter where in_features % 4 != 0), so the first call does not count."""
    counted = []
    original = forms.residual_24
    monkeypatch.setattr(forms, "residual_24", lambda *a: counted.append(1) or original(*a))
    torch.manual_seed(11)
    layer = st.nn.SparseLinear.from_dense(torch.randn(40, in_features).bfloat16(), sparsity=sparsity, scheme=scheme)
    got = layer._pattern().residual24
    assert not counted
    assert got == original(layer.crow_indices, layer.col_indices, (40, in_features))
    if scheme == "2:4":
        assert got == 0
    elif sparsity < 0.5:  # more than half kept: some groups hold 3 or 4
        assert got > 0
    for shape in ((0, in_features), (0, 0), (8, 0), (5, 3)):  # empty and shorter than a group
        small = st.nn.SparseLinear.from_dense(torch.randn(*shape).bfloat16(), sparsity=sparsity, scheme=scheme)
        assert small._pattern().residual24 == original(small.crow_indices, small.col_indices, shape)


@pytest.mark.parametrize("scheme", ["global", "row", "2:4"])
def test_from_dense_and_moves_in_inference_mode(scheme):
    """Tensors made in inference mode have no version counter: from_dense and a move record nothing about the
    pattern there (it is counted at the first call) and the layer computes the product; so does a compact
    layer, moved too."""
    torch.manual_seed(12)
    with torch.inference_mode():
        w = torch.randn(32, 64).bfloat16()
        layer = st.nn.SparseLinear.from_dense(w, scheme=scheme, sparsity=0.5)
        assert "_known_residual" not in layer.__dict__
        layer = layer._apply(lambda t: t.clone())  # what .to() / .cuda() do with new tensors
        x = torch.randn(5, 64).bfloat16()
        assert _rel(layer(x), _ref(layer, x)) < 2e-2
        assert layer._pattern().residual24 == forms.residual_24(layer.crow_indices, layer.col_indices, (32, 64))
        ref = _ref(layer, x)
        compact = layer.compact()._apply(lambda t: t.clone())
        assert _rel(compact(x), ref) < 2e-2 and _rel(compact(x), ref) < 2e-2


# --- the first call and the online samples ---------------------------------------------------------

def test_first_call_takes_the_rule_without_timing(monkeypatch):
    """A new bucket's first call runs the rule's form: nothing is timed (timing.device_time / wall_time are
    never called), and the bucket is undecided until samples come back."""
    def no_timing(*a, **k):
        raise AssertionError("the first call of a bucket timed something")

    monkeypatch.setattr(lin.timing, "time_call", no_timing)
    torch.manual_seed(0)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 48), sparsity=0.95)  # float32 CPU: csr by rule
    x = torch.randn(3, 64)
    with torch.no_grad():
        y = layer(x)
    assert _rel(y, _ref(layer, x)) < 1e-5
    assert layer.routes == {4: "csr"}
    entry = [e for e in st.tuning_table(kind="linear") if e["key"][-1] == 4]
    assert entry and entry[0]["rule"] == "csr"


def test_undecided_bucket_samples_held_forms_then_decides():
    """With two held forms applicable (the neighbours' choices), the tuner hands each out as the real call
    (warm-up + counted samples) and decides; every call is the product; the loser is freed once every bucket
    is decided."""
    torch.manual_seed(1)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 48), sparsity=0.5)  # float32 CPU, 50%: dense by rule
    key = layer._tuning_key(4)
    # make "csr" a neighbour's choice so that bucket 4 has two candidates held
    layer._derived.choices[2] = "csr"
    layer._form("csr", torch.device("cpu"))
    table = tuning.tuner("linear")
    calls = 0
    with torch.no_grad():
        while table.decided(key) is None:
            x = torch.randn(4, 64)
            assert _rel(layer(x), _ref(layer, x)) < 1e-5
            calls += 1
            assert calls <= 2 * (tuning.WARMUP_SAMPLES + tuning.SAMPLES) + 2
    entry = next(e for e in st.tuning_table(kind="linear") if e["key"] == key)
    assert set(entry["candidates"]) == {"dense", "csr"} and entry["source"] == "sampled"
    assert all(len(c["costs_ms"]) >= 1 for c in entry["candidates"].values())


def test_undecided_bucket_samples_only_near_its_largest_token_count(monkeypatch):
    """A bucket's token counts span 2x, and a sparse form's time grows with them faster than dense's: a call
    is sampled only within tuning.SIZE_WINDOW of the largest count the bucket has run, so counts low in the
    bucket do not decide it; the bucket still decides, and every call is the product."""
    torch.manual_seed(2)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 48), sparsity=0.5)  # float32 CPU: dense by rule
    key = layer._tuning_key(32)
    layer._derived.choices[16] = "csr"  # a neighbour's choice: bucket 32 has two candidates held
    layer._form("csr", torch.device("cpu"))
    table = tuning.tuner("linear")
    sampled, largest = [], [0]
    submit = table.submit

    def watch(k, choice, sample, size=1.0):
        if k == key:
            sampled.append((size, largest[0]))
        submit(k, choice, sample, size)

    monkeypatch.setattr(table, "submit", watch)
    with torch.no_grad():
        for i in range(400):
            n = 17 + (i * 7) % 16  # 17..32, mixed
            largest[0] = max(largest[0], n)
            x = torch.randn(n, 64)
            assert _rel(layer(x), _ref(layer, x)) < 1e-5
            if table.decided(key) is not None:
                break
    assert table.decided(key) in ("dense", "csr")
    assert len(sampled) >= 2 * tuning.WARMUP_SAMPLES + tuning.SAMPLES  # a warm-up each, 3 of the survivor
    assert all(size >= tuning.SIZE_WINDOW * top for size, top in sampled)
    assert min(size for size, _ in sampled) < 24 <= max(size for size, _ in sampled)  # the window moved up


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA_READY and sparse24.available() else []))
def test_decided_24_bucket_runs_a_new_token_count_on_dense_and_plans_it_the_second_time(monkeypatch, device):
    """A bucket decided for the 2:4 form, in a layer holding its dense form: each token count (padded to
    cuSPARSELt's 8) runs dense the first time and the 2:4 form from the second (built at that first use);
    every call is the product. (The CPU 2:4 form is a reference with no plans: the plan rule is switched on.)"""
    if device == "cpu":
        monkeypatch.setattr(lin, "_plans_per_token_count", lambda x: True)
    torch.manual_seed(9)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 48).to(device, torch.bfloat16), scheme="2:4")
    table = tuning.tuner("linear")
    table.decide(layer._tuning_key(16), "dense")
    table.decide(layer._tuning_key(256), "2:4")
    ran = []
    for cls, name in ((forms.Sparse24Form, "2:4"), (forms.DenseForm, "dense")):
        original = cls.__call__
        monkeypatch.setattr(cls, "__call__", lambda self, *a, _o=original, _n=name, **k: ran.append(_n) or _o(self, *a, **k))
    monkeypatch.setattr(lin.F_torch, "linear", lambda *a, _o=F.linear, **k: ran.append("dense") or _o(*a, **k))
    with torch.no_grad():
        layer(torch.randn(16, 64, device=device).bfloat16())  # bucket 16: the dense form, held from now on
        assert "2:4" not in layer._derived.forms
        for n, expected in ((200, "dense"), (200, "2:4"), (197, "2:4"), (201, "dense"), (208, "2:4"), (200, "2:4")):
            ran.clear()
            x = torch.randn(n, 64, device=device).bfloat16()
            y = layer(x)
            assert ran == [expected], (n, ran)
            assert _rel(y.float(), _ref(layer, x.float())) < 2e-2
            assert "2:4" in layer._derived.forms or expected == "dense"
    # the plans the 2:4 calls made (at 200 and 208 tokens; the CPU reference makes none)
    assert layer.routes[256] == "2:4" and len(lin._sparse24.PLANS) == (2 if device == "cuda" else 0)
    st.clear_caches()
    assert len(lin._sparse24.PLANS) == 0


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA_READY and sparse24.available() else []))
def test_layers_of_one_shape_each_run_a_new_token_count_dense_once_and_share_its_plan(monkeypatch, device):
    """Two 2:4 layers of one shape (a block's gate and up) at a token count new to both: each runs it dense
    once (the other's first request does not make it the plan-making second call), the first to see it again
    makes the plan, and a layer reaching a count whose plan exists takes the 2:4 form at once."""
    if device == "cpu":
        monkeypatch.setattr(lin, "_plans_per_token_count", lambda x: True)
        made = set()  # the CPU reference makes no plans: count the 2:4 calls as the CUDA form does
        monkeypatch.setattr(lin._sparse24.PLANS, "seen", lambda key: int(key in made))
        original = forms.Sparse24Form.__call__

        def call(self, x, bias, act, slope, code, _o=original):
            made.add(lin._sparse24.PLANS.key(x, (48, 64), False, bias, code))
            return _o(self, x, bias, act, slope, code)
        monkeypatch.setattr(forms.Sparse24Form, "__call__", call)
    torch.manual_seed(10)
    base = torch.nn.Linear(64, 48, bias=False).to(device, torch.bfloat16)  # a plan is keyed on the bias too
    gate, up, third = (st.nn.SparseLinear.from_dense(base, scheme="2:4") for _ in range(3))
    table = tuning.tuner("linear")
    ran = []
    monkeypatch.setattr(lin.F_torch, "linear", lambda *a, _o=F.linear, **k: ran.append("dense") or _o(*a, **k))
    with torch.no_grad():
        for layer in (gate, up, third):
            table.decide(layer._tuning_key(16), "dense")
            table.decide(layer._tuning_key(256), "2:4")
            layer(torch.randn(16, 64, device=device).bfloat16())  # the dense form, held from now on
        for layer, expected in ((gate, ["dense"]), (up, ["dense"]), (gate, []), (up, []), (third, [])):
            ran.clear()
            x = torch.randn(200, 64, device=device).bfloat16()
            y = layer(x)
            assert ran == expected, (layer is gate, ran)
            assert _rel(y.float(), _ref(layer, x.float())) < 2e-2


def test_a_held_dense_form_is_the_expansion_later_builds_start_from(monkeypatch):
    """Building a 2:4 form of a 2:4 layer that holds its dense form expands no CSR again (a scatter of every
    entry: 2.9 ms of a 14336 x 4096 layer's first call on an H100), and the form computes the product."""
    torch.manual_seed(4)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32).to(torch.bfloat16), scheme="2:4")
    assert layer._pattern().is_24
    expansions = []
    original, from_pairs = st.CSR.to_dense, forms.dense_from_pairs
    monkeypatch.setattr(st.CSR, "to_dense", lambda self: expansions.append(1) or original(self))
    monkeypatch.setattr(forms, "dense_from_pairs", lambda *a: expansions.append(1) or from_pairs(*a))
    layer._refresh()
    layer._form("dense", torch.device("cpu"))
    assert len(expansions) == 1
    form = layer._form("2:4", torch.device("cpu"))
    assert len(expansions) == 1
    x = torch.randn(5, 64).bfloat16()
    assert _rel(form(x, layer.bias).float(), _ref(layer, x.float())) < 2e-2


def test_a_24_pruned_layer_builds_its_24_forms_from_its_values_as_stored(monkeypatch):
    """from_dense(scheme="2:4") stores two entries per group of 4: both 2:4 forms and the dense one are made from
    the values as stored (no CSR expansion by a scatter), and each computes the product."""
    torch.manual_seed(5)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32).to(torch.bfloat16), scheme="2:4")
    expansions = []
    original = st.CSR.to_dense
    monkeypatch.setattr(st.CSR, "to_dense", lambda self: expansions.append(1) or original(self))
    layer._refresh()
    checks = []
    is_pairs = forms.is_pair_layout
    monkeypatch.setattr(forms, "is_pair_layout", lambda *a: checks.append(1) or is_pairs(*a))
    x = torch.randn(5, 64).bfloat16()
    built = {name: layer._form(name, torch.device("cpu")) for name in ("2:4 decode", "2:4", "dense")}
    assert expansions == [] and checks == []  # the pruning's layout is known, never checked
    for name, form in built.items():
        assert _rel(form(x, layer.bias).float(), _ref(layer, x.float())) < 2e-2, name


def test_layers_of_one_signature_share_decisions():
    torch.manual_seed(2)
    a = st.nn.SparseLinear.from_dense(torch.nn.Linear(32, 16), sparsity=0.5)
    b = st.nn.SparseLinear.from_dense(torch.nn.Linear(32, 16), sparsity=0.5)
    assert a._tuning_key(8) == b._tuning_key(8)
    tuning.tuner("linear").decide(a._tuning_key(8), "csr")
    with torch.no_grad():
        b(torch.randn(7, 32))
    assert b.routes == {8: "csr"}
    other = st.nn.SparseLinear.from_dense(torch.nn.Linear(32, 16), sparsity=0.9)  # another density
    assert other._tuning_key(8) != a._tuning_key(8)


def test_cache_file_holds_linear_decisions_and_a_new_process_starts_decided(tmp_path):
    path = str(tmp_path / "tuning.json")
    code = textwrap.dedent("""
        import torch, sparsetorch as st
        torch.manual_seed(0)
        layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(32, 16), sparsity=0.5)
        decided = [e["route"] for e in st.tuning_table(decided_only=True, kind="linear")]
        print("START", decided)
        layer.prepare([1, 8])
        print("END", layer.routes)
    """)
    env = python_env(SPARSETORCH_TUNING_CACHE=path)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    first = subprocess.run([sys.executable, "-c", code], env=env, cwd=tests_dir, capture_output=True, text=True,
                           check=True, timeout=300).stdout
    assert "START []" in first
    doc = json.loads(open(path).read())
    group = doc["builds"][-1]
    assert len(group["linear"]) == 2 and all(isinstance(k, list) and isinstance(r, str) for k, r in group["linear"])
    assert sorted(group["linear_measured"]) == sorted(k for k, _ in group["linear"])  # prepare() decided both
    second = subprocess.run([sys.executable, "-c", code], env=env, cwd=tests_dir, capture_output=True, text=True,
                            check=True, timeout=300).stdout
    assert "START []" not in second and second.count("'") >= 2


# --- prepare --------------------------------------------------------------------------------------

def test_prepare_decides_every_bucket_and_frees_unused_forms():
    torch.manual_seed(3)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(96, 64).bfloat16(), sparsity=0.8, activation="relu")
    chosen = layer.prepare([1, 5, 100])
    assert set(chosen) == {1, 8, 128} and chosen == layer.routes
    for bucket, form in chosen.items():
        assert tuning.tuner("linear").decided(layer._tuning_key(bucket)).partition("#")[0] == form
        assert form in layer.route_times[bucket]
    held = set(layer._derived.forms) - {"csr"}
    assert held <= set(chosen.values())
    for n in (1, 5, 100):
        x = torch.randn(n, 96).bfloat16()
        with torch.no_grad():
            assert _rel(layer(x), _ref(layer, x)) < 2e-2


def test_prepare_model_shares_a_signature_between_layers(capsys):
    torch.manual_seed(4)
    model = torch.nn.Sequential(*[st.nn.SparseLinear.from_dense(torch.nn.Linear(32, 32), sparsity=0.5)
                                  for _ in range(3)])
    out = st.nn.prepare(model, [1, 16])
    assert set(out) == {"0", "1", "2"} and all(set(v) == {1, 16} for v in out.values())
    assert "3/3 layers" in capsys.readouterr().err
    assert len(st.tuning_table(kind="linear")) == 2  # one signature, two buckets


def test_prepare_model_shares_a_signature_between_compact_layers():
    """Compact layers of one signature: the first is timed, the others take its decisions (their stored form or
    the expansion) without a pattern to analyse; each runs what it decided."""
    torch.manual_seed(7)
    base = torch.nn.Linear(64, 32)
    model = torch.nn.Sequential(*[st.nn.SparseLinear.from_dense(base, sparsity=0.5) for _ in range(3)])
    st.nn.compact(model)
    out = st.nn.prepare(model, [1, 16], progress=False)
    assert out["0"] == out["1"] == out["2"] and set(out["0"]) == {1, 16}
    x = torch.randn(16, 64)
    with torch.no_grad():
        for layer in model:
            assert _rel(layer(x), F.linear(x, base.weight * (layer.to_dense() != 0), base.bias)) < 1e-5


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA_READY and sparse24.available() else []))
def test_prepare_model_prepares_each_layer_forced_to_a_format(device):
    """Layers forced to a format record no decision in the tuner: st.nn.prepare prepares each (a forced
    "2:4" runs the 2:4 decode kernel up to 16 tokens on CUDA, else cuSPARSELt, whose algorithm prepare
    searches per bucket), and an "auto" layer of the same signature after them still times its buckets."""
    torch.manual_seed(5)
    base = torch.nn.Linear(64, 64, device=device, dtype=torch.bfloat16 if device == "cuda" else torch.float32)
    forced = [st.nn.SparseLinear.from_dense(base, scheme="2:4", format="2:4") for _ in range(2)]
    auto = st.nn.SparseLinear.from_dense(base, scheme="2:4")
    model = torch.nn.Sequential(*forced, auto)
    assert forced[0]._tuning_key(1) == auto._tuning_key(1)  # one signature
    out = st.nn.prepare(model, [1, 16, 64], progress=False)
    few = "2:4 decode" if device == "cuda" else "2:4"
    assert out["0"] == out["1"] == {1: few, 16: few, 64: "2:4"}
    assert set(forced[1]._derived.algs) == ({64} if device == "cuda" else {1, 16, 64})
    assert set(out["2"]) == {1, 16, 64} and len(st.tuning_table(kind="linear")) == 3
    with torch.no_grad():
        for n in (16, 64):
            x = torch.randn(n, 64, device=device, dtype=base.weight.dtype)
            for layer in model:
                assert _rel(layer(x), _ref(layer, x)) < (2e-2 if device == "cuda" else 1e-5)


def test_prepare_keeps_its_own_and_a_cache_files_decisions_and_builds_their_forms(tmp_path, monkeypatch):
    """A second prepare(), and the prepare() of a process that loaded a tuning cache file, time nothing: each
    bucket keeps its decision and has its form built; remeasure=True times again; a bucket decided by the
    online samples is timed (they compared only the rule's form and its neighbours')."""
    from sparsetorch import timing as _timing

    torch.manual_seed(6)
    dense = torch.nn.Linear(96, 64).bfloat16()
    make = lambda: st.nn.SparseLinear.from_dense(dense, sparsity=0.8).requires_grad_(False)  # noqa: E731
    timed = []
    real = _timing.time_call
    monkeypatch.setattr(_timing, "time_call", lambda *a, **k: timed.append(1) or real(*a, **k))
    layer = make()
    first = layer.prepare([1, 16])
    assert timed and first == layer.routes
    timed.clear()
    assert layer.prepare([1, 16]) == first and not timed
    assert layer.prepare([1, 16], remeasure=True) and timed

    path = tmp_path / "tuning.json"
    st.save_tuning_cache(str(path))
    st.clear_tuning()
    assert st.set_tuning_cache(str(path)) == 2  # a new process, the earlier decisions loaded
    fresh, timed[:] = make(), []
    decisions = {b: tuning.tuner("linear").decided(fresh._tuning_key(b)) for b in (1, 16)}
    assert fresh.prepare([1, 16]) == {b: r.partition("#")[0] for b, r in decisions.items()} and not timed
    assert set(fresh.routes.values()) <= set(fresh._derived.forms)  # the forms are built, not left for a call
    x = torch.randn(16, 96).bfloat16()
    with torch.no_grad():
        assert _rel(fresh(x), _ref(fresh, x)) < 2e-2
    st.set_tuning_cache(None)

    st.clear_tuning()
    sampled = make()
    with torch.no_grad():
        for _ in range(12):
            sampled(torch.randn(3, 96).bfloat16())
    key = sampled._tuning_key(4)
    assert tuning.tuner("linear").source(key) == "sampled" and not tuning.tuner("linear").measured(key)
    st.save_tuning_cache(str(path))  # the samples' decision, through a file: still not one prepare() keeps
    st.clear_tuning()
    st.set_tuning_cache(str(path))
    assert tuning.tuner("linear").source(key) == "cache" and not tuning.tuner("linear").measured(key)
    st.set_tuning_cache(None)
    timed.clear()
    make().prepare([4])
    assert timed and tuning.tuner("linear").source(key) == "measured" and tuning.tuner("linear").measured(key)


def test_a_cached_decision_this_build_cannot_run_is_left_to_the_rule():
    """A tuning cache file may hold another build's decisions for the same GPU and signature (e.g. a form
    needing tensor-core code that this build lacks, or one a newer version added): the call and prepare() take
    the rule (prepare() times the bucket) instead of failing; so does a form the pattern does not allow."""
    torch.manual_seed(8)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(96, 64).bfloat16(), sparsity=0.8).requires_grad_(False)
    table = tuning.tuner("linear")
    table.decide(layer._tuning_key(16), "a form of a newer build", source="cache")
    table.decide(layer._tuning_key(128), "2:4 decode", source="cache")  # the pattern is not 2:4
    for n in (16, 100):
        x = torch.randn(n, 96).bfloat16()
        with torch.no_grad():
            assert _rel(layer(x), _ref(layer, x)) < 2e-2
        assert layer.routes[lin._bucket(n)] == layer._rule(n)
    chosen = layer.prepare([16, 100])
    assert tuning.tuner("linear").source(layer._tuning_key(16)) == "measured"
    assert chosen[128] != "2:4 decode" and chosen[16] in layer.route_times[16]


def test_a_24_prunings_pair_layout_is_known_without_a_check(monkeypatch):
    """from_dense(scheme="2:4") keeps at most 2 of every 4 with increasing columns: where half the positions
    are kept the pattern is the pair layout by counting, with no check pass (a device sync on CUDA); it agrees
    with the check, and the check runs again once the index tensors change."""
    from sparsetorch.pruned import sparse24_decode

    checks = []
    real = forms.is_pair_layout
    monkeypatch.setattr(forms, "is_pair_layout", lambda *a: checks.append(1) or real(*a))
    torch.manual_seed(10)
    for k, sparsity, dtype in ((64, 0.5, torch.bfloat16), (64, 0.75, torch.float16), (66, 0.5, torch.bfloat16),
                               (128, 0.5, torch.float32)):
        layer = st.nn.SparseLinear.from_dense(torch.randn(48, k).to(dtype), sparsity=sparsity, scheme="2:4")
        pattern = layer._pattern()
        truth = pattern.is_24 and sparse24_decode.is_pair_layout(layer.crow_indices, layer.col_indices, (48, k))
        assert pattern.pairs == truth and not checks, (k, sparsity, dtype)
    layer = st.nn.SparseLinear.from_dense(torch.randn(48, 64).bfloat16(), scheme="2:4")
    with torch.no_grad():
        layer.col_indices[:2] = layer.col_indices[:2].flip(0)  # no longer in column order
    assert layer._pattern().pairs is False and checks
    checks.clear()  # a CSR given to the constructor is checked, once per pattern
    given = st.nn.SparseLinear(64, 48, layer.crow_indices.clone(), layer.col_indices.clone(), layer.values.detach())
    assert given._pattern().pairs is False and given._pattern().pairs is False and len(checks) == 1


# --- compact ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, scheme, sparsity, stored", [
    (torch.bfloat16, "global", 0.8, "slots"),
    (torch.float16, "row", 0.7, "slots"),
    (torch.bfloat16, "2:4", 0.5, "2:4 decode"),
    (torch.float32, "global", 0.9, "csr"),
])
def test_compact_holds_one_form_and_runs_every_token_count(dtype, scheme, sparsity, stored):
    torch.manual_seed(5)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).to(dtype), sparsity=sparsity, scheme=scheme,
                                          activation="silu")
    w = layer.to_dense().detach().clone()
    csr_bytes = layer.memory()["csr"]
    layer.compact()
    assert layer.stored_format == stored
    mem = layer.memory()
    assert "csr" not in mem and set(mem) == {"stored", "bias", "held", "dense_weight", "peak_transient"}
    assert mem["stored"] <= max(csr_bytes, mem["dense_weight"])
    assert "values" not in dict(layer.named_parameters())
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    for n in (1, 16, 200, 700, 1500, 1, 16):  # twice: the second calls take the decided buckets' bound calls
        x = torch.randn(n, 128).to(dtype)
        with torch.no_grad():
            assert _rel(layer(x), _ref(layer, x, w)) < tol, n
    if stored != "csr":  # large token counts expanded to dense for the call: reported, not held
        assert layer.memory()["peak_transient"] == w.numel() * w.element_size()
        assert layer.memory()["held"] == mem["held"]
    torch.testing.assert_close(layer.to_dense(), w)


def test_compact_builds_no_refresh_maps_and_reuses_a_held_form(monkeypatch):
    """compact() makes the stored form without the maps only training needs (no 2:4 split: a sort of every
    entry), or takes the one the layer holds; the compact layer computes the product."""
    torch.manual_seed(6)
    splits = []
    original = forms.Sparse24Split.__init__
    monkeypatch.setattr(forms.Sparse24Split, "__init__", lambda self, *a: splits.append(1) or original(self, *a))
    x = torch.randn(3, 64).bfloat16()
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32).to(torch.bfloat16), scheme="2:4")
    ref = _ref(layer, x.float())
    layer.compact()
    assert layer.stored_format == "2:4 decode" and splits == []
    assert _rel(layer(x).float(), ref) < 2e-2
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32).to(torch.bfloat16), scheme="2:4")
    held = layer._form("2:4 decode", torch.device("cpu"))  # the layer's first use: the form is kept
    assert layer._derived.forms["2:4 decode"] is held
    layer.compact()
    assert layer._stored_form().weight.values.data_ptr() == held.weight.values.data_ptr()  # not built again


def test_compact_layer_decides_by_rule_and_never_samples_the_expansion(monkeypatch):
    """A compact layer's buckets are decided at their first call (one route each): the stored form up to
    its token limit, the dense expansion above; the expansion never runs where the stored form serves."""
    torch.manual_seed(7)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.8).compact()
    assert layer.stored_format == "slots"
    form = layer._stored_form()
    expansions = []
    original = type(form).to_dense
    monkeypatch.setattr(type(form), "to_dense", lambda self: expansions.append(1) or original(self))
    st.clear_tuning()
    with torch.no_grad():
        limit = rule.COMPACT_STORED_MAX_TOKENS["slots"]
        below = (1, 16, limit // 2)
        for _ in range(6):
            for n in below:
                layer(torch.randn(n, 128).bfloat16())
        assert not expansions
        assert all(layer._derived.decided.get(b) for b in below)
        assert {layer.routes[b] for b in below} == {"slots"}
        layer(torch.randn(limit, 128).bfloat16())
        assert not expansions and layer.routes[limit] == "slots"
        layer(torch.randn(limit + 1, 128).bfloat16())
    assert expansions and layer.routes[2 * limit] == "expand"


def test_compact_layer_route_is_its_rule_whatever_the_table_holds():
    """A compact layer's route is its rule's alone: a decision in the tuning table (a cache file written with
    other limits, another version) does not override it."""
    torch.manual_seed(7)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.8).compact()
    limit = rule.COMPACT_STORED_MAX_TOKENS["slots"]  # a power of 2: its own bucket
    tuning.tuner("linear").decide(layer._tuning_key(limit), "expand")
    with torch.no_grad():
        layer(torch.randn(limit, 128).bfloat16())
    assert layer.routes[limit] == layer._rule(limit) == "slots" and layer.memory()["peak_transient"] == 0


def test_capture_runs_a_held_searched_24_route(monkeypatch):
    """A bucket prepare() decided as "2:4#<algorithm>" runs the held 2:4 form inside a CUDA graph capture (the
    route names the algorithm; the form is held under "2:4"), not the held-forms fallback."""
    import types

    torch.manual_seed(9)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 48).bfloat16(), scheme="2:4")
    table = tuning.tuner("linear")
    table.decide(layer._tuning_key(16), "dense")
    table.decide(layer._tuning_key(512), "2:4#7")
    with torch.no_grad():
        layer(torch.randn(16, 64).bfloat16())
        layer._form("2:4", torch.device("cpu"))
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    capturing_x = types.SimpleNamespace(shape=(300, 64), is_cuda=True, device=torch.device("cpu"))
    assert layer._choose(capturing_x, 512) == ("2:4#7", None)
    del layer._derived.forms["2:4"]  # not held: no build inside a capture, the held dense form runs
    assert layer._choose(capturing_x, 512)[0] == "dense"


def test_compact_state_dict_round_trips_and_is_checked():
    torch.manual_seed(6)
    src = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.8).compact()
    sd = src.state_dict()
    assert set(sd) == {"bias", "stored_offsets", "stored_entries", "stored_summary"}
    dst = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.3)  # a training layer
    dst.load_state_dict(sd)
    assert dst.stored_format == "slots"
    x = torch.randn(9, 128).bfloat16()
    with torch.no_grad():
        torch.testing.assert_close(dst(x), src(x))
    bad = dict(sd)
    entries = sd["stored_entries"].clone()
    entries[0] = (entries[0] & ~0xFFFF) | 2000  # a slot past 1023
    bad["stored_entries"] = entries
    fresh = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.3)
    with pytest.raises(ValueError, match="entries"):
        fresh.load_state_dict(bad)
    with pytest.raises(RuntimeError, match="compact"):
        src.load_state_dict(st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.5)
                            .state_dict())


def test_compact_24_state_dict_rejects_undefined_metadata():
    torch.manual_seed(7)
    src = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32).bfloat16(), scheme="2:4").compact()
    sd = dict(src.state_dict())
    meta = sd["stored_meta"].clone()
    meta.view(-1)[0] = 0x55555555  # idx0 == idx1: undefined for mma.sp
    sd["stored_meta"] = meta
    with pytest.raises(ValueError, match="meta"):
        st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32).bfloat16(), scheme="2:4").load_state_dict(sd)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if CUDA_READY else []))
def test_layer_converted_with_to_dtype_trains_and_infers_in_the_new_dtype(device):
    # the README tour's `layer.to(device, dtype)`: the ops' input check reads the values' dtype after .to()
    torch.manual_seed(0)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32), sparsity=0.75, activation="relu").to(device, torch.float64)
    x = torch.randn(5, 64, device=device, dtype=torch.float64, requires_grad=True)
    expected = F.relu(x @ layer.to_dense().detach().t() + layer.bias)
    y = layer(x)
    torch.testing.assert_close(y, expected)
    y.sum().backward()
    assert x.grad is not None and layer.values.grad is not None and layer.values.grad.dtype == torch.float64
    with torch.no_grad():
        torch.testing.assert_close(layer(x.detach()), expected.detach())
    layer.compact()
    with torch.no_grad():
        torch.testing.assert_close(layer(x.detach()), expected.detach())
    with pytest.raises(TypeError, match="float64"):
        layer(x.detach().float())


def test_compact_layer_does_not_train():
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(16, 8), sparsity=0.5).compact()
    with pytest.raises(RuntimeError, match="compact"):
        layer(torch.randn(2, 16, requires_grad=True))
    with pytest.raises(RuntimeError, match="compact"):
        layer.weight


# --- the op torch.compile sees ------------------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["auto", "csr", "dense", "bitmap", "slots", "csr16"])
def test_compiles_fullgraph_without_breaks_and_matches_eager(fmt):
    torch.manual_seed(8)
    dtype = torch.float32 if fmt in ("auto", "csr", "dense") else torch.bfloat16
    model = torch.nn.Sequential(
        st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 48).to(dtype), sparsity=0.8, activation="gelu", format=fmt),
        st.nn.SparseLinear.from_dense(torch.nn.Linear(48, 32).to(dtype), sparsity=0.5, format=fmt))
    x = torch.randn(5, 64).to(dtype)
    explain = torch._dynamo.explain(model)(x)
    assert explain.graph_count == 1 and explain.graph_break_count == 0
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for n in (5, 1, 33):
            xx = torch.randn(n, 64).to(dtype)
            torch.testing.assert_close(compiled(xx), model(xx))


def test_compiled_training_matches_eager_gradients():
    torch.manual_seed(9)
    model = torch.nn.Sequential(st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 48), sparsity=0.8, activation="relu"),
                                st.nn.SparseLinear.from_dense(torch.nn.Linear(48, 16), sparsity=0.5))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    x = torch.randn(6, 64)
    grads = []
    for m in (model, compiled):
        for p in model.parameters():
            p.grad = None
        xx = x.clone().requires_grad_()
        m(xx).square().sum().backward()
        grads.append([p.grad.clone() for p in model.parameters()] + [xx.grad.clone()])
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b)


def test_dynamic_token_counts_compile_once():
    torch.manual_seed(10)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(32, 16), sparsity=0.7)
    counter = CompileCounter()
    compiled = torch.compile(layer, backend=counter, dynamic=True, fullgraph=True)
    with torch.no_grad():
        for n in (3, 7, 1, 40, 129, 2, 600):
            x = torch.randn(n, 32)
            torch.testing.assert_close(compiled(x), layer(x))
    assert counter.frame_count <= 2  # one graph for every N > 1 (and at most one for N = 1)


def test_compact_model_compiles():
    torch.manual_seed(11)
    model = st.nn.compact(torch.nn.Sequential(
        st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 48).bfloat16(), sparsity=0.8),
        st.nn.SparseLinear.from_dense(torch.nn.Linear(48, 16).bfloat16(), scheme="2:4")))
    compiled = torch.compile(model, fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        for n in (1, 9, 300):
            x = torch.randn(n, 64).bfloat16()
            torch.testing.assert_close(compiled(x), model(x))


# --- copies and state -----------------------------------------------------------------------------

def test_copies_get_their_own_handle_and_no_forms(tmp_path):
    torch.manual_seed(12)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(8, 16), sparsity=0.5, activation="relu")
    x = torch.randn(3, 8)
    with torch.no_grad():
        y = layer(x)
    torch.save(layer, tmp_path / "layer.pt")
    for other in (torch.load(tmp_path / "layer.pt", weights_only=False), copy.deepcopy(layer)):
        assert other.routes == {} and other._handle != layer._handle
        assert lin._layer(other._handle) is other and lin._layer(layer._handle) is layer
        with torch.no_grad():
            torch.testing.assert_close(other(x), y)


def test_new_values_reach_the_forms_and_a_new_pattern_starts_over():
    torch.manual_seed(13)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(24, 12, dtype=torch.float64), sparsity=0.3,
                                          activation="gelu")  # 70% kept: dense by rule
    x = torch.randn(16, 24, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _ref(layer, x).to(torch.float64))
        layer.values.mul_(-2.0)  # an optimizer step in place: the dense form follows
        torch.testing.assert_close(layer(x), _ref(layer, x).to(torch.float64))
    assert "dense" in layer.memory()
    other = st.nn.SparseLinear.from_dense(torch.nn.Linear(24, 12, dtype=torch.float64), sparsity=0.9)
    layer.load_state_dict(other.state_dict())
    assert layer.routes == {} and "dense" not in layer.memory()
    with torch.no_grad():
        torch.testing.assert_close(layer(x), _ref(layer, x).to(torch.float64))
    assert set(layer.state_dict()) == {"values", "bias", "crow_indices", "col_indices"}


@pytest.mark.parametrize("fmt", ["dense", "2:4", "csr", "bitmap"])
def test_forced_formats_train_like_csr(fmt):
    """Gradients through each form equal the CSR route's (values are the Parameter in every form)."""
    torch.manual_seed(14)
    base = st.nn.SparseLinear.from_dense(torch.nn.Linear(20, 12, dtype=torch.float64), sparsity=0.6,
                                         activation="tanh", format="csr")
    layer = st.nn.SparseLinear(20, 12, base.crow_indices, base.col_indices, base.values.detach().clone(),
                               base.bias.detach().clone(), activation="tanh", format=fmt)
    x = torch.randn(2, 9, 20, dtype=torch.float64)
    for model in (base, layer):
        model(x).square().sum().backward()
    torch.testing.assert_close(layer.values.grad, base.values.grad)
    torch.testing.assert_close(layer.bias.grad, base.bias.grad)
    xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
    torch.testing.assert_close(torch.autograd.grad(layer(xa).sum(), xa)[0], torch.autograd.grad(base(xb).sum(), xb)[0])
    assert set(layer.routes.values()) == {fmt} and not st.tuning_table(kind="linear")  # forced: nothing tuned
    with torch.no_grad():
        layer.values.mul_(3.0)
        base.values.mul_(3.0)
        torch.testing.assert_close(layer(x), base(x))  # the form repacked the new values


def test_format_errors():
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(8, 4), sparsity=0.5)
    with pytest.raises(ValueError, match="format"):
        st.nn.SparseLinear(8, 4, layer.crow_indices, layer.col_indices, layer.values.detach(), format="bsr")
    with pytest.raises(TypeError, match="dtype"):
        layer(torch.randn(2, 8, dtype=torch.float64))
    with pytest.raises(ValueError, match="in_features"):
        layer(torch.randn(2, 9))
    with pytest.raises(ValueError, match="format"):
        layer.compact("bitmap")


# --- CUDA: what the GPU runs --------------------------------------------------------------------------

@needs_mma
@pytest.mark.parametrize("scheme", ["2:4", "global"])
def test_cuda_rule_forms_match_and_stay_bounded(scheme):
    torch.manual_seed(20)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(512, 1024, device="cuda", dtype=torch.bfloat16),
                                          sparsity=0.5 if scheme == "2:4" else 0.9, scheme=scheme, activation="silu")
    for n in (1, 3, 8, 16, 40, 100, 300, 1100):
        x = torch.randn(n, 512, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            assert _rel(layer(x), _ref(layer, x)) < 2e-2, n
    expected = {"2:4": {1: "2:4 decode", 16: "2:4 decode"}, "global": {1: "csr16", 8: "slots"}}[scheme]
    assert {b: layer.routes[b] for b in expected} == expected or any(
        e["decided"] for e in st.tuning_table(kind="linear"))


@needs_mma
@pytest.mark.parametrize("scheme, stored", [("2:4", "2:4 decode"), ("global", "slots")])
def test_cuda_compact_memory_and_results(scheme, stored):
    torch.manual_seed(21)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(1024, 2048, device="cuda", dtype=torch.bfloat16),
                                          sparsity=0.5 if scheme == "2:4" else 0.9, scheme=scheme)
    w = layer.to_dense().detach().clone()
    layer.compact()
    assert layer.stored_format == stored
    mem = layer.memory()
    assert mem["stored"] <= (0.57 if scheme == "2:4" else 0.22) * mem["dense_weight"]
    for n in (1, 16, 64, 65, 2048):
        x = torch.randn(n, 1024, device="cuda", dtype=torch.bfloat16)
        with torch.no_grad():
            assert _rel(layer(x), _ref(layer, x, w)) < 2e-2, n


@needs_cuda
def test_cuda_graph_capture_replays_the_decided_form_and_builds_nothing():
    torch.manual_seed(22)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(512, 256, device="cuda", dtype=torch.bfloat16),
                                          sparsity=0.9)
    layer.prepare([16])
    x = torch.randn(16, 512, device="cuda", dtype=torch.bfloat16)
    x32 = torch.randn(32, 512, device="cuda", dtype=torch.bfloat16)
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
            out32 = layer(x32)  # undecided: a held form, nothing built in the capture
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, eager)
    assert set(layer._derived.forms) == held and layer.routes[32] in held
    assert _rel(out32, _ref(layer, x32)) < 2e-2


@needs_mma
def test_cuda_reduce_overhead_runs_the_chosen_form():
    torch.manual_seed(23)
    model = torch.nn.Sequential(
        st.nn.SparseLinear.from_dense(torch.nn.Linear(512, 1024, device="cuda", dtype=torch.bfloat16), scheme="2:4"),
        st.nn.SparseLinear.from_dense(torch.nn.Linear(1024, 512, device="cuda", dtype=torch.bfloat16), sparsity=0.9))
    st.nn.prepare(model, [1, 16], progress=False)
    compiled = torch.compile(model, mode="reduce-overhead", fullgraph=True)
    with torch.no_grad():
        for _ in range(3):
            for n in (1, 16):
                x = torch.randn(n, 512, device="cuda", dtype=torch.bfloat16)
                torch.testing.assert_close(compiled(x).float(), model(x).float(), rtol=2e-2, atol=2e-2)
    for layer in model:  # each ran (and kept) what prepare() decided
        for bucket in (1, 16):
            decided = tuning.tuner("linear").decided(layer._tuning_key(bucket))
            assert layer.routes[bucket] == decided.partition("#")[0]


def test_inference_forms_hold_no_refresh_maps_until_the_values_change():
    """An auto layer builds its slot/bitmap/2:4-decode forms without the maps from the CSR's order (8 bytes per
    entry for slots); once its values change (it trains), forms are rebuilt with them and follow every step."""
    torch.manual_seed(15)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.8)
    tuning.tuner("linear").decide(layer._tuning_key(8), "slots")
    x = torch.randn(7, 128).bfloat16()
    with torch.no_grad():
        assert _rel(layer(x), _ref(layer, x)) < 2e-2
    entries = layer.nnz
    assert layer.memory()["slots"] == 4 * (layer._derived.forms["slots"].weight.offsets.numel() + entries)
    with torch.no_grad():
        layer.values.mul_(-3.0)  # an optimizer step
        assert _rel(layer(x), _ref(layer, x)) < 2e-2
        assert layer._derived.forms["slots"].refreshable
        layer.values.mul_(0.5)
        assert _rel(layer(x), _ref(layer, x)) < 2e-2  # repacked in place this time
    w24 = st.nn.SparseLinear.from_dense(torch.nn.Linear(64, 32).bfloat16(), scheme="2:4")
    tuning.tuner("linear").decide(w24._tuning_key(1), "2:4 decode")
    x1 = torch.randn(1, 64).bfloat16()
    with torch.no_grad():
        assert _rel(w24(x1), _ref(w24, x1)) < 2e-2
        decode = w24._derived.forms["2:4 decode"]
        assert decode.refreshable and decode.weight.split is None  # packed from its pairs: repacked, no split
        w24.values.mul_(2.0)
        assert _rel(w24(x1), _ref(w24, x1)) < 2e-2
        assert w24._derived.forms["2:4 decode"] is decode and decode.weight.split is None  # repacked in place
    w24.compact()
    assert w24._stored_form().weight.pair_col is None  # the CSR's columns go with the CSR


def test_sparse_linear_op_opcheck_and_gradcheck():
    """The ops torch.compile sees: schema, fake kernel and registered autograd (opcheck), and float64 gradients
    of x and of the CSR values (gradcheck) through the training op; the inference op gives the layer's output."""
    torch.manual_seed(16)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(12, 8, dtype=torch.float64), sparsity=0.5,
                                          activation="relu")
    x = torch.randn(5, 12, dtype=torch.float64, requires_grad=True)
    op = torch.ops.sparsetorch.sparse_linear
    torch.library.opcheck(op, (x, layer.values, layer._handle))
    assert torch.autograd.gradcheck(lambda a: op(a, layer.values, layer._handle), (x,))
    # values other than the layer's own (gradcheck perturbs through .data, which no version counter sees, so
    # a copy): the op computes on them
    v = layer.values.detach().clone().requires_grad_()
    assert torch.autograd.gradcheck(lambda a, w: op(a, w, layer._handle), (x, v))
    inference = torch.ops.sparsetorch.sparse_linear_inference
    torch.library.opcheck(inference, (x.detach(), layer._handle), test_utils=("test_schema", "test_faketensor"))
    with torch.no_grad():
        ref = torch.relu(x.detach() @ layer.to_dense().T + layer.bias)
        assert torch.allclose(inference(x.detach(), layer._handle), ref)
    with pytest.raises(RuntimeError, match="no live SparseLinear"):
        inference(x.detach(), 10**9)
    for bad in (x.detach()[:, :5], x.detach().float(), x.detach().unsqueeze(0)):  # the layer's forward checks these
        for call in (lambda a: inference(a, layer._handle), lambda a: op(a, layer.values, layer._handle)):
            with pytest.raises(ValueError, match=r"x: expected \(N, 12\) of torch.float64"):
                call(bad)


def _calls_to_repay(form, pattern):
    """The call at which the default policy builds ``form``: the first whose summed gains reach its cost."""
    cost, gain = rule.build_cost(form, pattern), rule.gain(form, pattern)
    paid, calls = 0.0, 0
    while True:
        calls += 1
        paid += gain
        if not paid < cost:
            return calls


@pytest.mark.repaid_builds
def test_a_form_is_built_once_the_calls_that_want_it_repay_its_build():
    """The default policy: buckets decided for the slot layout run dense (right results, nothing built)
    until what their calls would have gained reaches the layout's build cost (one account per form, over
    both buckets); the call that repays it builds it, and the bucket binds it."""
    torch.manual_seed(21)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.7)
    calls = _calls_to_repay("slots", layer._pattern())
    assert calls > 3  # the model makes a 30%-dense slot layout wait (rule.py: ~300 calls)
    for bucket in (4, 8):
        tuning.tuner("linear").decide(layer._tuning_key(bucket), "slots")
    xs = [torch.randn(7, 128).bfloat16(), torch.randn(3, 128).bfloat16()]
    with torch.no_grad():
        for i in range(calls - 1):
            x = xs[i % 2]
            assert _rel(layer(x), _ref(layer, x)) < 2e-2
            assert "slots" not in layer._derived.forms and layer.routes[lin._bucket(x.shape[0])] == "dense"
        x = xs[(calls - 1) % 2]
        y = layer(x)
        assert "slots" in layer._derived.forms and layer.routes[lin._bucket(x.shape[0])] == "slots"
        assert _rel(y, _ref(layer, x)) < 2e-2
        assert _rel(layer(x), _ref(layer, x)) < 2e-2 and lin._bucket(x.shape[0]) in layer._derived.runners


@pytest.mark.repaid_builds
def test_forms_built_at_once_where_the_policy_does_not_apply():
    """build_when_repaid=False, the inference op (what compiled code and CUDA graphs call), and a form with
    no cost model (bitmap) each build the chosen form at its first call."""
    torch.manual_seed(22)
    x = torch.randn(7, 128).bfloat16()
    for case in ("off", "op", "no model"):
        st.clear_tuning()
        layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=0.7)
        form = "bitmap" if case == "no model" else "slots"
        tuning.tuner("linear").decide(layer._tuning_key(8), form)
        if case == "off":
            layer.build_when_repaid = False
        with torch.no_grad():
            y = torch.ops.sparsetorch.sparse_linear_inference(x, layer._handle) if case == "op" else layer(x)
        assert form in layer._derived.forms and layer.routes[8] == form, case
        assert _rel(y, _ref(layer, x)) < 2e-2


def test_steady_fast_path_runs_only_what_the_layer_now_holds():
    """Once a token count is bound, the fast path runs it only while x and the state tensors are what it was
    bound for: another dtype raises, in-place and .data changes of values or indices (even set behind the
    module's back), x requiring grad, a 3-D x and a compact layer's changed stored tensors all give what the
    layer now computes."""
    torch.manual_seed(23)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(32, 16), sparsity=0.6)
    x = torch.randn(4, 32)
    with torch.no_grad():
        for _ in range(3):
            layer(x)
        assert 4 in layer._derived.runners and layer._derived.check is not None
        with pytest.raises(TypeError, match="x: expected dtype"):
            layer(x.double())
        layer.values.mul_(2.0)
        assert _rel(layer(x), _ref(layer, x)) < 1e-5
        layer.values.data = layer.values.data * -1.0  # a new address, no version bump
        assert _rel(layer(x), _ref(layer, x)) < 1e-5
        col = layer.col_indices.clone()
        k = int(layer.crow_indices[1])
        col[:k] = torch.arange(32 - k, 32)  # row 0's entries moved to the last k columns (sorted, unique)
        assert k > 0 and not torch.equal(col, layer.col_indices)
        layer._buffers["col_indices"] = col  # replaced without __setattr__
        assert _rel(layer(x), _ref(layer, x)) < 1e-5
        assert _rel(layer(x.reshape(2, 2, 32)).reshape(4, 16), _ref(layer, x)) < 1e-5
    xg = x.clone().requires_grad_(True)
    y = layer(xg)
    assert y.grad_fn is not None
    y.sum().backward()
    assert xg.grad is not None and layer.values.grad is not None
    with torch.no_grad():
        compact = copy.deepcopy(layer).compact()
        for _ in range(3):
            compact(x)
        before = compact(x).clone()
        stored = next(iter(compact._stored_buffers().values()))
        if stored.is_floating_point():
            stored.mul_(2.0)
        else:
            vals = [t for t in compact._stored_buffers().values() if t.is_floating_point()][0]
            vals.mul_(2.0)
        assert _rel(compact(x), 2 * before - layer.bias) < 1e-5  # the weight doubled, not the bias


def _slots_decided_layer(seed=24, sparsity=0.7):
    torch.manual_seed(seed)
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=sparsity)
    tuning.tuner("linear").decide(layer._tuning_key(8), "slots")
    return layer


@pytest.mark.repaid_builds
def test_renting_survives_grad_calls_compiled_calls_and_prepare(monkeypatch):
    """A renting bucket's bound call gives way: to a grad-recording call of a frozen layer (which builds the
    form, as the training path does; the no-grad calls after it run that form, no recursion), to the
    inference op (it builds at once, as compiled code must), to build_when_repaid turned off on the class,
    and to prepare(), which builds what it decides, for every layer of a shared signature too."""
    x = torch.randn(7, 128).bfloat16()
    frozen = _slots_decided_layer().requires_grad_(False)
    with torch.no_grad():
        frozen(x)
        assert frozen._derived.renting == {8: "slots"} and 8 in frozen._derived.runners
    frozen(x.clone().requires_grad_(True)).sum().backward()
    assert "slots" in frozen._derived.forms
    with torch.no_grad():
        for _ in range(5):
            assert _rel(frozen(x), _ref(frozen, x)) < 2e-2
    assert frozen.routes[8] == "slots" and not frozen._derived.renting

    st.clear_tuning()
    layer = _slots_decided_layer()
    with torch.no_grad():
        layer(x)
        assert "slots" not in layer._derived.forms
        y = torch.ops.sparsetorch.sparse_linear_inference(x, layer._handle)
        assert "slots" in layer._derived.forms and _rel(y, _ref(layer, x)) < 2e-2
        assert _rel(layer(x), _ref(layer, x)) < 2e-2 and layer.routes[8] == "slots"  # eager takes the held form

    st.clear_tuning()
    layer = _slots_decided_layer()
    with torch.no_grad():
        layer(x)
        assert layer._derived.renting == {8: "slots"}
        with monkeypatch.context() as patch:
            patch.setattr(lin.SparseLinear, "build_when_repaid", False)  # on the class: no __setattr__ runs
            assert _rel(layer(x), _ref(layer, x)) < 2e-2
            assert "slots" in layer._derived.forms and layer.routes[8] == "slots"

    st.clear_tuning()
    torch.manual_seed(25)
    base = torch.nn.Linear(128, 64).bfloat16()
    model = torch.nn.Sequential(*[st.nn.SparseLinear.from_dense(base, sparsity=0.7) for _ in range(3)])
    tuning.tuner("linear").decide(model[0]._tuning_key(8), "slots")  # one signature: every layer's decision
    with torch.no_grad():
        for m in model:
            m(x)
        assert all(m._derived.renting == {8: "slots"} and "slots" not in m._derived.forms for m in model)
        st.clear_tuning()
        got = st.nn.prepare(model, [8], progress=False)
        assert len({tuple(v.items()) for v in got.values()}) == 1  # one signature, one decision
        chosen = got["0"][8]
        for m in model:
            assert chosen in m._derived.forms and not m._derived.renting and m.routes[8] == chosen
            assert _rel(m(x), _ref(m, x)) < 2e-2 and m.routes[8] == chosen


def test_a_used_layer_is_freed_without_the_cycle_collector():
    """Neither the fast path's check nor a renting bucket's bound call holds the layer: deleting the last
    reference frees it (and its forms) at once."""
    import gc
    import weakref

    x = torch.randn(7, 128).bfloat16()
    for repaid in (False, True):
        layer = _slots_decided_layer()
        layer.build_when_repaid = repaid
        with torch.no_grad():
            for _ in range(3):
                layer(x)
        assert layer._derived.check is not None and (repaid == ("slots" not in layer._derived.forms))
        ref = weakref.ref(layer)
        gc.disable()
        try:
            del layer
            assert ref() is None, repaid
        finally:
            gc.enable()


@pytest.mark.repaid_builds
def test_forms_that_repay_their_build_quickly_are_built_at_once():
    """Only a form whose build needs more than REPAY_AT_ONCE_CALLS calls' gain rents: CSR16 at 90% (a few
    calls) is built by the first call that chooses it, the slot layout at 70% (hundreds) is not."""
    x = torch.randn(7, 128).bfloat16()
    for sparsity, form, rents in ((0.9, "csr16", False), (0.9, "slots", False), (0.7, "slots", True)):
        st.clear_tuning()
        torch.manual_seed(26)
        layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(128, 64).bfloat16(), sparsity=sparsity)
        assert rule.rents(form, layer._pattern()) == rents
        tuning.tuner("linear").decide(layer._tuning_key(8), form)
        with torch.no_grad():
            assert _rel(layer(x), _ref(layer, x)) < 2e-2
        assert (form in layer._derived.forms) != rents and layer.routes[8] == ("dense" if rents else form)


@pytest.mark.repaid_builds
@needs_mma
def test_cuda_renting_and_a_graph_captured_while_renting():
    """On the GPU: a slot decision at 70% sparsity rents (dense calls, right results); a CUDA graph captured while
    the bucket rents holds the dense call, and the dense weight stays held after later eager calls build the
    slot layout (the graph reads it at every replay), so replays stay right."""
    torch.manual_seed(27)
    dev = torch.device("cuda")
    layer = st.nn.SparseLinear.from_dense(torch.nn.Linear(256, 512).to(dev, torch.bfloat16), sparsity=0.7)
    assert rule.rents("slots", layer._pattern())
    tuning.tuner("linear").decide(layer._tuning_key(8), "slots")
    x = torch.randn(7, 256, device=dev, dtype=torch.bfloat16)
    calls = _calls_to_repay("slots", layer._pattern())
    with torch.no_grad():
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(3):
                layer(x)  # the warm-up a capture needs: the bucket rents, its dense call is bound
        torch.cuda.current_stream().wait_stream(side)
        assert layer._derived.renting == {8: "slots"} and "slots" not in layer._derived.forms
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y_graph = layer(x)
        assert "dense" in layer._derived.pinned
        for _ in range(calls):
            assert _rel(layer(x), _ref(layer, x)) < 2e-2
        torch.cuda.synchronize()
        assert "slots" in layer._derived.forms and layer.routes[8] == "slots"
        assert "dense" in layer._derived.forms  # pinned: the graph's weight
        torch.cuda.empty_cache()
        junk = [torch.randn(512, 256, device=dev, dtype=torch.bfloat16) for _ in range(8)]  # reuse freed memory
        graph.replay()
        torch.cuda.synchronize()
        assert _rel(y_graph, _ref(layer, x)) < 2e-2
        del junk
