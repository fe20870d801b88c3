"""The compile suite: the layers as users deploy them, under ``torch.compile`` and CUDA graphs, against
torch_geometric and dense ``F.linear`` run the same ways, in one run.

Modes: ``eager``; ``compiled`` (``torch.compile``; ``dynamic=True`` for mini-batches, whose sizes change
every step); ``reduce-overhead`` (``torch.compile(mode="reduce-overhead")``: CUDA graphs); for decode also
``CUDA graph`` (a manual ``torch.cuda.graph`` capture after a warm-up).

Cases:

* GCN and SAGE mini-batch training steps (the gnn suite's: a 300k-node power-law graph, fanout [15, 10],
  1024 seeds, 3 layers 128-256-256-47, Adam; 20k nodes on the CPU), a new sampled subgraph every step:
  eager and compiled (the model compiled with ``dynamic=True``; backward and the optimizer outside).
* GCN and SAGE full-graph training steps on Planetoid (PubMed quick; Cora, CiteSeer and PubMed with
  ``--full``): eager, compiled and reduce-overhead.
* A pruned Llama-3-8B MLP block (4096-14336-4096, bf16; 2:4 and 90% global, 70% per row with ``--full``),
  N = 1 and 16 tokens, and the 4-layer decoder stack of the decode suite (2:4, a 512-token KV cache): the
  SparseLinear layers prepared for those N (``st.nn.prepare``), then eager, compiled, reduce-overhead and a
  manual CUDA graph; dense ``F.linear`` on the pruned weights the same four ways.

Rows: ``time_ms`` (per step / call: wall time with a synchronize for training steps, device time with a
clean L2 for the pruned calls, replays for graphs), ``mode``, ``graphs`` and ``breaks``
(``torch._dynamo.explain`` on one input), ``compile_s`` (the first compiled call, compilation included),
``recompiles`` (mini-batches: graphs compiled over the timed batches), ``vs_eager`` (the same library's eager
time / this time) and ``vs_baseline`` (the best mode of the other side / this time: torch_geometric, or
dense).
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

import sparsetorch as st
from benchmarks.harness import make_clean_l2_timer
from benchmarks.suites.common import Context, Job
from benchmarks.suites.decode import (LLAMA3_8B, TINY, calibrate, dense_stack, heavy_tailed_weight, kv_caches,
                                      pruned_stacks, rope_at)
from benchmarks.suites.decode import _graphed as decode_graphed
from benchmarks.suites.gnn import Net, planetoid_case
from benchmarks.suites.gnn_common import power_law_edge_index, pyg_layers, release_memory
from benchmarks.suites.minibatch import Net3, make_batches
from sparsetorch import timing


def _explain(fn, *args) -> tuple:
    """(graphs, breaks) torch._dynamo.explain finds for fn(*args); (None, None) if it cannot trace."""
    try:
        e = torch._dynamo.explain(fn)(*args)
        return e.graph_count, e.graph_break_count
    except Exception:  # noqa: BLE001 - an untraceable model is reported as such
        return None, None
    finally:
        torch._dynamo.reset()


def _frames() -> int:
    return int(torch._dynamo.utils.counters["stats"].get("unique_graphs", 0))


def _finish(rows: List[dict], key: str = "impl") -> List[dict]:
    """vs_eager per library and vs_baseline: the other side's best mode / this time."""
    eager = {(r["case"], r["lib"]): r["time_ms"] for r in rows if r["mode"] == "eager"}
    best = {}
    for r in rows:
        k = (r["case"], r["lib"])
        best[k] = min(best.get(k, float("inf")), r["time_ms"])
    for r in rows:
        r["vs_eager"] = eager.get((r["case"], r["lib"]), r["time_ms"]) / r["time_ms"]
        others = [v for (case, lib), v in best.items() if case == r["case"] and lib != r["lib"]]
        r["vs_baseline"] = (min(others) / r["time_ms"]) if others else None
    return rows


# --- GNN training -------------------------------------------------------------------------------------------

