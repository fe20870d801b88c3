"""How the timing method moves the dense/bitmap ratio: do_bench (L2 flushed by a 256 MB zero_: dirty lines
written back during the timed kernel), events after a read flush (clean L2), and a CUDA graph over 8
distinct weights of the shape (every weight read cold, as in a decoder stack)."""
import os, json, torch, torch.nn.functional as F, triton.testing as tt
import sparsetorch as st
from run import weight
OUT = os.environ.get("OUT", ".")
gen = torch.Generator(device="cuda"); gen.manual_seed(1)
cache = torch.empty(256 * 2**20 // 4, dtype=torch.int32, device="cuda").fill_(1)
def t_dobench(f): return tt.do_bench(f, warmup=10, rep=40, return_mode="median") * 1e3
def t_readflush(f, reps=40):
    f(); torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        cache.sum(); a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); f(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3)
    return sorted(ts)[len(ts) // 2]
def t_graph(fs, reps=20):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for f in fs: f()
    torch.cuda.current_stream().wait_stream(s); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for f in fs: f()
    g.replay(); torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); torch.cuda.synchronize(); ts.append(a.elapsed_time(b) * 1e3 / len(fs))
    return sorted(ts)[len(ts) // 2]
res = []
for (m, k) in [(14336, 4096), (4096, 14336)]:
    for sp in (0.5, 0.7, 0.9):
        ws = [weight(m, k, sp, True, gen) for _ in range(8)]
        bws = [st.BitmapWeight.from_dense(w) for w in ws]
        nbytes = bws[0].values.numel() * 2 + bws[0].bitmaps.numel() * 8
        rds = [torch.empty(nbytes // 2, dtype=torch.bfloat16, device="cuda").normal_() for _ in range(8)]
        for n in (1, 16):
            x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
            row = dict(m=m, k=k, sp=sp, n=n, mb=nbytes / 1e6)
            for name, mk in (("dense", lambda i: (lambda: F.linear(x, ws[i]))), ("bitmap", lambda i: (lambda: st.bitmap_linear(x, bws[i]))),
                             ("sum_same_bytes", lambda i: (lambda: rds[i].sum()))):
                if name == "sum_same_bytes" and n != 1: continue
                row[name] = dict(dobench=t_dobench(mk(0)), readflush=t_readflush(mk(0)), graph8=t_graph([mk(i) for i in range(8)]))
            d, b = row["dense"], row["bitmap"]
            print(f"{m}x{k} {int(sp*100)}% N={n} ({nbytes/1e6:.0f} MB): " + "; ".join(
                f"{mode}: dense {d[mode]:.1f} bitmap {b[mode]:.1f} ({d[mode]/b[mode]:.2f}x)" + (f" sum {row['sum_same_bytes'][mode]:.1f}" if n == 1 else "")
                for mode in ("dobench", "readflush", "graph8")), flush=True)
            res.append(row)
        del ws, bws, rds
json.dump(res, open(os.path.join(OUT, "modes.json"), "w"), indent=1)
