"""Per-warp globaltimer traces of the bitmap kernel (full and copy-only cubins) on Llama shapes, N = 1."""
import ctypes, os, json, torch, torch.nn.functional as F, triton.testing as tt
import sparsetorch as st
from drv import Module, choose_v6, run, cu, ck
from run import weight, pad8
HERE = os.path.dirname(os.path.abspath(__file__))
KV = "_ZN11sparsetorch4cuda6bitmap20bitmap_linear_kernelI13__nv_bfloat16Li{}ELb{}EEEvNS1_6ParamsE"
RN = "_ZN11sparsetorch4cuda6bitmap27bitmap_splitk_reduce_kernelI13__nv_bfloat16EEvPKfillPKtNS_10ActivationEfPt"
OUT = os.environ.get("OUT", ".")
bench = lambda f: tt.do_bench(f, warmup=10, rep=40, return_mode="median") * 1e3
sms = torch.cuda.get_device_properties(0).multi_processor_count
mods = {n: Module(os.path.join(HERE, n + ".cubin")) for n in os.environ.get("MODS", "full,copy").split(",")}
def trace_ptr(mod):
    p = ctypes.c_uint64(); sz = ctypes.c_size_t()
    ck(cu.cuModuleGetGlobal_v2(ctypes.byref(p), ctypes.byref(sz), mod.mod, b"_ZN11sparsetorch4cuda6bitmap7g_traceE"), "global")
    return p.value, sz.value
flush = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda").fill_(1)
FL = os.environ.get("FLUSH", "zero")
def do_flush():
    if FL == "zero": flush.zero_()
    else: flush.sum()
def t_readflush(f, reps=40):
    f(); torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        do_flush(); a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[len(ts) // 2]
bench = t_readflush
src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
print(f"copy {2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-6) / 1e9:.0f} GB/s (read+write)", flush=True)
del src, dst
gen = torch.Generator(device="cuda"); gen.manual_seed(0)
res = []
SH = [tuple(int(v) for v in t.split(",")) for t in os.environ.get("SHAPES", "14336,4096;4096,14336").split(";")]
for (m, k) in SH:
    for sp in [float(v) for v in os.environ.get("SPS", "0.5,0.7").split(",")]:
        w = weight(m, k, sp, True, gen); bw = st.BitmapWeight.from_dense(w)
        nbytes = bw.values.numel() * 2 + bw.bitmaps.numel() * 8 + bw.offsets.numel() * 4
        rd = torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_()
        for n in (1,):
            x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16); xx = pad8(x)
            td = bench(lambda: F.linear(x, w)); tsum = bench(lambda: rd.sum())
            L = choose_v6(m, n, k, bw.values.numel(), sms)
            out = torch.empty(n, m, dtype=torch.bfloat16, device="cuda")
            work = torch.empty(L["splits"], n, m, dtype=torch.float32, device="cuda") if L["splits"] > 1 else None
            kn = KV.format(L["nt"], int(L["dense"]))
            row = dict(m=m, k=k, sp=sp, n=n, dense=td, sum_same_bytes=tsum, mb=nbytes / 1e6, L=L)
            for name, mod in mods.items():
                f = lambda: run(mod, kn, RN, bw, xx, out, work, L)
                row[name] = bench(f)
                ptr, sz = trace_ptr(mod)
                traces = []
                for rep in range(3):
                    cu.cuMemsetD8_v2(ctypes.c_uint64(ptr), 0, sz); do_flush(); torch.cuda.synchronize()
                    f(); torch.cuda.synchronize()
                    nw = L["ct"] * L["rb"] * L["splits"] * 8
                    t = torch.empty(nw * 8, dtype=torch.int64, device="cuda")
                    ck(cu.cuMemcpyDtoD_v2(ctypes.c_uint64(t.data_ptr()), ctypes.c_uint64(ptr), nw * 64), "copy")
                    t = t.view(nw, 8).cpu()
                    t0 = t[:, 0].min().item()
                    rel = lambda c: ((t[:, c] - t0).double() / 1e3)
                    live = t[:, 6] > 0
                    q = lambda v: [round(v.quantile(p).item(), 2) for p in (0.0, 0.1, 0.5, 0.9, 1.0)]
                    wc = (t[:, 7] & 0xffffffff).double(); tc = (t[:, 7] >> 32).double()
                    wf = (wc / tc.clamp_min(1))[live]
                    traces.append(dict(waitfrac=q(wf), span=rel(4).max().item(), start=q(rel(0)), first=q((rel(1) - rel(0))[live]), loop_end=q(rel(2)[live]),
                                       end=q(rel(4)), warps=nw, live=int(live.sum())))
                    if rep == 0:
                        torch.save(t, os.path.join(OUT, f"trace_{FL}_{name}_{m}x{k}_{int(sp*100)}.pt"))
                row[name + "_trace"] = traces
                tr = traces[1]
                print(f"{m}x{k} {int(sp*100)}% N={n} {name}: do_bench {row[name]:.1f} us (dense {td:.1f}, sum of same {nbytes/1e6:.0f} MB {tsum:.1f}); "
                      f"[{FL}] span {tr['span']:.1f}; waitfrac {tr['waitfrac']}; start {tr['start']}; first-data {tr['first']}; loop_end {tr['loop_end']}; end {tr['end']}; grid {L['rb']}x{L['splits']} ws{L['ws']} wk{L['wk']}", flush=True)
            res.append(row)
json.dump(res, open(os.path.join(OUT, f"trace_{FL}.json"), "w"), indent=1)
