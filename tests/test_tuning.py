"""The tuning table of "auto" (csrc/common/spmm_tuning.{h,cpp}, csrc/cuda/spmm_autotune.cu,
sparsetorch/tuning.py, docs/tuning.md).

The bookkeeping -- signatures, the rotation over candidates, pruning, the decision, the LRU bound, export
and import, the cache file -- is pure C++ and is tested here on the CPU through the test hooks
``torch.ops.sparsetorch_testing.spmm_tuning_next`` / ``spmm_tuning_record`` (what the CUDA op does with real
events). The CUDA tests (skipped without a GPU) check that online tuning never changes a result and that it ends decided.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import sparsetorch as st
from sparsetorch import tuning
from sparsetorch._ops import ops

from _helpers import assert_matches, random_csr, rounded
from conftest import CUDA_READY, python_env

needs_cuda = pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")

FIELDS = tuning.SIGNATURE_FIELDS
F = len(FIELDS)


@pytest.fixture(autouse=True)
def clean_table():
    """Every test runs with autotune on, the default bound and no cache file (and an empty table, as every
    test starts: tests/conftest.py)."""
    previous = st.set_autotune(True)
    yield
    st.set_autotune(previous)
    ops.spmm_tuning_capacity(4096)
    st.set_tuning_cache(None)


def sig(i=0, n=32):
    """A synthetic signature (fields only need the right count)."""
    return [6, n, 0, 0, 0, 10, 10, 14, 4, 0, 0, 0, i]


def nxt(signature, candidates, device="test-gpu", tune=True):
    return tuple(torch.ops.sparsetorch_testing.spmm_tuning_next(device, signature, candidates, tune))


def record(signature, route, device_ms, host_ms=0.0, work=1.0, device="test-gpu", outcome="ok"):
    torch.ops.sparsetorch_testing.spmm_tuning_record(device, signature, route, device_ms, host_ms, work, outcome)


def entry(signature, device="test-gpu"):
    for e in st.tuning_table():
        if e["device"] == device and [e["signature"][f] if f != "dtype" else 6 for f in FIELDS] == signature:
            return e
    return None


def from_lengths(lengths, k, seed=0, dtype=torch.float32, device="cpu"):
    rng = np.random.default_rng(seed)
    lengths = np.minimum(np.asarray(lengths, dtype=np.int64), k)
    rows = np.repeat(np.arange(len(lengths)), lengths)
    cols = np.concatenate([rng.choice(k, size=n, replace=False) for n in lengths]) if rows.size else rows
    a = sp.csr_matrix((rng.standard_normal(rows.size), (rows, cols)), shape=(len(lengths), k))
    return st.from_scipy(a, device=device, dtype=dtype)


def signature_of(A, B):
    a = st.as_csr(A)
    return ops.spmm_tuning_signature(a.crow_indices, a.col_indices, a.values.to(B.dtype), B)


def cuda_route(A, B):
    """The route the CUDA op would take (as_cuda=True), table included, on CPU tensors."""
    a = st.as_csr(A)
    return ops.spmm_route(a.crow_indices, a.col_indices, a.values.to(B.dtype), B, "auto", True, True)


# --- signatures ------------------------------------------------------------------------------------

def test_signature_fields_and_buckets():
    # 300 rows: 200 of 3 entries, 90 empty, 9 of 100, one of 5000 (k = 6000)
    lengths = [3] * 200 + [0] * 90 + [100] * 9 + [5000]
    A = from_lengths(lengths, 6000)
    B = torch.randn(6000, 48)
    device, fields = signature_of(A, B)
    s = dict(zip(FIELDS, fields))
    entries = sum(lengths)  # 6500
    assert device == "cpu"
    assert s["dtype"] == 6 and s["n"] == 48 and s["batch_flags"] == 0 and s["batch_bucket"] == 0
    assert s["b_layout"] == 0
    assert s["rows_bucket"] == 9          # 256 <= 300 < 512
    assert s["cols_bucket"] == 13         # 4096 <= 6000 < 8192
    assert s["entries_bucket"] == entries.bit_length()
    assert s["longest_row_bin"] == 1 + 12  # 4096 <= 5000 < 8192
    assert s["share_64"] == 3             # (900 + 5000) / 6500 >= 50%
    assert s["share_256"] == 3            # 5000 / 6500
    assert s["share_4096"] == 3
    assert s["empty_share"] == 2          # 90 / 300 = 30%
    # B's layout: transposed storage, unaligned rows
    assert dict(zip(FIELDS, signature_of(A, torch.randn(48, 6000).t())[1]))["b_layout"] == 2
    assert dict(zip(FIELDS, signature_of(A, torch.randn(6000, 49)[:, :48])[1]))["b_layout"] == 1
    # the public face names the dtype
    assert st.tuning_signature(A, B)["dtype"] == "float32" and st.tuning_signature(A, B)["device"] == "cpu"
    # an empty matrix
    E = st.from_scipy(sp.csr_matrix((10, 20)))
    e = dict(zip(FIELDS, signature_of(E, torch.randn(20, 4))[1]))
    assert e["entries_bucket"] == 0 and e["longest_row_bin"] == 0 and e["empty_share"] == 3


def test_similar_matrices_share_a_signature_and_others_do_not():
    rng = np.random.default_rng(0)
    sigs = set()
    for seed in range(8):  # fresh power-law-ish graphs of about 5000 nodes
        r = np.random.default_rng(seed)
        lengths = np.minimum(r.zipf(2.2, 5000), 40)
        A = from_lengths(lengths, 5000, seed=seed)
        sigs.add(tuple(signature_of(A, torch.randn(5000, 64))[1]))
    assert len(sigs) <= 2  # (a bucket boundary may split a stream in two, never more here)
    A = st.from_scipy(random_csr(rng, 300, 200, 0.05), dtype=torch.float32)
    base = signature_of(A, torch.randn(200, 16))
    assert signature_of(A, torch.randn(200, 17)) != base                        # width
    assert signature_of(A, torch.randn(200, 16, dtype=torch.float64)) != base   # dtype
    assert signature_of(A, torch.randn(3, 200, 16)) != base                     # batched B
    assert signature_of(A, torch.randn(200, 16)) == base


# --- the rotation, pruning and decision ----------------------------------------------------------------

ROUTES = ["native", "balanced", "split", "cusparse"]


def test_rotation_hands_out_each_candidate_in_turn_rules_first():
    s = sig(1)
    # warm-up round, then one counted sample each: every candidate in rotation order, the rules' first, the
    # order turned by one every round (signatures called at fixed places in a step sample each route at each)
    got = [nxt(s, ROUTES) for _ in range(8)]
    assert got == [(r, True) for r in ROUTES + ROUTES[1:] + ROUTES[:1]]
    # every needed sample is in flight: the best so far (none yet: the rules' route), no sample
    assert nxt(s, ROUTES) == ("native", False)
    e = entry(s)
    assert not e["decided"] and e["route"] is None
    assert {r: c["issued"] for r, c in e["candidates"].items()} == {r: 2 for r in ROUTES}


def test_warmup_discarded_pruning_and_decision():
    s = sig(2)
    for _ in range(8):
        nxt(s, ROUTES)
    for route in ROUTES:  # warm-up samples: cold code, discarded whatever they say
        record(s, route, 50.0)
    assert all(c["costs_ms"] == [] for c in entry(s)["candidates"].values())
    costs = {"native": 1.0, "balanced": 0.9, "split": 2.5, "cusparse": 1.6}
    for route, c in costs.items():
        record(s, route, c)
    e = entry(s)
    assert e["candidates"]["split"]["dropped"]              # 2.5 > 2 x 0.9
    assert not e["candidates"]["cusparse"]["dropped"]       # 1.6 <= 1.8
    # only the survivors are handed out now, two more samples each
    got = [nxt(s, ROUTES) for _ in range(6)]
    assert sorted(r for r, sample in got if sample) == sorted(["native", "balanced", "cusparse"] * 2)
    assert nxt(s, ROUTES) == ("balanced", False)  # waiting: the best so far
    for route, c in [("native", 0.8), ("balanced", 0.9), ("cusparse", 1.5), ("native", 0.85), ("balanced", 1.0)]:
        record(s, route, c)
    assert not entry(s)["decided"]
    record(s, "cusparse", 1.4)
    e = entry(s)
    assert e["decided"] and e["route"] == "native"  # minimum 0.8 against balanced's 0.9
    # decided: every later call takes it, no sample, and the table bumps its generation once
    assert nxt(s, ROUTES) == ("native", False)
    assert nxt(s, ["native", "balanced"]) == ("native", False)
    # a matrix of this signature that cannot take the decided route gets its rules' route
    assert nxt(s, ["split", "balanced"]) == ("split", False)


def test_rules_route_is_never_pruned_and_minima_decide():
    """One counted sample of the rules' route carries a one-time cost (a kernel loaded on first use): it is
    not pruned on it, and the smallest samples decide (the medians would pick balanced)."""
    s = sig(8)
    for _ in range(4):
        nxt(s, ["native", "balanced"])
    for r in ("native", "balanced"):
        record(s, r, 9.0)  # warm-up
    record(s, "native", 5.0)
    record(s, "balanced", 1.0)
    e = entry(s)
    assert not e["candidates"]["native"]["dropped"] and not e["decided"]  # 5.0 > 2 x 1.0, but the rules'
    for _ in range(4):
        nxt(s, ["native", "balanced"])
    for native, balanced in ((0.8, 1.0), (1.1, 0.95)):
        record(s, "native", native)
        record(s, "balanced", balanced)
    e = entry(s)
    assert e["decided"] and e["route"] == "native"  # minimum 0.8 against 0.95 (medians 1.1 and 1.0)


def test_costs_are_normalised_by_work_and_bounded_below_by_host_time():
    s = sig(3)
    for _ in range(4):
        nxt(s, ["native", "balanced"])
    for r in ("native", "balanced"):
        record(s, r, 9.0)  # warm-up
    # native ran on a matrix with twice the work: 2.0 ms there is 1.0 at the reference work (1.0)
    record(s, "balanced", 1.2, work=1.0)
    record(s, "native", 2.0, work=2.0)
    assert entry(s)["candidates"]["native"]["costs_ms"] == [pytest.approx(1.0)]
    # host time bounds the cost: a route quick on the device but slow to launch loses
    s = sig(31)
    for _ in range(8):
        nxt(s, ["native", "balanced"])
    for _ in range(4):
        record(s, "native", 0.5, host_ms=3.0)
        record(s, "balanced", 1.2, host_ms=0.1)
    e = entry(s)
    assert e["decided"] and e["route"] == "balanced"


def test_python_tuner_counts_only_samples_near_the_largest_size():
    """The Python tables (SparseLinear's forms, SpmmPlan's layouts): a signature's calls may differ in size
    (a bucket's token counts), and only samples within SIZE_WINDOW of the largest size seen count; a smaller
    call takes the best so far without a sample. Here "decode" wins at 17 and loses at 32."""
    table = tuning.tuner("linear")
    key = ("test", "size window")
    cost = {17: {"dense": 1.0, "decode": 0.7}, 20: {}, 24: {"dense": 1.0, "decode": 1.2}, 32: {"dense": 1.0, "decode": 1.3}}

    def call(size):
        name, sample = table.choose(key, ["dense", "decode"], "dense", "cpu", size=size)
        if sample is not None:
            table.record(key, name, cost[size][name], size)
        return name, sample is not None

    # warm-up, then one counted each (the tie order turns by one every round)
    assert [call(17) for _ in range(4)] == [("dense", True), ("decode", True), ("decode", True), ("dense", True)]
    assert call(17)[1]  # undecided: more samples at 17
    assert call(32)[1]  # the largest size so far: the samples at 17 no longer count
    e = next(e for e in st.tuning_table(kind="linear") if e["key"] == key)
    assert e["top_size"] == 32 and not e["decided"]
    assert call(20)[1] is False  # below the window: the best so far, no sample
    assert call(24)[1]  # 24 >= 0.75 x 32: counted
    while table.decided(key) is None:
        call(32)
    assert table.decided(key) == "dense"
    e = next(e for e in st.tuning_table(kind="linear") if e["key"] == key)
    assert all(size >= tuning.SIZE_WINDOW * 32 for c in e["candidates"].values() for size in c["sizes"][2:])


def test_python_tuner_prunes_only_on_samples_that_still_count():
    """A candidate dropped by pruning (over 2x the best) at small sizes comes back once the largest size has
    grown past what those samples ran: here dense is 2.5x decode's time at 17 tokens and wins at 32 (the rule
    is decode's: the rule's candidate is never pruned). A candidate that failed stays dropped."""
    table = tuning.tuner("linear")
    key = ("test", "pruned then back")
    cost = {17: {"dense": 1.0, "decode": 0.4, "bad": 0.5}, 32: {"dense": 1.0, "decode": 1.3, "bad": 0.5}}

    def call(size):
        name, sample = table.choose(key, ["dense", "decode", "bad"], "decode", "cpu", size=size)
        if sample is not None:
            if name == "bad":
                table.fail(key, name)
            else:
                table.record(key, name, cost[size][name], size)
        return name, sample is not None

    for _ in range(6):
        call(17)
    e = next(e for e in st.tuning_table(kind="linear") if e["key"] == key)
    assert e["candidates"]["dense"]["dropped"] and e["candidates"]["bad"]["dropped"]
    while table.decided(key) is None:
        call(32)
    assert table.decided(key) == "dense"
    e = next(e for e in st.tuning_table(kind="linear") if e["key"] == key)
    assert not e["candidates"]["dense"]["dropped"] and e["candidates"]["bad"]["dropped"]


def test_python_tuner_of_one_size_decides_as_before():
    """Calls of one size (the default) count every sample: warm-up, one each, pruning at 2x, three each."""
    table = tuning.tuner("plan")
    key = ("test", "one size")
    cost = {"a": 1.0, "b": 0.8, "c": 2.5}
    handed = []
    while table.decided(key) is None and len(handed) < 20:
        name, sample = table.choose(key, list(cost), "a", "cpu")
        assert sample is not None
        handed.append(name)
        table.record(key, name, cost[name])
    # a round of warm-ups, a round of one counted each (the tie order turned by one), c pruned, two more each
    assert handed == ["a", "b", "c", "b", "c", "a"] + ["a", "b"] * 2
    assert table.decided(key) == "b"


def test_python_tuner_never_prunes_the_rule_and_decides_on_minima():
    """One sample can carry a one-time cost (measured on an H100: the first dense call of a 46-token bucket
    took 2.7 ms against 46 us alone, a cuBLAS kernel loaded lazily): the rule's candidate is not pruned on it,
    and the decision takes each candidate's smallest sample, where the medians would pick the other."""
    table = tuning.tuner("linear")
    key = ("test", "rule kept")
    costs = {"dense": [9.0, 2.7, 0.046, 0.047, 0.090], "decode": [9.0, 0.054, 0.051, 0.052]}
    while table.decided(key) is None:
        name, sample = table.choose(key, ["dense", "decode"], "dense", "cpu")
        assert sample is not None
        table.record(key, name, costs[name].pop(0))
    e = next(e for e in st.tuning_table(kind="linear") if e["key"] == key)
    assert not e["candidates"]["dense"]["dropped"]  # 2.7 > 2 x 0.054, but the rule's
    assert e["candidates"]["dense"]["costs_ms"] == [2.7, 0.046, 0.047] and table.decided(key) == "dense"
    # a candidate other than the rule's is pruned on its one counted sample
    key2 = ("test", "other pruned")
    costs = {"dense": [9.0, 0.05, 0.05, 0.05], "decode": [9.0, 0.2]}
    while table.decided(key2) is None:
        name, sample = table.choose(key2, ["dense", "decode"], "dense", "cpu")
        table.record(key2, name, costs[name].pop(0))
    e = next(e for e in st.tuning_table(kind="linear") if e["key"] == key2)
    assert e["candidates"]["decode"]["dropped"] and table.decided(key2) == "dense"


