"""Where the serving suite's first pass goes (benchmarks/suites/serving.py; issue 63), one run each:

    python -m benchmarks.serving_profile [--cases 2:4,90%,70%] [--table] [--call-kinds] [--samples]
                                          [--dense-runs N] [--pin CPU]

For each MLP case: the dense sequence (after its untimed warm-up), then fresh SparseLinear layers over the
sequence twice, in default mode, with the tuning cache file that the default mode saved, and prepared
(``prepare()`` of the sequence's buckets first, untimed, by timing, as a first server process): each pass's total
against dense, the sum of the calls' event times and the rest of the wall time (silu, the product, the step's
synchronisation), the routes, each layer's calls per token-count range against dense's (pass 1 / pass 2), and
the calls whose first-pass cost exceeds their second-pass cost the most.
``--table``: torch.profiler over a third, cache-file first pass (host ops by self CPU time).
``--call-kinds``: each pass's calls grouped by what the layer did (CallKinds): count, time and ratio to dense's
same calls. Its bookkeeping runs inside the calls' event spans (a few us each, both passes alike).
``--samples``: after the default mode's passes, each bucket the tuner sampled (two or more candidates): its
decision, rule and largest count, every counted sample as (tokens, us), and each candidate form's time alone
at the bucket's smallest and largest counts (``st.timing.time_call``, clean L2): whether the samples saw what
the forms cost.
``--dense-runs N``: the dense sequence N times (the ratios take the median run): how far one process's host
moves between runs of the same work (the serving suite's dense runs fell at ~60 or ~83 ms in one process on an
H100 host, 2026-12-08). ``--pin CPU``: the process pinned to that CPU first (``os.sched_setaffinity``), to see
whether the spread follows the scheduler's placement.
"""
from __future__ import annotations

import argparse
import os
import tempfile

import torch

import sparsetorch as st
from benchmarks.harness import make_timer
from sparsetorch.nn.linear import _bucket
from sparsetorch.pruned.sparse24 import PLANS
from sparsetorch.tuning import tuner
from benchmarks.suites import serving
from benchmarks.suites.common import Context


class CallKinds:
    """A SparseLinear whose calls are labelled by what the layer did: "bound" (the bucket's bound call, the
    steady path; "bound, renting" while it runs dense to repay a form), "first" (the bucket's first call: its
    rule), "undecided" (a later call of an undecided bucket), with "+sample" where the tuner handed out a
    sample, "+build" where a form was built, "+plan" where cuSPARSELt made a plan for a new token count, and
    "+plan deferred" where the 2:4 form ran dense at a count's first request to this layer."""

    def __init__(self, layer):
        self.layer, self.kinds = layer, []

    def _issued(self, bucket: int) -> int:
        entry = tuner("linear")._entries.get(self.layer._tuning_key(bucket))
        return 0 if entry is None else sum(c.issued for c in entry.candidates.values())

    def __call__(self, x):
        derived, bucket = self.layer._derived, _bucket(x.shape[0])
        bound = derived.runners.get(bucket)
        first = bucket not in derived.rules and bucket not in derived.choices
        forms, issued = set(derived.forms), self._issued(bucket)
        plans, requests = len(PLANS), len(derived.plan_requests)
        y = self.layer(x)
        if bound is not None:
            kind = "bound, renting" if getattr(bound, "renting", False) else "bound"
        else:
            kind = "first" if first else "undecided"
        after = self.layer._derived
        kind += "+sample" * (self._issued(bucket) > issued) + "+build" * bool(set(after.forms) - forms)
        kind += "+plan" * (len(PLANS) > plans) + "+plan deferred" * (len(after.plan_requests) > requests)
        self.kinds.append(kind)
        return y


def _by_kind(watched, dense_costs, costs) -> str:
    """A pass's calls by CallKinds label: count, time, and dense's time on the same steps over it."""
    groups = {}
    for k, w in enumerate(watched):
        for i, kind in enumerate(w.kinds):
            g = groups.setdefault(kind, [0, 0.0, 0.0])
            g[0], g[1], g[2] = g[0] + 1, g[1] + costs[i][k], g[2] + dense_costs[i][k]
        w.kinds = []
    return ("    by call kind: " + "; ".join(f"{kind} {c} calls {t * 1e3:.2f} ms ({d / t:.2f}x dense)"
                                          for kind, (c, t, d) in sorted(groups.items(), key=lambda g: -g[1][1])))


