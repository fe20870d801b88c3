"""The benchmark suites. Each suite returns a list of jobs (one per case); a job builds its inputs,
checks every implementation's output against a float64 reference, times it, and returns rows.

Byte and flop models (the floor of a row is max(bytes / copy bandwidth, flops / GEMM rate), both
measured in the same run; sparse kernels are held to the fp32 CUDA-core/AVX rate of the dtype's
GEMM, dense GEMMs to their own dtype's rate):
  SpMM  C (m x n) = A (m x k, nnz) @ B (k x n):  bytes = nnz * (index + value) + (m + 1) * index
        + min(nnz, k) * n * value (each referenced row of B read once) + m * n * value (C written);
        flops = 2 * nnz * n. A batch sums this over its matrices.
  GEMM  bytes = (m*k + k*n + m*n) * value;  flops = 2 * m * k * n (per batch).
  elementwise: bytes = (inputs read + output written) * value; flops ignored.
"""
from __future__ import annotations

import glob
import math
import os
import time
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

import sparsetorch as st
from sparsetorch.bench.timing import Ceilings, Rotating, check, rotation, tf32_mode

Job = Callable[[], List[dict]]
TOL = {"float32": 1e-4, "tf32": 1e-2, "bfloat16": 3e-2, "float16": 1e-2, "float64": 1e-10}


class Context:
    def __init__(self, device: torch.device, timer, ceilings: Ceilings, quick: bool, data_root: Optional[str]):
        self.device, self.timer, self.ceilings, self.quick = device, timer, ceilings, quick
        self.data_root = data_root

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def spmm_model(nnz: int, m: int, k: int, n: int, value: int, index: int, batch: int = 1):
    return (nnz * (index + value) + batch * (m + 1) * index + min(nnz, batch * k) * n * value
            + batch * m * n * value, 2.0 * nnz * n)


def gemm_model(m: int, k: int, n: int, value: int, batch: int = 1):
    return batch * (m * k + k * n + m * n) * value, 2.0 * batch * m * k * n


def densify_model(nnz: int, m: int, k: int, n: int, value: int, index: int):
    """The densify route (A expanded, then a dense GEMM): A written and read densely, its entries read
    once, B read twice (the NaN/Inf check, the GEMM), out written; dense GEMM flops."""
    return 2 * m * k * value + nnz * (index + value) + 2 * k * n * value + m * n * value, 2.0 * m * k * n


def plan_route(plan, b: torch.Tensor) -> str:
    """The route a SpmmPlan takes for `b` (autotuned by this call on CUDA): floors follow the route."""
    plan(b)
    return next(iter(plan.routes.values()), plan.backend)


def host_time_per_call(fn, b: torch.Tensor, reps: int = 200) -> float:
    """Seconds the host spends per call of fn(b) on a CUDA stream that keeps up (no sync inside)."""
    fn(b)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn(b)
    elapsed = time.perf_counter() - t0
    torch.cuda.synchronize()
    return elapsed / reps


def measure(ctx: Context, base: dict, impls: Dict[str, tuple], ref: torch.Tensor, rotate_bytes: int) -> List[dict]:
    """impls: name -> (fn(B) -> out, list of B copies or None, bytes, flops, rate key, dtype label).
    Every output is checked before timing; B is rotated through its copies while timing."""
    rows = []
    for name, (fn, inputs, nbytes, flops, rate_key, dtype_label) in impls.items():
        try:
            out = fn(*inputs[0]) if inputs else fn()
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run this case is reported, not fatal
            if name.startswith(("sparsetorch", "st.")):
                raise
            print(f"\n{base['suite']} {base['case']}: {name} failed ({type(e).__name__}: {str(e)[:120]}); left out")
            continue
        err = check(out, ref, f"{base['suite']} {base['case']}: {name}", TOL[dtype_label])
        del out
        timed = Rotating(fn, inputs) if inputs else fn
        seconds = ctx.timer(timed)
        floor = ctx.ceilings.floor(nbytes, flops, rate_key)
        rows.append({**base, "impl": name, "dtype": dtype_label, "time_ms": seconds * 1e3,
                     "GBps": nbytes / seconds / 1e9, "GFLOPs": flops / seconds / 1e9, "floor_ms": floor * 1e3,
                     "of_floor": floor / seconds, "rel_err": err})
    return rows