def test_python_tuner_ties_go_to_the_rule():
    table = tuning.tuner("plan")
    key = ("test", "tie")
    while table.decided(key) is None:
        name, _ = table.choose(key, ["other", "rule"], "rule", "cpu")
        table.record(key, name, 1.0)
    assert table.decided(key) == "rule"


def test_python_tuner_samples_each_candidate_at_each_place_of_a_step():
    """Two layers sharing a signature, called in a fixed order every step (a model's gate and up): the first
    call of a step starts on an idle GPU and the second behind the first. Each candidate is sampled at both
    places (a fixed tie order sampled dense always first and the decode kernel always second)."""
    table = tuning.tuner("linear")
    key = ("test", "places")
    places = {"dense": [], "decode": []}
    for step in range(12):
        for place in ("gate", "up"):
            name, sample = table.choose(key, ["dense", "decode"], "dense", "cpu")
            if sample is not None:
                places[name].append(place)
                table.record(key, name, 1.0 if name == "dense" else 1.1)
    assert table.decided(key) == "dense"
    for name, seen in places.items():
        assert len(seen) == 1 + tuning.SAMPLES and {"gate", "up"} <= set(seen[1:]), (name, seen)


def test_lost_and_failed_samples():
    s = sig(4)
    assert nxt(s, ["native", "balanced", "densify"]) == ("native", True)
    record(s, "native", 0, outcome="lost")  # no event free: handed out again
    assert nxt(s, ["native", "balanced", "densify"]) == ("native", True)
    assert nxt(s, ["native", "balanced", "densify"]) == ("balanced", True)
    assert nxt(s, ["native", "balanced", "densify"]) == ("densify", True)
    record(s, "densify", 0, outcome="failed")  # raised (out of memory): never again
    e = entry(s)
    assert e["candidates"]["densify"]["failed"]
    got = {nxt(s, ["native", "balanced", "densify"])[0] for _ in range(2)}
    assert got == {"native", "balanced"}
    # every candidate failing decides the rules' route
    s2 = sig(5)
    nxt(s2, ["native", "split"])
    record(s2, "native", 0, outcome="failed")
    record(s2, "split", 0, outcome="failed")
    assert entry(s2)["route"] == "native"


