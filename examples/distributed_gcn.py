"""Full-graph training of a 2-layer GCN on a synthetic power-law graph, partitioned by rows over the
ranks of torch.distributed (one process per GPU with NCCL, or CPU processes with gloo).

    torchrun --nproc-per-node 2 examples/distributed_gcn.py                          # CPU, gloo
    torchrun --nproc-per-node 2 examples/distributed_gcn.py --device cuda --nodes 8000000
    python examples/distributed_gcn.py                                               # one process

Every rank generates only its own rows of the graph and its nodes' features and labels
(sparsetorch.distributed.graphs: the same graph for any number of ranks), builds a DistributedCSR
from its block, and trains: each step exchanges only the halo rows of each layer's input (and their
gradients back). The loss and accuracy are over every rank's nodes; the weights stay identical on
every rank (gradients summed by one all-reduce). ``--memory-fraction`` caps each process's CUDA
memory (torch.cuda.set_per_process_memory_fraction), to train a graph one capped GPU cannot hold.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

from sparsetorch.distributed._comm import nccl_options, set_no_multicast_env

set_no_multicast_env()  # before NCCL starts: NVLink multicast stays off (see the device README)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from sparsetorch.distributed import (GCN, DistributedCSR, balanced_row_bounds, masked_cross_entropy,  # noqa: E402
                                     node_features, node_labels, node_mask, power_law_block, power_law_degrees,
                                     sync_gradients)


def parse(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    ap.add_argument("--nodes", type=int, default=200_000)
    ap.add_argument("--degree", type=float, default=16, help="mean entries per row")
    ap.add_argument("--features", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--classes", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory-fraction", type=float, default=None, help="cap each process's CUDA memory")
    ap.add_argument("--timeout", type=float, default=300, help="process group timeout (s)")
    ap.add_argument("--out", default=None, help="write the summary as JSON here (rank 0)")
    return ap.parse_args(argv)


def train(args, group=None) -> dict:
    """Build this rank's part of the graph and train; returns rank 0's summary (every rank returns one)."""
    rank, world = dist.get_rank(group), dist.get_world_size(group)
    device = torch.device("cuda", torch.cuda.current_device()) if args.device == "cuda" else torch.device("cpu")
    if args.memory_fraction is not None and device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(args.memory_fraction, device)
    t0 = time.perf_counter()
    degrees = power_law_degrees(args.nodes, args.degree, args.seed, device)
    crow = torch.zeros(args.nodes + 1, dtype=torch.int64, device=device)
    torch.cumsum(degrees, 0, out=crow[1:])
    bounds = balanced_row_bounds(crow, world)
    rows = (bounds[rank], bounds[rank + 1])
    block = power_law_block(args.nodes, args.degree, rows=rows, seed=args.seed, device=device, degrees=degrees)
    adjacency = DistributedCSR.from_blocks(block, group=group)
    del block, degrees, crow
    x = node_features(rows, args.features, args.seed + 1, device)
    y = node_labels(x, args.classes, args.seed + 2)
    train_mask = node_mask(rows, 0.5, args.seed + 3, device)
    torch.manual_seed(args.seed)
    model = GCN(args.features, args.hidden, args.classes).to(device)
    for p in model.parameters():  # one set of weights on every rank
        dist.broadcast(p.data, src=dist.get_global_rank(group, 0) if group is not None else 0, group=group)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    setup_s = time.perf_counter() - t0
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats(device)
    losses, accuracies, epoch_s = [], [], []
    for _ in range(args.epochs):
        t = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        logits = model(x, adjacency)
        loss = masked_cross_entropy(logits, y, train_mask, group)
        loss.backward()
        sync_gradients(model.parameters(), group)
        opt.step()
        with torch.no_grad():
            stats = torch.stack([loss.detach().float(), ((logits.argmax(1) == y) & ~train_mask).sum().float(),
                                 (~train_mask).sum().float()])
            if world > 1:
                dist.all_reduce(stats, group=group)
        loss_value, correct, count = stats.tolist()  # a host sync per epoch, so the epoch time is real
        epoch_s.append(time.perf_counter() - t)
        losses.append(loss_value)
        accuracies.append(correct / max(count, 1.0))
    normalized = adjacency.gcn_normalized()
    volume = adjacency.halo_volume(1)[rank]  # rows received per product against the partition's minimum
    summary = {
        "rank": rank, "world_size": world, "device": str(device), "nodes": args.nodes,
        "edges": int(sum(_all(torch.tensor([adjacency.nnz], device=device), group))),
        "rows": list(rows), "stored_entries": adjacency.nnz, "halo_rows": adjacency.halo_size,
        "halo_min_rows": volume["min_rows"], "halo_vs_min": volume["ratio"],
        "setup_s": setup_s, "epoch_ms_median": 1e3 * statistics.median(epoch_s[1:] or epoch_s),
        "first_epoch_ms": 1e3 * epoch_s[0], "losses": losses, "test_accuracy": accuracies,
        "exchange": dict(normalized.halo_plan.stats),
        "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None,
        "memory_fraction": args.memory_fraction,
    }
    summary["per_rank"] = _gather_objects({k: summary[k] for k in ("rank", "rows", "stored_entries", "halo_rows",
                                                                    "halo_min_rows", "halo_vs_min", "peak_gib",
                                                                    "epoch_ms_median")}, group)
    return summary


def _all(t, group):
    if dist.get_world_size(group) > 1:
        dist.all_reduce(t, group=group)
    return t.tolist()


def _gather_objects(obj, group):
    out = [None] * dist.get_world_size(group)
    dist.all_gather_object(out, obj, group=group)
    return out


def main(argv=None):
    args = parse(argv)
    backend = "nccl" if args.device == "cuda" else "gloo"
    timeout = datetime.timedelta(seconds=args.timeout)
    if "RANK" in os.environ:  # torchrun
        if args.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(backend, timeout=timeout, pg_options=nccl_options() if backend == "nccl" else None)
    else:  # a plain `python` run: a group of one
        from sparsetorch.distributed.launch import free_port

        if args.device == "cuda":
            torch.cuda.set_device(0)
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{free_port()}", rank=0, world_size=1,
                                timeout=timeout, pg_options=nccl_options() if backend == "nccl" else None)
    try:
        summary = train(args)
    finally:
        dist.destroy_process_group()
    if summary["rank"] == 0:
        print(f"{summary['world_size']} rank(s), {summary['device']}: {summary['nodes']} nodes, {summary['edges']} "
              f"stored entries (+ self loops); setup {summary['setup_s']:.1f} s")
        for r in summary["per_rank"]:
            peak = f", peak {r['peak_gib']:.2f} GiB" if r["peak_gib"] is not None else ""
            print(f"  rank {r['rank']}: rows {r['rows']}, {r['stored_entries']} entries, halo {r['halo_rows']} rows "
                  f"({r['halo_vs_min']:.3f}x the minimum {r['halo_min_rows']}){peak}, {r['epoch_ms_median']:.1f} ms "
                  f"per epoch")
        for i in sorted({0, len(summary["losses"]) // 2, len(summary["losses"]) - 1}):
            print(f"  epoch {i + 1:3d}: loss {summary['losses'][i]:.4f}, test accuracy {summary['test_accuracy'][i]:.3f}")
        print(f"  {summary['epoch_ms_median']:.1f} ms per epoch (median; first epoch {summary['first_epoch_ms']:.0f} ms)")
        if args.out:
            with open(args.out, "w") as f:
                json.dump(summary, f, indent=1)
    return summary


if __name__ == "__main__":
    main()
