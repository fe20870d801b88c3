"""Where the 2-GPU distributed SpMM loses time against half of the 1-GPU time, and what the exchange
costs when it overlaps the local product: NCCL (default and with its CTAs capped) against a
copy-engine push through PyTorch's symmetric memory (the sender's cudaMemcpy writes straight into the
receiver's halo buffer; no SM runs the transfer; sparsetorch/distributed/transport.py). Also the GCN
training step with the first layer's dense product on either side of the SpMM.

    python -m benchmarks.distributed_overlap_cuda [--nodes 4194304] [--widths 64,256] [--out DIR]

Needs 2 CUDA devices (one process each, spawned here); NVLink multicast stays off (launch.py).
Every time is the slowest rank's median (ranks aligned before each call).
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import time

import torch
import torch.distributed as dist


def _nccl_group(max_ctas):
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    if max_ctas:
        opts.config.max_ctas = max_ctas
        opts.config.min_ctas = min(max_ctas, 1)
    return dist.new_group([0, 1], backend="nccl", pg_options=opts)


def _worker(rank, world, cfg):
    import sparsetorch as st
    from benchmarks.suites.distributed import exchange_only, free_memory, global_b, time_ranks
    from sparsetorch.distributed import DistributedCSR, balanced_row_bounds, power_law_block, power_law_degrees
    from sparsetorch.distributed._spmm import _route

    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device("cuda", torch.cuda.current_device())
    world_group = dist.group.WORLD
    solo = dist.new_group([rank], use_local_synchronization=True)
    reps, warm = cfg["reps"], 2
    T = functools.partial(time_ranks, group=world_group, device=device, reps=reps, warmup=warm)
    out = {"rank": rank, "spmm": {}, "gcn": {}}
    log = (lambda s: print(f"[{time.strftime('%H:%M:%S')}] {s}", flush=True)) if rank == 0 else (lambda s: None)

    N, deg, seed = cfg["nodes"], 32, 11
    degrees = power_law_degrees(N, deg, seed, device)
    crow = torch.zeros(N + 1, dtype=torch.int64, device=device)
    torch.cumsum(degrees, 0, out=crow[1:])
    bounds = balanced_row_bounds(crow, world)
    r0, r1 = bounds[rank], bounds[rank + 1]
    del crow

    # ---- 1 GPU (rank 0; rank 1 waits) ----
    if rank == 0:
        whole = power_law_block(N, deg, seed=seed, device=device, degrees=degrees)
        plan = st.SpmmPlan(whole, validate=False)
        for n in cfg["widths"]:
            B = global_b({"seed": seed, "nodes": N}, n, device)
            out["spmm"].setdefault(n, {})["one_gpu"] = time_ranks(functools.partial(plan, B), solo, device, reps, warm)
            del B
        del plan, whole
        free_memory(device)
        one = DistributedCSR.from_global(power_law_block(N, deg, seed=seed, device=device, degrees=degrees), group=solo)
        for order in ("xw_first", "ax_first"):
            out["gcn"].setdefault(order, {})["one_gpu"] = _gcn_step_time(cfg, one, (0, N), solo, device, order)
        del one
        free_memory(device)
        log(f"1 GPU: {out}")
    dist.barrier()

    # ---- 2 GPUs ----
    block = power_law_block(N, deg, rows=(r0, r1), seed=seed, device=device, degrees=degrees)
    A = DistributedCSR.from_blocks(block, transport="all_to_all")
    plan = A.halo_plan
    for n in cfg["widths"]:
        rec = out["spmm"].setdefault(n, {})
        B = global_b({"seed": seed, "nodes": N}, n, device)
        b = B[A.col_start:A.col_end].clone()
        del B
        rec["default_all_to_all"] = T(functools.partial(st.spmm, A, b))
        rec["exchange_all_to_all"] = T(functools.partial(exchange_only, plan, b))
        halo = plan.exchange(b)
        rl, rr = _route(A, "local", A.local, b, "auto"), _route(A, "remote", A.remote, halo, "auto")
        rec["routes"] = (rl, rr)
        rec["local"] = T(lambda: st.spmm(A.local, b, backend=rl))
        rec["remote"] = T(lambda: st.spmm(A.remote, halo, backend=rr))

        def compute_only():
            z = st.spmm(A.local, b, backend=rl)
            st.spmm(A.remote, halo, beta=1.0, out=z, backend=rr)

        rec["compute_only"] = T(compute_only)
        log(f"n={n}: {rec}")
        # NCCL with its CTAs capped: the same matrix on another group
        for ctas in cfg["ctas"]:
            try:
                g = _nccl_group(ctas)
                Ag = DistributedCSR.from_blocks(block, group=g, transport="all_to_all")
                rec[f"default_ctas{ctas}"] = T(functools.partial(st.spmm, Ag, b))
                rec[f"exchange_ctas{ctas}"] = T(functools.partial(exchange_only, Ag.halo_plan, b))
                del Ag
            except Exception as e:  # noqa: BLE001
                rec[f"ctas{ctas}_error"] = repr(e)[:300]
            log(f"n={n} ctas={ctas}: {rec.get(f'default_ctas{ctas}')} {rec.get(f'exchange_ctas{ctas}')}")
        # the copy engines (the library's transport): the same products (cuSPARSE's sums may differ
        # in the last bits from call to call)
        try:
            Ace = DistributedCSR.from_blocks(block, transport="copy_engine")
            y_ce, y_a2a = st.spmm(Ace, b), st.spmm(A, b)
            rec["ce_vs_all_to_all_rel_diff"] = float((y_ce - y_a2a).norm() / y_a2a.norm())
            del y_ce, y_a2a
            rec["default_copy_engine"] = T(functools.partial(st.spmm, Ace, b))
            rec["exchange_copy_engine"] = T(functools.partial(exchange_only, Ace.halo_plan, b))
            del Ace
        except Exception:  # noqa: BLE001
            import traceback
            rec["ce_error"] = traceback.format_exc()[-1500:]
        log(f"n={n}: {rec}")
        del b, halo
        free_memory(device)
    del A
    free_memory(device)
    A = DistributedCSR.from_blocks(block)  # the default transport
    del block
    for order in ("xw_first", "ax_first"):
        out["gcn"].setdefault(order, {})["two_gpus"] = _gcn_step_time(cfg, A, (r0, r1), world_group, device, order)
    log(f"gcn: {out['gcn']}")
    return out


def _gcn_step_time(cfg, A, rows, group, device, order):
    import sparsetorch as st
    from benchmarks.suites.distributed import time_ranks
    from sparsetorch.distributed import GCN, masked_cross_entropy, node_features, node_labels, node_mask, sync_gradients

    F_, H, C, seed = 128, 256, 16, 11
    x = node_features(rows, F_, seed + 1, device)
    y = node_labels(x, C, seed + 2)
    mask = node_mask(rows, 0.5, seed + 3, device)
    torch.manual_seed(seed)
    model = GCN(F_, H, C).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)

    def forward():
        if order == "ax_first":
            return model(x, A)  # the library's order for 128 -> 256: (A x) W1
        a = A.gcn_normalized()  # the order before: A (x W1)
        h = st.spmm(a, x @ model.w1, bias=model.b1, activation="relu")
        return st.spmm(a, h @ model.w2, bias=model.b2)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = masked_cross_entropy(forward(), y, mask, group)
        loss.backward()
        sync_gradients(model.parameters(), group)
        opt.step()

    torch.cuda.reset_peak_memory_stats(device)
    t = time_ranks(step, group, device, cfg["reps"], 2)
    return {"seconds": t, "peak_GiB": torch.cuda.max_memory_allocated(device) / 2**30}


def main(argv=None):
    from sparsetorch.distributed.launch import spawn

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--nodes", type=int, default=1 << 22)
    ap.add_argument("--widths", default="64,256")
    ap.add_argument("--ctas", default="", help="also NCCL groups with at most these CTAs, e.g. 4,8,16")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cfg = {"nodes": args.nodes, "widths": [int(w) for w in args.widths.split(",")],
           "ctas": [int(c) for c in args.ctas.split(",") if c], "reps": args.reps}
    res = spawn(_worker, 2, cfg, backend="nccl", timeout=300, join_timeout=900, threads=None)
    r0 = res[0]
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "distributed_overlap.json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
    for n, rec in r0["spmm"].items():
        one = rec.get("one_gpu", float("nan"))
        print(f"\nn={n}: 1 GPU {one * 1e3:.2f} ms (half {one * 500:.2f})")
        for k, v in rec.items():
            if isinstance(v, float):
                print(f"  {k:>22}: {v * 1e3:8.2f} ms   scaling {one / v:5.2f}x")
            else:
                print(f"  {k:>22}: {v}")
    for order, rec in r0["gcn"].items():
        one, two = rec.get("one_gpu", {}), rec.get("two_gpus", {})
        print(f"GCN {order}: 1 GPU {one.get('seconds', 0) * 1e3:.2f} ms peak {one.get('peak_GiB', 0):.2f} GiB; "
              f"2 GPUs {two.get('seconds', 0) * 1e3:.2f} ms peak {two.get('peak_GiB', 0):.2f} GiB; scaling "
              f"{one.get('seconds', 0) / max(two.get('seconds', 1e-9), 1e-9):.2f}x")


if __name__ == "__main__":
    main()