def test_candidate_never_offered_is_dropped():
    s = sig(6)
    assert nxt(s, ["native", "balanced", "densify"]) == ("native", True)  # the first matrix offers densify
    for _ in range(40):  # later matrices of the signature never do
        nxt(s, ["native", "balanced"])
    assert entry(s)["candidates"]["densify"]["dropped"]


def test_single_candidate_decides_at_once():
    s = sig(7)
    assert nxt(s, ["split"]) == ("split", False)
    assert entry(s)["route"] == "split"


def test_autotune_off_tunes_nothing_but_keeps_decisions():
    s = sig(8)
    st.set_autotune(False)
    assert nxt(s, ROUTES) == ("native", False)
    assert entry(s) is None  # nothing created
    ops.spmm_tuning_import(["test-gpu"], s, ["split"], False)
    assert nxt(s, ROUTES) == ("split", False)  # decided routes are still taken
    st.set_autotune(True)
    assert nxt(sig(9), ROUTES) == ("native", True)
    assert nxt(sig(10), ROUTES, tune=False) == ("native", False)


def test_table_is_bounded_least_recently_used_first():
    assert ops.spmm_tuning_capacity(0) == 4096
    for i in range(5000):
        nxt(sig(i, n=8), ROUTES)
        if i % 1000 == 0:
            nxt(sig(0, n=8), ROUTES)  # kept in use: never the least recently used
    assert len(st.tuning_table()) == 4096
    assert entry(sig(0, n=8)) is not None
    assert entry(sig(1, n=8)) is None  # the oldest went first
    assert entry(sig(4999, n=8)) is not None
    ops.spmm_tuning_capacity(10)
    assert len(st.tuning_table()) == 10
    with pytest.raises(ValueError):
        ops.spmm_tuning_capacity(-1)


