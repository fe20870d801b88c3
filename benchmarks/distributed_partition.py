"""The halo of a partition, off line (no process group, no GPU): how many rows of B each part of the
distributed suite's power-law graph must receive per product, per node ordering and part count, and what
would cross the network past one host.

    python -m benchmarks.distributed_partition --halo-table [--nodes 4194304] [--parts 2,4,8,16,64]
        [--orderings natural,random,degree,rcm] [--json FILE]
    python -m benchmarks.distributed_partition --host-table [--nodes 4194304] [--json FILE]

The relabellings here were measured against the balanced-entry row blocks of the natural order; none of
them wins on the power-law generator (docs/distributed.md, "Exchange volume and partitioning"), so they live here, not in
sparsetorch.distributed.partition. The distributed suite itself: ``python -m benchmarks --suites distributed``.
"""
from __future__ import annotations

import argparse
import gc
import json
from typing import List

import torch

from benchmarks.harness import once

CPU = torch.device("cpu")


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

    g, seconds = once(lambda: power_law_graph(nodes, degree, seed=seed), CPU)
    entries = g.col_indices.numel()
    log(f"graph: {nodes} nodes, {entries} entries, generated in {seconds:.1f} s")
    out = []
    for ordering in orderings:
        order, order_s = once(lambda: node_order(g, ordering, seed), CPU)
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
    ap = argparse.ArgumentParser(prog="python -m benchmarks.distributed_partition", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--halo-table", action="store_true",
                      help="the halo volume per ordering and part count")
    what.add_argument("--host-table", action="store_true",
                      help="the exchange volume past one host (8, 16, 64 GPUs, 8 per host)")
    ap.add_argument("--nodes", type=int, default=1 << 22)
    ap.add_argument("--parts", default="2,4,8,16,64", help="with --halo-table: part counts")
    ap.add_argument("--orderings", default=",".join(ORDERINGS), help="with --halo-table: orderings")
    ap.add_argument("--json", default=None, help="write the rows here")
    args = ap.parse_args(argv)
    if args.host_table:
        rows = host_table(args.nodes)
    else:
        rows = halo_table(args.nodes, parts=[int(p) for p in args.parts.split(",")],
                          orderings=args.orderings.split(","))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return rows


if __name__ == "__main__":
    main()
