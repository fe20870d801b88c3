"""Counts for the safety tests: every (corruption, entry point) pair of tests/_corruptions.py on one
device, each worker process running pairs until one kills it or its CUDA context (then a new one goes
on from the next pair), tallied by outcome.

    python -m benchmarks.safety_probe --device cuda --out safety.json

tests/test_safety.py asserts the rules; this prints how many pairs ended how (raised / silent / crash /
dead context / inputs changed), for the default entry points and for validate=False separately.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")
sys.path.insert(0, TESTS)


def run_all(device: str) -> list:
    import _corruptions as C

    return [r for index_dtype in ("int32", "int64") for layout in ("single", "batched")
            for r in C.run_isolated(device, index_dtype, layout)]


def summarize(results: list) -> None:
    for opt_out in (False, True):
        sel = [r for r in results if ("validate=False" in r["entry"]) == opt_out]
        c = Counter()
        for r in sel:
            c["pairs"] += 1
            c["crash"] += r["outcome"] == "crash"
            c["dead context"] += r["outcome"] != "crash" and r.get("healthy_after") is False
            c["inputs changed"] += r.get("inputs_unchanged") is False
            c["no error"] += r["outcome"] == "no error"
            c["raised"] += r["outcome"].startswith("raised")
            c["rule broken"] += r["verdict"] is not None
        print(("validate=False" if opt_out else "default") + ": " + ", ".join(f"{k} {v}" for k, v in c.items()))
    for r in results:
        if r["verdict"]:
            print(f"  {r['index_dtype']} {r['layout']:7s} {r['corruption']:18s} {r['entry']:30s} {r['verdict'][:120]}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    found = run_all(args.device)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(found, f, indent=1)
    summarize(found)
