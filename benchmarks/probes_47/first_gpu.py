"""Issue 47: where the wall time of a first st.spmm call on CUDA goes (fresh matrices, wall + sync)."""
import statistics, time, sys, warnings
import torch, numpy as np
import sparsetorch as st
from sparsetorch._ops import ops
from sparsetorch.bench.suites.fresh import _forget_everything, _copy
from sparsetorch.bench.suites.skew import power_law_lengths, with_row_lengths
from torch.profiler import profile, ProfilerActivity
warnings.filterwarnings("ignore")
import os
dev = torch.device(os.environ.get("DEV", "cuda"))
if dev.type == "cpu": torch.cuda.synchronize = lambda *a: None


def mats():
    out = {}
    for name, m, mean, exp in (("pl161", 161, 4, 1.5), ("pl5k", 5000, 20, 1.8), ("pl100k", 100_000, 20, 1.2)):
        lengths = power_law_lengths(m, mean, exp, 1, m // 2)
        a = with_row_lengths(lengths, m, 2, hub_exponent=1.5)
        out[name] = st.to_torch(st.from_scipy(a, device=dev))
    return out


def wall(fn, reps=15, prep=None):
    ts = []
    for _ in range(reps):
        args = prep() if prep else ()
        torch.cuda.synchronize(); t0 = time.perf_counter(); fn(*args); torch.cuda.synchronize()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts) * 1e6


M = mats()
# warm every route once
for A in M.values():
    B = torch.randn(A.shape[1], 32, device=dev)
    for be in ("native", "balanced", "split", "cusparse", "tiled"):
        try: st.spmm(A, B, backend=be)
        except Exception as e: print("warm", be, e)
    torch.sparse.mm(A, B)
torch.cuda.synchronize()

for name, A in M.items():
    for n in (32, 128):
        B = torch.randn(A.shape[1], n, device=dev)
        res = {}
        def fresh_t():
            _forget_everything(); return (_copy(A),)
        def fresh_csr():
            _forget_everything(); return (st.as_csr(_copy(A)),)
        res["torch first"] = wall(lambda a: torch.sparse.mm(a, B), prep=fresh_t)
        res["st first"] = wall(lambda a: st.spmm(a, B), prep=fresh_t)
        res["st first (CSR given)"] = wall(lambda a: st.spmm(a, B), prep=fresh_csr)
        res["as_csr only"] = wall(lambda a: st.as_csr(a), prep=fresh_t)
        res["analysis only (csr_stats+cpu)"] = wall(lambda a: ops.csr_stats(a.crow_indices, a.col_indices, A.shape[1]).cpu(), prep=fresh_csr)
        res["st.analyze"] = wall(lambda a: st.analyze(a), prep=fresh_csr)
        old = st.set_autotune(False)
        res["st first, autotune off"] = wall(lambda a: st.spmm(a, B), prep=fresh_t)
        st.set_autotune(old)
        res["st first, validate=False"] = wall(lambda a: st.spmm(a, B, validate=False), prep=fresh_t)
        a0 = _copy(A); st.spmm(a0, B)
        res["st second call"] = wall(lambda: st.spmm(a0, B))
        res["st steady"] = wall(lambda: st.spmm(A, B), reps=30)
        res["torch steady"] = wall(lambda: torch.sparse.mm(A, B), reps=30)
        for be in ("native", "balanced", "split", "cusparse"):
            try: res[f"st first backend={be}"] = wall(lambda a: st.spmm(a, B, backend=be), prep=fresh_t)
            except Exception as e: res[f"st first backend={be}"] = float("nan")
        print(f"== {name} n={n} nnz={A._nnz()} route={st.spmm_route(A, B)}", flush=True)
        for k, v in res.items(): print(f"   {k:36s} {v:8.1f} us")

# profiles: pl161 n=32, default first call / validate=False first call / steady call
A = M["pl161"]; B = torch.randn(A.shape[1], 32, device=dev)
def prof_of(label, fn, prep):
    args = [prep() for _ in range(20)]
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for a in args:
            fn(*a); torch.cuda.synchronize()
    print(f"######## {label}")
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25, max_name_column_width=50))
prof_of("pl161 first call (default)", lambda a: st.spmm(a, B), lambda: (_forget_everything(), _copy(A))[1:])
prof_of("pl161 first call validate=False", lambda a: st.spmm(a, B, validate=False), lambda: (_forget_everything(), _copy(A))[1:])
a0 = _copy(A); [st.spmm(a0, B) for _ in range(30)]
prof_of("pl161 steady", lambda a: st.spmm(a, B), lambda: (a0,))
# profile first calls on pl5k n=32
A = M["pl5k"]; B = torch.randn(A.shape[1], 32, device=dev)
fresh = []
for _ in range(20):
    fresh.append(_copy(A))
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for a in fresh:
        _forget_everything()
        st.spmm(a, B)
        torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=40, max_name_column_width=60))
import cProfile, pstats
fresh = [_copy(A) for _ in range(50)]
torch.cuda.synchronize()
pr = cProfile.Profile(); pr.enable()
for a in fresh:
    _forget_everything(); st.spmm(a, B); torch.cuda.synchronize()
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(25)