def test_export_import_round_trip():
    decided = {i: r for i, r in zip(range(20, 26), ["native", "balanced", "split", "tiled", "cusparse", "densify"])}
    for i, r in decided.items():
        ops.spmm_tuning_import(["test-gpu"], sig(i), [r], False)
    nxt(sig(30), ROUTES)  # one undecided
    devices, fields, routes, details = ops.spmm_tuning_export(True)
    assert len(devices) == len(decided) and len(fields) == F * len(decided)
    st.clear_tuning()
    assert st.tuning_table() == []
    assert ops.spmm_tuning_import(devices, fields, routes, False) == len(decided)
    for i, r in decided.items():
        assert entry(sig(i))["route"] == r
    # bad entries are skipped, not fatal
    assert ops.spmm_tuning_import(["test-gpu", "test-gpu"], sig(40) + sig(41), ["warp-magic", "auto"], False) == 0
    with pytest.raises(ValueError):
        ops.spmm_tuning_import(["test-gpu"], sig(40)[:-1], ["native"], False)
    # an import does not overwrite what this process decided itself, unless asked
    ops.spmm_tuning_import(["test-gpu"], sig(20), ["split"], False)
    assert entry(sig(20))["route"] == "native"
    ops.spmm_tuning_import(["test-gpu"], sig(20), ["split"], True)
    assert entry(sig(20))["route"] == "split"


