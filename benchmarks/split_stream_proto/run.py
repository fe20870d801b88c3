"""Stand-alone prototype (issue 18) of the streamed entry-split SpMM: proto.cu built with nvcc -cubin,
launched through cupy, timed against the library and torch.sparse.mm (python
benchmarks/split_stream_proto/run.py). The library kernel follows it; the gap that remains is in
benchmarks/NOTES.md."""
import json, math, os, sys
import numpy as np
import torch
import cupy
from triton.testing import do_bench

sys.path.insert(0, os.getcwd())
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sparsetorch as st
import graphs

mod = cupy.RawModule(path=os.environ.get("CUBIN", "/tmp/proto.cubin"))
dev = torch.device("cuda")



def cp(t):
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return cupy.from_dlpack(t.detach())


def prep(crow, U):
    crow64 = crow.long()
    nnz = int(crow64[-1])
    units = max(1, math.ceil(nnz / U))
    nominal = torch.arange(units, device=dev, dtype=torch.long) * U
    r = torch.searchsorted(crow64, nominal, right=True) - 1
    r = r.clamp(0, crow.numel() - 2)
    rs, re = crow64[r], crow64[r + 1]
    ustart = torch.where(re - rs <= U, rs, nominal)
    ustart[0] = 0
    ustart = torch.cat([ustart, torch.tensor([nnz], device=dev)])
    urow = (torch.searchsorted(crow64, ustart[:-1], right=True) - 1).clamp(0, crow.numel() - 2)
    lengths = crow64[1:] - crow64[:-1]
    u0 = crow64[:-1] // U
    u1 = (crow64[1:] - 1) // U
    cut = (lengths > U) & (u1 > u0)
    empty = lengths == 0
    rows = torch.nonzero(cut | empty).flatten()
    first = torch.where(empty[rows], 0, u0[rows])
    pieces = torch.where(empty[rows], 0, (u1 - u0 + 1)[rows])
    i32 = lambda t: t.to(torch.int32).contiguous()
    return dict(units=units, ustart=i32(ustart), urow=i32(urow), rows=i32(rows), first=i32(first), pieces=i32(pieces))


def make_proto(A, B, U, G, tn, variant=""):
    crow, col, val = A.crow_indices().int(), A.col_indices().int(), A.values()
    m, k = A.shape
    n = B.shape[1]
    P = prep(crow, U)
    partial = torch.empty(P["units"] * 2 * n, device=dev, dtype=torch.float32)
    C = torch.empty(m, n, device=dev, dtype=B.dtype)
    kern = mod.get_function(f"stream{variant}_{tn}_g{G}")
    fix = mod.get_function(f"fixup_{tn}_g{G}")
    nnz = col.numel()
    blocks = math.ceil(P["units"] / (256 // G))
    nfix = P["rows"].numel()
    args = (cp(crow), cp(col), cp(val), cp(B), cp(C), cp(partial), cp(P["ustart"]), cp(P["urow"]),
            np.int32(m), np.int32(k), np.int32(n), np.int32(nnz), np.int32(P["units"]))
    fargs = (cp(P["rows"]), cp(P["first"]), cp(P["pieces"]), cp(partial), cp(C), np.int32(n))

    def run():
        kern((blocks,), (256,), args)
        if nfix:
            fix((nfix,), (256,), fargs)
        return C
    return run, nfix, P["units"]


def rel(x, ref):
    return float((x.double() - ref).norm() / ref.norm().clamp_min(1e-30))


def main():
    quick = "--quick" in sys.argv
    specs = graphs.SPECS[:4] if quick else graphs.SPECS[:6]
    cases = [(torch.float32, 16), (torch.float32, 32), (torch.float32, 64), (torch.bfloat16, 32), (torch.bfloat16, 64),
             (torch.float32, 128)]
    Us = [int(u) for u in os.environ.get("UNITS", "32,64,128,256").split(",")]
    out = []
    for spec in specs:
        name = spec[0]
        g, crow, col, vals = graphs.load(spec, dev)
        for dtype, n in cases:
            tn = "f32" if dtype == torch.float32 else "bf16"
            vec = 4 if dtype == torch.float32 else 8
            G = n // vec
            if G not in (4, 8, 16, 32):
                continue
            A = torch.sparse_csr_tensor(crow, col, vals.to(dtype), size=g.shape)
            B = torch.randn(g.shape[1], n, device=dev, dtype=dtype)
            A64 = torch.sparse_csr_tensor(crow.long(), col.long(), vals.double(), size=g.shape)
            ref = torch.sparse.mm(A64, B.double())
            res = {}
            fns = {"torch": lambda: torch.sparse.mm(A, B)}
            for r in ("auto", "split", "cusparse"):
                fns[r] = (lambda r=r: st.spmm(A, B, backend=r))
            for U in Us:
                run, nfix, units = make_proto(A, B, U, G, tn)
                fns[f"proto U={U}"] = run
            for v, U in (("4", 128), ("16", 128)):
                try:
                    run, nfix, units = make_proto(A, B, U, G, tn, v)
                    fns[f"proto{v} U={U}"] = run
                except Exception:
                    pass
            for label, fn in fns.items():
                y = fn()
                torch.cuda.synchronize()
                err = rel(y, ref)
                t = do_bench(fn, warmup=10, rep=60, return_mode="median") * 1e3
                res[label] = (t, err)
            base = min(res["torch"][0], res["cusparse"][0])
            line = " | ".join(f"{k} {t:7.1f}us {base / t:4.2f}x e{e:.0e}" for k, (t, e) in res.items())
            print(f"{name} {tn} n={n}: {line}", flush=True)
            out.append(dict(graph=name, dtype=tn, n=n, res=res))
    json.dump(out, open(os.path.join(os.environ.get("OUT", "/tmp"), "proto.json"), "w"), indent=1)


if __name__ == "__main__":
    main()
