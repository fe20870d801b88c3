"""Tables, headline ratios, JSON/CSV/markdown files and matplotlib plots from the benchmark rows."""
from __future__ import annotations

import csv
import json
import math
import os
from collections import OrderedDict, defaultdict
from typing import Dict, List, Optional

from benchmarks.ratios import geomean, summary, versus
from benchmarks.suites.cpu import headlines as cpu_headlines
from benchmarks.suites.decode import headlines as decode_headlines
from benchmarks.suites.serving import headlines as serving_headlines
from benchmarks.suites.compile import headlines as compile_headlines
from benchmarks.suites.skew import summarize as skew_summary

NOTES = [
    "`sparsetorch is` compares that implementation's time with sparsetorch's (fp32, `SpmmPlan` with backend "
    "\"auto\") in the same case, in words: \"1.21x faster\" means sparsetorch took 1/1.21 of its time. "
    "Elementwise rows compare within a dtype. The JSON/CSV keep the number as `speedup` (their time / ours).",
    "`floor` is max(bytes / copy bandwidth, flops / GEMM rate) with the byte and flop models of "
    "benchmarks/suites/common.py and both ceilings measured once at the start of the run (the copy row of "
    "the elementwise suite is that measurement); `of floor` is floor / time. `-` where a row has no byte or "
    "flop model (host overhead, accuracy). The copy moves far more than the last-level cache holds, so a small "
    "case whose operands stay in cache between calls can read above 100%: its floor is the memory's.",
    "Every output was checked against a float64 reference (cuSPARSE in float64 for the graphs on CUDA, "
    "dense float64 products elsewhere) before it was timed; the dense operand is rotated through copies "
    "when one call's inputs would otherwise still sit in L2.",
    "cupy is called as users call it (`csr_matrix @ ndarray` with a row-major ndarray); torch_geometric "
    "is `SimpleConv(aggr=\"sum\")` with edge weights, i.e. its message passing for the same product.",
    "gnn rows time one training step (forward + backward + Adam) of a 2-layer GCN / GraphSAGE; `peak_GiB` in "
    "the JSON/CSV is the most memory allocated during a step by that variant (benchmarks/suites/gnn.py); "
    "`dense_part_ms` the same step with every layer's aggregation removed (its GEMMs, ReLU, loss and Adam), "
    "work both libraries do, so torch_geometric's time / the dense part's bounds the ratio a step can reach "
    "(approximately: separate timings, and with batches moved each step the copies' waits overlap differently).",
]

REFERENCE_IMPL = {"density": "sparsetorch", "graphs": "sparsetorch", "batched": "sparsetorch",
                  "elementwise": "st.bias_act gelu (fused)", "skew": "st.spmm (default)", "distributed": "2 GPUs",
                  "cpu": "sparsetorch", "decode": "sparsetorch"}


def add_speedups(rows: List[dict]) -> None:
    """row["speedup"] = this implementation's time / sparsetorch's time in the same case (and suite,
    dtype-independent): > 1 means sparsetorch is faster."""
    def key(r):  # elementwise compares within a dtype; the SpMM suites against sparsetorch in fp32
        return r["suite"], r["case"], r.get("cpu"), r["dtype"] if r["suite"] == "elementwise" else None

    ours = {}
    for r in rows:
        if r["impl"] == REFERENCE_IMPL.get(r["suite"]) and key(r) not in ours:
            ours[key(r)] = r["time_ms"]
    for r in rows:
        t = ours.get(key(r))
        r["speedup"] = r["time_ms"] / t if t else None


def _density_ratios(rows: List[dict]) -> Dict[str, List[tuple]]:
    """Per dense baseline of the density sweep: sorted (density, sparsetorch time / its time); < 1: sparse wins."""
    by_impl = defaultdict(dict)
    for r in rows:
        if r["suite"] == "density" and not r.get("cpu"):
            by_impl[r["impl"]][r["density"]] = r["time_ms"]
    ours = by_impl.get("sparsetorch", {})
    return {impl: sorted((d, ours[d] / times[d]) for d in times if d in ours)
            for impl, times in by_impl.items() if impl.startswith("dense")}


