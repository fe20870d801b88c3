"""distributed: strong scaling of SpMM and of a 2-layer GCN training step from 1 to 2+ GPUs (NCCL, one
process per GPU) on a synthetic power-law graph of >= 100M stored entries, generated on the GPUs.

Rank counts: SPARSETORCH_BENCH_DIST_RANKS (default 2). Per rank count: the default transport, the other
one (CUDA), and the default with B's rows moved in bf16 (``DistributedCSR.exchange_dtype``).
Per case: time (the slowest rank's median), bytes each rank receives per product against the
partition's minimum (its distinct remote rows x n x element size, counted from its block, apart from
the exchange plan), peak memory per rank. Also the all-to-all bandwidth between the GPUs (measured
first) and a capped-memory run: each process's memory capped (set_per_process_memory_fraction)
between what 2 ranks need and what one GPU needs for the whole training step; one GPU then runs
out of memory and 2 GPUs train. Skipped with a message when fewer than 2 CUDA devices are present.

Rehearsal on CPUs (gloo): ``python -m sparsetorch.bench.suites.distributed --device cpu --nodes 20000``.
"""
from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import statistics
import time
from typing import Dict, List

import torch
import torch.distributed as dist

from sparsetorch.bench.ratios import versus
from sparsetorch.bench.suites.common import Context, Job, gemm_model, spmm_model
from sparsetorch.bench.timing import call_seconds

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
    count = torch.cuda.device_count() if ctx.cuda else 0
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


def _worlds(count: int) -> List[int]:
    """The rank counts to run: those of SPARSETORCH_BENCH_DIST_RANKS (default "2") that the host has."""
    asked = [int(w) for w in os.environ.get(RANKS_ENV, "2").split(",") if w.strip()]
    return [w for w in asked if 2 <= w <= count]


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


def _time(fn, group, device, reps: int, warmup: int, calls: int = 1) -> float:
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
        times.append(call_seconds(loop, device) / calls)
    return _max(statistics.median(times), group, device)


def _peak_reset(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)


def _peak(device):
    return torch.cuda.max_memory_allocated(device) if device.type == "cuda" else None


def _free(device):
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
        seconds = _time(functools.partial(dist.all_to_all_single, recv, send, splits, splits, group=group), group,
                        device, 5, 2)
        out.append({"bytes_per_peer": size, "seconds": seconds, "GBps_per_rank": size * (world - 1) / seconds / 1e9})
        del send, recv
    return out


