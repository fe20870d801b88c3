"""The decode suite (benchmarks/suites/decode.py) at CPU scale: rows, routes, the correctness check,
Wanda pruning of the stack, headlines and the command line."""
import json
from dataclasses import replace

import pytest
import torch

from benchmarks.harness import Ceilings, make_timer
from benchmarks.suites import decode, pruned
from benchmarks.suites.common import Context

pytestmark = pytest.mark.repaid_builds  # the suites and the tour run as users run them

CPU = torch.device("cpu")
SMALL = replace(decode.TINY, hidden=128, heads=2, kv_heads=1, inner=256, context=16)


def _ctx(widths=(1, 3), layers=None):
    return Context(CPU, make_timer(CPU, True), Ceilings(1e10, {"float32": 1e11}), True, None, widths, None, layers)


@pytest.fixture
def small(monkeypatch):
    monkeypatch.setattr(decode, "TINY", SMALL)


def test_rows_of_a_decode_job(small):
    jobs = decode.decode_suite(_ctx(layers=2))
    assert len(jobs) == len(decode.SPARSITIES)
    rows = jobs[0]()  # 50% per row
    assert [(r["n"], r["impl"]) for r in rows] == [(1, decode.DENSE), (1, "sparsetorch"), (3, decode.DENSE),
                                                   (3, "sparsetorch")]
    for r in rows:
        assert r["suite"] == "decode" and r["sparsity"] == "50% per row" and r["layers"] == 2
        assert r["tokens_per_s"] == pytest.approx(r["n"] / (r["time_ms"] * 1e-3))
        assert r["per_layer_ms"] == pytest.approx(r["time_ms"] / 2)
        assert 0 < r["linear_share"] <= 1 and r["floor_ms"] > 0 and r["weight_MiB"] > 0
        assert r["rel_err"] < 1e-4 and r["vs_dense"] > 0
    sparse = [r for r in rows if r["impl"] == "sparsetorch"]
    assert all(set(r["routes"]) == set(decode.KINDS) for r in sparse)
    for r in sparse:  # the CPU's forms, per kind over the 2 layers: "csr", "dense" or "csr x1, dense x1"
        assert all(part.split(" x")[0] in ("csr", "dense") for v in r["routes"].values() for part in v.split(", "))
    dense = rows[0]
    assert sparse[0]["floor_ms"] < dense["floor_ms"]  # half the weights' values (+ a bitmap) to read


def test_stacks_are_wanda_pruned_alike():
    stack = decode.dense_stack(SMALL, CPU, torch.float32, seed=3)
    norms = decode.calibrate(stack, SMALL, CPU, torch.float32, tokens=8)
    assert set(norms) == {f"layers.0.{k}" for k in decode.KINDS}
    for sparsity, scheme in ((0.7, "row"), (0.5, "2:4")):
        dense, sparse = decode.pruned_stacks(stack, norms, sparsity, scheme)
        for kind in decode.KINDS:
            w = getattr(dense.layers[0], kind).weight
            assert torch.equal(getattr(sparse.layers[0], kind).to_dense().detach(), w)
            if scheme == "row":
                assert torch.all((w != 0).sum(1) == round(0.3 * w.shape[1]))
            else:
                assert int((w != 0).view(w.shape[0], -1, 4).sum(-1).max()) <= 2
        # the sparse stack computes what the dense stack computes
        x = torch.randn(2, SMALL.hidden)
        caches = decode.kv_caches(SMALL, 2, CPU, torch.float32, seed=0)
        rope = decode.rope_at(SMALL, SMALL.context, CPU, torch.float32)
        with torch.no_grad():
            torch.testing.assert_close(sparse(x, caches, rope), dense(x, caches, rope), rtol=1e-4, atol=1e-4)


def test_a_wrong_sparse_stack_fails_the_check(small, monkeypatch):
    make = decode.pruned_stacks

    def broken(*args):
        dense, sparse = make(*args)
        with torch.no_grad():
            sparse.layers[0].down.values.mul_(1.5)
        return dense, sparse

    monkeypatch.setattr(decode, "pruned_stacks", broken)
    with pytest.raises(AssertionError, match="relative error"):
        decode.decode_suite(_ctx(widths=(1,)))[0]()


def test_the_pruned_suite_runs_the_decode_jobs(monkeypatch):
    monkeypatch.setattr(pruned, "decode_suite", lambda ctx: ["decode job"])
    assert pruned.pruned_suite(_ctx())[-1] == "decode job"


def test_headlines_say_which_side_is_faster_and_when_dense_runs():
    def row(n, impl, ms, routes=None):
        r = {"suite": "decode", "case": f"s, N={n}", "impl": impl, "n": n, "sparsity": "50% per row", "layers": 4,
             "hidden": 4096, "time_ms": ms, "tokens_per_s": n / (ms * 1e-3)}
        if routes:
            r["routes"] = routes
        return r

    rows = [row(1, decode.DENSE, 2.0), row(1, "sparsetorch", 1.0, {k: "bitmap" for k in decode.KINDS}),
            row(16, decode.DENSE, 2.0), row(16, "sparsetorch", 2.1, {k: "dense" for k in decode.KINDS})]
    decode._vs_dense(rows)
    (line,) = decode.headlines(rows)
    assert line.startswith("decode 50% per row, 4 layers of hidden 4096")
    assert "N=1 2.00x faster (1000 vs 500 tokens/s)" in line
    assert "N=16 dense fallback" in line


def test_command_line_runs_the_decode_suite(small, tmp_path, monkeypatch):
    from benchmarks import run as cli

    monkeypatch.setattr(cli, "measure_ceilings", lambda *a: Ceilings(1e10, {"float32": 1e11}))
    monkeypatch.setattr(decode, "SPARSITIES", decode.SPARSITIES[:1])
    main = cli.main
    main(["--device", "cpu", "--suites", "decode", "--layers", "2", "--widths", "2", "--no-plots", "--out",
          str(tmp_path)])
    data = json.loads((tmp_path / "results.json").read_text())
    assert {r["layers"] for r in data["rows"]} == {2} and {r["n"] for r in data["rows"]} == {2}
    assert len(data["rows"]) == 2 * len(decode.SPARSITIES)
    assert sum(h.startswith("decode ") for h in data["headlines"]) == len(decode.SPARSITIES)