def profile_case(ctx: Context, case: str, steps, table: bool, call_kinds: bool = False, samples: bool = False,
                 dense_runs: int = 1) -> None:
    _, seed, sparsity, scheme = serving.MLP_CASES[case]
    weights = serving._mlp_weights(ctx, seed)
    kinds = list(weights)
    dtype = weights["gate"].dtype
    pool, pool_inner = serving.input_pools(ctx, steps, weights)
    fresh = lambda: serving.fresh_layers(weights, sparsity, scheme)  # noqa: E731
    serving._warm_libraries(ctx, dtype)
    dense = [serving._dense_linear(layer.to_dense().detach()) for layer in fresh()]
    serving._run_sequence(ctx, dense, True, steps, pool, None)  # cuBLAS's first call per shape, untimed
    runs = [serving._run_sequence(ctx, dense, True, steps, pool, None) for _ in range(max(1, dense_runs))]
    dense_total, dense_costs = sorted(runs, key=lambda r: r[0])[len(runs) // 2]
    dense_calls = sum(map(sum, dense_costs))
    print(f"\n{case}: dense {dense_total * 1e3:.1f} ms (calls {dense_calls * 1e3:.1f} ms, rest "
          f"{(dense_total - dense_calls) * 1e3:.1f} ms)", flush=True)
    if len(runs) > 1:
        print(f"  dense runs in order (ms): {', '.join(f'{r[0] * 1e3:.1f}' for r in runs)}", flush=True)
    cache = os.path.join(tempfile.mkdtemp(prefix="st-serving-profile-"), "tuning.json")
    for mode in ("default", "cache file", "prepared"):
        st.clear_tuning()
        st.clear_caches()
        layers = fresh()
        if mode == "cache file":
            st.set_tuning_cache(cache)
        if mode == "prepared":
            for layer in layers:
                layer.prepare(steps)
        watched = [CallKinds(layer) for layer in layers] if call_kinds else None
        passes, kinds_of_pass = [], []
        for _ in range(2):
            passes.append(serving._run_sequence(ctx, watched or layers, True, steps, pool, None))
            kinds_of_pass.append(_by_kind(watched, dense_costs, passes[-1][1]) if call_kinds else None)
        if mode == "default":
            st.save_tuning_cache(cache)
            if samples:
                _sampled_buckets(ctx, kinds, layers, {"gate": pool, "up": pool, "down": pool_inner})
        st.set_tuning_cache(None)
        for i, (total, costs) in enumerate(passes):
            calls = sum(map(sum, costs))
            print(f"  {mode}, pass {i + 1}: {total * 1e3:.1f} ms ({dense_total / total:.3f}x dense; calls "
                  f"{calls * 1e3:.1f} ms, rest {(total - calls) * 1e3:.1f} ms)")
            if kinds_of_pass[i]:
                print(kinds_of_pass[i])
        for kind, layer in zip(kinds, layers):
            print(f"  routes of {kind}: {dict(sorted(layer.routes.items()))}")
        _by_range(steps, kinds, dense_costs, [c for _, c in passes])
        (_, first), (_, second) = passes
        extra = sorted(((a - b, i, k, a, b) for i, (r1, r2) in enumerate(zip(first, second))
                        for k, (a, b) in enumerate(zip(r1, r2))), reverse=True)
        print(f"  pass 1 over pass 2 in calls: {sum(d for d, *_ in extra if d > 0) * 1e3:.1f} ms; the largest:")
        for d, i, k, a, b in extra[:10]:
            print(f"    step {i:3d} {kinds[k]:4s} N={steps[i]:4d}: {a * 1e3:7.3f} ms, then {b * 1e3:7.3f} ms")
    if table:
        from torch.profiler import ProfilerActivity, profile

        st.clear_tuning()
        st.clear_caches()
        layers = fresh()
        st.set_tuning_cache(cache)
        activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if ctx.cuda else [])
        with profile(activities=activities) as prof:
            serving._run_sequence(ctx, layers, True, steps, pool, None)
        st.set_tuning_cache(None)
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25, max_name_column_width=60))


