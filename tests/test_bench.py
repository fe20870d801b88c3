"""The benchmark harness: the report arithmetic on known rows, and a small end-to-end run on the CPU."""
import json
import math

import pytest

from benchmarks import report

pytestmark = pytest.mark.repaid_builds  # the suites and the tour run as users run them


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
    assert any("sparsetorch 4.00x faster than torch.sparse.mm (geomean over 2 cases; from 2.00x faster to 8.00x "
               "faster)" in h for h in report.headlines(rows)), report.headlines(rows)


def test_ratios_say_which_side_is_faster():
    from benchmarks.ratios import summary, versus

    assert versus(1.21, "torch_geometric") == "1.21x faster than torch_geometric"
    assert versus(0.5, "torch.sparse.mm") == "2.00x slower than torch.sparse.mm"
    assert versus(None) == "-"
    assert summary([0.5, 2.0], "X") == "1.00x faster than X (geomean over 2 cases; from 2.00x slower to 2.00x faster)"


def test_density_headline_when_sparse_wins_at_every_density():
    """A sweep whose highest density still favours sparsetorch has no crossover inside it: the headline says
    so instead of naming the highest density as the crossover."""
    rows = []
    for d in (0.01, 0.1, 0.3):
        rows += [_row("density", f"d={d}", "sparsetorch", 0.5, density=d),
                 _row("density", f"d={d}", "dense fp32", 1.0, density=d)]
    (line,) = report.crossover_lines(rows)
    assert "at every density swept (up to 30%" in line and "below" not in line
    rows = [dict(r, time_ms=2.0) if r["impl"] == "sparsetorch" else r for r in rows]
    (line,) = report.crossover_lines(rows)
    assert "dense fp32 is faster than sparsetorch (fp32) at every density swept (down to 1%)" in line


def test_terminal_table_cuts_nothing_off_and_marks_missing_models(capsys):
    long_case = "a case name far longer than any column width the table used to have, n=128"
    rows = [_row("skew", long_case, "st.spmm (default)", 1.0),
            _row("skew", long_case, "host overhead per call", 0.01, GBps=0.0, GFLOPs=0.0, floor_ms=0.0,
                 of_floor=0.0)]
    report.add_speedups(rows)
    report.print_table(rows)
    out = capsys.readouterr().out
    assert long_case in out
    overhead = next(line for line in out.splitlines() if "host overhead" in line)
    assert " 0 " not in overhead and "0%" not in overhead and overhead.split().count("-") >= 4
    assert "(reference)" in out


def test_elementwise_copy_row_is_the_ceiling():
    """One ceiling: the copy row of the elementwise suite is the copy that measured the bandwidth, so it
    reads 100% of floor, and the fused kernel's headline quotes the same fraction as its row."""
    import torch

    from benchmarks.harness import make_timer, measure_ceilings
    from benchmarks.suites.common import Context
    from benchmarks.suites.elementwise import elementwise_suite

    cpu = torch.device("cpu")
    timer = make_timer(cpu, True)
    ctx = Context(cpu, timer, measure_ceilings(cpu, timer, True), True, None)
    rows = [r for job in elementwise_suite(ctx) for r in job()]
    copy = next(r for r in rows if r["impl"].startswith("copy"))
    assert abs(copy["of_floor"] - 1.0) < 1e-9
    assert abs(copy["GBps"] * 1e9 - ctx.ceilings.bandwidth) / ctx.ceilings.bandwidth < 1e-9
    report.add_speedups(rows)
    fused = next(r for r in rows if r["impl"].startswith("st.bias_act"))
    (line,) = [h for h in report.headlines(rows) if h.startswith("fused bias+gelu")]
    assert f"{100 * fused['of_floor']:.0f}% of the copy ceiling" in line


