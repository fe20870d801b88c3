"""The benchmark harness: the report arithmetic on known rows, and a small end-to-end run on the CPU."""
import json
import math

import pytest

from sparsetorch.bench import report


def _row(suite, case, impl, t, **kw):
    return {"suite": suite, "case": case, "impl": impl, "dtype": "float32", "time_ms": t, "GBps": 1.0,
            "GFLOPs": 1.0, "floor_ms": 0.1, "of_floor": 0.1 / t, "cpu": False, **kw}


def test_crossover_is_interpolated_in_log_density():
    rows = []
    for d, ours in ((0.01, 0.5), (0.1, 2.0)):  # sparse time crosses dense (1.0) between the two
        rows += [_row("density", f"d={d}", "sparsetorch", ours, density=d),
                 _row("density", f"d={d}", "dense fp32", 1.0, density=d)]
    cross = report.crossovers(rows)["dense fp32"]
    # log-linear: ratio 0.5 -> 2.0 crosses 1 halfway in log density
    assert math.isclose(cross, math.sqrt(0.01 * 0.1), rel_tol=1e-9)


def test_speedups_and_headlines():
    rows = [_row("graphs", "g, n=32", "sparsetorch", 1.0, graph="g"),
            _row("graphs", "g, n=32", "torch.sparse.mm", 2.0, graph="g"),
            _row("graphs", "g, n=64", "sparsetorch", 1.0, graph="g"),
            _row("graphs", "g, n=64", "torch.sparse.mm", 8.0, graph="g")]
    report.add_speedups(rows)
    assert [r["speedup"] for r in rows] == [1.0, 2.0, 1.0, 8.0]
    assert any("4.00x geomean over torch.sparse.mm" in h for h in report.headlines(rows))


def test_quick_run_on_cpu_writes_results(tmp_path, capsys):
    pytest.importorskip("scipy")
    from sparsetorch.bench.__main__ import main

    out = tmp_path / "res"
    main(["--device", "cpu", "--suites", "density,batched", "--no-plots", "--out", str(out)])
    data = json.loads((out / "results.json").read_text())
    impls = {r["impl"] for r in data["rows"]}
    assert {"sparsetorch", "torch.sparse.mm", "dense fp32", "scipy"} <= impls
    assert all(r["time_ms"] > 0 and r["floor_ms"] > 0 and r["rel_err"] < 1e-4 for r in data["rows"])
    assert (out / "README.md").exists() and (out / "results.csv").exists()
    assert "x ours" in capsys.readouterr().out


def test_cpu_time_rounds_extends_fast_cases_and_stops_slow_ones():
    """The CPU suite's rounds: every fn called once per round in a rotating order; a case of microseconds
    runs past `rounds` until it has run min_s (at most 20 x rounds), a slow one stops at its budget after at
    least 3 rounds."""
    import time

    from sparsetorch.bench.suites.cpu import time_rounds

    calls = []
    times = time_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=5, budget_s=10.0,
                        min_s=60.0)
    assert len(times["a"]) == len(times["b"]) == 100  # min_s not reached: 20 x rounds
    assert calls[2:6] == ["a", "b", "b", "a"]  # after the warm-up calls, the order rotates each round
    times = time_rounds({"a": lambda: time.sleep(0.002)}, rounds=5, budget_s=10.0, min_s=0.0)
    assert len(times["a"]) == 5  # min_s reached: `rounds` rounds
    times = time_rounds({"a": lambda: time.sleep(0.02)}, rounds=50, budget_s=0.01, min_s=1.0)
    assert len(times["a"]) == 3  # over budget: 3 rounds
