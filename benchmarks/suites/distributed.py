"""distributed: strong scaling of SpMM and of a 2-layer GCN training step from 1 to 2+ GPUs (NCCL, one
process per GPU) on a synthetic power-law graph of >= 100M stored entries, generated on the GPUs.

Rank counts: SPARSETORCH_BENCH_DIST_RANKS (default 2). Per rank count: the default transport, the other
one (CUDA), and the default with B's rows moved in bf16 (``DistributedCSR.exchange_dtype``).
Per case: time (the slowest rank's median), bytes each rank receives per product against the
partition's minimum (its distinct remote rows x n x element size, counted from its block, apart from
the exchange plan), peak memory per rank. Also the all-to-all bandwidth between the GPUs (measured
first) and a capped-memory run: each process's memory capped (set_per_process_memory_fraction)
between what 2 ranks need and what one GPU needs for the whole training step; one GPU then runs
out of memory and 2 GPUs train. Left out, with a message, when fewer than 2 CUDA devices are present.

With ``--device cpu`` the suite rehearses on CPU processes (gloo) with a 20k-node graph: the same code
paths, minutes on a laptop (``SPARSETORCH_BENCH_DIST_RANKS`` sets the process counts there too).
Times: the slowest rank's median wall time with a synchronize (harness.once per repetition).
The off-line halo and exchange-volume tables: ``python -m benchmarks.distributed_partition``.
"""
from __future__ import annotations

import functools
import gc
import json
import os
import statistics
import time
from typing import Dict, List

import torch
import torch.distributed as dist

from benchmarks.harness import once
from benchmarks.ratios import versus
from benchmarks.suites.common import Context, Job, gemm_model, spmm_model

GIB = 2**30


def _gib(nbytes):
    return None if nbytes is None else nbytes / GIB


def _config(quick: bool, device: str = "cuda", nodes: int = 1 << 22) -> dict:
    """4.2M nodes, mean degree 32: 134M stored entries (+ 4.2M self loops in the GCN)."""
    return {"device": device, "nodes": nodes, "degree": 32, "seed": 11, "widths": (64, 256), "features": 128,
            "hidden": 256, "classes": 16, "reps": 10 if quick else 20, "warmup": 2, "loop": 5, "capped": device == "cuda",
            "capped_epochs": 5, "link_sizes": (2**24, 2**27, 2**30) if device == "cuda" else (2**20,),
            "partial": os.environ.get("SPARSETORCH_BENCH_PARTIAL")}


def _save_partial(cfg, rank, res) -> None:
    """Rank 0's results so far, as JSON (SPARSETORCH_BENCH_PARTIAL): kept if a later phase fails."""
    if cfg.get("partial") and rank == 0:
        with open(cfg["partial"], "w") as f:
            json.dump(res, f, indent=1, default=str)


def _count(x: int) -> str:
    return f"{x / 1e6:.1f}M" if x >= 1e6 else f"{x / 1e3:.0f}k"


def distributed_suite(ctx: Context) -> List[Job]:
    if not ctx.cuda:  # the rehearsal: gloo processes on the CPU, a small graph
        cfg = _config(ctx.quick, "cpu", 20_000)
        cfg.update(widths=(16, 64), features=32, hidden=64, reps=3)
        return [functools.partial(run, ctx, cfg, world=w) for w in _worlds(None)]
    count = torch.cuda.device_count()
    if count < 2:
        ctx.leave_out("distributed (the whole suite)", f"needs at least 2 CUDA devices, found {count}")
        return []
    worlds = _worlds(count)
    for w in os.environ.get(RANKS_ENV, "2").split(","):
        if w.strip() and int(w) not in worlds:
            ctx.leave_out(f"distributed on {int(w)} ranks", f"{RANKS_ENV} asks for it; found {count} CUDA devices")
    cfg = _config(ctx.quick)
    return [functools.partial(run, ctx, cfg, world=w) for w in worlds]


RANKS_ENV = "SPARSETORCH_BENCH_DIST_RANKS"  # e.g. "2,3,4": the rank counts the suite runs (default 2)


