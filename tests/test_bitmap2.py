"""The bitmap2 layout (sparsetorch/pruned/bitmap2.py, csrc/cuda/bitmap2_kernel.cuh) on the CPU: the packer
and the emulation of the CUDA kernel's per-lane decode (popcount rule, end-anchored loads, prmt selection,
mma fragment positions) rebuild the weight bit for bit, at densities 0..100%, empty rows and fully dense
tiles, bf16 and fp16, several shapes; byte counts; bad input raises ValueError naming the argument."""
import pytest
import torch

from _helpers import randn
from sparsetorch.pruned import bitmap2 as bm2

HALF = [torch.bfloat16, torch.float16]
SHAPES = [(16, 16), (48, 96), (64, 64), (128, 192), (80, 272)]
DENSITIES = [0.0, 0.05, 0.3, 0.5, 0.7, 1.0]


def _weight(rng, m, k, density, dtype, empty_rows=0.0):
    w = randn(rng, m, k, dtype=torch.float64)
    # Heavy-tailed row and column scales, as pruned LLM weights have.
    w = w * torch.from_numpy(rng.lognormal(0, 1.5, (m, 1))) * torch.from_numpy(rng.lognormal(0, 1.5, (1, k)))
    keep = torch.from_numpy(rng.random((m, k)) < density)
    w = torch.where(keep, w, torch.zeros_like(w))
    if empty_rows:
        w[torch.from_numpy(rng.random(m) < empty_rows)] = 0.0
    w = w.to(dtype)
    return w


def _same_bits(a, b):
    assert a.shape == b.shape and a.dtype == b.dtype
    assert torch.equal(a.view(torch.int16), b.view(torch.int16))


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("density", DENSITIES)
@pytest.mark.parametrize("shape", SHAPES)
def test_round_trip(rng, shape, density, dtype):
    w = _weight(rng, *shape, density, dtype)
    blob, offsets = bm2.pack(w)
    _same_bits(bm2.unpack(blob, offsets, shape, dtype), w)


@pytest.mark.parametrize("dtype", HALF)
def test_empty_rows_and_dense_tiles(rng, dtype):
    m, k = 192, 320
    w = _weight(rng, m, k, 0.5, dtype, empty_rows=0.3)
    w[16:32] = randn(rng, 16, k, dtype=dtype) + 3.0  # a fully dense strip (every tile full, no zero)
    w[:, 64:128] = 0                                  # an empty chunk
    blob, offsets = bm2.pack(w)
    _same_bits(bm2.unpack(blob, offsets, (m, k), dtype), w)


def test_mask_keeps_explicit_zeros_and_negative_zero(rng):
    w = _weight(rng, 64, 128, 0.5, torch.bfloat16)
    mask = torch.from_numpy(rng.random((64, 128)) < 0.6)
    w[~mask] = 0
    w[0, :8] = -0.0
    mask[0, :8] = True
    blob, offsets = bm2.pack(w, mask)
    got = bm2.unpack(blob, offsets, (64, 128), torch.bfloat16)
    _same_bits(got, w)
    # The stored values are exactly the masked positions.
    assert int(offsets[-1]) * 16 == blob.numel()


def test_unpack_reads_through_the_decode(rng):
    # Changing one stored value changes exactly the element the decode maps it to.
    w = _weight(rng, 64, 64, 0.5, torch.float16)
    blob, offsets = bm2.pack(w)
    b16 = blob.view(torch.int16).clone()
    b16[64 + 5] = torch.tensor(0x3C00, dtype=torch.int16)  # 6th value of group 0 := 1.0
    got = bm2.unpack(b16.view(torch.uint8), offsets, (64, 64), torch.float16)
    diff = (got.view(torch.int16) != w.view(torch.int16)).nonzero()
    assert diff.shape[0] <= 1
    # Group 0 is rows 0..15, columns 0..63; its values are in fragment order.
    pos = bm2.fragment_positions().reshape(-1)
    grp = w[:16, :64].reshape(-1)[pos]
    nz = (grp.view(torch.int16) != 0).nonzero().flatten()
    r, c = divmod(int(pos[nz[5]]), 64)
    assert got[r, c].item() == 1.0


def test_fragment_positions_are_a_permutation():
    pos = bm2.fragment_positions().reshape(-1)
    assert torch.equal(pos.sort().values, torch.arange(1024))