def crossovers(rows: List[dict]) -> Dict[str, Optional[float]]:
    """Density below which sparsetorch (fp32) beats each dense baseline, interpolated in log density: the
    highest density swept where it wins everywhere swept, 0.0 where it wins nowhere, None without data or
    where the sweep does not cross once (see :func:`crossover_lines` for the words)."""
    out = {}
    for impl, pts in _density_ratios(rows).items():
        out[impl] = None
        if not pts:
            continue
        if all(r < 1 for _, r in pts):
            out[impl] = pts[-1][0]  # wins everywhere measured
            continue
        for (d0, r0), (d1, r1) in zip(pts, pts[1:]):
            if r0 < 1 <= r1:
                t = (math.log(r0)) / (math.log(r0) - math.log(r1))
                out[impl] = math.exp(math.log(d0) + t * (math.log(d1) - math.log(d0)))
                break
        else:
            out[impl] = 0.0 if pts[0][1] >= 1 else None
    return out


def crossover_lines(rows: List[dict]) -> List[str]:
    """The density sweep's crossovers in words, saying where the sweep ends when no crossover was seen."""
    lines = []
    cross = crossovers(rows)
    for impl, pts in _density_ratios(rows).items():
        d = cross.get(impl)
        if not pts or d is None:
            continue
        lo, hi = 100 * pts[0][0], 100 * pts[-1][0]
        if all(r < 1 for _, r in pts):
            lines.append(f"density sweep: sparsetorch (fp32) is faster than {impl} at every density swept "
                         f"(up to {hi:.3g}%; the crossover lies above)")
        elif d == 0.0:
            lines.append(f"density sweep: {impl} is faster than sparsetorch (fp32) at every density swept "
                         f"(down to {lo:.3g}%)")
        else:
            lines.append(f"density sweep: sparsetorch (fp32) is faster than {impl} below {100 * d:.3g}% density "
                         f"(interpolated between the densities swept, {lo:.3g}% .. {hi:.3g}%)")
    return lines


def headlines(rows: List[dict]) -> List[str]:
    lines = crossover_lines(rows)
    times16 = defaultdict(dict)  # impl -> density -> ms, the bf16 rows of the density sweep
    for r in rows:
        if r["suite"] == "density" and r["impl"] in ("sparsetorch bf16", "torch.sparse.mm bf16"):
            times16[r["impl"]][r["density"]] = r["time_ms"]
    ratios16 = {d: t / times16["sparsetorch bf16"][d] for d, t in times16["torch.sparse.mm bf16"].items()
                if d in times16["sparsetorch bf16"]}
    if ratios16:
        at10 = f"; {versus(ratios16[0.1])} at 10%" if 0.1 in ratios16 else ""
        lines.append(f"density sweep: sparsetorch bf16 {summary(list(ratios16.values()), 'torch.sparse.mm bf16', 'densities')}"
                     f"{at10}")
    for suite, baselines in (("graphs", ("torch.sparse.mm", "cupy", "torch_geometric", "scipy")),
                             ("batched", ("block-diagonal torch.sparse.mm", "loop of torch.sparse.mm",
                                          "dense bmm fp32", "dense bmm tf32"))):
        for base in baselines:
            sp = [r["speedup"] for r in rows if r["suite"] == suite and r["impl"] == base and r.get("speedup")
                  and not r.get("cpu")]
            if sp:
                lines.append(f"{suite}: sparsetorch {summary(sp, base)}")
    lines += gnn_headlines(rows)
    lines += cpu_headlines(rows)
    for r in rows:
        if r["suite"] == "elementwise" and r["impl"].startswith("st.bias_act"):
            others = {x["impl"]: x for x in rows if x["suite"] == "elementwise" and x["dtype"] == r["dtype"]}
            parts = [f"{100 * r['of_floor']:.0f}% of the copy ceiling ({r['GBps']:.0f} of "
                     f"{r['GBps'] / r['of_floor']:.0f} GB/s)" if r.get("of_floor") else "no floor"]
            for name in ("eager gelu(x*scale+bias)", "torch.compile gelu(x*scale+bias)"):
                if name in others and others[name].get("speedup"):
                    parts.append(versus(others[name]["speedup"], name.split(" ")[0]))
            lines.append(f"fused bias+gelu {r['dtype']}{' (cpu)' if r.get('cpu') else ''}: " + ", ".join(parts))
    lines += skew_summary(rows)
    lines += decode_headlines(rows)
    lines += serving_headlines(rows)
    lines += compile_headlines(rows)
    return lines


