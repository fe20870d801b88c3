"""Tables from a pruned-suite run (python -m benchmarks --suites pruned --out DIR):
time / dense F.linear per shape, sparsity and token count for SparseLinear (the route it chose), its 2:4 form
alone, torch's 2:4 paths and BSR; the MLP block; the host time per call of the cuSPARSELt paths; the largest
error against float64.

    python -m benchmarks.pruned_summary DIR [--md DIR/summary.md]
"""
from __future__ import annotations

import argparse
import json
import os
from collections import OrderedDict, defaultdict

IMPLS = ("sparsetorch", "sparsetorch 2:4 form", "torch to_sparse_semi_structured", "torch._cslt_sparse_mm")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--md", default=None)
    args = ap.parse_args()
    with open(os.path.join(args.results, "results.json")) as f:
        data = json.load(f)
    rows = [r for r in data["rows"] if r["suite"] == "pruned"]
    by = defaultdict(dict)  # (shape, sparsity) -> (n, impl) -> row
    for r in rows:
        by[(r["shape"], r["sparsity"])][(r["n"], r["impl"])] = r
    ns = sorted({r["n"] for r in rows if not r["shape"].startswith("MLP")})
    lines = [f"# Pruned layers vs dense F.linear: {data['meta']['device']}, {data['meta']['date']}", "",
             "Ratio = dense F.linear time / this time (> 1: faster than dense); the route SparseLinear chose in "
             f"brackets. {rows[0]['dtype'] if rows else ''}, y = x @ W.T, same run.", ""]
    head = "| weight | sparsity | impl | " + " | ".join(f"N = {n}" for n in ns) + " |"
    lines += [head, "|" + "---|" * (3 + len(ns))]
    for (shape, sp), cells in by.items():
        if shape.startswith("MLP"):
            continue
        for impl in IMPLS + tuple(sorted({i for _, i in cells if i.startswith("torch BSR")})):
            if not any((n, impl) in cells for n in ns):
                continue
            vals = []
            for n in ns:
                r = cells.get((n, impl))
                if r is None or not r.get("vs_dense"):
                    vals.append("")
                    continue
                route = f" ({r['route']})" if impl == "sparsetorch" and r.get("route") else ""
                vals.append(f"{r['vs_dense']:.2f}x{route}")
            lines.append(f"| {shape} | {sp} | {impl} | " + " | ".join(vals) + " |")
    lines += ["", "MLP block (gate/up/down, SiLU), SparseLinear vs dense F.linear:", "",
              "| block | sparsity | N | sparsetorch ms | dense ms | ratio | routes (gate/up/down) |", "|---|---|---|---|---|---|---|"]
    for (shape, sp), cells in by.items():
        if not shape.startswith("MLP"):
            continue
        for n in sorted({n for n, _ in cells}):
            s, d = cells.get((n, "sparsetorch")), cells.get((n, "dense F.linear"))
            if s and d:
                lines.append(f"| {shape} | {sp} | {n} | {s['time_ms']:.4f} | {d['time_ms']:.4f} | "
                             f"{d['time_ms'] / s['time_ms']:.2f}x | {s.get('route', '')} |")
    host = defaultdict(list)
    for r in rows:
        if r.get("host_us_per_call"):
            host[r["impl"]].append(r["host_us_per_call"])
    lines += ["", "Host time per call (us, median over cases): " + ", ".join(
        f"{impl} {sorted(v)[len(v) // 2]:.1f} (min {min(v):.1f}, max {max(v):.1f})" for impl, v in host.items())]
    errs = OrderedDict()
    for r in rows:
        if r["impl"].startswith("sparsetorch"):
            errs[r["impl"]] = max(errs.get(r["impl"], 0.0), r["rel_err"])
    lines += ["", "Largest relative Frobenius error vs float64: " + ", ".join(f"{k} {v:.2e}" for k, v in errs.items())]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)


if __name__ == "__main__":
    main()