def test_quick_run_on_cpu_writes_results(tmp_path, capsys):
    pytest.importorskip("scipy")
    from benchmarks.run import main

    out = tmp_path / "res"
    main(["--device", "cpu", "--suites", "density,batched", "--no-plots", "--out", str(out)])
    data = json.loads((out / "results.json").read_text())
    impls = {r["impl"] for r in data["rows"]}
    assert {"sparsetorch", "torch.sparse.mm", "dense fp32", "scipy"} <= impls
    assert all(r["time_ms"] > 0 and r["floor_ms"] > 0 and r["rel_err"] < 1e-4 for r in data["rows"])
    assert (out / "README.md").exists() and (out / "results.csv").exists()
    assert "sparsetorch is" in capsys.readouterr().out


def test_serving_suite_on_cpu_reports_every_mode(tmp_path):
    """The serving suite's CPU rehearsal: every pruning case has the dense baseline, nn.Linear, the five sparse modes
    and prepare(), each with its time, ratio (the median of its repetitions between dense runs), costliest call
    and memory; compact layers hold less than dense."""
    from benchmarks.run import main
    from benchmarks.suites.serving import REPEATS

    out = tmp_path / "res"
    main(["--device", "cpu", "--suites", "serving", "--no-plots", "--out", str(out)])
    rows = json.loads((out / "results.json").read_text())["rows"]
    modes = ["dense F.linear", "dense nn.Linear", "sparsetorch", "sparsetorch, cache file",
             "sparsetorch, prepared from a cache file",
             "sparsetorch compact", "sparsetorch compact, cache file"]
    cases = {r["case"] for r in rows}
    assert {"MLP block 2:4", "MLP block 90%", "MLP block 70% per row"} <= cases
    for case in cases:
        got = {r["impl"]: r for r in rows if r["case"] == case}
        assert set(modes) | {"prepare"} == set(got), case
        for mode in modes:
            r = got[mode]
            # the costliest call is the worst over every repetition: within the longest repetition's total
            runs_ms = r["time_ms_runs"]
            assert r["time_ms"] > 0 and r["vs_dense"] > 0 and 0 < r["costliest_ms"] <= max(runs_ms), (case, mode)
            assert min(runs_ms) - 1e-3 <= r["time_ms"] <= max(runs_ms) + 1e-3, (case, mode)
            assert r["held_bytes"] > 0 and r["costliest_call"].split(" at N=")[0] in ("gate", "up", "down")
            if mode != "dense F.linear":  # REPEATS runs between dense runs; the row is the median's
                runs = r["vs_dense_runs"]
                assert len(runs) == r["repeats"] == REPEATS and runs == sorted(runs), (case, mode)
                assert r["vs_dense"] == pytest.approx(runs[len(runs) // 2], abs=1e-3), (case, mode)
        assert got["dense F.linear"]["repeats"] == 2 * REPEATS * (len(modes) - 1), case
        # float32 on the CPU: a compact layer keeps the CSR (8 bytes per kept value, 4 per dense position)
        kept = 0.5 if "2:4" in case else 0.1 if "90%" in case else 0.3
        assert got["sparsetorch compact"]["held_vs_dense"] == pytest.approx(2 * kept, rel=0.02), case
        assert got["prepare"]["time_ms"] > 0
        # a second process's prepare() with the default run's cache file keeps its decisions: builds, no timing
        assert 0 < got["prepare"]["prepare_cached_ms"] < got["prepare"]["prepare_ms"] / 3, case


def test_serving_profile_reports_both_passes_of_each_mode_on_cpu(capsys):
    """benchmarks.serving_profile (a maintainer's script): dense, then each mode's two passes against it (default,
    cache file, prepared), the routes, and the first-pass calls that cost most over their second."""
    from benchmarks.serving_profile import main

    main(["--device", "cpu", "--cases", "90%", "--call-kinds"])
    out = capsys.readouterr().out
    assert "90%: dense" in out
    for mode in ("default", "cache file", "prepared"):
        for p in (1, 2):
            assert f"  {mode}, pass {p}: " in out and "x dense; calls " in out
    assert out.count("routes of gate: {") == 3 and out.count("pass 1 over pass 2 in calls: ") == 3
    assert " step   0 gate N=" in out  # the sequence's first call leads: it makes the layer's first forms
    # --call-kinds: every pass's calls by what the layer did, all of them counted; a default first pass begins
    # with the layers' first calls, which build their first forms
    lines = [line for line in out.splitlines() if line.startswith("    by call kind: ")]
    assert len(lines) == 6 and "first+build 3 calls" in lines[0]
    steps = int(out.split(" steps, ")[0])
    for line in lines:
        groups = [g.split(" calls ")[0].rsplit(" ", 1) for g in line[len("    by call kind: "):].split("; ")]
        assert sum(int(count) for _, count in groups) == 3 * steps
        assert {kind.split("+")[0] for kind, _ in groups} <= {"bound", "bound, renting", "first", "undecided"}


def test_serving_profile_dense_runs_and_pin(monkeypatch, capsys):
    """--dense-runs N: the dense sequence N times, each total printed in order, the median run the baseline;
    --pin CPU: the process pinned first (recorded here, not done: the test process keeps its CPUs)."""
    import os

    from benchmarks.serving_profile import main

    pinned = []
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: pinned.append((pid, set(cpus))))
    main(["--device", "cpu", "--cases", "90%", "--dense-runs", "3", "--pin", "1"])
    out = capsys.readouterr().out
    assert pinned == [(0, {1})] and "pinned to CPU 1" in out
    runs = [float(t) for t in out.split("dense runs in order (ms): ")[1].splitlines()[0].split(", ")]
    dense = float(out.split("90%: dense ")[1].split(" ms")[0])
    assert len(runs) == 3 and dense == sorted(runs)[1]


def test_serving_profile_samples_shows_each_sampled_bucket_against_its_forms_alone(monkeypatch, capsys):
    """serving_profile --samples: every bucket the tuner sampled (two candidates offered: on the CPU the layer
    offers one, so the test offers both CSR and dense) with its decision, its counted samples and each
    candidate timed alone at the bucket's ends."""
    import sparsetorch as st
    from benchmarks.serving_profile import main

    monkeypatch.setattr(st.nn.SparseLinear, "_candidates",
                        lambda self, n, rule, pattern: [rule] + [f for f in ("dense", "csr") if f != rule])
    main(["--device", "cpu", "--cases", "90%", "--samples"])
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("  sampled ")]
    assert {line.split(" bucket ")[0] for line in lines} == {"  sampled gate", "  sampled down"}  # up shares gate's
    for line in lines:
        bucket = int(line.split(" bucket ")[1].split(":")[0])
        assert "decided " in line and "samples (tokens, us) {'" in line
        alone = line.split("alone (us): ")[1]
        for form in ("dense", "csr"):
            assert f"{form} at {bucket}: " in alone and f"{form} at {bucket // 2 + 1}: " in alone