def gnn_headlines(rows: List[dict]) -> List[str]:
    """Per training-step case: sparsetorch against torch_geometric's fastest variant, time and peak
    memory; per accuracy case: the test accuracies."""
    lines = []
    by_case = OrderedDict()
    for r in rows:
        if r["suite"] == "gnn":
            by_case.setdefault((r["case"], bool(r.get("cpu"))), {})[r["impl"]] = r
    for (case, cpu), impls in by_case.items():
        ours = impls.get("sparsetorch")
        others = {k: v for k, v in impls.items() if k.startswith("torch_geometric")}
        if ours is None or not others:
            continue
        where = " (cpu)" if cpu else ""
        if "test_acc" in ours:
            parts = [f"{k} {100 * v['test_acc']:.1f}%" for k, v in others.items()]
            lines.append(f"gnn {case}{where}: test accuracy sparsetorch {100 * ours['test_acc']:.1f}% vs "
                         + ", ".join(parts))
            continue
        best = min(others.items(), key=lambda kv: kv[1]["time_ms"])
        line = (f"gnn {case}{where}: sparsetorch {versus(best[1]['time_ms'] / ours['time_ms'])} than "
                f"torch_geometric's fastest ({best[0][len('torch_geometric '):]}: {best[1]['time_ms']:.3g} ms, "
                f"sparsetorch {ours['time_ms']:.3g} ms")
        if ours.get("peak_GiB") is not None and best[1].get("peak_GiB") is not None:
            line += f"; peak {ours['peak_GiB']:.2f} GiB vs {best[1]['peak_GiB']:.2f} GiB"
        if ours.get("dense_part_ms"):  # the step without its aggregation: what no aggregation can remove
            dense = ours["dense_part_ms"]
            line += (f"; the dense part alone {dense:.3g} ms, torch_geometric's step "
                     f"{best[1]['time_ms'] / dense:.2f}x it")
        lines.append(line + ")")
    return lines


HEADER = ("suite", "case", "impl", "dtype", "time ms", "GB/s", "GFLOP/s", "floor ms", "of floor", "sparsetorch is")


def _num(value, fmt: str) -> str:
    """A measured quantity, or "-" where the row has none (no byte or flop model: host overhead, accuracy)."""
    return "-" if not value else format(value, fmt)


def _cells(r: dict, cpu_mark: str) -> List[str]:
    """One row's cells, formatted the same for the markdown table and the terminal."""
    reference = r["impl"] == REFERENCE_IMPL.get(r["suite"])
    return [r["suite"] + (cpu_mark if r.get("cpu") else ""), r["case"], r["impl"], r["dtype"],
            f"{r['time_ms']:.4g}", _num(r.get("GBps"), ".0f"), _num(r.get("GFLOPs"), ".0f"),
            _num(r.get("floor_ms"), ".3g"), "-" if not r.get("of_floor") else f"{100 * r['of_floor']:.0f}%",
            "(reference)" if reference else versus(r.get("speedup"))]


def table(rows: List[dict]) -> str:
    lines = [" | ".join(HEADER), " | ".join("---" for _ in HEADER)]
    lines += [" | ".join(_cells(r, " (cpu)")) for r in rows]
    return "\n".join(lines)


def print_table(rows: List[dict]) -> None:
    """The rows in aligned columns as wide as their longest cell (nothing cut off), a blank line between cases."""
    cells = [_cells(r, "/cpu") for r in rows]
    widths = [max([len(h)] + [len(c[i]) for c in cells]) for i, h in enumerate(HEADER)]

    def line(values):
        return "  ".join(v.ljust(w) if i < 4 else v.rjust(w) for i, (v, w) in enumerate(zip(values, widths))).rstrip()

    print(line(HEADER))
    last_case = None
    for r, c in zip(rows, cells):
        if r["case"] != last_case and last_case is not None:
            print()
        last_case = r["case"]
        print(line(c))
    print("(sparsetorch is: its time against that implementation's in the same case; floor = max(bytes / copy "
          "bandwidth, flops / GEMM rate), both measured once in this run, from memory: a case small enough to stay "
          "in cache can read above 100%; - : no byte/flop model for the row)")


