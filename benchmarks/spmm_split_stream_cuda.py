"""The entry-split route (backend="split", csrc/cuda/spmm_split.cu) on power-law graphs (3 exponents,
100k and 1M nodes, mean degree 20) and a uniform 100k graph, n = 32..256, float32 and bfloat16, int32
indices: its default unit size and forced ones (SPARSETORCH_SPLIT_UNIT = 128, 256), the default
st.spmm (backend="auto", steady state: autotuned on its second call), torch.sparse.mm, our cuSPARSE route,
and the stand-alone prototype of benchmarks/split_stream_proto (a precomputed unit plan, no epilogue,
int32 only) where cupy and its cubin are there; and split / st.spmm with the fused bias + relu a GCN
layer asks for (the general kernel, not the plain one). Ratios are against the faster of torch.sparse.mm and
the cuSPARSE route; every output is checked against a float64 product (ERR marks a relative error >= 3e-3).
do_bench medians, L2 flushed before every call.

    (cd benchmarks/split_stream_proto && nvcc -arch=sm_90 -cubin -O3 -std=c++17 proto.cu -o /tmp/proto.cubin)
    python benchmarks/spmm_split_stream_cuda.py          # GRAPHS=..., CASES=f32,f64,b32, UNITS=128 pick a subset
"""
import json, os, sys
import torch
from triton.testing import do_bench

sys.path.insert(0, os.getcwd())
import sparsetorch as st
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "split_stream_proto"))
import graphs

try:
    import run as proto
except Exception as exc:  # no cupy / cubin
    proto = None
    print("no prototype:", exc)


def knobs(unit=None):
    for k, v in (("SPARSETORCH_SPLIT_UNIT", unit),):
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = str(v)


def main():
    dev = torch.device("cuda")
    # Measured HBM bandwidth (a 1 GiB copy reads and writes 2 GiB) for the floors on every line.
    src = torch.empty(1 << 28, device=dev)
    dst = torch.empty_like(src)
    bw = 2 * src.numel() * 4 / (do_bench(lambda: dst.copy_(src), warmup=5, rep=30, return_mode="median") * 1e-3)
    del src, dst
    print(f"HBM copy bandwidth {bw / 1e12:.2f} TB/s", flush=True)
    specs = [s for s in graphs.SPECS if s[0] in os.environ.get("GRAPHS", s[0])]
    cases = [(torch.float32 if c.startswith("f") else torch.bfloat16, int(c[1:]))
             for c in os.environ.get("CASES", "f32,f128,f256,b32,b128").split(",")]
    out = []
    for spec in specs:
        name = spec[0]
        g, crow, col, vals = graphs.load(spec, dev)
        A64 = torch.sparse_csr_tensor(crow.long(), col.long(), vals.double(), size=g.shape)
        for dtype, n in cases:
            A = torch.sparse_csr_tensor(crow, col, vals.to(dtype), size=g.shape)
            B = torch.randn(g.shape[1], n, device=dev, dtype=dtype)
            ref = torch.sparse.mm(A64, B.double())
            fns = {"torch": (None, lambda: torch.sparse.mm(A, B)), "cusparse": (None, lambda: st.spmm(A, B, backend="cusparse"))}
            forced = [("split U%s" % u, {"unit": int(u)}) for u in os.environ.get("UNITS", "128,256").split(",") if u]
            for label, kn in [("split", {})] + forced + [("auto", {})]:
                fns[label] = (kn, lambda label=label: st.spmm(A, B, backend="auto" if label == "auto" else "split"))
            # The fused epilogue a GCN layer asks for (out = relu(A @ B + bias)): the general kernel.
            bias = torch.randn(n, device=dev, dtype=dtype)
            epi_ref = torch.relu(ref + bias.double())
            for label, route in (("split+bias,relu", "split"), ("auto+bias,relu", "auto")):
                fns[label] = (None, lambda route=route: st.spmm(A, B, bias=bias, activation="relu", backend=route))
            tn = "f32" if dtype == torch.float32 else "bf16"
            vec = 4 if dtype == torch.float32 else 8
            if proto is not None and n // vec in (4, 8, 16, 32):
                run, _, _ = proto.make_proto(A, B, 128, n // vec, tn, "4" if (tn, n // vec) in (("f32", 8), ("bf16", 4)) else "")
                fns["proto U128"] = (None, run)
            res = {}
            for label, (kn, fn) in fns.items():
                knobs(**(kn or {}))
                y = fn()
                torch.cuda.synchronize()
                want = epi_ref if "+bias" in label else ref
                err = float((y.double() - want).norm() / want.norm())
                t = do_bench(fn, warmup=10, rep=50, return_mode="median") * 1e3
                res[label] = (t, err)
                knobs()
            base = min(res["torch"][0], res["cusparse"][0])
            # Floors: every entry's B row read from HBM (the gather floor; hub rows that hit L2 beat
            # it), and A, B and out each moved once (the compulsory floor).
            esize = B.element_size()
            gather = g.nnz * n * esize / bw * 1e6
            compulsory = (g.nnz * (4 + esize) + (g.shape[0] + 1) * 4 + (g.shape[0] + g.shape[1]) * n * esize) / bw * 1e6
            line = " | ".join(f"{k} {t:7.1f} {base / t:4.2f}x{'' if e < 3e-3 else ' ERR%.0e' % e}" for k, (t, e) in res.items())
            print(f"{name} {tn} n={n}: {line} | floors: gather {gather:.1f}, compulsory {compulsory:.1f}", flush=True)
            out.append(dict(graph=name, dtype=tn, n=n, res=res, gather_floor_us=gather, compulsory_floor_us=compulsory,
                            hbm_tb_s=bw / 1e12))
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "bench_lib.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
