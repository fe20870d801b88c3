"""The CPU suite: sparsetorch's CPU kernels against what CPU users already have, on the CPU (also when
the harness runs on a GPU machine).

  SpMM     graphs (random and power-law, Cora, CiteSeer, ca-CondMat) and pruned weights (uniform
           density 1-30%) times B of n = 1 .. 128 columns: torch.sparse.mm (MKL) and SciPy.
  SDDMM    A's pattern sampled from a @ b.T: torch.sparse.sampled_addmm.
  scale    GCN normalisation D^-1/2 A D^-1/2 of the values: eager torch indexing.
  elementwise  add, mul, the activations and the fused bias + GELU against eager torch (and
           torch.compile with --full), held to the copy bandwidth.

Implementations of one case are timed in rounds, each once per round, so that a change of load on a
shared machine hits them alike; rows carry the median and the range over the rounds. Every output is
checked against a float64 reference first. Floors as in common.py: max(bytes / copy bandwidth,
flops / fp32 GEMM rate), both measured in the run.
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Callable, Dict, List

import numpy as np
import torch

import sparsetorch as st
from benchmarks.harness import check, copy_elements, make_timer, measure_ceilings
from benchmarks.ratios import summary
from benchmarks.suites.common import TOL, Context, Job, spmm_model
from benchmarks.suites.graphs import power_law_graph, random_graph
from benchmarks.suites.graphs import real_graphs as all_real_graphs
from sparsetorch import timing

CPU = torch.device("cpu")
# Quick-run sizes (the full run: in cpu_suite). Tests shrink these.
# The elementwise tensors have the size of the copy that measured the CPU's ceiling (harness.copy_elements).
QUICK = {"graph_nodes": 20_000, "widths": (1, 16, 128), "pruned": (0.1,), "pruned_size": 2048,
         "elementwise": copy_elements(CPU), "rounds": 5, "budget_s": 3.0}


def time_rounds(fns: Dict[str, Callable[[], object]], rounds: int, budget_s: float,
                min_s: float = 0.25) -> Dict[str, List[float]]:
    """Seconds per call of each fn: one warm-up call each, then `rounds` rounds calling every fn once
    (at least 3 rounds; fewer than `rounds` when the case would exceed `budget_s`), and more rounds (up to
    20 x `rounds`) while the case has run for less than `min_s`: a case of microseconds gets a median
    over a few hundred calls (Cora, n = 16, read 0.79-1.94x MKL over three runs of 11 rounds, 1.96x
    over 300). The order rotates by one each round: a fixed order always ran sparsetorch right after
    SciPy's single-threaded call (cache cold, worker threads asleep) and read 0.84x MKL for a case that
    measured 1.04-1.13x with MKL first (pruned 2048^2 at 30%, n = 4, 2-core machine)."""
    for fn in fns.values():
        fn()
    times = {k: [] for k in fns}
    names = list(fns)
    start = time.perf_counter()  # the budgets' clock; each call is timed by sparsetorch.timing
    stop = start + budget_s
    for i in range(20 * rounds):
        if i >= rounds and time.perf_counter() - start >= min_s:
            break
        for j in range(len(names)):
            k = names[(i + j) % len(names)]
            times[k].append(1e-3 * timing.wall_time(fns[k], device=CPU, reps=1, warmup=0))
        if i >= 2 and time.perf_counter() > stop:
            break
    return times


def rows_for(ctx, base: dict, impls: Dict[str, tuple], ref: torch.Tensor, rounds: int, budget_s: float,
             ceilings) -> List[dict]:
    """impls: name -> (fn, bytes, flops, dtype label). Checks each fn's output against ref (float64),
    times them in rounds, returns one row per implementation."""
    ok = {}
    errs = {}
    for name, (fn, nbytes, flops, label) in impls.items():
        try:
            out = fn()
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run this case is reported, not fatal
            if name == "sparsetorch":
                raise
            ctx.leave_out(f"cpu {base['case']}: {name}", f"failed ({type(e).__name__}: {str(e)[:120]})")
            continue
        if isinstance(out, np.ndarray):
            out = torch.from_numpy(out)
        errs[name] = check(out, ref, f"cpu {base['case']}: {name}", TOL[label])
        ok[name] = fn
    times = time_rounds(ok, rounds, budget_s)
    rows = []
    for name, ts in times.items():
        _, nbytes, flops, label = impls[name]
        sec = statistics.median(ts)
        floor = ceilings.floor(nbytes, flops, "float32")
        rows.append({**base, "suite": "cpu", "impl": name, "dtype": label, "time_ms": sec * 1e3,
                     "time_min_ms": min(ts) * 1e3, "time_max_ms": max(ts) * 1e3, "rounds": len(ts),
                     "GBps": nbytes / sec / 1e9, "GFLOPs": flops / sec / 1e9, "floor_ms": floor * 1e3,
                     "of_floor": floor / sec, "rel_err": errs[name]})
    return rows


def pruned_weight(size: int, density: float, seed: int):
    import scipy.sparse as sp

    return sp.random(size, size, density=density, format="csr", dtype=np.float32,
                     random_state=np.random.default_rng(seed))


def real_graphs(root) -> list:
    """The real graphs of the CPU suite, from the data folder: Cora, CiteSeer, PubMed, ca-CondMat."""
    order = ("cora", "citeseer", "pubmed", "ca-CondMat")
    found = {name: make for name, make in all_real_graphs(root)}
    return [(name, found[name]) for name in order if name in found]


def cpu_suite(ctx: Context) -> List[Job]:
    quick = ctx.quick
    cfg = dict(QUICK) if quick else {"graph_nodes": 100_000, "widths": (1, 4, 16, 32, 64, 128),
                                     "pruned": (0.01, 0.05, 0.1, 0.3), "pruned_size": 2048,
                                     "elementwise": copy_elements(CPU), "rounds": 11, "budget_s": 15.0}
    state = {}

    def ceilings():
        if "c" not in state:
            state["c"] = ctx.ceilings if ctx.device.type == "cpu" else measure_ceilings(CPU, make_timer(CPU, True),
                                                                                       True)
        return state["c"]

    nodes = cfg["graph_nodes"]
    graphs = [(f"random {nodes // 1000}k, 20/row", lambda: random_graph(nodes, 20, 1)),
              (f"power-law {nodes // 1000}k", lambda: power_law_graph(nodes, 20, 2))]
    graphs += real_graphs(ctx.data_root)[: 1 if quick else None]
    size = cfg["pruned_size"]
    graphs += [(f"pruned {size}x{size}, {100 * d:g}%", lambda d=d: pruned_weight(size, d, 3)) for d in cfg["pruned"]]

    def spmm_job(name, make):
        def run():
            a = make().astype(np.float32)
            a.sort_indices()
            A = st.from_scipy(a, dtype=torch.float32, index_dtype=torch.int32)
            a_torch = st.to_torch(A)
            a64 = a.astype(np.float64)
            m, k = a.shape
            rows = []
            for n in cfg["widths"]:
                g = torch.Generator().manual_seed(n)
                B = torch.randn(k, n, generator=g)
                b_np = B.numpy()
                ref = torch.from_numpy(a64 @ b_np.astype(np.float64))
                nbytes, flops = spmm_model(a.nnz, m, k, n, 4, 4)
                impls = {"sparsetorch": (lambda: st.spmm(A, B), nbytes, flops, "float32"),
                         "torch.sparse.mm": (lambda: torch.sparse.mm(a_torch, B), nbytes, flops, "float32"),
                         "scipy": (lambda: a @ b_np, nbytes, flops, "float32")}
                base = {"op": "spmm", "case": f"spmm {name}, n={n}", "graph": name, "n": n, "m": m, "nnz": a.nnz}
                rows += rows_for(ctx, base, impls, ref, cfg["rounds"], cfg["budget_s"], ceilings())
            return rows

        return run

    jobs = [spmm_job(name, make) for name, make in graphs]

    def sddmm_job(n):
        def run():
            a = random_graph(nodes, 20, 5)
            a.sort_indices()
            A = st.from_scipy(a, dtype=torch.float32, index_dtype=torch.int64)
            a_torch = st.to_torch(A)
            g = torch.Generator().manual_seed(n)
            x, y = torch.randn(a.shape[0], n, generator=g), torch.randn(a.shape[1], n, generator=g)
            coo = a.tocoo()
            ref = (x.double()[coo.row] * y.double()[coo.col]).sum(-1)
            # Bytes: the pattern, a's rows once, y's rows per entry (gathered), the values written.
            nbytes = a.nnz * (8 + 4 + 4 * n) + (a.shape[0] + 1) * 8 + a.shape[0] * n * 4
            flops = 2.0 * a.nnz * n
            impls = {"sparsetorch": (lambda: st.sddmm(A, x, y).values, nbytes, flops, "float32"),
                     "torch.sparse.sampled_addmm": (
                         lambda: torch.sparse.sampled_addmm(a_torch, x, y.t(), beta=0.0).values(), nbytes, flops,
                         "float32")}
            base = {"op": "sddmm", "case": f"sddmm random {nodes // 1000}k, 20/row, n={n}", "n": n, "nnz": a.nnz}
            return rows_for(ctx, base, impls, ref, cfg["rounds"], cfg["budget_s"], ceilings())

        return run

    jobs += [sddmm_job(n) for n in ((32,) if quick else (16, 64))]

    def scale_job():
        a = random_graph(nodes, 20, 6)
        a.sort_indices()
        A = st.from_scipy(a, dtype=torch.float32, index_dtype=torch.int64)
        deg = torch.rand(a.shape[0]) + 0.5
        d = deg.rsqrt()
        row = torch.repeat_interleave(torch.arange(a.shape[0]), A.crow_indices.diff())
        ref = A.values.double() * d.double()[row] * d.double()[A.col_indices]
        nbytes = a.nnz * (8 + 4 + 4 + 4 + 4) + (a.shape[0] + 1) * 8  # pattern, values in/out, gathered factors
        impls = {"sparsetorch": (lambda: st.scale(A, row=d, col=d).values, nbytes, 0.0, "float32"),
                 "eager torch": (lambda: A.values * d[row] * d[A.col_indices], nbytes, 0.0, "float32")}
        base = {"op": "scale", "case": f"scale D^-1/2 A D^-1/2, random {nodes // 1000}k, 20/row"}
        return rows_for(ctx, base, impls, ref, cfg["rounds"], cfg["budget_s"], ceilings())

    jobs.append(scale_job)

    def elementwise_job(dtype):
        def run():
            import torch.nn.functional as F

            numel = cfg["elementwise"]
            label = str(dtype).replace("torch.", "")
            size = torch.tensor([], dtype=dtype).element_size()
            g = torch.Generator().manual_seed(7)
            x = torch.randn(numel, generator=g).to(dtype)
            y = torch.randn(numel, generator=g).to(dtype)
            width = 1024
            x2 = x.view(-1, width)
            bias, scale = torch.randn(width, generator=g).to(dtype), torch.randn(width, generator=g).to(dtype)
            x64, y64 = x.double(), y.double()
            z64 = x2.double() * scale.double() + bias.double()

            def eager_fused():
                return F.gelu(x2 * scale + bias)

            def backward_case():
                """Forward + backward of the fused op (gradients of x and bias, as a layer's bias_act records
                them) against eager autograd of the same expression; both return (grad x, grad bias) as one."""
                xr, br = x2.clone().requires_grad_(), bias.clone().requires_grad_()
                grad_out = torch.randn(x2.shape, generator=g).to(dtype)

                def train(fn):
                    def step():
                        gx, gb = torch.autograd.grad(fn(xr, br), (xr, br), grad_out)
                        return torch.cat([gx.reshape(-1), gb])
                    return step

                x64r, b64r = x2.double().requires_grad_(), bias.double().requires_grad_()
                gx64, gb64 = torch.autograd.grad(F.gelu(x64r * scale.double() + b64r), (x64r, b64r),
                                                 grad_out.double())
                return (train(lambda a, b: st.bias_act(a, bias=b, scale=scale, activation="gelu")),
                        train(lambda a, b: F.gelu(a * scale + b)), torch.cat([gx64.reshape(-1), gb64]), 5)

            # name -> (ours, eager, reference, tensors read + written)
            cases = {"add": (lambda: st.add(x, y, alpha=2.0), lambda: torch.add(x, y, alpha=2.0), x64 + 2 * y64, 3),
                     "mul": (lambda: st.mul(x, y), lambda: torch.mul(x, y), x64 * y64, 3),
                     "relu": (lambda: st.relu(x), lambda: F.relu(x), F.relu(x64), 2),
                     "gelu": (lambda: st.gelu(x), lambda: F.gelu(x), F.gelu(x64), 2),
                     "silu": (lambda: st.silu(x), lambda: F.silu(x), F.silu(x64), 2),
                     "sigmoid": (lambda: st.sigmoid(x), lambda: torch.sigmoid(x), torch.sigmoid(x64), 2),
                     "tanh": (lambda: st.tanh(x), lambda: torch.tanh(x), torch.tanh(x64), 2),
                     "bias_act gelu(x*scale+bias)": (
                         lambda: st.bias_act(x2, bias=bias, scale=scale, activation="gelu"), eager_fused,
                         F.gelu(z64), 2)}
            if quick:
                cases = {k: v for k, v in cases.items() if k in ("add", "gelu", "bias_act gelu(x*scale+bias)")}
            else:
                cases["bias_act gelu(x*scale+bias) forward + backward"] = backward_case()
            rows = []
            for op, (ours, eager, ref, tensors) in cases.items():
                nbytes = tensors * numel * size
                impls = {"sparsetorch": (ours, nbytes, 0.0, label), "eager torch": (eager, nbytes, 0.0, label)}
                if op == "bias_act gelu(x*scale+bias)" and not quick:
                    impls["torch.compile"] = (torch.compile(eager_fused), nbytes, 0.0, label)
                base = {"op": "elementwise", "case": f"{op}, 2^{int(math.log2(numel))} {label}"}
                rows += rows_for(ctx, base, impls, ref.view(-1) if ref.dim() == 1 else ref, cfg["rounds"],
                                 cfg["budget_s"], ceilings())
            return rows

        return run

    jobs += [elementwise_job(dt) for dt in ((torch.float32,) if quick else (torch.float32, torch.bfloat16))]
    return jobs


def headlines(rows: List[dict]) -> List[str]:
    """The suite's summary lines: SpMM against each baseline, the elementwise ratios."""
    cpu = [r for r in rows if r["suite"] == "cpu" and r.get("speedup")]
    lines = []
    for op, baselines in (("spmm", ("torch.sparse.mm", "scipy")), ("sddmm", ("torch.sparse.sampled_addmm",)),
                          ("scale", ("eager torch",)), ("elementwise", ("eager torch", "torch.compile"))):
        for base in baselines:
            sp = [r for r in cpu if r.get("op") == op and r["impl"] == base]
            if not sp:
                continue
            worst = min(sp, key=lambda r: r["speedup"])
            lines.append(f"cpu {op}: sparsetorch {summary([r['speedup'] for r in sp], base)}; worst case: "
                         f"{worst['case']}")
    return lines