def test_e2e_suite_is_left_out_on_cpu_and_its_rows_make_a_headline(capsys, tmp_path):
    """The end-to-end model's suite runs on CUDA only (said at the end of a CPU run, nothing raised); its rows'
    headline gives tokens/s and weight bytes against dense."""
    from benchmarks.run import main
    from benchmarks.suites.serving import headlines

    main(["--device", "cpu", "--suites", "e2e", "--no-plots", "--out", str(tmp_path)])
    assert "e2e (the whole suite): CUDA only" in capsys.readouterr().out
    case = "e2e causal LM, 2 Llama-3-8B layers 2:4, batch 1, eager"
    rows = [{"suite": "e2e", "case": case, "impl": "dense", "tokens_per_s": 100.0, "vs_dense": 1.0,
             "linear_weight_bytes": 2**30},
            {"suite": "e2e", "case": case, "impl": "sparsetorch compact", "tokens_per_s": 130.0, "vs_dense": 1.3,
             "linear_weight_bytes": 2**29}]
    assert headlines(rows) == [f"{case}: sparsetorch compact 130 tokens/s against dense 100 (1.30x); linear weights "
                               "512 MiB against 1024 MiB"]


def test_e2e_job_runs_its_model_end_to_end_on_cpu():
    """The e2e job's plumbing on a tiny model, eager and compiled (the suite runs it on CUDA only): pruning with
    calibration, st.nn.prepare and compact, the decode loop (a compiled module as its step); rows for both
    sides with tokens/s, the weights' bytes (compact 2:4 at most 0.6x dense's) and ratios against dense."""
    import torch
    from benchmarks.harness import Ceilings
    from benchmarks.suites.common import Context
    from benchmarks.suites.decode import TINY
    from benchmarks.suites.serving import _e2e_job

    ctx = Context(torch.device("cpu"), None, Ceilings(bandwidth=1e11, gemm={"float32": 1e12}), True, None)
    rows = _e2e_job(ctx, shape=TINY, name="tiny", layers=1, vocab=64, max_len=8, tokens=4, batches=(1, 2),
                    modes=("eager", "compiled"))()
    assert [(r["batch"], r["mode"], r["impl"]) for r in rows] == [
        (b, m, impl) for b in (1, 2) for m in ("eager", "compiled") for impl in ("dense", "sparsetorch compact")]
    for r in rows:
        assert r["suite"] == "e2e" and r["case"] == f"e2e causal LM, 1 tiny layers 2:4, batch {r['batch']}, {r['mode']}"
        assert r["tokens_per_s"] > 0 and r["vs_dense"] > 0
    dense, sparse = rows[0]["linear_weight_bytes"], rows[1]["linear_weight_bytes"]
    assert 0 < sparse <= 0.6 * dense
    # the floor: the stored weights, the lm_head and the KV cache once per step, at the given bandwidth
    head_and_cache = 2 * (64 * TINY.hidden + 2 * (2 * TINY.kv_heads * 8 * TINY.head_dim))  # bf16; k, v at batch 2
    for r, weights in ((rows[-2], dense), (rows[-1], sparse)):
        assert r["batch"] == 2 and r["floor_ms"] == pytest.approx(4 * (weights + head_and_cache) / 1e11 * 1e3)
        assert r["of_floor"] == pytest.approx(r["floor_ms"] / r["time_ms"])