RANGES = ((1, 2), (3, 8), (9, 16), (17, 32), (33, 64), (65, 4096))


def _sampled_buckets(ctx: Context, kinds, layers, inputs) -> None:
    """Each sampled tuner entry of these layers (layers of one signature share theirs: gate and up): decision,
    rule, largest count, the counted samples (tokens, us), and each candidate form timed alone at the bucket's
    smallest and largest counts."""
    signatures = {}
    for kind, layer in zip(kinds, layers):
        signatures.setdefault(layer._tuning_key(0)[:-1], (kind, layer))
    found = 0
    for entry in tuner("linear").entries():
        kind, layer = signatures.get(tuple(entry["key"][:-1]), (None, None))
        if layer is None or len(entry["candidates"]) < 2:
            continue
        found += 1
        bucket = entry["key"][-1]
        seen = {name: [(round(size), round(ms * 1e3)) for ms, size in zip(c["costs_ms"], c["sizes"])]
                for name, c in entry["candidates"].items()}
        alone = []
        layer._refresh()  # _runner reads the current state
        with torch.no_grad():
            for n in sorted({bucket // 2 + 1, bucket}):
                x = inputs[kind][:n].contiguous()
                for name in entry["candidates"]:
                    if name.partition("#")[0] not in layer._derived.forms:
                        continue  # not built: a sample never ran it
                    call = layer._runner(name, x, bucket)
                    ms = st.timing.time_call(lambda: call(x), ctx.device, l2="clean", budget_ms=2.0, min_reps=3,
                                             max_reps=20)
                    alone.append(f"{name} at {n}: {ms * 1e3:.0f}")
        print(f"  sampled {kind} bucket {bucket}: decided {entry['route']} (rule {entry['rule']}, largest count "
              f"{entry['top_size']:.0f}); samples (tokens, us) {seen}; alone (us): {', '.join(alone)}")
    if not found:
        print("  sampled: no bucket had two candidates")


def _by_range(steps, kinds, dense_costs, pass_costs) -> None:
    """Calls' event time per token-count range and layer, dense against each pass: where a pass gains or loses."""
    for lo, hi in RANGES:
        idx = [i for i, n in enumerate(steps) if lo <= n <= hi]
        if not idx:
            continue
        parts = []
        for k, kind in enumerate(kinds):
            dense = sum(dense_costs[i][k] for i in idx)
            ours = [sum(costs[i][k] for i in idx) for costs in pass_costs]
            parts.append(f"{kind} {dense * 1e3:.2f} ms: " + "/".join(f"{dense / t:.2f}x" for t in ours))
        print(f"    N {lo}-{hi} ({len(idx)} steps): " + "; ".join(parts))


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.serving_profile", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="2:4,90%,70%", help="comma-separated: 2:4, 90%%, 70%%")
    ap.add_argument("--table", action="store_true", help="torch.profiler over a cache-file first pass")
    ap.add_argument("--call-kinds", action="store_true", help="each pass's calls by what the layer did")
    ap.add_argument("--samples", action="store_true", help="each sampled bucket's samples against its forms alone")
    ap.add_argument("--dense-runs", type=int, default=1, help="the dense sequence this many times (median taken)")
    ap.add_argument("--pin", type=int, default=None, metavar="CPU", help="pin the process to this CPU first")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    if args.pin is not None:
        os.sched_setaffinity(0, {args.pin})
        print(f"pinned to CPU {args.pin}")
    device = torch.device(args.device)
    ctx = Context(device, make_timer(device, True), None, True, None)
    steps = serving.serving_sequence(ctx.cuda)
    print(f"{len(steps)} steps, {sum(steps)} tokens, CUDA_MODULE_LOADING="
          f"{os.environ.get('CUDA_MODULE_LOADING', 'unset (lazy)')}")
    for case in args.cases.split(","):
        if case not in serving.MLP_CASES:
            ap.error(f"unknown case {case!r}; choose from {', '.join(serving.MLP_CASES)}")
        profile_case(ctx, case, steps, args.table, args.call_kinds, args.samples, args.dense_runs)


if __name__ == "__main__":
    main()
