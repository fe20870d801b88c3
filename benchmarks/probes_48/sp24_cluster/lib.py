"""The library rule (library_config + plan) of the 2:4 decode kernel, with clusters (sm_90) and without, against
F.linear, over Llama-3-8B projection shapes; correctness of the library rule first."""
import json, os, sys
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch
import torch.nn.functional as F
import probe as P

def main():
    prop = torch.cuda.get_device_properties(0); sms = prop.multi_processor_count
    P.log({"name": prop.name, "sms": sms})
    import sparsetorch.pruned.sparse24_decode as packer
    ext = P.build(); run = P.Runner(ext, sms)
    gen = torch.Generator(device="cuda"); gen.manual_seed(1)
    fails = cases = 0
    for (m, k) in [(16, 32), (48, 96), (256, 512), (1024, 4096), (4096, 14336), (14336, 4096), (4096, 4096)]:
        for dtype in (torch.bfloat16, torch.float16):
            w = P.make_weight(m, k, dtype, gen); v, mt = packer.pack_sparse24_decode(w)
            for n in (1, 3, 8, 9, 16, 17, 33, 64):
                for act, bias in (("none", False), ("gelu", True)):
                    for cl in (-1, 0):
                        err, g_ok, plan = P.check_one(run, w, v, mt, n, dtype, act, bias, gen, cfg=dict(cluster=cl),
                                                      x_scale=1 / 16 if dtype == torch.float16 else 1.0)
                        cases += 1
                        if not (err < (1e-2 if dtype == torch.bfloat16 else 2e-3) and g_ok):
                            fails += 1; P.log("FAIL", m, k, dtype, n, act, cl, err, g_ok, plan)
    P.log("correctness:", cases, "cases,", fails, "failures")
    if fails:
        raise SystemExit(2)
    import triton.testing as tt
    bench = lambda f: tt.do_bench(f, warmup=5, rep=30, return_mode="median")
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    copy = 2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-3) / 1e9; del src, dst
    P.log(f"copy {copy:.0f} GB/s")
    rows = []
    P.log(f"{'shape':>12} {'N':>3} {'dense':>6} {'new':>6} {'x':>5} {'%copy':>5} {'old':>6} {'x':>5}  plan")
    for (m, k) in [(14336, 4096), (4096, 14336), (11008, 4096), (4096, 11008), (4096, 4096), (1024, 4096)]:
        w = P.make_weight(m, k, torch.bfloat16, gen); v, mt = packer.pack_sparse24_decode(w)
        nbytes = v.numel() * 2 + mt.numel() * 4
        for n in (1, 2, 4, 8, 12, 16, 24, 32):
            x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
            out = torch.empty(n, m, dtype=torch.bfloat16, device="cuda")
            td = bench(lambda: F.linear(x, w)) * 1e3
            f, pl = run.fn(v, mt, x, out, m, n, k); tn = bench(f) * 1e3
            fo, po = run.fn(v, mt, x, out, m, n, k, cluster=0); to = bench(fo) * 1e3
            rows.append(dict(m=m, k=k, n=n, dense_us=td, new_us=tn, old_us=to, plan=pl, old_plan=po, copy_GBps=copy,
                             pct_copy=100 * nbytes / tn / 1e3 / copy))
            P.log(f"{m:>5}x{k:<6} {n:>3} {td:6.1f} {tn:6.1f} {td/tn:5.2f} {100*nbytes/tn/1e3/copy:5.0f} {to:6.1f} {td/to:5.2f}  "
                  f"rt={pl['rt']} u={pl['u']} w={pl['warps']} s={pl['splits']} cl={pl['cluster']} smem={pl['smem']}")
            if os.environ.get("OUT"):
                json.dump({"device": prop.name, "rows": rows}, open(os.path.join(os.environ["OUT"], "lib.json"), "w"), indent=1)

main()