def write(out_dir: str, meta: dict, rows: List[dict], plots: bool) -> List[str]:
    os.makedirs(out_dir, exist_ok=True)
    written = []
    path = os.path.join(out_dir, "results.json")
    with open(path, "w") as f:
        json.dump({"meta": meta, "headlines": headlines(rows), "crossovers": crossovers(rows), "rows": rows}, f,
                  indent=1)
    written.append(path)
    path = os.path.join(out_dir, "results.csv")
    keys = list(OrderedDict((k, None) for r in rows for k in r))
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys)
        w.writeheader()
        w.writerows(rows)
    written.append(path)
    if plots:
        written += make_plots(out_dir, rows)
    path = os.path.join(out_dir, "README.md")
    with open(path, "w") as f:
        f.write(f"# sparsetorch benchmark: {meta['device']}\n\n")
        f.write(f"Regenerate: `{meta['command']}`\n\n")
        if meta.get("partial"):
            cut = f" ({meta['unfinished']} finished)" if meta.get("unfinished") else ""
            f.write(f"**Partial**: the run stopped after the suites {', '.join(meta['suites'])}{cut}.\n\n")
        f.write(f"torch {meta['torch']}, sparsetorch {meta['sparsetorch']}, {meta['date']}. Ceilings measured in "
                f"this run: copy {meta['copy_GBps']:.0f} GB/s, GEMM " +
                ", ".join(f"{k} {v / 1e12:.1f} TFLOP/s" for k, v in meta["gemm_flops"].items()) + ".\n\n")
        f.write("## Headlines\n\n" + "".join(f"- {h}\n" for h in headlines(rows)) + "\n")
        if meta.get("left_out"):
            f.write("## Left out of this run\n\n" + "".join(f"- {line}\n" for line in meta["left_out"]) + "\n")
        f.write("## How to read the rows\n\n" + "".join(f"- {n}\n" for n in NOTES + meta.get("notes", [])) + "\n")
        for png in (p for p in written if p.endswith(".png")):
            f.write(f"![{os.path.basename(png)}]({os.path.basename(png)})\n\n")
        f.write("## All rows\n\n" + table(rows) + "\n")
    written.append(path)
    return written


_FACTORS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 4, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)


def _factor(v: float) -> str:
    return f"{v:g}x"


def _speedup_axis(ax, values: List[float], label: str, baseline: str = "1x: the same time") -> None:
    """A log axis for ratios, labelled in plain factors (0.5x, 1x, 2x, ...), with the 1x line marked."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator

    finite = [v for v in values if v and math.isfinite(v) and v > 0] or [1.0]
    lo, hi = min(min(finite), 1.0) / 1.3, max(max(finite), 1.0) * 1.3
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ticks = [f for f in _FACTORS if lo <= f <= hi]
    if len(ticks) > 8:  # keep the 1-2-5 steps only
        ticks = [f for f in ticks if str(f).lstrip("0.").rstrip("0")[:1] in ("1", "2", "5")]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: _factor(v)))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.axhline(1.0, color="black", linewidth=1.0, linestyle="--", label=baseline)  # named in the legend
    ax.set_ylabel(label)


def _title(ax, text: str, fig_width_in: float) -> None:
    """A title wrapped to the figure's width (about 11 characters per inch at 11 pt)."""
    import textwrap

    ax.set_title("\n".join(textwrap.wrap(text, max(30, int(fig_width_in * 11)))), fontsize=11)


def _bar_groups(ax, groups: List[str], impls: List[str], value) -> List[float]:
    width = 0.8 / max(1, len(impls))
    shown = []
    for j, impl in enumerate(impls):
        vals = [value(g, impl) for g in groups]
        shown += vals
        ax.bar([i + j * width for i in range(len(groups))], vals, width, label=impl)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(groups))])
    ax.set_xticklabels(groups, rotation=30, ha="right", fontsize=8)
    return shown