def test_decision_reaches_the_op_route_only_where_the_matrix_can_take_it():
    """spmm_route(as_cuda=True) resolves exactly as the CUDA op: the signature's decided route."""
    rng = np.random.default_rng(3)
    A = st.from_scipy(random_csr(rng, 400, 300, 0.02), dtype=torch.float32)
    B = torch.randn(300, 32)
    rules = cuda_route(A, B)
    device, fields = signature_of(A, B)
    other = "split" if rules != "split" else "balanced"
    ops.spmm_tuning_import([device], fields, [other], True)
    assert cuda_route(A, B) == other
    assert st.spmm_route(A, B) == "cpu"  # the CPU op has one kernel
    # a route this matrix's candidates exclude is never taken (tiled needs long rows and a wide B)
    ops.spmm_tuning_import([device], fields, ["tiled"], True)
    assert cuda_route(A, B) == rules
    # another device's decision does not apply here
    st.clear_tuning()
    ops.spmm_tuning_import(["Some Other GPU"], fields, [other], True)
    assert cuda_route(A, B) == rules


# --- the cache file ----------------------------------------------------------------------------------

def test_cache_file_marks_measured_decisions_in_a_list_of_their_own(tmp_path):
    """The "linear" / "plan" decisions stay [key, choice] pairs (what a reader without the marks reads); the
    keys an explicit measurement decided are listed beside them; a file without that list loads every decision
    as not measured."""
    path = tmp_path / "tuning.json"
    table = tuning.tuner("linear")
    table.decide(("a", 1), "dense")                       # an explicit measurement
    table.decide(("b", 2), "csr16", measured=False)       # as the online samples decide
    st.save_tuning_cache(str(path))
    doc = json.loads(path.read_text())
    group = doc["builds"][-1]
    assert sorted(group["linear"]) == [[["a", 1], "dense"], [["b", 2], "csr16"]]
    assert group["linear_measured"] == [["a", 1]]
    st.clear_tuning()
    st.set_tuning_cache(str(path))
    assert table.measured(("a", 1)) and not table.measured(("b", 2)) and table.source(("a", 1)) == "cache"
    st.set_tuning_cache(None)
    del group["linear_measured"]  # an older file
    path.write_text(json.dumps(doc))
    st.clear_tuning()
    st.set_tuning_cache(str(path))
    assert table.decided(("a", 1)) == "dense" and not table.measured(("a", 1))
    st.set_tuning_cache(None)