def _worlds(count) -> List[int]:
    """The rank counts to run: those of SPARSETORCH_BENCH_DIST_RANKS (default "2") that the host has
    (``count`` GPUs; None: CPU processes, any count)."""
    asked = [int(w) for w in os.environ.get(RANKS_ENV, "2").split(",") if w.strip()]
    return [w for w in asked if 2 <= w and (count is None or w <= count)]


def run(ctx: Context, cfg: dict, world: int = 2) -> List[dict]:
    from sparsetorch.distributed.launch import spawn

    backend = "nccl" if cfg["device"] == "cuda" else "gloo"
    results = spawn(_worker, world, cfg, backend=backend, timeout=180, join_timeout=480,
                    threads=None if backend == "nccl" else max(1, torch.get_num_threads() // world))
    rows = _rows(ctx, cfg, results)
    _print_summary(results[0], rows)
    return rows


# --- on every rank -------------------------------------------------------------------------------

def _sync(group, device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    if dist.get_world_size(group) > 1:
        if device.type == "cuda":
            t = torch.zeros(1, device=device)
            dist.all_reduce(t, group=group)
            torch.cuda.synchronize(device)
        else:
            dist.barrier(group=group)


def _max(value: float, group, device) -> float:
    if dist.get_world_size(group) == 1:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t)


def time_ranks(fn, group, device, reps: int, warmup: int, calls: int = 1) -> float:
    """The slowest rank's median seconds per call (ranks aligned before each timing). ``calls`` > 1:
    each timing runs that many calls back to back and divides, a loop's steady state, where the
    host's work for a call (argument checks, the ranks' agreement on them) overlaps the GPU's work
    for the previous one; with 1 the host's latency is on the critical path."""
    for _ in range(warmup):
        fn()
    times = []

    def loop():
        for _ in range(calls):
            fn()

    for _ in range(reps):
        _sync(group, device)
        times.append(once(loop, device)[1] / calls)
    return _max(statistics.median(times), group, device)


def _peak_reset(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def free_memory(device):
    gc.collect()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()


def _link(cfg, group, device, rank, world) -> List[dict]:
    """All-to-all bandwidth: each rank sends `size` bytes to every other rank."""
    out = []
    for size in cfg["link_sizes"]:
        send = torch.empty(size * (world - 1), dtype=torch.uint8, device=device)
        recv = torch.empty_like(send)
        splits = [0 if p == rank else size for p in range(world)]
        seconds = time_ranks(functools.partial(dist.all_to_all_single, recv, send, splits, splits, group=group), group,
                        device, 5, 2)
        out.append({"bytes_per_peer": size, "seconds": seconds, "GBps_per_rank": size * (world - 1) / seconds / 1e9})
        del send, recv
    return out


def global_b(cfg, n, device):
    gen = torch.Generator(device=device)
    gen.manual_seed(cfg["seed"] * 100 + n)
    return torch.randn(cfg["nodes"], n, generator=gen, device=device)


def _remote_rows(block, c0, c1) -> int:
    """Distinct columns of a row block outside [c0, c1): the partition's minimum rows to receive."""
    col = block.col_indices.long()
    return int(torch.unique(col[(col < c0) | (col >= c1)]).numel())


def _spmm_cases(cfg, A, group, device, b_rows, reference=None, plan=None):
    """Per width: time of st.spmm(A, B rows) (and of a SpmmPlan on the whole matrix if given), bytes
    received per call, peak; the result's error against ``reference`` (rows, per width)."""
    import sparsetorch as st

    out = {}
    for n in cfg["widths"]:
        B = global_b(cfg, n, device)
        rec = {}
        if plan is not None:
            _peak_reset(device)
            rec["plan_s"] = time_ranks(functools.partial(plan, B), group, device, cfg["reps"], cfg["warmup"])
            rec["plan_loop_s"] = time_ranks(functools.partial(plan, B), group, device, cfg["reps"], 0, cfg["loop"])
            rec["plan_peak"] = _peak(device)
            full = plan(B)
            rec["reference_rows"] = full[b_rows[0]:b_rows[1]].cpu()  # off the GPU: not in the 2-GPU peaks
            del full
        b = B[A.col_start:A.col_end].clone()
        del B
        free_memory(device)
        _peak_reset(device)
        rec["seconds"] = time_ranks(functools.partial(st.spmm, A, b), group, device, cfg["reps"], cfg["warmup"])
        rec["loop_s"] = time_ranks(functools.partial(st.spmm, A, b), group, device, cfg["reps"], 0, cfg["loop"])
        rec["peak"] = _peak(device)
        A.halo_plan.reset_stats()
        y = st.spmm(A, b)
        rec["halo_volume"] = A.halo_volume(n)  # every rank's received vs minimum, from the plan
        rec["bytes_received"] = A.halo_plan.stats["forward_bytes_received"]
        rec["bytes_sent"] = A.halo_plan.stats["forward_bytes_sent"]
        rec["transport"] = A.halo_plan.transport.name
        rec["outside_bytes"] = A.halo_plan.transport.bytes_outside_allocator
        if A.halo_plan.active:  # the three parts alone, to see how much of the exchange the overlap hides
            from sparsetorch.distributed._spmm import _route

            rec["exchange_s"] = time_ranks(functools.partial(exchange_only, A.halo_plan, b), group, device,
                                      cfg["reps"], 1)
            halo = A.halo_plan.exchange(b)
            for part, operand, key in ((A.local, b, "local"), (A.remote, halo, "remote")):
                route = _route(A, key, part, operand, "auto")
                rec[f"{key}_alone_s"] = time_ranks(functools.partial(st.spmm, part, operand, backend=route), group,
                                              device, cfg["reps"], 1)
            del halo
        if reference is not None:
            ref = reference[n]
            got = y.cpu().double()
            rec["rel_err"] = _max(float((got - ref.double()).norm() / ref.double().norm().clamp(min=1e-30)),
                                  group, device)
            del got
        out[n] = rec
        del b, y
        free_memory(device)
    return out


def exchange_only(plan, b):
    recv, pending = plan.start(b, plan.exchange_dtype)  # as a product moves the rows
    plan.finish(pending)
    return recv


def _gcn_case(cfg, A, rows, group, device, steps: int, reps: int):
    """A 2-layer GCN training step (forward, backward, gradient all-reduce, SGD step): losses of the
    first `steps` steps, then the time per step and the peak."""
    from sparsetorch.distributed import GCN, masked_cross_entropy, node_features, node_labels, node_mask, sync_gradients

    x = node_features(rows, cfg["features"], cfg["seed"] + 1, device)
    y = node_labels(x, cfg["classes"], cfg["seed"] + 2)
    mask = node_mask(rows, 0.5, cfg["seed"] + 3, device)
    torch.manual_seed(cfg["seed"])
    model = GCN(cfg["features"], cfg["hidden"], cfg["classes"]).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = masked_cross_entropy(model(x, A), y, mask, group)
        loss.backward()
        sync_gradients(model.parameters(), group)
        opt.step()
        return loss

    losses = []
    for _ in range(steps):
        loss = step().detach()
        if dist.get_world_size(group) > 1:
            dist.all_reduce(loss, group=group)
        losses.append(float(loss))
    rec = {"losses": losses}
    if reps:
        _peak_reset(device)
        rec["seconds"] = time_ranks(step, group, device, reps, 1)
        rec["loop_s"] = time_ranks(step, group, device, reps, 0, cfg["loop"])
        rec["peak"] = _peak(device)
        plan = A.gcn_normalized().halo_plan
        plan.reset_stats()
        step()
        rec["exchange"] = dict(plan.stats)
        rec["transport"] = plan.transport.name
        rec["outside_bytes"] = plan.transport.bytes_outside_allocator
    return rec


def _solo_under_cap(cfg, degrees, group, device) -> dict:
    """Rank 0 alone, the whole graph, under the cap: returns where it ran out of memory (or that it fit)."""
    from sparsetorch.distributed import DistributedCSR, power_law_block

    stage = "building the graph"
    try:
        block = power_law_block(cfg["nodes"], cfg["degree"], seed=cfg["seed"], device=device, degrees=degrees)
        A = DistributedCSR.from_global(block, group=group)
        del block
        stage = "training"
        _gcn_case(cfg, A, (0, cfg["nodes"]), group, device, steps=2, reps=0)
        return {"fits": True}
    except torch.cuda.OutOfMemoryError as e:
        return {"fits": False, "stage": stage, "error": str(e).split("\n")[0][:300]}


def _log(rank, start, text):
    """Rank 0's progress line, with the seconds since ``start`` (the worker's start)."""
    if rank == 0:
        print(f"  [distributed {time.perf_counter() - start:6.1f} s] {text}", flush=True)


def _worker(rank, world, cfg) -> dict:
    from sparsetorch.distributed import DistributedCSR, balanced_row_bounds, power_law_block, power_law_degrees
    import sparsetorch as st

    start = time.perf_counter()

    device = torch.device("cuda", torch.cuda.current_device()) if cfg["device"] == "cuda" else torch.device("cpu")
    torch.backends.cuda.matmul.allow_tf32 = False
    world_group = dist.group.WORLD
    solo = dist.new_group([rank], use_local_synchronization=True)
    res: Dict[str, object] = {"rank": rank}
    res["link"] = _link(cfg, world_group, device, rank, world)
    _save_partial(cfg, rank, res)
    _log(rank, start, f"link: {[round(x['GBps_per_rank'], 1) for x in res['link']]} GB/s per rank")

    N = cfg["nodes"]
    degrees = power_law_degrees(N, cfg["degree"], cfg["seed"], device)
    crow = torch.zeros(N + 1, dtype=torch.int64, device=device)
    torch.cumsum(degrees, 0, out=crow[1:])
    bounds = balanced_row_bounds(crow, world)
    r0, r1 = bounds[rank], bounds[rank + 1]
    res["entries"] = int(crow[-1])
    res["bounds"] = bounds
    del crow

    # 1 GPU: every rank runs the whole graph on its own GPU (rank 0's numbers are reported; the
    # other ranks' give their rows of the reference for the 2-GPU results)
    whole, res["generate_whole_s"] = once(lambda: power_law_block(N, cfg["degree"], seed=cfg["seed"], device=device,
                                                                   degrees=degrees), device)
    plan = st.SpmmPlan(whole, validate=False)
    one = DistributedCSR.from_global(whole, group=solo)
    _log(rank, start, f"whole graph generated ({res['entries']} entries, {res['generate_whole_s']:.2f} s)")
    spmm1 = _spmm_cases(cfg, one, solo, device, (r0, r1), plan=plan)
    _log(rank, start, "1 GPU: spmm " + ", ".join(f"n={n} {v['plan_s'] * 1e3:.2f} / {v['seconds'] * 1e3:.2f} ms"
                                                   for n, v in spmm1.items()))
    reference = {n: spmm1[n].pop("reference_rows") for n in cfg["widths"]}
    del plan, whole
    free_memory(device)
    gcn1 = _gcn_case(cfg, one, (0, N), solo, device, steps=3, reps=cfg["reps"])
    del one
    free_memory(device)
    res["one"] = {"spmm": spmm1, "gcn": gcn1}
    _save_partial(cfg, rank, res)
    _log(rank, start, f"1 GPU: GCN step {gcn1['seconds'] * 1e3:.2f} ms, peak {_gib(gcn1['peak'])} GiB")

    # 2+ GPUs: each rank generates only its rows; the default transport (the headline rows), then the
    # other transport (CUDA), then the default with B's rows moved in bf16 (exchange_dtype)
    _sync(world_group, device)
    block, res["generate_block_s"] = once(lambda: power_law_block(N, cfg["degree"], rows=(r0, r1), seed=cfg["seed"],
                                                                   device=device, degrees=degrees), device)
    res["min_rows"] = _remote_rows(block, r0, r1)
    res["block_entries"] = block.col_indices.numel()
    for key, transport, exchange_dtype in (("two", "auto", None), ("two_other", None, None),
                                           ("two_bf16", "auto", torch.bfloat16)):
        if key == "two_other":
            if device.type != "cuda":
                continue  # CPU ranks have the all-to-all only
            transport = "all_to_all" if res["two"]["transport"] == "copy_engine" else "copy_engine"
        def build(transport=transport):
            two = DistributedCSR.from_blocks(block, transport=transport)
            # the copy engines map the peers' buffers at the first exchange: fail here, not mid-case
            two.halo_plan.exchange(torch.zeros(two.col_end - two.col_start, 1, device=device))
            return two

        try:
            two, res["build_s"] = once(build, device)
        except RuntimeError as e:  # copy engines asked for where the GPUs cannot map each other's memory
            res[f"{key}_skipped"] = str(e)[:200]
            continue
        if exchange_dtype is not None:
            two.exchange_dtype = exchange_dtype
        res["halo_rows"] = two.halo_size
        spmm2 = _spmm_cases(cfg, two, world_group, device, (r0, r1), reference=reference)
        _log(rank, start, f"{world} GPUs ({two.halo_plan.transport.name}): spmm " +
             ", ".join(f"n={n} {v['seconds'] * 1e3:.2f} ms" for n, v in spmm2.items()))
        free_memory(device)
        gcn2 = _gcn_case(cfg, two, (r0, r1), world_group, device, steps=3, reps=cfg["reps"])
        res[key] = {"spmm": spmm2, "gcn": gcn2, "transport": two.halo_plan.transport.name,
                    "element": 2 if exchange_dtype is not None else 4,  # bytes per exchanged value
                    "label": _impl(world, two.halo_plan.transport.name) + (", B rows in bf16" if exchange_dtype else "")}
        del two
        free_memory(device)
        _save_partial(cfg, rank, res)
        _log(rank, start, f"{world} GPUs ({res[key]['transport']}): GCN step {gcn2['seconds'] * 1e3:.2f} ms, peak "
                          f"{_gib(gcn2['peak'])} GiB (+ {_gib(gcn2['outside_bytes'])} GiB outside the allocator)")
    del block, reference
    gcn2 = res["two"]["gcn"]

    if cfg["capped"] and device.type == "cuda":
        res["capped"] = _capped(cfg, degrees, rank, world, (r0, r1), gcn1, gcn2, solo, world_group, device)
        _save_partial(cfg, rank, res)
        _log(rank, start, f"capped: {res['capped']}")
    return res


def _capped(cfg, degrees, rank, world, rows, gcn1, gcn2, solo, world_group, device) -> dict:
    from sparsetorch.distributed import DistributedCSR, power_law_block

    # The copy-engine transport's buffer is symmetric memory, outside the caching allocator (and its
    # cap): it is counted in the peaks, and the 2-GPU run's allocator gets the cap less the buffer.
    outside = int(_max(float(gcn2.get("outside_bytes", 0)), world_group, device))
    one_peak = _max(float(gcn1["peak"]), world_group, device)
    two_peak = _max(float(gcn2["peak"] + gcn2.get("outside_bytes", 0)), world_group, device)
    total = torch.cuda.get_device_properties(device).total_memory
    out = {"one_gpu_peak": one_peak, "two_gpu_peak_uncapped": two_peak, "total": total, "outside_bytes": outside}
    if two_peak >= 0.9 * one_peak:
        out["skipped"] = "2 ranks need nearly what one GPU needs: no cap separates them"
        return out
    cap = 0.5 * (one_peak + two_peak)
    out["cap"] = cap
    free_memory(device)
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    try:
        if rank == 0:
            out["one_gpu_under_cap"] = _solo_under_cap(cfg, degrees, solo, device)
        free_memory(device)
        torch.cuda.set_per_process_memory_fraction((cap - outside) / total, device)
        _sync(world_group, device)
        block = power_law_block(cfg["nodes"], cfg["degree"], rows=rows, seed=cfg["seed"], device=device,
                                degrees=degrees)
        A = DistributedCSR.from_blocks(block)
        del block
        rec = _gcn_case(cfg, A, rows, world_group, device, steps=cfg["capped_epochs"], reps=3)
        out["epoch_s"] = rec["seconds"]
        out["losses"] = rec["losses"]
        out["peak"] = rec["peak"] + rec.get("outside_bytes", 0)
        out["outside_bytes_run"] = rec.get("outside_bytes", 0)
        out["within_cap"] = out["peak"] <= cap
        del A
    except torch.cuda.OutOfMemoryError as e:
        out["error"] = str(e).split("\n")[0][:300]
    finally:
        free_memory(device)
        torch.cuda.set_per_process_memory_fraction(1.0, device)
    return out


# --- rows and summary ----------------------------------------------------------------------------

def _total_peak(rec: dict):
    """The allocator's peak plus the transport's buffer outside it (None on CPUs)."""
    return None if rec["peak"] is None else rec["peak"] + rec.get("outside_bytes", 0)


def _two_keys(r0: dict) -> List[str]:
    """The multi-GPU runs present: the default transport, the other one, the default with a bf16 exchange."""
    return [k for k in ("two", "two_other", "two_bf16") if k in r0]


def _impl(world: int, transport: str) -> str:
    return f"{world} GPUs ({'copy engines' if transport == 'copy_engine' else 'all-to-all'})"


def _rows(ctx: Context, cfg: dict, results: List[dict]) -> List[dict]:
    r0 = results[0]
    world = len(results)
    N, E = cfg["nodes"], r0["entries"]
    bw = ctx.ceilings.bandwidth
    rate = ctx.ceilings.gemm.get("float32")
    graph = f"power-law {_count(N)} nodes, {_count(E)} entries"
    if world != 2:  # the cases of other rank counts apart (the 2-rank names as before)
        graph += f", {world} ranks"
    rows = []
    link = r0["link"][-1]
    rows.append({"suite": "distributed", "case": f"all-to-all, {link['bytes_per_peer'] / 2**20:.0f} MiB per peer",
                 "impl": f"{world} GPUs: NCCL all_to_all_single", "dtype": "uint8", "time_ms": link["seconds"] * 1e3,
                 "GBps": link["GBps_per_rank"], "GFLOPs": 0.0, "floor_ms": float("nan"), "of_floor": float("nan"),
                 "rel_err": 0.0, "link": r0["link"]})
    per_rank_nnz = [r["block_entries"] for r in results]
    per_rank_m = [r["bounds"][r["rank"] + 1] - r["bounds"][r["rank"]] for r in results]
    for n in cfg["widths"]:
        case = f"spmm {graph}, n={n}"
        flops = 2.0 * E * n
        one = r0["one"]["spmm"][n]
        floor1 = spmm_model(E, N, N, n, 4, 4)[0] / bw
        floor2 = max(spmm_model(e, m, N, n, 4, 4)[0] for e, m in zip(per_rank_nnz, per_rank_m)) / bw
        best1 = min(one["plan_s"], one["seconds"])
        best1_loop = min(one["plan_loop_s"], one["loop_s"])
        two = [r["two"]["spmm"][n] for r in results]
        t2 = two[0]["seconds"]
        base = {"suite": "distributed", "case": case, "dtype": "float32", "n": n, "nodes": N, "entries": E}
        rows.append({**base, "impl": "1 GPU: SpmmPlan", "time_ms": one["plan_s"] * 1e3,
                     "GBps": spmm_model(E, N, N, n, 4, 4)[0] / one["plan_s"] / 1e9, "GFLOPs": flops / one["plan_s"] / 1e9,
                     "floor_ms": floor1 * 1e3, "of_floor": floor1 / one["plan_s"], "rel_err": 0.0,
                     "peak_GiB_per_rank": [_gib(one["plan_peak"])]})
        rows.append({**base, "impl": "1 GPU: DistributedCSR", "time_ms": one["seconds"] * 1e3,
                     "GBps": spmm_model(E, N, N, n, 4, 4)[0] / one["seconds"] / 1e9,
                     "GFLOPs": flops / one["seconds"] / 1e9, "floor_ms": floor1 * 1e3,
                     "of_floor": floor1 / one["seconds"], "rel_err": 0.0, "peak_GiB_per_rank": [_gib(one["peak"])]})
        for key in _two_keys(r0):
            minimum = [r["min_rows"] * n * r0[key]["element"] for r in results]
            two = [r[key]["spmm"][n] for r in results]
            t2 = two[0]["seconds"]
            received = [t["bytes_received"] for t in two]
            rows.append({**base, "impl": r0[key]["label"], "time_ms": t2 * 1e3, "GBps": float("nan"),
                         "GFLOPs": flops / t2 / 1e9, "floor_ms": floor2 * 1e3, "of_floor": floor2 / t2,
                         "rel_err": two[0].get("rel_err", float("nan")), "transport": r0[key]["transport"],
                         "scaling": best1 / t2, "loop_time_ms": two[0]["loop_s"] * 1e3,
                         "scaling_loop": best1_loop / two[0]["loop_s"], "one_gpu_loop_ms": best1_loop * 1e3,
                         "bytes_received_per_rank": received, "min_bytes_per_rank": minimum,
                         "bytes_vs_min": max(b / m if m else (1.0 if b == 0 else float("inf"))
                                             for b, m in zip(received, minimum)),
                         "exchange_alone_ms": two[0].get("exchange_s", 0.0) * 1e3,
                         "local_product_alone_ms": two[0].get("local_alone_s", 0.0) * 1e3,
                         "remote_product_alone_ms": two[0].get("remote_alone_s", 0.0) * 1e3,
                         "peak_GiB_per_rank": [_gib(_total_peak(t)) for t in two],
                         "transport_buffer_GiB_per_rank": [_gib(t.get("outside_bytes", 0)) for t in two],
                         "entries_per_rank": per_rank_nnz, "rows_per_rank": per_rank_m,
                         "halo_rows_per_rank": [r["halo_rows"] for r in results],
                         "plan_received_vs_min_per_rank": [v["ratio"] for v in two[0].get("halo_volume", [])]})
    # GCN step
    F_, H, C = cfg["features"], cfg["hidden"], cfg["classes"]

    # The first layer is (A x) W1 when F < H (graph_linear): one SpMM of width F and none in its
    # backward; else A (x W1): width H forward and backward. The second: width C forward and backward.
    sparse_widths = (F_, C, C) if F_ < H else (H, H, C, C)
    exchanged_widths = (F_, C) if F_ < H else (H, C)  # forward exchanges per step

    def step_floor(e, m):
        s = 0.0
        for width in sparse_widths:
            b, f = spmm_model(e + m, m, N, width, 4, 4)
            s += max(b / bw, f / rate)
        for mm, kk, nn in ((m, F_, H), (F_, m, H), (m, H, C), (H, m, C), (m, C, H)):  # layer 1 and its grad; h W2, its grads
            b, f = gemm_model(mm, kk, nn, 4)
            s += max(b / bw, f / rate)
        return s

    one = r0["one"]["gcn"]
    case = f"GCN step {graph}, {F_}-{H}-{C}"
    base = {"suite": "distributed", "case": case, "dtype": "float32", "nodes": N, "entries": E}
    f1 = step_floor(E, N)
    f2 = max(step_floor(e, m) for e, m in zip(per_rank_nnz, per_rank_m))
    rows.append({**base, "impl": "1 GPU: DistributedCSR", "time_ms": one["seconds"] * 1e3, "GBps": float("nan"),
                 "GFLOPs": float("nan"), "floor_ms": f1 * 1e3, "of_floor": f1 / one["seconds"], "rel_err": 0.0,
                 "peak_GiB_per_rank": [_gib(one["peak"])], "losses": one["losses"]})
    for key in _two_keys(r0):
        two = [r[key]["gcn"] for r in results]
        loss_diff = max(abs(a - b) / abs(a) for a, b in zip(one["losses"], two[0]["losses"]))
        received = [t["exchange"]["forward_bytes_received"] for t in two]
        minimum = [r["min_rows"] * r0[key]["element"] * sum(exchanged_widths) for r in results]
        rows.append({**base, "impl": r0[key]["label"], "time_ms": two[0]["seconds"] * 1e3,
                     "GBps": float("nan"), "GFLOPs": float("nan"), "floor_ms": f2 * 1e3,
                     "of_floor": f2 / two[0]["seconds"], "rel_err": loss_diff, "transport": r0[key]["transport"],
                     "scaling": one["seconds"] / two[0]["seconds"], "loop_time_ms": two[0]["loop_s"] * 1e3,
                     "scaling_loop": one["loop_s"] / two[0]["loop_s"], "one_gpu_loop_ms": one["loop_s"] * 1e3,
                     "losses": two[0]["losses"],
                     "peak_GiB_per_rank": [_gib(_total_peak(t)) for t in two],
                     "transport_buffer_GiB_per_rank": [_gib(t.get("outside_bytes", 0)) for t in two],
                     "exchange_per_step_per_rank": [t["exchange"] for t in two],
                     "bytes_received_per_rank": received, "min_bytes_per_rank": minimum,
                     "bytes_vs_min": max(b / m if m else 1.0 for b, m in zip(received, minimum))})
    capped = [r.get("capped") for r in results]
    if capped[0] and "epoch_s" in capped[0]:
        c0 = capped[0]
        rows.append({**base, "case": f"{case}, memory capped at {c0['cap'] / GIB:.1f} GiB per GPU",
                     "impl": f"{world} GPUs (capped)", "time_ms": c0["epoch_s"] * 1e3,
                     "GBps": float("nan"), "GFLOPs": float("nan"), "floor_ms": f2 * 1e3,
                     "of_floor": f2 / c0["epoch_s"], "rel_err": 0.0,
                     "cap_GiB": c0["cap"] / GIB, "one_gpu_peak_GiB": c0["one_gpu_peak"] / GIB,
                     "one_gpu_under_cap": c0.get("one_gpu_under_cap"), "losses": c0["losses"],
                     "peak_GiB_per_rank": [_gib(c["peak"]) for c in capped],
                     "transport_buffer_GiB_per_rank": [_gib(c.get("outside_bytes_run", 0)) for c in capped],
                     "allocator_cap_GiB": (c0["cap"] - c0.get("outside_bytes", 0)) / GIB,
                     "within_cap": [c.get("within_cap") for c in capped]})
    return rows


def _print_summary(r0: dict, rows: List[dict]) -> None:
    print("\ndistributed:")
    for link in r0["link"]:
        print(f"  all-to-all {link['bytes_per_peer'] / 2**20:.0f} MiB per peer: {link['seconds'] * 1e3:.2f} ms, "
              f"{link['GBps_per_rank']:.1f} GB/s per rank each way")
    for r in rows:
        if "scaling" in r:
            extra = ""
            if "bytes_vs_min" in r:
                extra = (f"; received {[round(b / 2**20, 1) for b in r['bytes_received_per_rank']]} MiB per rank "
                         f"(forward), {r['bytes_vs_min']:.3f}x the partition's minimum")
            if "exchange_alone_ms" in r:
                extra += (f"; alone: exchange {r['exchange_alone_ms']:.2f} ms, local product "
                          f"{r['local_product_alone_ms']:.2f} ms, remote product {r['remote_product_alone_ms']:.2f} ms")
            peaks = [round(p, 2) for p in r["peak_GiB_per_rank"] if p is not None]
            print(f"  {r['case']}: {r['time_ms']:.2f} ms on {r['impl']}, {versus(r['scaling'], '1 GPU')}; in a loop "
                  f"of calls {r['one_gpu_loop_ms']:.2f} -> {r['loop_time_ms']:.2f} ms, "
                  f"{versus(r['scaling_loop'], '1 GPU')}; "
                  f"peak {peaks} GiB{extra}; error vs 1 GPU {r['rel_err']:.2g}")
        if "cap_GiB" in r:
            print(f"  capped at {r['cap_GiB']:.1f} GiB per GPU (one GPU's step peaks at {r['one_gpu_peak_GiB']:.1f} "
                  f"GiB): one GPU: {r['one_gpu_under_cap']}; {r['impl']}: {r['time_ms']:.1f} ms per epoch, losses "
                  f"{[round(x, 4) for x in r['losses']]}, peak {[round(p, 2) for p in r['peak_GiB_per_rank']]} GiB "
                  f"(incl. the transport's buffer {[round(p, 2) for p in r['transport_buffer_GiB_per_rank']]}), "
                  f"within the cap: {r['within_cap']}")
    capped = r0.get("capped")
    if capped and "epoch_s" not in capped:
        print(f"  capped run: {capped}")