def test_prmt_selection_table():
    # bits (b1 b0) -> register (low half first) from va = 0x1111, vb = 0x2222.
    va, vb = torch.tensor([0x1111] * 4), torch.tensor([0x2222] * 4)
    bits = torch.arange(4)
    sel = bm2._prmt(torch.full_like(bits, bm2.K0), torch.full_like(bits, bm2.K1), bits * 0x22 + 0x10)
    reg = bm2._prmt(va, vb, sel)
    assert reg.tolist() == [0, 0x2222, 0x2222 << 16, 0x1111 | (0x2222 << 16)]


@pytest.mark.parametrize("density,per_element", [(0.5, 1.14), (0.3, 0.74), (0.1, 0.34)])
def test_bytes(rng, density, per_element):
    m, k = 512, 1024
    w = _weight(rng, m, k, density, torch.bfloat16)
    blob, offsets = bm2.pack(w)
    nbytes = blob.numel() + 4 * offsets.numel()
    assert abs(nbytes / (m * k) - per_element) < 0.02
    groups = (m // 16) * (k // 64)
    assert blob.numel() == 16 * int(offsets[-1]) and offsets.numel() == groups + 1
    assert (offsets.diff() >= 8).all()  # every group has its 128 bytes of bitmaps


def test_product_through_the_layout(rng):
    # x @ W^T through the decoded weight against float64 (what the CUDA probe checks on the device).
    w = _weight(rng, 96, 160, 0.3, torch.bfloat16)
    x = randn(rng, 5, 160, dtype=torch.bfloat16)
    blob, offsets = bm2.pack(w)
    got = x.double() @ bm2.unpack(blob, offsets, w.shape, w.dtype).double().t()
    torch.testing.assert_close(got, x.double() @ w.double().t(), rtol=0, atol=0)


@pytest.mark.parametrize("bad,match", [
    (lambda: bm2.pack(torch.zeros(20, 32, dtype=torch.bfloat16)), "weight: out_features and in_features"),
    (lambda: bm2.pack(torch.zeros(32, 24, dtype=torch.bfloat16)), "weight: out_features and in_features"),
    (lambda: bm2.pack(torch.zeros(32, 32)), "weight: expected bfloat16 or float16"),
    (lambda: bm2.pack(torch.zeros(32, dtype=torch.bfloat16)), "weight: expected a 2-D tensor"),
    (lambda: bm2.pack(torch.zeros(32, 32, dtype=torch.bfloat16), torch.ones(32, 16, dtype=torch.bool)), "mask:"),
    (lambda: bm2.pack(torch.zeros(32, 32, dtype=torch.bfloat16), torch.ones(32, 32)), "mask:"),
])
def test_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        bad()


# --- the CUDA kernel's control flow, emulated at group granularity -------------------------------------
# Stage planning (the 32-wide ballot over prefetched offsets, copies clamped to the stage and the blob),
# the group walk by bitmap popcounts, the band flushes and the last-arriver fixed-order reduction, with the
# warps run one after another in a random order; each group's product uses the decode proven above.
import random  # noqa: E402

INT_MAX = 2**31 - 1


def run(w, x, total_warps, stages, stage_bytes):
    """max |y - x @ W^T| of the emulated launch (float64)."""
    m,k=w.shape; n=x.shape[0]
    blob,off=bm2.pack(w); off=off.tolist(); b16=blob.view(torch.int16)
    bands=-(-m//64); chunks=-(-k//64); units=bands*chunks
    dense=bm2.unpack(blob, torch.tensor(off,dtype=torch.int32), (m,k), w.dtype).double()  # per-group decode proven elsewhere
    mp,kp=bands*64,chunks*64
    D=torch.zeros(mp,kp,dtype=torch.float64); D[:m,:k]=dense
    X=torch.zeros(n,kp,dtype=torch.float64); X[:,:k]=x.double()
    ub=lambda ww: ww*units//total_warps
    owner=lambda u: ((u+1)*total_warps-1)//units
    partial={}; counters=[0]*bands; y=torch.full((n,m),float('nan'),dtype=torch.float64)
    cap16=stage_bytes//16; blob_units=len(b16)//8
    def flush(acc, band, wv):
        fu=band*chunks; lu=fu+chunks-1
        which=0 if ub(wv)//chunks==band else 1
        partial[(wv,which)]=acc.clone()
        wf,wl=owner(fu),owner(lu)
        if wf==wl:   # the warp holds the whole band: y straight from its registers
            rows=min(64,m-band*64); y[:,band*64:band*64+rows]=acc[:rows].t(); return
        if wf!=wl:
            old=counters[band]; counters[band]+=1
            if old!=wl-wf: return
        z=torch.zeros(64,n,dtype=torch.float64)
        for ww in range(wf,wl+1):
            wh=0 if ub(ww)//chunks==band else 1
            z+=partial[(ww,wh)]
        rows=min(64,m-band*64)
        y[:,band*64:band*64+rows]=z[:rows].t()
        if wf!=wl: counters[band]=0
    order=list(range(total_warps)); random.shuffle(order)   # warps run in any order
    # run warps one after another in random order (the reduction must not depend on it)
    for wv in order:
        u0,u1=ub(wv),ub(wv+1); gbase=4*u0; ng=4*(u1-u0)
        pa=0; pa_off=off[gbase] if ng>0 else 0
        win=[off[gbase+1+l] if l<ng else INT_MAX for l in range(32)]
        stage_data=[None]*stages; hdr=[None]*stages
        def issue(s):
            nonlocal pa,pa_off,win
            fits=[(l<ng-pa and win[l]>=pa_off and win[l]-pa_off<=cap16) for l in range(32)]
            nn=32 if all(fits) else fits.index(False)
            if nn==0: nn=1
            end=win[nn-1]
            src=min(max(pa_off,0),blob_units); by16=min(max(end-pa_off,0),min(cap16,blob_units-src))
            stage_data[s]=b16[src*8:(src+by16)*8].clone(); hdr[s]=(nn,by16*16)
            pa+=nn; pa_off=end
            win=[off[gbase+pa+1+l] if l<ng-pa else INT_MAX for l in range(32)]
        for s in range(stages):
            if pa<ng: issue(s)
        acc=torch.zeros(64,n,dtype=torch.float64); cur=-1; done=0; kk=0; ngroups=0
        nb,nc=(u0//chunks,u0%chunks) if ng>0 else (0,0)   # (band, chunk) of the next unit: advanced per unit
        while done<ng:
            s=kk%stages; nn,by=hdr[s]; st=stage_data[s]; ptr=0; ok=True
            for i in range(nn):
                rel=done+i; unit=u0+rel//4; sub=rel%4
                if sub==0:
                    band,chunk=nb,nc
                    nc+=1
                    if nc==chunks: nc=0; nb+=1
                    assert (band,chunk)==(unit//chunks,unit%chunks)
                    if band!=cur:
                        if cur>=0: flush(acc,cur,wv); acc.zero_()
                        cur=band
                    col=chunk*64
                if not ok or ptr+128>by: ok=False; continue
                words=st[ptr//2:ptr//2+64].view(torch.int32).to(torch.int64)&0xffffffff
                total=int(bm2._popcount(words).sum())
                if ptr+128+2*total>by: ok=False; continue
                # the group's decoded tile times x (decode mapping proven by unpack)
                r0=band*64+16*sub
                acc[16*sub:16*sub+16]+=D[r0:r0+16,col:col+64]@X[:,col:col+64].t()
                ptr+=128+((2*total+15)&~15); ngroups+=1
            done+=nn
            if pa<ng: issue(s)
            kk+=1
        if cur>=0: flush(acc,cur,wv)
        assert ngroups==ng, (ngroups,ng)
    assert all(c==0 for c in counters)
    ref=x.double()@w.double().t()
    return (y-ref).abs().max().item()


@pytest.mark.parametrize("shape,density", [((16, 16), 0.5), ((48, 96), 1.0), ((128, 384), 0.1), ((64, 1024), 0.5),
                                           ((64, 256), 0.0)])
def test_kernel_control_flow_emulation(shape, density):
    torch.manual_seed(0)
    random.seed(0)
    m, k = shape
    w = torch.randn(m, k).to(torch.bfloat16)
    w[torch.rand(m, k) >= density] = 0
    x = torch.randn(3, k).to(torch.bfloat16)
    units = -(-m // 64) * -(-k // 64)
    for total_warps in sorted({1, 3, 5, units}):
        if total_warps > units:
            continue
        for stages, stage_bytes in ((2, 2304), (4, 4096)):
            assert run(w, x, total_warps, stages, stage_bytes) < 1e-9