def test_cache_file_round_trip_and_foreign_entries(tmp_path):
    path = tmp_path / "sub" / "tuning.json"
    assert st.set_tuning_cache(str(path)) == 0  # no file yet
    ops.spmm_tuning_import(["test-gpu"], sig(50), ["balanced"], False)
    nxt(sig(51), ROUTES)  # undecided: not saved
    assert st.save_tuning_cache() == 1
    doc = json.loads(path.read_text())
    assert doc["format"] == "sparsetorch-tuning" and len(doc["builds"]) == 1
    build = doc["builds"][0]
    assert build["sparsetorch"] == st.__version__ and build["torch"] == torch.__version__
    assert build["entries"] == [["test-gpu", sig(50), "balanced"]]
    # another build's entries (other versions) and an entry for another GPU model
    build["entries"].append(["Other GPU", sig(52), "split"])
    foreign = dict(build, torch="0.0.1", entries=[["test-gpu", sig(53), "split"]])
    doc["builds"].append(foreign)
    path.write_text(json.dumps(doc))
    st.clear_tuning()
    assert st.set_tuning_cache(str(path)) == 2  # this build's two entries
    assert entry(sig(50))["route"] == "balanced"
    assert entry(sig(52), device="Other GPU")["route"] == "split"  # inert here: keyed on its device name
    assert entry(sig(53)) is None  # other torch: ignored...
    st.save_tuning_cache()
    kept = json.loads(path.read_text())["builds"]
    assert any(b["torch"] == "0.0.1" and b["entries"] == [["test-gpu", sig(53), "split"]] for b in kept)  # ...kept
    assert not list(path.parent.glob(".tuning-*"))  # no temporary file left


def test_cache_file_with_another_signature_version_is_ignored(tmp_path):
    path = tmp_path / "tuning.json"
    st.set_tuning_cache(str(path))
    ops.spmm_tuning_import(["test-gpu"], sig(60), ["balanced"], False)
    st.save_tuning_cache()
    doc = json.loads(path.read_text())
    doc["builds"][0]["signature_version"] += 1
    path.write_text(json.dumps(doc))
    st.clear_tuning()
    assert st.set_tuning_cache(str(path)) == 0
    assert entry(sig(60)) is None