def make_plots(out_dir: str, rows: List[dict]) -> List[str]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plots (pip install matplotlib)")
        return []
    written = []

    def save(fig, name):
        fig.tight_layout()
        path = os.path.join(out_dir, name)
        fig.savefig(path, dpi=120)
        plt.close(fig)
        written.append(path)

    density = [r for r in rows if r["suite"] == "density" and not r.get("cpu")]
    if density:
        fig, ax = plt.subplots(figsize=(9, 4.8))
        impls = list(OrderedDict((r["impl"], None) for r in density))
        for impl in impls:
            pts = sorted((r["density"], r["time_ms"]) for r in density if r["impl"] == impl)
            ax.plot([100 * d for d, _ in pts], [t for _, t in pts], marker="o", label=impl)
        ratios = _density_ratios(rows)
        for impl, d in crossovers(rows).items():
            if d and not all(r < 1 for _, r in ratios[impl]):  # a crossover inside the sweep
                ax.axvline(100 * d, linestyle="--", linewidth=0.8, color="gray")
                ax.text(100 * d, ax.get_ylim()[1], f" vs {impl}: {100 * d:.2g}%", rotation=90, va="top",
                        fontsize=7)
        from matplotlib.ticker import FuncFormatter

        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}%"))  # plain numbers, not 10^k
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.set_xlabel("density of A (%)")
        ax.set_ylabel("time (ms, lower is better)")
        _title(ax, f"A @ B, {density[0]['case'].split(',')[0]}: sparse vs dense; dashed: density below which "
                   "sparsetorch (fp32) is faster", 9)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        save(fig, "density.png")
    for suite in ("graphs", "batched"):
        sel = [r for r in rows if r["suite"] == suite and r.get("speedup") and r["impl"] != "sparsetorch"
               and not r.get("cpu")]
        if not sel:
            continue
        # Graphs: one bar group per graph, the geometric mean over its feature widths.
        group = (lambda r: r["graph"]) if suite == "graphs" else (lambda r: r["case"])
        cases = list(OrderedDict((group(r), None) for r in sel))
        impls = list(OrderedDict((r["impl"], None) for r in sel))
        width_in = min(16, max(8, 0.3 * len(cases) * len(impls)))
        fig, ax = plt.subplots(figsize=(width_in, 5))

        def value(c, impl):
            got = [r["speedup"] for r in sel if group(r) == c and r["impl"] == impl]
            return geomean(got) if got else float("nan")

        shown = _bar_groups(ax, cases, impls, value)
        _speedup_axis(ax, shown, "sparsetorch's speedup\n(their time / ours; above 1x: ours faster)")
        _title(ax, f"{suite}: sparsetorch against each baseline"
               + (", geomean over feature widths" if suite == "graphs" else ""), width_in)
        ax.legend(fontsize=7)
        save(fig, f"{suite}_speedup.png")
    gnn = [r for r in rows if r["suite"] == "gnn" and not r.get("cpu") and "test_acc" not in r]
    if gnn:
        cases = list(OrderedDict((r["case"], None) for r in gnn))
        impls = list(OrderedDict((r["impl"], None) for r in gnn if r["impl"] != "sparsetorch"))
        by = {(r["case"], r["impl"]): r for r in gnn}
        width_in = min(16, max(9, 0.45 * len(cases) * max(1, len(impls))))
        memory = any(r.get("peak_GiB") for r in gnn)  # measured on CUDA only
        fig, axes = plt.subplots(2 if memory else 1, 1, figsize=(width_in, 8 if memory else 5), sharex=True,
                                 squeeze=False)
        ax_t = axes[0][0]

        def ratio(key):
            def value(c, impl):
                theirs, ours = by.get((c, impl)), by.get((c, "sparsetorch"))
                if not theirs or not ours or not theirs.get(key) or not ours.get(key):
                    return float("nan")
                return theirs[key] / ours[key]
            return value

        shown = _bar_groups(ax_t, cases, impls, ratio("time_ms"))
        _speedup_axis(ax_t, shown, "step-time speedup\n(their time / ours)")
        _title(ax_t, "GNN training step (forward + backward + Adam): sparsetorch against torch_geometric",
               width_in)
        ax_t.legend(fontsize=7)
        if memory:
            ax_m = axes[1][0]
            shown = _bar_groups(ax_m, cases, impls, ratio("peak_GiB"))
            _speedup_axis(ax_m, shown, "peak-memory ratio\n(their peak / ours)", "1x: the same peak memory")
            ax_m.legend(fontsize=7)
        save(fig, "gnn_speedup.png")
    return written


def replot(out_dir: str, plots: bool = True) -> List[str]:
    """Rewrite README.md, CSV and plots of a results folder from its results.json."""
    with open(os.path.join(out_dir, "results.json")) as f:
        data = json.load(f)
    return write(out_dir, data["meta"], data["rows"], plots)