def copies(ctx: Context, tensor: torch.Tensor, working_set: int) -> List[tuple]:
    count = rotation(ctx.device, working_set)
    return [(tensor,)] + [(tensor.clone(),) for _ in range(count - 1)]


# --- density sweep ---------------------------------------------------------------------------------

def density_suite(ctx: Context) -> List[Job]:
    if ctx.cuda:
        m, n = 4096, 1024
        densities = (0.5, 0.1, 0.02, 0.005, 0.001) if ctx.quick else (0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005,
                                                                       0.002, 0.001)
    else:
        m, n = 1024, 128
        densities = (0.3, 0.1, 0.03, 0.01, 0.001) if ctx.quick else (0.5, 0.3, 0.1, 0.05, 0.02, 0.01, 0.003, 0.001)

    def job(d):
        def run():
            g = torch.Generator(device=ctx.device).manual_seed(int(d * 1e6))
            mask = torch.rand(m, m, device=ctx.device, generator=g) < d
            dense64 = torch.where(mask, torch.randn(m, m, device=ctx.device, generator=g, dtype=torch.float64), 0.0)
            del mask
            B64 = torch.randn(m, n, device=ctx.device, generator=g, dtype=torch.float64)
            ref = dense64 @ B64
            dense32, B32 = dense64.float(), B64.float()
            A32 = st.from_torch(dense32.to_sparse_csr()).to(index_dtype=torch.int32)
            nnz = A32.col_indices.numel()
            plan = st.SpmmPlan(A32, validate=False)
            a_torch = st.to_torch(A32)
            sb, sf = spmm_model(nnz, m, m, n, 4, 4)
            gb, gf = gemm_model(m, m, n, 4)
            work = sb
            routes = {"float32": plan_route(plan, B32)}
            ob, of = densify_model(nnz, m, m, n, 4, 4) if routes["float32"] == "densify" else (sb, sf)
            impls = {
                "sparsetorch": (lambda b: plan(b), copies(ctx, B32, work), ob, of, "float32", "float32"),
                "torch.sparse.mm": (lambda b: torch.sparse.mm(a_torch, b), copies(ctx, B32, work), sb, sf,
                                    "float32", "float32"),
                "dense fp32": (lambda b: dense32 @ b, copies(ctx, B32, gb), gb, gf, "float32", "float32"),
            }
            if ctx.cuda:
                def tf32_mm(b):
                    with tf32_mode(True):
                        return dense32 @ b

                dense16, B16 = dense64.bfloat16(), B64.bfloat16()
                A16 = A32.to(dtype=torch.bfloat16)
                plan16 = st.SpmmPlan(A16, validate=False)
                impls["dense tf32"] = (tf32_mm, copies(ctx, B32, gb), gb, gf, "tf32", "tf32")
                impls["dense bf16"] = (lambda b: dense16 @ b, copies(ctx, B16, gb // 2), gb // 2, gf, "bfloat16",
                                       "bfloat16")
                sb16, _ = spmm_model(nnz, m, m, n, 2, 4)
                # A sparse kernel's flops run on CUDA cores (fp32 FMA rate); the densify route's on tensor cores.
                routes["bfloat16"] = plan_route(plan16, B16)
                ob16, of16, rate16 = ((*densify_model(nnz, m, m, n, 2, 4), "bfloat16") if routes["bfloat16"] == "densify"
                                      else (sb16, sf, "float32"))
                impls["sparsetorch bf16"] = (lambda b: plan16(b), copies(ctx, B16, sb16), ob16, of16, rate16,
                                             "bfloat16")
                a_torch16 = st.to_torch(A16)
                impls["torch.sparse.mm bf16"] = (lambda b: torch.sparse.mm(a_torch16, b), copies(ctx, B16, sb16),
                                                 sb16, sf, "float32", "bfloat16")
            else:
                import scipy.sparse  # noqa: F401

                a_sp, b_np = st.to_scipy(A32), B32.numpy()
                impls["scipy"] = (lambda: a_sp @ b_np, None, sb, sf, "float32", "float32")
            base = {"suite": "density", "case": f"{m}x{m} @ {m}x{n}, {100 * d:g}%", "density": d, "m": m, "n": n,
                    "nnz": nnz, "sparsetorch_routes": routes}
            return measure(ctx, base, impls, ref, work)

        return run

    return [job(d) for d in densities]


# --- graphs ----------------------------------------------------------------------------------------

def random_graph(nodes: int, per_row: int, seed: int):
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    rows = np.repeat(np.arange(nodes), per_row)
    cols = rng.integers(0, nodes, rows.size)
    return sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(nodes, nodes))