def test_corrupt_cache_file_warns_and_is_replaced(tmp_path):
    path = tmp_path / "tuning.json"
    path.write_text("{not json")
    with pytest.warns(RuntimeWarning, match="ignored"):
        assert st.set_tuning_cache(str(path)) == 0
    ops.spmm_tuning_import(["test-gpu"], sig(70), ["native"], False)
    assert st.save_tuning_cache() == 1
    assert json.loads(path.read_text())["format"] == "sparsetorch-tuning"


def test_save_without_a_path_raises():
    with pytest.raises(ValueError):
        st.save_tuning_cache()


def _run(code, env_extra):
    env = python_env(**env_extra)
    tests_dir = os.path.dirname(os.path.abspath(__file__))
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, cwd=tests_dir, check=True,
                          capture_output=True, text=True, timeout=300).stdout


def test_cache_file_saved_at_exit_and_loaded_at_import(tmp_path):
    """SPARSETORCH_TUNING_CACHE: a process saves its decisions at exit; the next starts with them."""
    path = str(tmp_path / "tuning.json")
    _run(f"""
        import sparsetorch as st
        from sparsetorch._ops import ops
        ops.spmm_tuning_import(["test-gpu"], {sig(80)}, ["split"], False)
    """, {"SPARSETORCH_TUNING_CACHE": path})
    out = _run("""
        import sparsetorch as st
        print([(e["device"], e["route"]) for e in st.tuning_table()])
    """, {"SPARSETORCH_TUNING_CACHE": path})
    assert out.strip() == "[('test-gpu', 'split')]"


# --- CUDA: online tuning on real calls -------------------------------------------------------------

def _skewed(rng, m, k, dtype, device="cuda"):
    """A skewed matrix of m rows: a fifth empty, 70% of 1-8 entries, 9% of 20-60 and 1% of 300-400
    (lengths, order and columns random). Every m in a log2 bucket gives one signature (a third of the
    entries in rows of >= 256, mid-level). Returns (A on `device` in dtype, its SciPy matrix with
    the values A holds)."""
    empty, mid, long = m // 5, (9 * m) // 100, max(1, m // 100)
    short = m - empty - mid - long
    lengths = np.concatenate([np.zeros(empty, np.int64), rng.integers(1, 9, short), rng.integers(20, 61, mid),
                              rng.integers(300, 401, long)])
    lengths = rng.permutation(lengths)
    a = from_lengths(lengths, k, seed=int(rng.integers(1 << 30)), dtype=torch.float64, device="cpu")
    A = a.to(device=device, dtype=dtype)
    return A, rounded(st.to_scipy(a), dtype)


def _settle():
    torch.cuda.synchronize()


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_call_while_tuning_is_the_product(dtype):
    """Whatever candidate the rotation runs, each call's result is the product (fresh inputs each call)."""
    rng = np.random.default_rng(1)
    for i in range(60):
        m = int(rng.integers(1100, 1400))
        A, a = _skewed(rng, m, 1200, dtype)
        B = torch.from_numpy(rng.standard_normal((1200, 32))).to(dtype=dtype, device="cuda")
        assert_matches(st.spmm(A, B), a @ B.double().cpu().numpy(), dtype)
        if i % 5 == 4:
            _settle()
    table = st.tuning_table()
    assert len(table) == 1, [e["signature"] for e in table]
    assert table[0]["decided"], table
    assert sum(c["issued"] for c in table[0]["candidates"].values()) <= 60


@needs_cuda
def test_out_variant_with_accumulate_while_tuning():
    rng = np.random.default_rng(2)
    for i in range(24):
        A, a = _skewed(rng, 900, 800, torch.float32)
        B = torch.randn(800, 16, device="cuda")
        out = torch.randn(900, 16, device="cuda")
        ref = 2.0 * out.double().cpu().numpy() + 0.5 * (a @ B.double().cpu().numpy())
        st.spmm(A, B, alpha=0.5, beta=2.0, out=out)
        assert_matches(out, ref, torch.float32)
        if i % 4 == 3:
            _settle()


