"""Launch a cubin's bitmap kernel through the CUDA driver API (ctypes), on torch's stream."""
import ctypes, torch
try:
    cu = ctypes.CDLL("libcuda.so.1")
except OSError:
    cu = None
def ck(r, what):
    if r != 0:
        s = ctypes.c_char_p(); cu.cuGetErrorString(r, ctypes.byref(s)); raise RuntimeError(f"{what}: {r} {s.value}")

class TileParams(ctypes.Structure):
    _fields_ = [("x", ctypes.c_void_p), ("ldx", ctypes.c_int64), ("kx", ctypes.c_int), ("n", ctypes.c_int),
                ("m", ctypes.c_int), ("strips", ctypes.c_int), ("chunks", ctypes.c_int), ("out", ctypes.c_void_p),
                ("bias", ctypes.c_void_p), ("act", ctypes.c_int), ("slope", ctypes.c_float), ("ws", ctypes.c_int),
                ("wk", ctypes.c_int), ("chunks_per_split", ctypes.c_int)]
class Params(TileParams):
    _fields_ = [("bitmaps", ctypes.c_void_p), ("offsets", ctypes.c_void_p), ("values", ctypes.c_void_p),
                ("nvalues", ctypes.c_int64), ("scatter_max", ctypes.c_int), ("batch", ctypes.c_int),
                ("stage_values", ctypes.c_int), ("even_warps", ctypes.c_int)]
class EvenSplit(ctypes.Structure):
    _fields_ = [("groups", ctypes.c_int64), ("chunks", ctypes.c_int), ("warps", ctypes.c_int)]

class Module:
    def __init__(self, path):
        torch.cuda.init(); torch.empty(1, device="cuda")
        self.mod = ctypes.c_void_p(); ck(cu.cuModuleLoad(ctypes.byref(self.mod), path.encode()), "load")
        self.funcs = {}
    def fn(self, name, smem):
        if name not in self.funcs:
            f = ctypes.c_void_p(); ck(cu.cuModuleGetFunction(ctypes.byref(f), self.mod, name.encode()), name)
            ck(cu.cuFuncSetAttribute(f, 8, 227 * 1024), "attr")
            self.funcs[name] = f
        return self.funcs[name]
    def launch(self, name, grid, block, smem, args):
        f = self.fn(name, smem)
        arr = (ctypes.c_void_p * len(args))(*[ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args])
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        ck(cu.cuLaunchKernel(f, *grid, *block, smem, stream, arr, None), "launch")