def _libraries() -> dict:
    """name -> the layers' module: sparsetorch's, and torch_geometric's where installed."""
    pyg_nn, _ = pyg_layers()
    return {"sparsetorch": st.nn, **({"torch_geometric": pyg_nn} if pyg_nn is not None else {})}

def _train_step(model, opt):
    def step(batch):
        x, edge_index, y, size = batch
        opt.zero_grad(set_to_none=True)
        out = model(x, edge_index)
        F.cross_entropy(out[:size] if size else out, y).backward()
        opt.step()
    return step


def _minibatch_job(ctx: Context, layer: str) -> Job:
    def run():
        nodes, entries = (300_000, 3_000_000) if ctx.cuda else (20_000, 200_000)
        steps = 20 if ctx.cuda else 4
        graph = power_law_edge_index(nodes, entries, seed=7, device=str(ctx.device))
        batches = make_batches(ctx, graph, nodes, (15, 10), steps + 5, seed=2)
        case = f"{layer} mini-batch, power-law {nodes // 1000}k, fanout [15, 10], 128-256-256-47"
        libs = _libraries()
        torch.manual_seed(0)
        initial = Net3(st.nn, layer).state_dict()
        rows = []
        for lib_name, lib in libs.items():
            for mode in ("eager", "compiled"):
                release_memory(ctx.device)
                torch._dynamo.reset()
                model = Net3(lib, layer).to(ctx.device)
                model.load_state_dict(initial)
                graphs = breaks = None
                if mode == "compiled":
                    x0, ei0 = batches[0][0], batches[0][1]
                    graphs, breaks = _explain(model, x0, ei0)
                    model_c = torch.compile(model, dynamic=True)
                else:
                    model_c = model
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
                step = _train_step(model_c, opt)
                t0 = time.perf_counter()
                step(batches[0])
                timing.synchronize(ctx.device)
                first_s = time.perf_counter() - t0
                for b in batches[1:5]:
                    step(b)
                before = _frames()

                def loop():
                    for b in batches[5:]:
                        step(b)

                seconds = 1e-3 * timing.wall_time(loop, device=ctx.device, reps=3, warmup=0) / len(batches[5:])
                rows.append({"suite": "compile", "case": case, "lib": lib_name, "impl": f"{lib_name} {mode}",
                             "mode": mode, "dtype": "float32", "time_ms": seconds * 1e3, "graphs": graphs,
                             "breaks": breaks, "compile_s": first_s if mode == "compiled" else None,
                             "recompiles": _frames() - before if mode == "compiled" else None})
        torch._dynamo.reset()
        return _finish(rows)

    return run


def _planetoid_job(ctx: Context, name: str, layer: str) -> Job:
    def run():
        from sparsetorch.datasets import planetoid_available

        if not planetoid_available(name, ctx.data_root, graph_only=name == "pubmed"):
            ctx.leave_out(f"compile {name}", "Planetoid data not found")
            return []
        edge_index, x, y, _ = planetoid_case(ctx.data_root, name)
        edge_index, x, y = edge_index.to(ctx.device), x.to(ctx.device), y.to(ctx.device)
        channels = (x.shape[1], 16 if layer == "GCNConv" else 64, int(y.max()) + 1)
        case = f"{layer} full-graph step, {name}"
        libs = _libraries()
        torch.manual_seed(0)
        initial = Net(st.nn, layer, channels).state_dict()
        # A fixed graph: sparsetorch's layers hold its matrix (cached=True, as torch_geometric's GCNConv does in
        # Net), so a compiled or graphed step does not rebuild it.
        modes = ("eager", "compiled", "reduce-overhead") if ctx.cuda else ("eager", "compiled")
        rows = []
        for lib_name, lib in libs.items():
            for mode in modes:
                release_memory(ctx.device)
                torch._dynamo.reset()
                model = Net(lib, layer, channels).to(ctx.device)
                model.load_state_dict(initial)
                if lib is st.nn:
                    model.conv1.cached = model.conv2.cached = True
                graphs = breaks = None
                if mode != "eager":
                    graphs, breaks = _explain(model, x, edge_index)
                    model_c = torch.compile(model, mode=None if mode == "compiled" else mode)
                else:
                    model_c = model
                opt = torch.optim.Adam(model.parameters(), lr=0.01)
                step = _train_step(model_c, opt)
                batch = (x, edge_index, y, 0)
                t0 = time.perf_counter()
                try:
                    for _ in range(3):
                        step(batch)
                    timing.synchronize(ctx.device)
                except Exception as e:  # noqa: BLE001 - a mode a library cannot run is reported
                    ctx.leave_out(f"compile {case}: {lib_name} {mode}", f"failed ({type(e).__name__}: {str(e)[:120]})")
                    continue
                first_s = time.perf_counter() - t0
                seconds = 1e-3 * timing.wall_time(lambda: step(batch), device=ctx.device, reps=50, warmup=3,
                                                  budget_s=1.0)
                rows.append({"suite": "compile", "case": case, "lib": lib_name, "impl": f"{lib_name} {mode}",
                             "mode": mode, "dtype": "float32", "time_ms": seconds * 1e3, "graphs": graphs,
                             "breaks": breaks, "compile_s": first_s if mode != "eager" else None})
        torch._dynamo.reset()
        return _finish(rows)

    return run


