"""A table of the skew suite (python -m benchmarks --suites skew): per case the default call,
the route it took, the fastest route and torch.sparse.mm, with their errors against float64.

    python -m benchmarks.skew_summary results.json [more.json ...] > summary.md
"""
from __future__ import annotations

import json
import math
import sys
from collections import defaultdict


def summarize(path: str) -> str:
    rows = json.load(open(path))["rows"]
    times, loops, errs, route = defaultdict(dict), defaultdict(dict), {}, {}
    for r in rows:
        if r["suite"] != "skew":
            continue
        times[r["case"]][r["impl"]] = r["time_ms"] * 1e3
        if r.get("loop_ms") is not None:  # calls back to back, host time included (CUDA rows)
            loops[r["case"]][r["impl"]] = r["loop_ms"] * 1e3
        errs[(r["case"], r["impl"])] = r.get("rel_err")
        if r["impl"] == "st.spmm (default)":
            route[r["case"]] = r.get("route", "?")
    out = [f"## {path}", "",
           "| case | default (us) | its route | fastest other (us) | default / fastest | torch.sparse.mm (us) | "
           "torch / default | error default, fastest | in a loop: default, fastest other (us) |",
           "|---|---:|---|---|---:|---:|---:|---|---|"]
    ratios, below, loop_ratios, loop_below = [], 0, [], 0
    for case, t in times.items():
        d = t["st.spmm (default)"]
        fastest = min((v, k) for k, v in t.items() if k != "st.spmm (default)")
        of_best = fastest[0] / d
        below += of_best < 0.9
        torch_t = t.get("torch.sparse.mm")
        if torch_t:
            ratios.append(torch_t / d)
        loop, in_loop = loops.get(case, {}), ""
        if "st.spmm (default)" in loop and len(loop) > 1:
            ld = loop["st.spmm (default)"]
            lf = min((v, k) for k, v in loop.items() if k != "st.spmm (default)")
            loop_below += lf[0] / ld < 0.9
            if "torch.sparse.mm" in loop:
                loop_ratios.append(loop["torch.sparse.mm"] / ld)
            in_loop = f"{ld:.1f}, {lf[1].replace('route ', '')} {lf[0]:.1f}"
        out.append(f"| {case} | {d:.1f} | {route[case]} | {fastest[1].replace('route ', '')} {fastest[0]:.1f} | "
                   f"{of_best:.2f} | {torch_t:.1f} | {torch_t / d:.2f} | "
                   f"{errs[(case, 'st.spmm (default)')]:.1e}, {errs[(case, fastest[1])]:.1e} | {in_loop} |")
    gm = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    out += ["", f"{len(times)} cases: the default call is {gm:.2f}x torch.sparse.mm (geomean); {below} cases below "
                f"0.9x the fastest of torch.sparse.mm and every route."]
    if loop_ratios:
        lgm = math.exp(sum(math.log(x) for x in loop_ratios) / len(loop_ratios))
        out.append(f"In a loop (calls back to back, host time included): {lgm:.2f}x torch.sparse.mm (geomean over "
                   f"{len(loop_ratios)} cases); {loop_below} cases below 0.9x the fastest other.")
    out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    print("\n".join(summarize(p) for p in sys.argv[1:]))
