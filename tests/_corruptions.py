"""Malformed CSR matrices and the entry points that take a sparse matrix, for the safety tests.

Each corruption is a function (crow, col, values, shape) -> (crow, col, values, shape) that breaks one
field of a valid matrix the way a user's data can be broken: a torch CSR tensor built with
``check_invariants=False`` (torch's default) carries any of these. Each entry point is a function
(A, device) -> result that calls sparsetorch as a user would. tests/test_safety.py runs every pair;
benchmarks/safety_probe.py runs them on a GPU in subprocesses (a crash is a finding, not the end).
"""
from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
from typing import Callable, Dict

import torch

import sparsetorch as st
from conftest import python_env

M, K, PER_ROW = 200, 150, 6


def valid_parts(device, index_dtype=torch.int64, dtype=torch.float32, seed=0, batch=None, square=False):
    """A valid (m, k) matrix (k = m if square) with PER_ROW entries per row (sorted columns), as components."""
    g = torch.Generator().manual_seed(seed)
    n_b = batch or 1
    m, k = (M, M) if square else (M, K)
    # PER_ROW distinct sorted columns per row: the first PER_ROW of a random permutation of each row.
    col = torch.rand(n_b, m, k, generator=g).argsort(dim=-1)[..., :PER_ROW].sort(dim=-1).values.reshape(n_b, -1)
    crow = torch.arange(0, m * PER_ROW + 1, PER_ROW).expand(n_b, m + 1).clone()
    v = torch.randn(n_b, m * PER_ROW, generator=g)
    if not batch:
        crow, col, v = crow[0], col[0], v[0]
    shape = (batch, m, k) if batch else (m, k)
    return crow.to(device, index_dtype), col.to(device, index_dtype), v.to(device, dtype), shape