# --- pruned decode ------------------------------------------------------------------------------------------

def _graphed(fn):
    """fn captured into a CUDA graph (decode.py's capture): a call that replays it and returns its output."""
    graph, out = decode_graphed(fn)

    def replay():
        graph.replay()
        return out

    return replay


def _modes(ctx: Context, fn: Callable, args: tuple) -> Dict[str, tuple]:
    """mode -> (callable, compile seconds, (graphs, breaks))."""
    out = {"eager": (lambda: fn(*args), None, (None, None))}
    if not ctx.cuda:
        modes = ("compiled",)
    else:
        modes = ("compiled", "reduce-overhead")
    for mode in modes:
        torch._dynamo.reset()
        explain = _explain(fn, *args)
        compiled = torch.compile(fn, mode=None if mode == "compiled" else mode, fullgraph=False)
        t0 = time.perf_counter()
        with torch.no_grad():
            for _ in range(3):
                compiled(*args)
        timing.synchronize(ctx.device)
        out[mode] = ((lambda c=compiled: c(*args)), time.perf_counter() - t0, explain)
    if ctx.cuda:
        out["CUDA graph"] = (_graphed(lambda: fn(*args)), None, (None, None))
    return out


def _pruned_job(ctx: Context, kind: str, sparsity, scheme: str) -> Job:
    def run():
        dtype = torch.bfloat16 if ctx.cuda else torch.float32
        shape = LLAMA3_8B if ctx.cuda else TINY
        tokens = (1, 16)
        label = "2:4" if scheme == "2:4" else (f"{100 * sparsity:g}% per row" if scheme == "row"
                                               else f"{100 * sparsity:g}%")
        g = torch.Generator(device=ctx.device).manual_seed(11)
        if kind == "mlp":
            h, i = shape.hidden, shape.inner
            ws = [heavy_tailed_weight(i, h, ctx.device, dtype, g), heavy_tailed_weight(i, h, ctx.device, dtype, g),
                  heavy_tailed_weight(h, i, ctx.device, dtype, g)]
            sparse = torch.nn.ModuleList(st.nn.SparseLinear.from_dense(w, sparsity=sparsity, scheme=scheme)
                                         .requires_grad_(False) for w in ws)
            # Parameters, as a model holds them: CUDA graph trees treat them as static inputs (a plain tensor
            # captured by the function would be copied into the graph's input buffer at every replay).
            dense_w = [torch.nn.Parameter(m.to_dense().detach(), requires_grad=False) for m in sparse]

            def st_fn(x):
                return sparse[2](F.silu(sparse[0](x)) * sparse[1](x))

            def dense_fn(x):
                return F.linear(F.silu(F.linear(x, dense_w[0])) * F.linear(x, dense_w[1]), dense_w[2])

            st.nn.prepare(sparse, tokens, progress=False)
            case_name = f"MLP {h}-{i}-{h} {label}"
        else:
            stack = dense_stack(shape, ctx.device, dtype, seed=3)
            norms = calibrate(stack, shape, ctx.device, dtype, seed=4)
            dense_stack_, sparse_stack = pruned_stacks(stack, norms, sparsity, scheme)
            del stack
            st.nn.prepare(sparse_stack, tokens, progress=False)
            rope = rope_at(shape, shape.context, ctx.device, dtype)
            case_name = f"{shape.layers}-layer decoder stack {label}"
        rows = []
        timer = make_clean_l2_timer(ctx.device, ctx.quick)
        for n in tokens:
            x = torch.randn(n, shape.hidden, device=ctx.device, generator=g).to(dtype)
            if kind == "mlp":
                fns = {"sparsetorch": (st_fn, (x,)), "dense": (dense_fn, (x,))}
            else:
                # Parameters, as a model's buffers would be: static inputs that the step may write in place
                # (cudagraph trees do not capture a graph that mutates a plain input tensor).
                caches = [tuple(torch.nn.Parameter(t, requires_grad=False) for t in kv)
                          for kv in kv_caches(shape, n, ctx.device, dtype, seed=20 + n)]
                fns = {"sparsetorch": (lambda a, c=caches: sparse_stack(a, c, rope), (x,)),
                       "dense": (lambda a, c=caches: dense_stack_(a, c, rope), (x,))}
            case = f"{case_name}, N={n}"
            with torch.no_grad():
                ref = fns["dense"][0](x).double()
                for lib, (fn, args) in fns.items():
                    for mode, (call, compile_s, (graphs, breaks)) in _modes(ctx, fn, args).items():
                        err = float(call().double().sub(ref).norm() / ref.norm())
                        if not err < 3e-2:
                            raise AssertionError(f"compile {case}: {lib} {mode}: relative error {err:.2e}")
                        seconds = timer(call)
                        rows.append({"suite": "compile", "case": case, "lib": lib, "impl": f"{lib} {mode}",
                                     "mode": mode, "dtype": str(dtype).replace("torch.", ""), "n": n,
                                     "time_ms": seconds * 1e3, "graphs": graphs, "breaks": breaks,
                                     "compile_s": compile_s, "rel_err": err})
                        torch._dynamo.reset()
        return _finish(rows)

    return run


