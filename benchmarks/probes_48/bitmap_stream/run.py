"""Prototype bitmap stream kernel against F.linear and the library's bitmap / csr16 / chosen form."""
import json, os, sys, tempfile, time
import torch, torch.nn.functional as F
HERE = os.path.dirname(os.path.abspath(__file__))
import sparsetorch as st

def log(*a):
    print(*a, flush=True)

def build():
    from torch.utils.cpp_extension import load
    t = time.time()
    ext = load(name="bmsprobe", sources=[os.path.join(HERE, "binding.cpp"), os.path.join(HERE, "glue.cu")],
               extra_cuda_cflags=["-O3", "-gencode=arch=compute_90a,code=sm_90a", "-lineinfo", "-Xptxas=-v"],
               build_directory=tempfile.mkdtemp(), verbose=False)
    log(f"built in {time.time() - t:.1f} s")
    return ext

def weight(m, k, sparsity, per_row, gen, dtype=torch.bfloat16):
    w = torch.randn(m, k, generator=gen, device="cuda")
    w = w * torch.exp(torch.randn(m, 1, generator=gen, device="cuda")) * torch.exp(torch.randn(1, k, generator=gen, device="cuda"))
    if sparsity == 0:
        return w.to(dtype)
    a = w.abs()
    if per_row:
        kk = int(round(k * (1 - sparsity)))
        thr = a.kthvalue(k - kk, dim=1, keepdim=True).values
        mask = a > thr
    else:
        flat = a.flatten()
        kk = int(round(flat.numel() * (1 - sparsity)))
        thr = flat.kthvalue(flat.numel() - kk).values
        mask = a > thr
    return (w * mask).to(dtype)

def main():
    prop = torch.cuda.get_device_properties(0); sms = prop.multi_processor_count
    log(prop.name, sms)
    ext = build()
    gen = torch.Generator(device="cuda"); gen.manual_seed(0)
    stream = lambda: torch.cuda.current_stream().cuda_stream

    def run(bw, x, out, splits=0, act=0, bias=None, pf=0):
        m = bw.shape[0]
        strips, chunks = bw.bitmaps.shape[0], bw.bitmaps.shape[1]
        r = ext.launch(bw.bitmaps, bw.offsets, bw.values, x, out, bias, m, strips, chunks, act, splits, sms, stream(), pf)
        if r != 0:
            raise RuntimeError(f"launch error {r}")
    # correctness
    fails = 0
    for (m, k) in [(16, 64), (48, 192), (256, 512), (4096, 4096), (1000 // 16 * 16, 640)]:
        for sp in (0.5, 0.7, 0.9, 0.99, 0.0):
            for per_row in (True, False):
                w = weight(m, k, sp, per_row, gen)
                bw = st.BitmapWeight.from_dense(w)
                assert tuple(bw.bitmaps.shape[:2]) == ((m + 15) // 16, (k + 63) // 64), bw.bitmaps.shape
                for n in (1, 5, 8, 9, 16):
                    for splits, pf in ((0, 0), (1, 1), (3, 1)):
                        x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
                        out = torch.full((n, m), 7.0, dtype=torch.bfloat16, device="cuda")
                        bias = torch.randn(m, generator=gen, device="cuda").to(torch.bfloat16)
                        run(bw, x, out, splits, 5, bias, pf)
                        ref = F.silu(x.double() @ w.double().t() + bias.double())
                        err = ((out.double() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                        if not err < 1e-2:
                            fails += 1
                            if fails < 10: log("FAIL", m, k, sp, per_row, n, splits, err)
    log("correctness fails:", fails)
    if fails:
        raise SystemExit(2)
    import triton.testing as tt
    bench = lambda f: tt.do_bench(f, warmup=5, rep=30, return_mode="median") * 1e3
    src = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda"); dst = torch.empty_like(src)
    copy = 2 * src.numel() / (bench(lambda: dst.copy_(src)) * 1e-6) / 1e9; del src, dst
    log(f"copy {copy:.0f} GB/s")
    res = []
    for (m, k) in [(11008, 4096), (4096, 11008)]:
        for sp, per_row in ((0.5, True), (0.7, True), (0.9, True)):
            w = weight(m, k, sp, per_row, gen)
            bw = st.BitmapWeight.from_dense(w)
            for n in (1, 16):
                x = torch.randn(n, k, generator=gen, device="cuda").to(torch.bfloat16)
                out = torch.empty(n, m, dtype=torch.bfloat16, device="cuda")
                td = bench(lambda: F.linear(x, w))
                line = []
                for splits in (0, 4, 8):
                    for pf in (0, 1):
                        tn = bench(lambda: run(bw, x, out, splits, pf=pf))
                        line.append(f"s{splits}{'p' if pf else ''}:{tn:.1f}({td/tn:.2f}x)")
                        res.append(dict(m=m, k=k, sp=sp, n=n, splits=splits, pf=pf, us=tn, dense=td))
                log(f"{m:>5}x{k:<5} {int(sp*100)}% N={n:>2} dense {td:.1f}: " + " ".join(line))
    if os.environ.get("OUT"):
        json.dump(res, open(os.path.join(os.environ["OUT"], "bms2.json"), "w"), indent=1)

main()