def test_serving_causal_lm_decodes_like_a_reference_on_cpu():
    """The end-to-end model of the serving suite (--full, CUDA only there): its decode steps, with the static
    KV cache, the causal mask and grouped-query attention, equal an attention written out per head."""
    import torch
    import torch.nn.functional as F
    from benchmarks.suites.decode import TINY
    from benchmarks.suites.serving import CausalLM, _rope

    torch.manual_seed(0)
    s = TINY
    kv = s.kv_heads * s.head_dim
    sizes = dict(q=(s.hidden, s.hidden), k=(kv, s.hidden), v=(kv, s.hidden), o=(s.hidden, s.hidden),
                 gate=(s.inner, s.hidden), up=(s.inner, s.hidden), down=(s.hidden, s.inner))
    lin = [{k: torch.nn.Linear(i, o, bias=False, dtype=torch.float64).requires_grad_(False)
            for k, (o, i) in sizes.items()}]
    batch, vocab, max_len = 3, 50, 8
    model = CausalLM(s, lin, vocab, max_len, batch, "cpu", torch.float64, seed=1)
    tokens = torch.randint(0, vocab, (4, batch))
    keys, values = [], []
    with torch.no_grad():
        for p in range(tokens.shape[0]):
            got = model(tokens[p], torch.tensor([p]))
            x = model.embed[tokens[p]]
            h = F.rms_norm(x, (s.hidden,), eps=1e-5)
            cos, sin = model.cos[p], model.sin[p]
            q = _rope(lin[0]["q"](h).view(batch, s.heads, s.head_dim), cos, sin)
            keys.append(_rope(lin[0]["k"](h).view(batch, s.kv_heads, s.head_dim), cos, sin))
            values.append(lin[0]["v"](h).view(batch, s.kv_heads, s.head_dim))
            K, V = torch.stack(keys, 2), torch.stack(values, 2)  # (batch, kv heads, positions <= p, dim)
            group = s.heads // s.kv_heads
            att = torch.stack([torch.softmax((q[:, hd, None, :] * K[:, hd // group]).sum(-1) / s.head_dim ** 0.5, -1)
                               for hd in range(s.heads)], 1)  # (batch, heads, positions)
            a = torch.stack([(att[:, hd, :, None] * V[:, hd // group]).sum(1) for hd in range(s.heads)], 1)
            x = x + lin[0]["o"](a.reshape(batch, s.hidden))
            h = F.rms_norm(x, (s.hidden,), eps=1e-5)
            x = x + lin[0]["down"](F.silu(lin[0]["gate"](h)) * lin[0]["up"](h))
            want = F.linear(F.rms_norm(x, (s.hidden,), eps=1e-5), model.head)
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_a_run_cut_short_keeps_the_suites_it_finished(tmp_path, monkeypatch):
    """Each finished suite's rows are written (marked partial) before the next suite starts, so a run that
    is killed or fails in a later suite leaves a results folder that --replot can redraw."""
    pytest.importorskip("scipy")
    from benchmarks import run as runner
    from benchmarks.run import main

    def failing_suite(ctx):
        def job():
            raise RuntimeError("stopped here")
        return [job]

    monkeypatch.setitem(runner.SUITES, "graphs", failing_suite)
    out = tmp_path / "res"
    with pytest.raises(RuntimeError, match="stopped here"):
        main(["--device", "cpu", "--suites", "batched,graphs", "--no-plots", "--out", str(out)])
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["partial"] is True and data["meta"]["suites"] == ["batched"]
    assert "unfinished" not in data["meta"]  # batched finished; graphs wrote nothing
    assert data["rows"] and {r["suite"] for r in data["rows"]} == {"batched"}
    assert "**Partial**" in (out / "README.md").read_text()
    main(["--replot", str(out), "--no-plots"])  # the partial folder is a complete folder for --replot
    assert json.loads((out / "results.json").read_text())["meta"]["partial"] is True

    def half_done_suite(ctx):  # a suite cut short in its second job keeps its first job's rows
        def bad():
            raise RuntimeError("stopped here")
        return [lambda: [_row("graphs", "tiny", "sparsetorch", 1.0)], bad]

    monkeypatch.setitem(runner.SUITES, "graphs", half_done_suite)
    with pytest.raises(RuntimeError, match="stopped here"):
        main(["--device", "cpu", "--suites", "graphs", "--no-plots", "--out", str(out)])
    data = json.loads((out / "results.json").read_text())
    assert data["meta"]["unfinished"] == "graphs: 1 of 2 jobs" and [r["case"] for r in data["rows"]] == ["tiny"]


def test_append_adds_suites_to_a_folder_and_replaces_rerun_ones(tmp_path):
    """--append: a second run's suites join the folder's results; a suite run again replaces its old rows; the
    meta lists both commands. A failed appending run leaves the earlier suites in place."""
    pytest.importorskip("scipy")
    from benchmarks import run as runner
    from benchmarks.run import main

    out = str(tmp_path / "res")
    main(["--device", "cpu", "--suites", "batched", "--no-plots", "--out", out])
    first = json.loads((tmp_path / "res" / "results.json").read_text())
    main(["--device", "cpu", "--suites", "elementwise,batched", "--no-plots", "--out", out, "--append"])
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    assert data["meta"]["suites"] == ["elementwise", "batched"]
    assert len(data["meta"]["commands"]) == 2 and "--append" in data["meta"]["commands"][1]
    batched = [r for r in data["rows"] if r["suite"] == "batched"]
    assert len(batched) == len(first["rows"])  # replaced, not doubled
    assert any(r["suite"] == "elementwise" for r in data["rows"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setitem(runner.SUITES, "graphs", lambda ctx: [lambda: (_ for _ in ()).throw(RuntimeError("cut"))])
        with pytest.raises(RuntimeError, match="cut"):
            main(["--device", "cpu", "--suites", "density,graphs", "--no-plots", "--out", out, "--append"])
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    assert data["meta"]["partial"] is True
    assert {r["suite"] for r in data["rows"]} == {"elementwise", "batched", "density"}


def test_append_replaces_the_rows_a_suite_emits_under_another_name(tmp_path, monkeypatch):
    """A suite whose jobs also emit rows of another suite name (pruned emits the decode stack's "decode"
    rows) replaces those too on --append: they are not doubled."""
    from benchmarks import run as runner
    from benchmarks.run import main

    def row(suite, case):
        return {"suite": suite, "case": case, "impl": "sparsetorch", "dtype": "float32", "time_ms": 1.0,
                "GBps": 0.0, "GFLOPs": 0.0, "floor_ms": 0.0, "of_floor": 0.0}

    monkeypatch.setitem(runner.SUITES, "pruned", lambda ctx: [lambda: [row("pruned", "a"), row("decode", "b")]])
    out = str(tmp_path / "res")
    main(["--device", "cpu", "--suites", "pruned", "--no-plots", "--out", out])
    main(["--device", "cpu", "--suites", "pruned", "--no-plots", "--out", out, "--append"])
    data = json.loads((tmp_path / "res" / "results.json").read_text())
    assert sorted(r["suite"] for r in data["rows"]) == ["decode", "pruned"]


def test_run_says_what_it_left_out_without_data(tmp_path, capsys, monkeypatch):
    """No data folder: the graphs suite runs its synthetic cases and the run says, at its start and its end,
    that the real matrices and the Planetoid graphs were left out and how to get them; no torch warning about
    the harness's own sparse tensors reaches the output."""
    import warnings

    from benchmarks import run as runner
    from benchmarks.run import main

    monkeypatch.setitem(runner.SUITES, "graphs", _tiny_graph_suite(runner.suite_function("graphs")))
    empty = tmp_path / "nodata"
    empty.mkdir()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(["--device", "cpu", "--suites", "graphs", "--no-plots", "--out", str(tmp_path / "res"),
              "--data", str(empty)])
    out = capsys.readouterr().out
    assert f"left out: graphs: the real matrices (no Matrix Market files in {empty}/matrices)" in out
    assert "the Planetoid graphs cora, citeseer, pubmed" in out
    assert "Left out of this run:" in out and "Planetoid('DIR', 'Cora')" in out
    assert not [w for w in caught if "Sparse CSR tensor support is in beta state" in str(w.message)]
    readme = (tmp_path / "res" / "README.md").read_text()
    assert "## Left out of this run" in readme


def _tiny_graph_suite(suite):
    def tiny(ctx):
        return suite(ctx)[:1]  # the first synthetic graph only: the test is about what is printed
    return tiny


def test_cpu_time_rounds_extends_fast_cases_and_stops_slow_ones():
    """The CPU suite's rounds: every fn called once per round in a rotating order; a case of microseconds
    runs past `rounds` until it has run min_s (at most 20 x rounds), a slow one stops at its budget after at
    least 3 rounds."""
    import time

    from benchmarks.suites.cpu import time_rounds

    calls = []
    times = time_rounds({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, rounds=5, budget_s=10.0,
                        min_s=60.0)
    assert len(times["a"]) == len(times["b"]) == 100  # min_s not reached: 20 x rounds
    assert calls[2:6] == ["a", "b", "b", "a"]  # after the warm-up calls, the order rotates each round
    times = time_rounds({"a": lambda: time.sleep(0.002)}, rounds=5, budget_s=10.0, min_s=0.0)
    assert len(times["a"]) == 5  # min_s reached: `rounds` rounds
    times = time_rounds({"a": lambda: time.sleep(0.02)}, rounds=50, budget_s=0.01, min_s=1.0)
    assert len(times["a"]) == 3  # over budget: 3 rounds


def test_gnn_headline_states_the_dense_part_bound():
    rows = [_row("gnn", "SAGEConv x", "sparsetorch", 3.0, dense_part_ms=2.0),
            _row("gnn", "SAGEConv x", "torch_geometric edge_index", 3.3, dense_part_ms=2.0)]
    line = next(h for h in report.gnn_headlines(rows) if "SAGEConv x" in h)
    assert "the dense part alone 2 ms, torch_geometric's step 1.65x it" in line, line


@pytest.mark.parametrize("layer", ["GCNConv", "SAGEConv"])
def test_dense_part_is_the_layer_without_its_aggregation(layer):
    """DENSE_PART's layers compute what the library layer computes when the aggregation is the identity
    (a graph of self loops only, no normalisation effect), with the same parameter names."""
    import torch

    import sparsetorch as st
    from benchmarks.suites.gnn_common import DENSE_PART

    torch.manual_seed(0)
    ours = getattr(st.nn, layer)(8, 5)
    dense = getattr(DENSE_PART, layer)(8, 5)
    state = ours.state_dict()
    if layer == "GCNConv":  # PyG's GCNConv: an unbiased lin and a separate bias
        dense.lin.weight.data.copy_(state["lin.weight"])
        dense.lin.bias.data.copy_(state["bias"])
    else:
        dense.load_state_dict(state)
    x = torch.randn(6, 8, dtype=torch.float64)
    ours, dense = ours.double(), dense.double()
    loops = torch.arange(6).repeat(2, 1)
    # GCN adds self loops itself (a self loop per node: D^-1/2 (I) D^-1/2 = I); SAGE's mean of one neighbour
    graph = torch.empty(2, 0, dtype=torch.int64) if layer == "GCNConv" else loops
    torch.testing.assert_close(dense(x, None), ours(x, graph))


def test_minibatch_rows_carry_the_dense_part():
    import torch

    from benchmarks.harness import make_timer
    from benchmarks.suites.common import Context
    from benchmarks.suites.gnn_common import power_law_edge_index
    from benchmarks.suites.minibatch import minibatch_rows

    dev = torch.device("cpu")
    ctx = Context(dev, make_timer(dev, True), None, False, None)
    graph = power_law_edge_index(3000, 20000, seed=1, device="cpu")
    rows = minibatch_rows(ctx, "tiny", graph, 3000, "SAGEConv", (4, 3), steps=1)
    assert rows and all(r["dense_part_ms"] > 0 for r in rows)
    assert rows[0]["impl"] == "sparsetorch"


def test_harness_times_every_call_through_sparsetorch_timing():
    """One timing rule: nothing under benchmarks/ makes its own CUDA events, calls triton's do_bench or
    reaches into private torch APIs (sparsetorch._compat holds those)."""
    import os
    import re

    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "benchmarks")
    banned = re.compile(r"Event\(enable_timing|do_bench\(|torch\._C\.|\"_op\"|\._op\b|_sleep")
    found = []
    for folder, _, files in os.walk(root):
        for name in files:
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as f:
                    found += [f"{name}:{i}: {line.strip()}" for i, line in enumerate(f, 1) if banned.search(line)]
    assert not found, "\n".join(found)


def test_once_and_host_seconds_measure_the_call():
    import time

    import torch

    from benchmarks.harness import host_seconds, make_step_timer, once

    cpu = torch.device("cpu")
    out, seconds = once(lambda: time.sleep(0.02) or "result", cpu)
    assert out == "result" and 0.02 <= seconds < 1.0
    assert 0.02 <= host_seconds(lambda: time.sleep(0.02), cpu) < 1.0
    assert 0.005 <= make_step_timer(cpu, True)(lambda: time.sleep(0.005)) < 1.0


def test_distributed_suite_rehearses_on_cpu_processes(tmp_path, monkeypatch):
    """--device cpu runs the distributed suite on 2 gloo processes (a 20k-node graph): one GPU's and two
    ranks' rows, the two ranks' product equal to the one rank's."""
    from benchmarks.run import main

    monkeypatch.setenv("SPARSETORCH_BENCH_DIST_RANKS", "2")
    out = tmp_path / "dist"
    main(["--device", "cpu", "--suites", "distributed", "--no-plots", "--out", str(out)])
    rows = json.loads((out / "results.json").read_text())["rows"]
    impls = {r["impl"] for r in rows}
    assert {"1 GPU: DistributedCSR", "2 GPUs (all-to-all)"} <= impls
    two = [r for r in rows if r["impl"] == "2 GPUs (all-to-all)" and r["case"].startswith("spmm")]
    assert two and all(r["rel_err"] < 1e-5 and r["time_ms"] > 0 for r in two)