def compile_suite(ctx: Context) -> List[Job]:
    jobs = [_minibatch_job(ctx, "GCNConv"), _minibatch_job(ctx, "SAGEConv")]
    names = ("cora", "citeseer", "pubmed") if not ctx.quick else ("pubmed",)
    for name in names:
        jobs += [_planetoid_job(ctx, name, "GCNConv"), _planetoid_job(ctx, name, "SAGEConv")]
    sparsities = (("2:4", 0.5, "2:4"), ("90%", 0.9, "global")) + ((("70%", 0.7, "row"),) if not ctx.quick else ())
    for _, s, scheme in sparsities:
        jobs.append(_pruned_job(ctx, "mlp", s, scheme))
    jobs.append(_pruned_job(ctx, "stack", 0.5, "2:4"))
    return jobs


def headlines(rows: List[dict]) -> List[str]:
    lines = []
    for case in dict.fromkeys(r["case"] for r in rows if r.get("suite") == "compile"):
        got = [r for r in rows if r["case"] == case]
        ours = [r for r in got if r["lib"] == "sparsetorch"]
        if not ours:
            continue
        best = min(ours, key=lambda r: r["time_ms"])
        parts = [f"{r['mode']} {r['time_ms']:.3g} ms" + (f" ({r['breaks']} breaks)" if r.get("breaks") else "")
                 for r in ours]
        vs = f"; best ({best['mode']}) {best['vs_baseline']:.2f}x the other side's best" if best.get("vs_baseline") \
            else ""
        lines.append(f"compile {case}: sparsetorch " + ", ".join(parts) + vs)
    return lines