def _global_b(cfg, n, device):
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
        B = _global_b(cfg, n, device)
        rec = {}
        if plan is not None:
            _peak_reset(device)
            rec["plan_s"] = _time(functools.partial(plan, B), group, device, cfg["reps"], cfg["warmup"])
            rec["plan_loop_s"] = _time(functools.partial(plan, B), group, device, cfg["reps"], 0, cfg["loop"])
            rec["plan_peak"] = _peak(device)
            full = plan(B)
            rec["reference_rows"] = full[b_rows[0]:b_rows[1]].cpu()  # off the GPU: not in the 2-GPU peaks
            del full
        b = B[A.col_start:A.col_end].clone()
        del B
        _free(device)
        _peak_reset(device)
        rec["seconds"] = _time(functools.partial(st.spmm, A, b), group, device, cfg["reps"], cfg["warmup"])
        rec["loop_s"] = _time(functools.partial(st.spmm, A, b), group, device, cfg["reps"], 0, cfg["loop"])
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

            rec["exchange_s"] = _time(functools.partial(_exchange_only, A.halo_plan, b), group, device,
                                      cfg["reps"], 1)
            halo = A.halo_plan.exchange(b)
            for part, operand, key in ((A.local, b, "local"), (A.remote, halo, "remote")):
                route = _route(A, key, part, operand, "auto")
                rec[f"{key}_alone_s"] = _time(functools.partial(st.spmm, part, operand, backend=route), group,
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
        _free(device)
    return out


def _exchange_only(plan, b):
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
        rec["seconds"] = _time(step, group, device, reps, 1)
        rec["loop_s"] = _time(step, group, device, reps, 0, cfg["loop"])
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
    t0 = time.perf_counter()
    whole = power_law_block(N, cfg["degree"], seed=cfg["seed"], device=device, degrees=degrees)
    res["generate_whole_s"] = time.perf_counter() - t0
    plan = st.SpmmPlan(whole, validate=False)
    one = DistributedCSR.from_global(whole, group=solo)
    _log(rank, start, f"whole graph generated ({res['entries']} entries, {res['generate_whole_s']:.2f} s)")
    spmm1 = _spmm_cases(cfg, one, solo, device, (r0, r1), plan=plan)
    _log(rank, start, "1 GPU: spmm " + ", ".join(f"n={n} {v['plan_s'] * 1e3:.2f} / {v['seconds'] * 1e3:.2f} ms"
                                                   for n, v in spmm1.items()))
    reference = {n: spmm1[n].pop("reference_rows") for n in cfg["widths"]}
    del plan, whole
    _free(device)
    gcn1 = _gcn_case(cfg, one, (0, N), solo, device, steps=3, reps=cfg["reps"])
    del one
    _free(device)
    res["one"] = {"spmm": spmm1, "gcn": gcn1}
    _save_partial(cfg, rank, res)
    _log(rank, start, f"1 GPU: GCN step {gcn1['seconds'] * 1e3:.2f} ms, peak {_gib(gcn1['peak'])} GiB")

    # 2+ GPUs: each rank generates only its rows; the default transport (the headline rows), then the
    # other transport (CUDA), then the default with B's rows moved in bf16 (exchange_dtype)
    _sync(world_group, device)
    t0 = time.perf_counter()
    block = power_law_block(N, cfg["degree"], rows=(r0, r1), seed=cfg["seed"], device=device, degrees=degrees)
    res["generate_block_s"] = time.perf_counter() - t0
    res["min_rows"] = _remote_rows(block, r0, r1)
    res["block_entries"] = block.col_indices.numel()
    for key, transport, exchange_dtype in (("two", "auto", None), ("two_other", None, None),
                                           ("two_bf16", "auto", torch.bfloat16)):
        if key == "two_other":
            if device.type != "cuda":
                continue  # CPU ranks have the all-to-all only
            transport = "all_to_all" if res["two"]["transport"] == "copy_engine" else "copy_engine"
        t0 = time.perf_counter()
        try:
            two = DistributedCSR.from_blocks(block, transport=transport)
            # the copy engines map the peers' buffers at the first exchange: fail here, not mid-case
            two.halo_plan.exchange(torch.zeros(two.col_end - two.col_start, 1, device=device))
        except RuntimeError as e:  # copy engines asked for where the GPUs cannot map each other's memory
            res[f"{key}_skipped"] = str(e)[:200]
            continue
        if exchange_dtype is not None:
            two.exchange_dtype = exchange_dtype
        res["build_s"] = time.perf_counter() - t0
        res["halo_rows"] = two.halo_size
        spmm2 = _spmm_cases(cfg, two, world_group, device, (r0, r1), reference=reference)
        _log(rank, start, f"{world} GPUs ({two.halo_plan.transport.name}): spmm " +
             ", ".join(f"n={n} {v['seconds'] * 1e3:.2f} ms" for n, v in spmm2.items()))
        _free(device)
        gcn2 = _gcn_case(cfg, two, (r0, r1), world_group, device, steps=3, reps=cfg["reps"])
        res[key] = {"spmm": spmm2, "gcn": gcn2, "transport": two.halo_plan.transport.name,
                    "element": 2 if exchange_dtype is not None else 4,  # bytes per exchanged value
                    "label": _impl(world, two.halo_plan.transport.name) + (", B rows in bf16" if exchange_dtype else "")}
        del two
        _free(device)
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
    _free(device)
    torch.cuda.set_per_process_memory_fraction(cap / total, device)
    try:
        if rank == 0:
            out["one_gpu_under_cap"] = _solo_under_cap(cfg, degrees, solo, device)
        _free(device)
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
        _free(device)
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


# --- the halo of a partition, off line (no group, no GPU) -----------------------------------------
# Relabellings measured against today's balanced-entry blocks of the natural order; none of them
# wins on the power-law generator (docs/distributed.md, "Partitioning"), so they live here, not in
# sparsetorch.distributed.partition.

def relabel(a, order: torch.Tensor):
    """The square matrix with its nodes renumbered: new node j is old node ``order[j]`` (rows and
    columns alike, ``P A P^T``). Columns keep their order within each row (not re-sorted)."""
    from sparsetorch.csr import CSR

    m, k = a.shape
    if m != k:
        raise ValueError(f"relabel: expected a square matrix, got shape {a.shape}")
    order = order.long().to(a.crow_indices.device)
    if order.numel() != m:
        raise ValueError(f"relabel: expected an order of {m} nodes, got {order.numel()}")
    rank = torch.empty_like(order)
    rank[order] = torch.arange(m, device=order.device)
    crow = a.crow_indices.long()
    counts = (crow[1:] - crow[:-1])[order]
    new_crow = torch.zeros(m + 1, dtype=torch.int64, device=crow.device)
    torch.cumsum(counts, 0, out=new_crow[1:])
    nnz = a.col_indices.numel()
    # entry e of new row j comes from old entry crow[order[j]] + (e - new_crow[j])
    src = torch.repeat_interleave(crow[:-1][order] - new_crow[:-1], counts, output_size=nnz)
    src += torch.arange(nnz, device=crow.device)
    col = rank[a.col_indices.long()[src]]
    values = a.values[src]
    del src
    return CSR(new_crow.to(a.index_dtype), col.to(a.index_dtype), values, a.shape)


ORDERINGS = ("natural", "random", "degree", "rcm")


def node_order(a, ordering: str, seed: int = 0) -> torch.Tensor:
    """A relabelling of the nodes of a square matrix (for :func:`relabel`): "natural" (as stored),
    "random" (a control), "degree" (by in + out degree, largest first: hubs together), "rcm"
    (reverse Cuthill-McKee of the symmetrised pattern, SciPy's: a BFS order that keeps neighbours
    in nearby rows, so in the same block)."""
    m = a.shape[0]
    crow = a.crow_indices.long()
    if ordering == "natural":
        return torch.arange(m)
    if ordering == "random":
        gen = torch.Generator()
        gen.manual_seed(seed)
        return torch.randperm(m, generator=gen)
    if ordering == "degree":
        deg = (crow[1:] - crow[:-1]).cpu() + torch.bincount(a.col_indices.long().cpu(), minlength=m)
        return torch.sort(deg, descending=True, stable=True).indices
    if ordering == "rcm":
        import numpy as np
        import scipy.sparse as sp
        from scipy.sparse.csgraph import reverse_cuthill_mckee

        nnz = a.col_indices.numel()
        pattern = sp.csr_matrix((np.ones(nnz, dtype=np.bool_), a.col_indices.cpu().numpy(), crow.cpu().numpy()),
                                shape=(m, m))
        sym = (pattern + pattern.T).tocsr()
        del pattern
        sym.sort_indices()
        return torch.from_numpy(reverse_cuthill_mckee(sym, symmetric_mode=True).astype(np.int64))
    raise ValueError(f"ordering: expected one of {', '.join(ORDERINGS)}, got {ordering!r}")



def _halo_model(nodes: int, degree: float, seed: int, entries: int, parts: int) -> float:
    """The expected halo rows of a part of the power-law graph: its entries/parts columns are drawn
    independently with the generator's column probabilities w_c, so it references column c with
    probability 1 - exp(-entries/parts * w_c), and owns 1/parts of them. No ordering of the nodes
    changes this sum (only which part owns the hub rows, i.e. the entry balance)."""
    from sparsetorch.distributed.graphs import _pareto

    w = _pareto(torch.arange(nodes), seed * 4 + 1, 1.5)
    w /= w.sum()
    return float((1 - torch.exp(-(entries / parts) * w)).sum()) * (1 - 1 / parts)


def halo_table(nodes: int, degree: float = 32, seed: int = 11, parts=(2, 4, 8, 16, 64),
               orderings=("natural", "random", "degree", "rcm"), widths=(64, 256), log=print) -> List[dict]:
    """Per ordering and part count: the rows and bytes each part receives per product with the
    balanced-entry row blocks of the relabelled power-law graph (the suite's generator, on the CPU),
    against the partition's minimum (partition.halo_counts). Times are of the ordering alone."""
    from sparsetorch.distributed import balanced_row_bounds, power_law_graph
    from sparsetorch.distributed.partition import halo_counts

    t0 = time.perf_counter()
    g = power_law_graph(nodes, degree, seed=seed)
    entries = g.col_indices.numel()
    log(f"graph: {nodes} nodes, {entries} entries, generated in {time.perf_counter() - t0:.1f} s")
    out = []
    for ordering in orderings:
        t0 = time.perf_counter()
        order = node_order(g, ordering, seed)
        order_s = time.perf_counter() - t0
        h = g if ordering == "natural" else relabel(g, order)
        del order
        for p in parts:
            bounds = balanced_row_bounds(h.crow_indices, p)
            c = halo_counts(h, bounds)
            rec = {"ordering": ordering, "parts": p, "nodes": nodes, "entries": entries, "order_s": order_s,
                   "model_mean_rows": _halo_model(nodes, degree, seed, entries, p),
                   "needed_rows": c["needed"], "received_rows": c["received"], "entries_per_part": c["entries"],
                   "rows_per_part": c["rows"],
                   "max_needed_rows": max(c["needed"]), "mean_needed_rows": sum(c["needed"]) / p,
                   "max_received_rows": max(c["received"]), "total_received_rows": sum(c["received"]),
                   "ratio": max(r / n if n else 1.0 for r, n in zip(c["received"], c["needed"])),
                   "entry_imbalance": max(c["entries"]) * p / max(1, entries),
                   "local_entry_fraction": [le / max(1, e) for le, e in zip(c["local_entries"], c["entries"])]}
            for n in widths:
                rec[f"max_MiB_per_rank_n{n}"] = rec["max_received_rows"] * n * 4 / 2**20
            out.append(rec)
            log(f"{ordering:8s} {p:3d} parts: halo rows per part max {rec['max_needed_rows']}, mean "
                f"{rec['mean_needed_rows']:.0f} ({rec['mean_needed_rows'] / nodes:.3f} of the nodes; model "
                f"{rec['model_mean_rows']:.0f}), received / "
                f"minimum {rec['ratio']:.4f}, n=256 fp32 {rec['max_MiB_per_rank_n256']:.1f} MiB per rank max, "
                f"entry imbalance {rec['entry_imbalance']:.3f}, local entries {min(rec['local_entry_fraction']):.3f}-"
                f"{max(rec['local_entry_fraction']):.3f} (ordering {order_s:.1f} s)")
        del h
        gc.collect()
    return out


def host_table(nodes: int, degree: float = 32, seed: int = 11, gpus=(8, 16, 64), per_host: int = 8,
               widths=(64, 256), log=print) -> List[dict]:
    """Past one host, off line: per GPU count (``per_host`` GPUs per host, balanced-entry row blocks
    of the power-law graph), the rows each GPU receives per product, the part of them from GPUs on
    other hosts, and per host what crosses the network: flat (every GPU fetches its own rows) and
    deduplicated (each distinct row a host needs from another host crosses once, then moves on
    NVLink: the halo of the host-level partition)."""
    from sparsetorch.distributed import balanced_row_bounds, power_law_graph
    from sparsetorch.distributed.partition import halo_counts

    g = power_law_graph(nodes, degree, seed=seed)
    out = []
    for p in gpus:
        bounds = balanced_row_bounds(g.crow_indices, p)
        c = halo_counts(g, bounds)
        hosts = max(1, p // per_host)
        host_of = [r * hosts // p for r in range(p)]
        off_host = [sum(n for q, n in enumerate(c["pairs"][r]) if host_of[q] != host_of[r]) for r in range(p)]
        flat = [sum(off_host[r] for r in range(p) if host_of[r] == h) for h in range(hosts)]
        if hosts > 1:
            host_bounds = [bounds[h * p // hosts] for h in range(hosts + 1)]
            dedup = halo_counts(g, host_bounds)["needed"]
        else:
            dedup = [0]
        rec = {"gpus": p, "hosts": hosts, "nodes": nodes, "entries": g.col_indices.numel(),
               "received_rows_per_gpu_max": max(c["received"]), "received_rows_per_gpu_mean": sum(c["received"]) / p,
               "min_rows_per_gpu_max": max(c["needed"]), "off_host_rows_per_gpu_max": max(off_host),
               "network_rows_per_host_flat_max": max(flat), "network_rows_per_host_dedup_max": max(dedup),
               "total_received_rows": sum(c["received"])}
        for n in widths:
            mib = n * 4 / 2**20
            rec[f"n{n}_MiB"] = {k: v * mib for k, v in rec.items() if k.endswith("_max") or k.endswith("_mean")
                                or k == "total_received_rows"}
        out.append(rec)
        log(f"{p:3d} GPUs on {hosts} host(s): per GPU max {rec['received_rows_per_gpu_max']} rows received "
            f"(minimum {rec['min_rows_per_gpu_max']}), {rec['off_host_rows_per_gpu_max']} from other hosts; per host "
            f"over the network: flat {rec['network_rows_per_host_flat_max']}, deduplicated "
            f"{rec['network_rows_per_host_dedup_max']} rows; all GPUs together {rec['total_received_rows']} rows")
    return out


def main(argv=None):
    from sparsetorch.bench.timing import make_timer, measure_ceilings

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda", choices=("cpu", "cuda"))
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=None)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--halo-table", action="store_true",
                    help="only the off-line halo volume per ordering and part count (CPU, no group)")
    ap.add_argument("--parts", default="2,4,8,16,64", help="with --halo-table: part counts")
    ap.add_argument("--orderings", default="natural,random,degree,rcm", help="with --halo-table: orderings")
    ap.add_argument("--json", default=None, help="with --halo-table: write the rows here")
    ap.add_argument("--host-table", action="store_true",
                    help="only the off-line exchange volume past one host (8, 16, 64 GPUs, 8 per host)")
    args = ap.parse_args(argv)
    if args.host_table:
        rows = host_table(args.nodes or (1 << 22))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return rows
    if args.halo_table:
        rows = halo_table(args.nodes or (1 << 22), parts=[int(p) for p in args.parts.split(",")],
                          orderings=args.orderings.split(","))
        if args.json:
            with open(args.json, "w") as f:
                json.dump(rows, f, indent=1)
        return rows
    device = torch.device(args.device)
    timer = make_timer(device, True)
    ctx = Context(device, timer, measure_ceilings(device, timer, True), not args.full, None)
    cfg = _config(ctx.quick, args.device, args.nodes or (1 << 23 if args.device == "cuda" else 20_000))
    if args.device == "cpu":
        cfg.update(widths=(16, 64), features=32, hidden=64, reps=3)
    for r in run(ctx, cfg, world=args.ranks):
        print({k: v for k, v in r.items() if k not in ("link",)})


if __name__ == "__main__":
    main()