def power_law_graph(nodes: int, mean_degree: int, seed: int):
    """Row degrees from a Pareto(1.5) law (a few rows hold thousands of entries), columns drawn
    with probability proportional to a second Pareto weight (hub columns)."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    deg = rng.pareto(1.5, nodes) + 1.0
    deg = np.minimum(np.maximum(1, np.round(deg / deg.mean() * mean_degree)), nodes // 2).astype(np.int64)
    weight = rng.pareto(1.5, nodes) + 1.0
    cols = rng.choice(nodes, size=int(deg.sum()), p=weight / weight.sum())
    rows = np.repeat(np.arange(nodes), deg)
    return sp.csr_matrix((rng.standard_normal(rows.size).astype(np.float32), (rows, cols)), shape=(nodes, nodes))


def real_graphs(root: Optional[str]):
    """The Matrix Market files and the Planetoid graphs in ../shared/data (values: ones)."""
    import scipy.io
    import scipy.sparse as sp

    if not root or not os.path.isdir(root):
        return []
    found = []
    for path in sorted(glob.glob(os.path.join(root, "matrices", "*.mtx"))):
        name = os.path.basename(path)[:-4].replace("Mongoose_Matrix_", "")
        found.append((name, lambda path=path: sp.csr_matrix(scipy.io.mmread(path), dtype=np.float32)))
    for name in ("cora", "citeseer", "pubmed"):
        if os.path.exists(os.path.join(root, "planetoid", f"ind.{name}.graph")):
            found.append((name, lambda name=name: planetoid_graph(root, name)))
    return found


def planetoid_graph(root: str, name: str):
    from sparsetorch.datasets import planetoid_adjacency

    return planetoid_adjacency(name, root)


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
    except Exception:  # noqa: BLE001 - not installed or no GPU support: the baseline is left out
        pass
    try:
        from torch_geometric.nn import SimpleConv

        coo = a_sp.tocoo()
        # Edge j -> i carries A[i, j]: sum aggregation at i of w * x_j is row i of A @ x.
        edge_index = torch.from_numpy(np.stack([coo.col, coo.row]).astype(np.int64)).to(ctx.device)
        weight = torch.from_numpy(coo.data).to(ctx.device)
        conv = SimpleConv(aggr="sum")
        out["torch_geometric"] = lambda b: conv(b, edge_index, weight)
    except Exception:  # noqa: BLE001
        pass
    return out


# --- batched ---------------------------------------------------------------------------------------

def batched_suite(ctx: Context) -> List[Job]:
    if ctx.cuda:
        cases = [(8, 4096), (512, 256), (4096, 64)] if ctx.quick else [(8, 4096), (64, 1024), (512, 256),
                                                                        (4096, 64)]
        n = 64
    else:
        cases = [(8, 512), (64, 64)] if ctx.quick else [(8, 1024), (64, 256), (512, 64)]
        n = 32

    def job(b, s):
        def run():
            import scipy.sparse as sp

            rng = np.random.default_rng(b * 7 + s)
            per_row = min(16, s // 4)
            mats = []
            for _ in range(b):  # a different pattern (and nnz) per batch
                d = per_row / s * rng.uniform(0.5, 1.5)
                mats.append(sp.random(s, s, density=d, format="csr", random_state=rng, dtype=np.float32))
            A = st.from_list(mats, device=ctx.device, index_dtype=torch.int32)
            B = torch.randn(b, s, n, device=ctx.device)
            A_dense = A.to_dense()
            ref = torch.bmm(A_dense.double(), B.double())
            nnz = sum(x.nnz for x in mats)
            torch_list = [st.to_torch(st.from_scipy(x, device=ctx.device)) for x in mats]
            block = st.to_torch(st.from_scipy(sp.block_diag(mats, format="csr"), device=ctx.device))
            sb, sf = spmm_model(nnz, s, s, n, 4, 4, batch=b)
            gb, gf = gemm_model(s, s, n, 4, batch=b)

            def loop(B):
                return torch.stack([torch.sparse.mm(t, B[i]) for i, t in enumerate(torch_list)])

            def tf32_bmm(B):
                with tf32_mode(True):
                    return torch.bmm(A_dense, B)

            impls = {"sparsetorch": (lambda B: st.spmm(A, B), copies(ctx, B, sb), sb, sf, "float32", "float32"),
                     "block-diagonal torch.sparse.mm": (
                         lambda B: torch.sparse.mm(block, B.reshape(b * s, n)).reshape(b, s, n),
                         copies(ctx, B, sb), sb, sf, "float32", "float32"),
                     "dense bmm fp32": (lambda B: torch.bmm(A_dense, B), copies(ctx, B, gb), gb, gf, "float32",
                                        "float32")}
            if ctx.cuda:
                impls["dense bmm tf32"] = (tf32_bmm, copies(ctx, B, gb), gb, gf, "tf32", "tf32")
            if b <= 512:  # a Python loop over thousands of matrices measures the interpreter
                impls["loop of torch.sparse.mm"] = (loop, [(B,)], sb, sf, "float32", "float32")
            base = {"suite": "batched", "case": f"b={b}, {s}x{s}, n={n}", "batch": b, "m": s, "n": n, "nnz": nnz}
            return measure(ctx, base, impls, ref, sb)

        return run

    return [job(b, s) for b, s in cases]


# --- elementwise / fused bias + activation -------------------------------------------------------------

def elementwise_suite(ctx: Context) -> List[Job]:
    numel = 2**26 if ctx.cuda else 2**22
    dtypes = [torch.float32, torch.bfloat16] if ctx.cuda else [torch.float32]
    compile_too = ctx.cuda and not ctx.quick

    def job(dtype):
        def run():
            import torch.nn.functional as F

            label = str(dtype).replace("torch.", "")
            size = torch.tensor([], dtype=dtype).element_size()
            x = torch.randn(numel, device=ctx.device, dtype=dtype)
            y = torch.randn(numel, device=ctx.device, dtype=dtype)
            dst = torch.empty_like(x)
            copy_s = ctx.timer(lambda: dst.copy_(x))
            width = 1024
            x2 = x.view(-1, width)
            bias = torch.randn(width, device=ctx.device, dtype=dtype)
            scale = torch.randn(width, device=ctx.device, dtype=dtype)
            x64, s64, b64 = x2.double(), scale.double(), bias.double()
            fused_ref = F.gelu(x64 * s64 + b64)

            def eager():
                return F.gelu(x2 * scale + bias)

            cases = [("copy (ceiling)", lambda: dst.copy_(x), x.double(), 2),
                     ("st.add", lambda: st.add(x, y, alpha=2.0), x.double() + 2 * y.double(), 3),
                     ("st.relu", lambda: st.relu(x), F.relu(x.double()), 2),
                     ("st.gelu", lambda: st.gelu(x), F.gelu(x.double()), 2),
                     ("st.bias_act gelu (fused)", lambda: st.bias_act(x2, bias=bias, scale=scale, activation="gelu"),
                      fused_ref, 2),
                     ("eager gelu(x*scale+bias)", eager, fused_ref, 2)]
            if compile_too:
                cases.append(("torch.compile gelu(x*scale+bias)", torch.compile(eager), fused_ref, 2))
            rows = []
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            for name, fn, ref, tensors in cases:
                err = check(fn(), ref.view(-1) if ref.dim() == 1 else ref, f"elementwise {name}", tol)
                seconds = copy_s if name.startswith("copy") else ctx.timer(fn)
                nbytes = tensors * numel * size
                # The fused kernel, eager torch and torch.compile share one case (compared); the
                # single kernels are each their own case, held to the copy bandwidth.
                what = "gelu(x*scale+bias)" if "gelu(x*scale+bias)" in name or "fused" in name else name
                rows.append({"suite": "elementwise", "case": f"{what}, 2^{int(math.log2(numel))} elements",
                             "impl": name, "dtype": label, "time_ms": seconds * 1e3, "GBps": nbytes / seconds / 1e9,
                             "GFLOPs": 0.0, "floor_ms": nbytes / ctx.ceilings.bandwidth * 1e3,
                             "of_floor": nbytes / ctx.ceilings.bandwidth / seconds,
                             "of_copy": (nbytes / seconds) / (2 * numel * size / copy_s), "rel_err": err})
            return rows

        return run

    return [job(dt) for dt in dtypes]


SUITES = {"density": density_suite, "graphs": graph_suite, "batched": batched_suite,
          "elementwise": elementwise_suite}