@needs_cuda
def test_stream_of_fresh_matrices_tunes_once_and_stays_bounded():
    rng = np.random.default_rng(4)
    for i in range(200):
        A, _ = _skewed(rng, int(rng.integers(2100, 2600)), 2500, torch.float32)
        B = torch.randn(2500, 64, device="cuda")
        for _ in range(3):
            st.spmm(A, B)
    _settle()
    st.spmm(A, B)  # reads the last samples
    table = st.tuning_table()
    assert len(table) <= 4, [e["signature"] for e in table]
    decided = [e for e in table if e["decided"]]
    assert decided, table
    # a decided signature hands out no more samples
    before = {e["route"]: sum(c["issued"] for c in e["candidates"].values()) for e in decided}
    for _ in range(5):
        A, _ = _skewed(rng, int(rng.integers(2100, 2600)), 2500, torch.float32)
        st.spmm(A, torch.randn(2500, 64, device="cuda"))
    after = {e["route"]: sum(c["issued"] for c in e["candidates"].values()) for e in st.tuning_table() if e["decided"]}
    assert all(after.get(r, v) == v for r, v in before.items())


def _tune(A, B, calls=60):
    for i in range(calls):
        st.spmm(A, B)
        if i % 8 == 7:
            _settle()
        if any(e["decided"] for e in st.tuning_table()):
            return
    raise AssertionError(f"not decided after {calls} calls: {st.tuning_table()}")


@needs_cuda
def test_graph_capture_after_tuning():
    rng = np.random.default_rng(5)
    A, a = _skewed(rng, 1500, 1500, torch.float32)
    B = torch.randn(1500, 32, device="cuda")
    _tune(A, B)
    route = st.spmm_route(A, B)
    assert route == st.tuning_table(decided_only=True)[0]["route"]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        st.spmm(A, B)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = st.spmm(A, B)
    B.copy_(torch.randn(1500, 32, device="cuda"))
    graph.replay()
    _settle()
    assert_matches(y, a @ B.double().cpu().numpy(), torch.float32)


@needs_cuda
def test_graph_capture_of_an_undecided_signature_takes_the_rules():
    rng = np.random.default_rng(6)
    A, a = _skewed(rng, 1000, 1000, torch.float32)
    B = torch.randn(1000, 16, device="cuda")
    st.set_autotune(False)
    st.spmm(A, B)  # analysed before the capture
    st.set_autotune(True)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = st.spmm(A, B)
    graph.replay()
    _settle()
    assert_matches(y, a @ B.double().cpu().numpy(), torch.float32)
    assert st.tuning_table() == []  # nothing tuned inside the capture


@needs_cuda
def test_autotune_off_on_cuda():
    rng = np.random.default_rng(7)
    A, a = _skewed(rng, 1000, 1000, torch.float32)
    B = torch.randn(1000, 16, device="cuda")
    st.set_autotune(False)
    for _ in range(10):
        assert_matches(st.spmm(A, B), a @ B.double().cpu().numpy(), torch.float32)
    assert st.tuning_table() == []


@needs_cuda
def test_plan_measurement_decides_the_signature():
    rng = np.random.default_rng(8)
    A, a = _skewed(rng, 1200, 1000, torch.float32)
    B = torch.randn(1000, 32, device="cuda")
    route = ops.spmm_tune(A.crow_indices, A.col_indices, A.values, B)
    decided = st.tuning_table(decided_only=True)
    assert len(decided) == 1 and decided[0]["route"] == route
    assert st.spmm_route(A, B) == route
    plan = st.SpmmPlan(A)
    assert_matches(plan(B), a @ B.double().cpu().numpy(), torch.float32)


@needs_cuda
def test_cache_file_makes_a_new_process_start_decided(tmp_path):
    path = str(tmp_path / "tuning.json")
    code = """
        import numpy as np, scipy.sparse as sp, torch, sparsetorch as st
        rng = np.random.default_rng(9)
        a = sp.random(3000, 3000, density=0.002, format="csr", random_state=9, dtype=np.float32)
        A = st.from_scipy(a, device="cuda")
        B = torch.randn(3000, 64, device="cuda")
        print("START", st.spmm_route(A, B), len(st.tuning_table(decided_only=True)))
        for i in range(80):
            st.spmm(A, B)
            if i % 8 == 7:
                torch.cuda.synchronize()
        print("END", st.spmm_route(A, B), len(st.tuning_table(decided_only=True)))
    """
    first = _run(code, {"SPARSETORCH_TUNING_CACHE": path}).split()
    assert first[0] == "START" and first[2] == "0" and first[3] == "END" and first[5] == "1"
    decided_route = first[4]
    second = _run(code, {"SPARSETORCH_TUNING_CACHE": path}).split()
    assert second[:3] == ["START", decided_route, "1"]
