"""Graphs: random, power-law, and the real matrices and Planetoid graphs of the data folder (--data)."""
from __future__ import annotations

import os
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

import sparsetorch as st
from benchmarks.suites.common import Context, Job, copies, host_time_per_call, measure, spmm_model


def random_graph(nodes: int, per_row: int, seed: int):
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(nodes), per_row)
    cols = rng.integers(0, nodes, rows.size)
    return sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(nodes, nodes))


def power_law_graph(nodes: int, mean_degree: int, seed: int, exponent: float = 1.5):
    """Row degrees from a Pareto(exponent) law (a few rows hold thousands of entries; a smaller
    exponent, a heavier tail), columns drawn with probability proportional to a second Pareto weight
    of the same exponent (hub columns)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    deg = rng.pareto(exponent, nodes) + 1.0
    deg = np.minimum(np.maximum(1, np.round(deg / deg.mean() * mean_degree)), nodes // 2).astype(np.int64)
    weight = rng.pareto(exponent, nodes) + 1.0
    cols = _weighted_choice(rng, nodes, int(deg.sum()), weight / weight.sum())
    rows = np.repeat(np.arange(nodes), deg)
    return sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(nodes, nodes))


def _weighted_choice(rng, nodes: int, size: int, p):
    """rng.choice(nodes, size=size, p=p): the same draws and result (numpy's Generator.choice looks the
    uniform draws up in the cumulative sum), with the draws looked up in sorted order, which keeps
    numpy's binary search in cache: 2.7x faster for 20M draws over 1M nodes."""
    cdf = p.cumsum()
    cdf /= cdf[-1]
    u = rng.random(size)
    order = np.argsort(u)
    out = np.empty(size, dtype=np.int64)
    out[order] = cdf.searchsorted(u[order], side="right")
    return out


def real_graphs(root: Optional[str]):
    """(name, loader) of the Matrix Market files (``<root>/matrices/*.mtx``) and the Planetoid graphs found in
    the data folder ``root`` (any layout sparsetorch.datasets reads; values: ones); none without a folder."""
    import scipy.io
    import scipy.sparse as sp

    from sparsetorch.datasets import matrix_files, planetoid_adjacency, planetoid_available

    if not root or not os.path.isdir(root):
        return []
    found = []
    for path in matrix_files(root):
        name = os.path.basename(path)[:-4].replace("Mongoose_Matrix_", "")
        found.append((name, lambda path=path: sp.csr_matrix(scipy.io.mmread(path), dtype=np.float32)))
    for name in PLANETOID:
        if planetoid_available(name, root, graph_only=True):
            found.append((name, lambda name=name: planetoid_adjacency(name, root)))
    return found


PLANETOID = ("cora", "citeseer", "pubmed")


def graph_suite(ctx: Context) -> List[Job]:
    big = 1_000_000 if not ctx.quick else None
    size = 100_000 if ctx.cuda else 20_000
    graphs = [(f"random {size // 1000}k, 20/row", lambda: random_graph(size, 20, 1)),
              (f"power-law {size // 1000}k", lambda: power_law_graph(size, 20, 2))]
    if big and ctx.cuda:
        graphs += [("random 1M, 20/row", lambda: random_graph(big, 20, 3)),
                   ("power-law 1M", lambda: power_law_graph(big, 20, 4))]
    graphs += real_graphs(ctx.data_root)
    widths = (32, 128) if ctx.quick else (32, 64, 128, 256, 512)
    if not ctx.cuda:
        widths = (32,) if ctx.quick else (32, 128)

    def job(name, make):
        def run():
            a_sp = make()
            a_sp.sort_indices()
            A = st.from_scipy(a_sp, device=ctx.device, dtype=torch.float32, index_dtype=torch.int32)
            plan = st.SpmmPlan(A, validate=False)
            a_torch = st.to_torch(A)
            m, k, nnz = a_sp.shape[0], a_sp.shape[1], a_sp.nnz
            extra = optional_graph_baselines(ctx, a_sp, A)
            rows = []
            for n in widths:
                g = torch.Generator(device=ctx.device).manual_seed(n)
                B = torch.randn(k, n, device=ctx.device, generator=g)
                if ctx.cuda:  # cuSPARSE in float64: independent of sparsetorch's kernels
                    ref = torch.sparse.mm(st.to_torch(A.to(dtype=torch.float64)), B.double())
                else:
                    ref = torch.from_numpy(a_sp.astype(np.float64) @ B.double().numpy())
                sb, sf = spmm_model(nnz, m, k, n, 4, 4)
                impls = {"sparsetorch": (lambda b: plan(b), copies(ctx, B, sb), sb, sf, "float32", "float32"),
                         "torch.sparse.mm": (lambda b: torch.sparse.mm(a_torch, b), copies(ctx, B, sb), sb, sf,
                                             "float32", "float32")}
                for label, fn in extra.items():
                    impls[label] = (fn, copies(ctx, B, sb), sb, sf, "float32", "float32")
                base = {"suite": "graphs", "case": f"{name}, n={n}", "graph": name, "n": n, "m": m, "nnz": nnz}
                measured = measure(ctx, base, impls, ref, sb)
                for r in measured:
                    if ctx.cuda and r["impl"] in ("sparsetorch", "torch.sparse.mm"):
                        # Host time per call: a call's time includes it where it exceeds the device
                        # time (and the L2 flush before each timed call), as on small graphs.
                        r["host_us_per_call"] = host_time_per_call(impls[r["impl"]][0], B) * 1e6
                    if r["impl"] == "sparsetorch":
                        r["sparsetorch_route"] = plan.routes.get((n, torch.float32, False), plan.backend)
                rows += measured
            return rows

        return run

    return [job(name, make) for name, make in graphs]


def optional_graph_baselines(ctx: Context, a_sp, A) -> Dict[str, Callable]:
    """cupyx.scipy.sparse and torch_geometric's sum propagation, where installed; SciPy on the CPU."""
    out = {}
    if not ctx.cuda:
        out["scipy"] = lambda b: torch.from_numpy(a_sp @ b.numpy())
        return out
    try:
        import cupy
        import cupyx.scipy.sparse as csp

        a_cp = csp.csr_matrix((cupy.asarray(A.values), cupy.asarray(A.col_indices), cupy.asarray(A.crow_indices)),
                              shape=A.shape)
        out["cupy"] = lambda b: torch.as_tensor(a_cp @ cupy.asarray(b), device=ctx.device)
    except ImportError:
        pass  # listed at the start of the run (__main__.packages_left_out)
    except Exception as e:  # noqa: BLE001 - installed but unusable here: the baseline is left out
        ctx.leave_out("graphs: the cupy baseline", f"{type(e).__name__}: {str(e)[:120]}")
    try:
        from torch_geometric.nn import SimpleConv

        coo = a_sp.tocoo()
        # Edge j -> i carries A[i, j]: sum aggregation at i of w * x_j is row i of A @ x.
        edge_index = torch.from_numpy(np.stack([coo.col, coo.row]).astype(np.int64)).to(ctx.device)
        weight = torch.from_numpy(coo.data).to(ctx.device)
        conv = SimpleConv(aggr="sum")
        out["torch_geometric"] = lambda b: conv(b, edge_index, weight)
    except ImportError:
        pass  # listed at the start of the run (__main__.packages_left_out)
    except Exception as e:  # noqa: BLE001
        ctx.leave_out("graphs: the torch_geometric baseline", f"{type(e).__name__}: {str(e)[:120]}")
    return out