def _set(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def _last(t):  # the last position of the (possibly batched) index vector
    return (0, -1) if t.dim() == 2 else -1


def _at(t, i):
    return (0, i) if t.dim() == 2 else i


CORRUPTIONS: Dict[str, Callable] = {
    "col = 2^30": lambda cr, co, v, s: (cr, _set(co, _at(co, 3), 2**30), v, s),
    "col = k": lambda cr, co, v, s: (cr, _set(co, _at(co, 3), s[-1]), v, s),
    "col = -1": lambda cr, co, v, s: (cr, _set(co, _at(co, 3), -1), v, s),
    "col = -2^30": lambda cr, co, v, s: (cr, _set(co, _at(co, 7), -(2**30)), v, s),
    "crow negative": lambda cr, co, v, s: (_set(cr, _at(cr, 5), -100), co, v, s),
    "crow[0] != 0": lambda cr, co, v, s: (_set(cr, _at(cr, 0), 1), co, v, s),
    "crow[-1] > nnz": lambda cr, co, v, s: (_set(cr, _last(cr), co.shape[-1] + 5), co, v, s),
    "crow[-1] < nnz": lambda cr, co, v, s: (_set(cr, _last(cr), co.shape[-1] - 5), co, v, s),
    "crow not monotone": lambda cr, co, v, s: (_set(cr, _at(cr, 10), int(cr.reshape(-1)[20])), co, v, s),
    "crow huge": lambda cr, co, v, s: (_set(cr, _at(cr, 9), 2**31 - 1 if cr.dtype == torch.int32 else 2**40), co,
                                       v, s),
}

# Batched patterns may store fewer entries than their slots (padding): not a corruption there.
UNBATCHED_ONLY = {"crow[-1] < nnz"}

# Corruptions that change lengths or types: caught by the O(1) checks on every path.
SHAPE_CORRUPTIONS: Dict[str, Callable] = {
    "values too short": lambda cr, co, v, s: (cr, co, v[..., :-1], s),
    "col too short": lambda cr, co, v, s: (cr, co[..., :-1], v, s),
    "crow too short": lambda cr, co, v, s: (cr[..., :-1], co, v, s),
    "mixed index dtypes": lambda cr, co, v, s: (cr.to(torch.int32), co.to(torch.int64), v, s),
    "float indices": lambda cr, co, v, s: (cr.float(), co, v, s),
}


def as_torch_csr(crow, col, values, shape):
    """A torch sparse CSR tensor holding the parts as given (torch's invariant checks off, its default)."""
    return torch.sparse_csr_tensor(crow, col, values, shape, check_invariants=False)


def _b(A, device, n=8, dtype=torch.float32, seed=1):
    k = A.shape[-1]
    g = torch.Generator().manual_seed(seed)
    return torch.randn(k, n, generator=g).to(device, dtype)


def _spmm(backend, validate=None):
    def run(A, device):
        kwargs = {} if validate is None else {"validate": validate}
        return st.spmm(A, _b(A, device), backend=backend, **kwargs)
    return run


def _sddmm(backend):
    def run(A, device):
        m, k = A.shape[-2:]
        g = torch.Generator().manual_seed(2)
        a = torch.randn(m, 8, generator=g).to(device)
        b = torch.randn(k, 8, generator=g).to(device)
        return st.sddmm(A, a, b, backend=backend)
    return run


def _plan(A, device):
    return st.SpmmPlan(A)(_b(A, device))


def _sparse_linear(A, device):
    layer = st.nn.SparseLinear.from_sparse(A).to(device)
    return layer(torch.randn(3, A.shape[-1], device=device))


def _gcn(A, device):
    n = A.shape[-1]
    conv = st.nn.GCNConv(4, 3).to(device)
    return conv(torch.randn(n, 4, device=device), A)


def _sage(A, device):
    conv = st.nn.SAGEConv(4, 3).to(device)
    return conv(torch.randn(A.shape[-1], 4, device=device), A)


def _transpose(A, device):
    return st.transpose(A)


def _scale(A, device):
    m, k = A.shape[-2:]
    return st.scale(A, row=torch.rand(m, device=device), col=torch.rand(k, device=device))


def _add(A, device):
    return st.add(A, A)


def _relu(A, device):
    return st.relu(A)


ENTRY_POINTS: Dict[str, Callable] = {
    "spmm auto": _spmm("auto"),
    "spmm native": _spmm("native"),
    "spmm balanced": _spmm("balanced"),
    "spmm tiled": _spmm("tiled"),
    "spmm densify": _spmm("densify"),
    "spmm cusparse": _spmm("cusparse"),
    "sddmm auto": _sddmm("auto"),
    "sddmm cusparse": _sddmm("cusparse"),
    "SpmmPlan": _plan,
    "SparseLinear.from_sparse": _sparse_linear,
    "GCNConv": _gcn,
    "SAGEConv": _sage,
    "transpose": _transpose,
    "scale": _scale,
    "add (CSR values)": _add,
    "relu (CSR values)": _relu,
}

# Entry points that need a square matrix (the runner builds a square one for them), and those that
# take one 2-D matrix only (not run on batched patterns).
SQUARE = {"GCNConv", "SAGEConv"}
UNBATCHED_ENTRY_POINTS = {"SparseLinear.from_sparse", "GCNConv", "SAGEConv"}

# With validate=False the caller vouches for the matrix: a wrong answer is allowed, a crash is not.
OPT_OUT_ENTRY_POINTS: Dict[str, Callable] = {
    f"spmm {b} validate=False": _spmm(b, validate=False) for b in ("auto", "native", "balanced", "tiled", "densify",
                                                                  "cusparse")
}


@functools.lru_cache(maxsize=None)
def reference_spmm(device, index_dtype=torch.int64):
    """A valid product and its float64 answer: run after a corrupt call to show the device still works."""
    crow, col, values, shape = valid_parts(device, index_dtype, seed=5)
    A = as_torch_csr(crow, col, values, shape)
    B = _b(A, device, seed=6)
    dense = torch.zeros(shape, dtype=torch.float64, device=device)
    rows = torch.repeat_interleave(torch.arange(shape[0], device=device), torch.diff(crow.long()))
    dense.index_put_((rows, col.long()), values.double(), accumulate=True)
    return A, B, dense @ B.double()


# --- running one corruption through every entry point ------------------------------------------------

ARGUMENT_NAMES = ("crow_indices", "col_indices", "values")


def run_one(device, index_dtype, layout, corruption, entry):
    """One (corruption, entry point) pair: a dict with the outcome ("raised <Type>", "no error"), the
    error message, whether the caller's tensors are unchanged and whether a valid product still gives
    the right answer right after."""
    table = {**CORRUPTIONS, **SHAPE_CORRUPTIONS}
    fn = {**ENTRY_POINTS, **OPT_OUT_ENTRY_POINTS}[entry]
    parts = valid_parts(device, index_dtype, batch=4 if layout == "batched" else None, square=entry in SQUARE)
    crow, col, values, shape = table[corruption](*parts)
    before = [t.clone() for t in (crow, col, values)]
    try:
        A = as_torch_csr(crow, col, values, shape)
    except Exception:  # noqa: BLE001 - torch refuses this one: pass the components instead
        A = (crow, col, values, shape)
    record = {}
    try:
        fn(A, device)
        if device == "cuda":
            torch.cuda.synchronize()
        record["outcome"] = "no error"
    except Exception as e:  # noqa: BLE001 - the finding
        record["outcome"] = f"raised {type(e).__name__}"
        record["error"] = str(e).splitlines()[0][:300] if str(e) else ""
    record["inputs_unchanged"] = all(torch.equal(a, b) for a, b in zip(before, (crow, col, values)))
    A_ok, B_ok, ref = reference_spmm(device, index_dtype)
    try:
        err = ((st.spmm(A_ok, B_ok).double() - ref).norm() / ref.norm()).item()
        record["healthy_after"] = err < 1e-5
    except Exception as e:  # noqa: BLE001
        record["healthy_after"] = False
        record["health_error"] = f"{type(e).__name__}: {str(e)[:200]}"
    return record


def pairs(layout):
    """The (corruption, entry point) pairs that apply to a layout ("single" or "batched")."""
    corruptions = list(CORRUPTIONS) + (list(SHAPE_CORRUPTIONS) if layout == "single" else [])
    corruptions = [c for c in corruptions if not (layout == "batched" and c in UNBATCHED_ONLY)]
    entries = [e for e in list(ENTRY_POINTS) + list(OPT_OUT_ENTRY_POINTS)
               if not (layout == "batched" and e in UNBATCHED_ENTRY_POINTS)]
    return [(c, e) for c in corruptions for e in entries]


def verdict(entry, record):
    """None if the record meets the rules, else what is wrong. Default entry points: an exception of
    type ValueError / IndexError / TypeError whose message names the argument. Opt-out entry points
    (validate=False): anything but a crash. Both: inputs unchanged, the device healthy after."""
    if record.get("outcome") == "crash":
        return f"the process died: {record.get('error', '')}"
    if not record.get("healthy_after", False):
        return f"device not healthy after: {record.get('health_error', 'wrong result')}"
    if not record.get("inputs_unchanged", False):
        return "the caller's tensors were modified"
    if "validate=False" in entry:
        return None
    outcome = record["outcome"]
    if outcome not in ("raised ValueError", "raised IndexError", "raised TypeError"):
        return f"expected a ValueError/IndexError/TypeError, got {outcome}"
    if not any(name in record.get("error", "") for name in ARGUMENT_NAMES):
        return f"the message does not name the argument: {record.get('error')!r}"
    return None


def _worker(device, index_dtype, layout, start):
    """In a fresh process: the pairs of a layout from `start` on, one JSON line each (a line before each
    pair too, so the parent knows which pair a dying process was in); stops after a pair that left the
    device unhealthy."""
    for i, (corruption, entry) in enumerate(pairs(layout)):
        if i < start:
            continue
        print(json.dumps({"i": i, "started": True}), flush=True)
        record = run_one(device, getattr(torch, index_dtype), layout, corruption, entry)
        print(json.dumps({"i": i, **record}), flush=True)
        if not record["healthy_after"]:
            return


def run_isolated(device, index_dtype, layout):
    """Every pair of a layout in worker processes: a process runs pairs until one kills it or its CUDA
    context, that pair is recorded as such, and a new process goes on from the next pair. Returns one
    record per pair, with its corruption, entry point and verdict (None: the rules hold)."""
    todo, start, out = pairs(layout), 0, []
    here = os.path.dirname(os.path.abspath(__file__))
    while start < len(todo):
        code = (f"import sys; sys.path.insert(0, {here!r}); import _corruptions; "
                f"_corruptions._worker({device!r}, {index_dtype!r}, {layout!r}, {start})")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=900,
                              env=python_env())
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        records = {x["i"]: x for x in lines if "started" not in x}
        started = [x["i"] for x in lines if "started" in x]
        last = started[-1] if started else start
        if last not in records:  # the process died inside this pair
            records[last] = {"i": last, "outcome": "crash", "healthy_after": False,
                             "error": f"exit {proc.returncode}: {proc.stderr.strip()[-300:]}"}
        for i, r in sorted(records.items()):
            out.append({**r, "corruption": todo[i][0], "entry": todo[i][1], "layout": layout,
                        "index_dtype": index_dtype, "verdict": verdict(todo[i][1], r)})
        start = last + 1
    return out