# --- bitmap_kernel.cuh's launch choice, in Python -------------------------------------------------
K_WARPS, K_STAGES, K_MAXBATCH = 8, 4, 4
def max_stage_values(batch): return batch * 1024 + 16
def stage_bytes(sv, batch): return batch * 128 + 16 + 2 * sv
def warp_smem(sv, batch, bar): return K_STAGES * stage_bytes(sv, batch) + 2048 + 256 + bar
def block_smem(sv, batch, nt, bar): return max(K_WARPS * warp_smem(sv, batch, bar), K_WARPS * 8 * nt * 20 * 4)
def stage_values_for(nvalues, groups, batch, full_single=False):
    if full_single and batch == 1: return max_stage_values(1)
    mean = batch * ((max(nvalues, 0) + groups - 1) // groups) if groups else 0
    want = (5 * mean + 3) // 4 + 48
    return min(max_stage_values(batch), (want + 7) // 8 * 8)
def split_work(strips, chunks, column_tiles, wanted, min_chunks=4, one_wave=True):
    bat = lambda w: ((strips + K_WARPS // w - 1) // (K_WARPS // w)) * column_tiles
    wk = 1
    while wk < K_WARPS and chunks >= 2 * wk * min_chunks and (bat(2 * wk) <= wanted if one_wave else bat(wk) < wanted):
        wk *= 2
    ws = K_WARPS // wk; row_blocks = (strips + ws - 1) // ws; blocks = row_blocks * column_tiles; s = 1
    while blocks * s * 2 <= wanted and chunks >= 2 * s * wk * min_chunks: s *= 2
    cps = max(1, (chunks + s - 1) // s); splits = max(1, (chunks + cps - 1) // cps)
    return ws, wk, row_blocks, splits, cps
def split_one_wave(strips, chunks, ct, wanted, min_chunks=4):
    best = None
    w = 1
    while w <= K_WARPS:
        if w > 1 and chunks < w * min_chunks: break
        rows = (strips + K_WARPS // w - 1) // (K_WARPS // w)
        for s_ in range(1, 9):
            ps = max(1, -(-chunks // s_))
            if s_ > 1 and ps < w * min_chunks: break
            ns = -(-chunks // ps)
            if s_ > 1 and ns != s_: continue
            blocks = rows * ct * ns; fits = blocks <= wanted
            if best is None: better = True
            else:
                bb, bf, bs = best[0], best[1], best[4]
                better = (fits and (not bf or blocks > bb or (blocks == bb and ns < bs))) or (not fits and not bf and blocks < bb)
            if better: best = (blocks, fits, K_WARPS // w, w, ns, rows, ps)
        w *= 2
    _, _, ws, wk, ns, rows, ps = best
    return ws, wk, rows, ns, ps

def choose_final(m, n, k, nvalues, sms, bar=32, smem_sm=233472, reserved=1024, per_block=232448):
    """bitmap_kernel.cuh's choose_launch as of this stop (blocks_per_sm, one-wave split for batch 1)."""
    nt = 1 if n <= 8 else 2 if n <= 16 else 4 if n <= 32 else 8
    ct = (n + 8 * nt - 1) // (8 * nt); strips, chunks = (m + 15) // 16, (k + 63) // 64
    mean = nvalues // (strips * chunks) if strips * chunks else 0
    batch = K_MAXBATCH
    while True:
        byreg = 2 if (batch <= 2 or nt > 4) else 3
        sv = stage_values_for(nvalues, strips * chunks, batch, True); smem = block_smem(sv, batch, nt, bar)
        if batch == 1 or (batch * mean <= 640 and byreg * (smem + reserved) <= smem_sm and smem <= per_block): break
        batch //= 2
    per_sm = max(1, min(byreg, smem_sm // (smem + reserved)))
    if batch <= 2: ws, wk, rb, splits, cps = split_one_wave(strips, chunks, ct, per_sm * sms)
    else: ws, wk, rb, splits, cps = split_work(strips, chunks, ct, per_sm * sms, one_wave=False)
    return dict(nt=nt, ct=ct, ws=ws, wk=wk, rb=rb, splits=splits, cps=cps, batch=batch, sv=sv, smem=smem, blocks=byreg)

def choose(m, n, k, nvalues, sms, bar=32, smem_sm=233472, reserved=1024, per_block=232448, per_sm_regs=None, full_single=False):
    nt = 1 if n <= 8 else 2 if n <= 16 else 4 if n <= 32 else 8
    ct = (n + 8 * nt - 1) // (8 * nt); strips, chunks = (m + 15) // 16, (k + 63) // 64
    byreg = per_sm_regs or (3 if nt <= 4 else 2)
    mean = nvalues // (strips * chunks) if strips * chunks else 0
    batch = K_MAXBATCH
    while True:
        sv = stage_values_for(nvalues, strips * chunks, batch, full_single); smem = block_smem(sv, batch, nt, bar)
        if batch == 1 or (batch * mean <= 640 and byreg * (smem + reserved) <= smem_sm and smem <= per_block): break
        batch //= 2
    per_sm = max(1, min(byreg, smem_sm // (smem + reserved)))
    ws, wk, rb, splits, cps = split_one_wave(strips, chunks, ct, per_sm * sms) if full_single else split_work(strips, chunks, ct, per_sm * sms, one_wave=False)
    return dict(nt=nt, ct=ct, ws=ws, wk=wk, rb=rb, splits=splits, cps=cps, batch=batch, sv=sv, smem=smem)

def run(mod, kname, rname, bw, x, out, work, L, act=0, bias=None, scatter_max=256):
    m, k = bw.shape; n = x.shape[0]
    p = Params()
    p.x = x.data_ptr(); p.ldx = x.stride(0); p.kx = x.shape[1]; p.n = n; p.m = m
    p.strips, p.chunks = bw.bitmaps.shape[0], bw.bitmaps.shape[1]
    p.out = (work if L["splits"] > 1 else out).data_ptr(); p.bias = bias.data_ptr() if (bias is not None and L["splits"] == 1) else None
    p.act = act; p.slope = 0.01; p.ws, p.wk, p.chunks_per_split = L["ws"], L["wk"], L["cps"]
    p.bitmaps, p.offsets, p.values = bw.bitmaps.data_ptr(), bw.offsets.data_ptr(), bw.values.data_ptr()
    p.nvalues = bw.values.numel(); p.scatter_max = scatter_max; p.batch = L["batch"]; p.stage_values = L["sv"]
    ev = L.get("even", 0); p.even_warps = ev
    if ev: p.out = work.data_ptr(); p.bias = None
    mod.launch(kname, (L["ct"], L["rb"], L["splits"]), (256, 1, 1), L["smem"], [p])
    if L["splits"] > 1 or ev:
        cells = n * m
        args = [ctypes.c_void_p(work.data_ptr()), ctypes.c_int(L["splits"]), ctypes.c_int64(cells), ctypes.c_int64(m)]
        if "even" in L: args.append(EvenSplit(p.strips * p.chunks, p.chunks, ev))
        args += [ctypes.c_void_p(bias.data_ptr() if bias is not None else None), ctypes.c_int(act), ctypes.c_float(0.01),
                ctypes.c_void_p(out.data_ptr())]
        mod.launch(rname, (max(1, min((cells + 255) // 256, 8 * 132)), 1, 1), (256, 1, 1), 0, args)

def choose_v2(m, n, k, nvalues, sms, smem_sm=233472, reserved=1024, per_block=232448):
    """bitmap_kernel.cuh's choose_launch with the dense/sparse configurations."""
    nt = 1 if n <= 8 else 2 if n <= 16 else 4 if n <= 32 else 8
    ct = (n + 8 * nt - 1) // (8 * nt); strips, chunks = (m + 15) // 16, (k + 63) // 64
    mean = nvalues // (strips * chunks) if strips * chunks else 0
    def wsm(sv, batch, dense): return (3 if dense else 4) * stage_bytes(sv, batch) + (0 if dense else 2048) + 256 + 32
    def conf(dense, batch):
        byreg = 2 if (dense or nt > 4) else 3
        sv = max_stage_values(batch) if dense else stage_values_for(nvalues, strips * chunks, batch)
        smem = max(K_WARPS * wsm(sv, batch, dense), K_WARPS * 8 * nt * 20 * 4)
        return dict(dense=dense, batch=batch, byreg=byreg, sv=sv, smem=smem), byreg * (smem + reserved) <= smem_sm and smem <= per_block
    c, ok = conf(False, 4)
    if not (4 * mean <= 640 and ok):
        c, ok = conf(True, 2)
        if not ok: c, ok = conf(True, 1)
    per_sm = max(1, min(c["byreg"], smem_sm // (c["smem"] + reserved)))
    if c["dense"]: ws, wk, rb, splits, cps = split_one_wave(strips, chunks, ct, per_sm * sms)
    else: ws, wk, rb, splits, cps = split_work(strips, chunks, ct, per_sm * sms, one_wave=False)
    return dict(nt=nt, ct=ct, ws=ws, wk=wk, rb=rb, splits=splits, cps=cps, batch=c["batch"], sv=c["sv"], smem=c["smem"],
                blocks=c["byreg"], dense=c["dense"])

def choose_v4(m, n, k, nvalues, sms, **kw):
    """choose_v2 plus the even split (dense configuration)."""
    L = choose_v2(m, n, k, nvalues, sms, **kw); L["even"] = 0; L["slots"] = 0
    if not L["dense"]: return L
    strips, chunks = (m + 15) // 16, (k + 63) // 64; groups = strips * chunks
    per_sm = max(1, min(L["blocks"], 233472 // (L["smem"] + 1024))); wanted = per_sm * sms
    eb = min(wanted // L["ct"], groups // 32)
    if eb > 0:
        es = -(-groups // (eb * 8)); bb = L["rb"] * L["ct"] * L["splits"]
        bs = -(-L["cps"] // L["wk"]) * (-(-bb // wanted))
        if 20 * es < 19 * bs:
            L.update(even=eb * 8, slots=chunks // (groups // (eb * 8)) + 2, ws=8, wk=1, rb=eb, splits=1, cps=chunks)
    return L

def choose_v5(m, n, k, nvalues, sms, **kw):
    """choose_v2 with the one-wave split for the sparse configuration too."""
    L = choose_v2(m, n, k, nvalues, sms, **kw)
    if not L["dense"]:
        strips, chunks = (m + 15) // 16, (k + 63) // 64
        per_sm = max(1, min(L["blocks"], 233472 // (L["smem"] + 1024)))
        ws, wk, rb, splits, cps = split_one_wave(strips, chunks, L["ct"], per_sm * sms)
        L.update(ws=ws, wk=wk, rb=rb, splits=splits, cps=cps)
    return L

def choose_v6(m, n, k, nvalues, sms, **kw):
    """choose_v2, the sparse configuration taking the one-wave split when split_work's grid exceeds a wave."""
    L = choose_v2(m, n, k, nvalues, sms, **kw)
    if not L["dense"]:
        strips, chunks = (m + 15) // 16, (k + 63) // 64
        per_sm = max(1, min(L["blocks"], 233472 // (L["smem"] + 1024))); wanted = per_sm * sms
        if L["rb"] * L["ct"] * L["splits"] > wanted:
            ws, wk, rb, splits, cps = split_one_wave(strips, chunks, L["ct"], wanted)
            if rb * L["ct"] * splits <= wanted: L.update(ws=ws, wk=wk, rb=rb, splits=splits, cps=cps)
    return L
