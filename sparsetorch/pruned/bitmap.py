"""Pruned bf16/fp16 weights in bitmap tiles, multiplied on tensor cores ("load as sparse, compute as
dense", after Flash-LLM and SpInfer): :class:`BitmapWeight` and :func:`bitmap_linear`.

Layout (csrc/common/bitmap_layout.h): W (out, in) in groups of 16 rows x 64 columns, each group 16
quadrants of 8 x 8 with a 64-bit bitmap of its nonzeros; the values packed in bit order, quadrant
after quadrant, group after group ((strip, chunk) order); ``offsets[g]`` is group g's first value.
Bit b of quadrant q is the position the mma A fragment gives it (row ``(b // 8) + 8 (q % 2)``, a
permuted column; see ``_position``), so the CUDA kernel decodes registers straight from the bitmaps.
Bytes per nonzero: 2 + 8 / (64 d) + 4 / (1024 d) at density d (3.29 at 90% sparsity: 11008 x 4096
bf16 is 9.0 MB of values + 5.6 MB of bitmaps + 0.18 MB of offsets, against 90 MB dense).

Built once, with torch ops on the weight's device (a sort of the nonzeros). Training changes values,
never the pattern: ``values`` can require grad (``bitmap_linear`` differentiates through it and x),
and :meth:`BitmapWeight.values_from_csr` refreshes it from a CSR of the same pattern in one gather.
"""
from __future__ import annotations

from typing import Optional, Tuple

import torch

from sparsetorch._ops import ops
from sparsetorch.csr import as_csr
from sparsetorch.functional import _activation_name, _records_grad

__all__ = ["BitmapWeight", "bitmap_linear"]

GROUP_ROWS, GROUP_COLS, QUADRANTS = 16, 64, 16
_HALF = (torch.float16, torch.bfloat16)
_FLOATS = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _position(q: torch.Tensor, b: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(row, column) within its group of bit b of quadrant q (bitmap_layout.h, bitmap_position)."""
    s, r, lane, j = q >> 2, q & 3, b >> 1, b & 1
    return (lane >> 2) + 8 * (r & 1), 16 * (lane & 3) + 4 * s + 2 * (r >> 1) + j


def _slot(rr: torch.Tensor, cc: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    """(quadrant, bit) of row rr (0..15), column cc (0..63) of a group: the inverse of _position."""
    t, s, h, j = cc >> 4, (cc >> 2) & 3, (cc >> 1) & 1, cc & 1
    q = 4 * s + (rr >> 3) + 2 * h
    return q, 2 * (4 * (rr & 7) + t) + j


def _encode(rows: torch.Tensor, cols: torch.Tensor, shape: Tuple[int, int]):
    """Bitmaps and offsets of the distinct positions (rows, cols) of an (m, k) weight, and the order
    that packs them: packed value p is position order[p]."""
    m, k = shape
    strips, chunks = _ceil_div(m, GROUP_ROWS), _ceil_div(k, GROUP_COLS)
    device = rows.device
    q, b = _slot(rows % GROUP_ROWS, cols % GROUP_COLS)
    group = (rows // GROUP_ROWS) * chunks + cols // GROUP_COLS
    key = (group * QUADRANTS + q) * 64 + b
    order = torch.argsort(key)
    # 1 << b as int64; bit 63 is the sign bit (written out: a shift into it is not defined behaviour).
    bits = torch.where(b == 63, torch.full_like(b, -2**63), torch.bitwise_left_shift(torch.ones_like(b), b.clamp(max=62)))
    bitmaps = torch.zeros(strips * chunks * QUADRANTS, dtype=torch.int64, device=device)
    bitmaps.index_add_(0, group * QUADRANTS + q, bits)  # distinct bits: the sum is their OR
    offsets = torch.zeros(strips * chunks + 1, dtype=torch.int64, device=device)
    torch.cumsum(torch.bincount(group, minlength=strips * chunks), 0, out=offsets[1:])
    return bitmaps.view(strips, chunks, QUADRANTS), offsets.int(), order


def _decode(bitmaps: torch.Tensor, shape: Tuple[int, int]) -> Tuple[torch.Tensor, torch.Tensor]:
    """(rows, cols) of every packed value, in packed order. O(m * k) work, in slices of strips so that
    the expanded bits stay small."""
    strips, chunks = bitmaps.shape[0], bitmaps.shape[1]
    shifts = torch.arange(64, device=bitmaps.device)
    step = max(1, (1 << 22) // max(1, chunks * QUADRANTS * 64))
    rows, cols = [], []
    for first in range(0, strips, step):
        # >> is arithmetic on int64: bit 63 comes out as -1, & 1 makes it 1.
        bits = ((bitmaps[first:first + step].unsqueeze(-1) >> shifts) & 1).bool()
        strip, chunk, q, b = bits.nonzero(as_tuple=True)  # row-major: packed order
        rr, cc = _position(q, b)
        rows.append((strip + first) * GROUP_ROWS + rr)
        cols.append(chunk * GROUP_COLS + cc)
    if not rows:
        empty = torch.zeros(0, dtype=torch.int64, device=bitmaps.device)
        return empty, empty.clone()
    return torch.cat(rows), torch.cat(cols)


class BitmapWeight:
    """A pruned weight W (out_features, in_features) in bitmap tiles, for :func:`bitmap_linear`.

    Fields: ``bitmaps`` (int64, (ceil(out / 16), ceil(in / 64), 16)), ``offsets`` (int32), ``values``
    (the nonzeros in W's dtype, packed; may require grad), ``shape``, ``dtype``, ``nbytes``. Build with
    :meth:`from_csr` or :meth:`from_dense`; the CUDA kernel takes bfloat16 and float16, the CPU
    (reference) kernel every float dtype.
    """

    def __init__(self, bitmaps: torch.Tensor, offsets: torch.Tensor, values: torch.Tensor, shape, *,
                 _csr_gather: Optional[torch.Tensor] = None, _csr_scatter: Optional[torch.Tensor] = None,
                 _csr_nnz: Optional[int] = None, _backward: Optional[tuple] = None):
        self.bitmaps, self.offsets, self.values = bitmaps, offsets, values
        self.shape = (int(shape[0]), int(shape[1]))
        # How a CSR's values map onto `values`: packed = csr_values[_csr_gather], or, when the CSR
        # repeats positions, a scatter-add of csr_values at _csr_scatter.
        self._csr_gather, self._csr_scatter, self._csr_nnz = _csr_gather, _csr_scatter, _csr_nnz
        self._backward = _backward

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def from_csr(cls, weight, dtype: Optional[torch.dtype] = None, device=None) -> "BitmapWeight":
        """From anything :func:`sparsetorch.as_csr` takes (one unbatched matrix): every stored entry
        is in the pattern (explicit zeros too), repeated positions summed. ``dtype`` converts the
        values (default: the CSR's); ``device`` places a SciPy weight (torch tensors are not moved)."""
        from sparsetorch._validate import validate_csr

        a = as_csr(weight, device=device)
        if a.batched or a.values.dim() != 1:
            raise ValueError(f"weight: expected one unbatched (out_features, in_features) matrix, got shape {a.shape}")
        dtype = a.dtype if dtype is None else dtype
        if dtype not in _FLOATS:
            raise TypeError(f"dtype: expected a float dtype, got {dtype}")
        validate_csr(a)
        m, k = a.shape
        crow = a.crow_indices.long()
        nnz = a.col_indices.numel()
        rows = torch.repeat_interleave(torch.arange(m, device=crow.device), torch.diff(crow), output_size=nnz)
        cols = a.col_indices.long()
        unique, inverse = torch.unique(rows * k + cols, return_inverse=True)  # sorted: positions in row order
        bitmaps, offsets, order = _encode(unique // max(k, 1), unique % max(k, 1), (m, k))
        _check_size(order.numel())
        packed_of_unique = torch.empty_like(order)
        packed_of_unique[order] = torch.arange(order.numel(), device=order.device)
        scatter = packed_of_unique[inverse]  # packed slot of every CSR entry
        if unique.numel() == nnz:
            gather = torch.empty_like(scatter)
            gather[scatter] = torch.arange(nnz, device=scatter.device)
            values = a.values.detach()[gather].to(dtype)
            return cls(bitmaps, offsets, values, (m, k), _csr_gather=gather, _csr_nnz=nnz)
        # Repeated positions summed in float64, rounded once: the same bits whatever the order.
        summed = torch.zeros(unique.numel(), dtype=torch.float64, device=a.device)
        summed.index_add_(0, scatter, a.values.detach().double())
        return cls(bitmaps, offsets, summed.to(dtype), (m, k), _csr_scatter=scatter, _csr_nnz=nnz)

    @classmethod
    def from_dense(cls, weight: torch.Tensor, mask: Optional[torch.Tensor] = None) -> "BitmapWeight":
        """From a dense (out_features, in_features) weight: its nonzeros, or the positions where
        ``mask`` is true (zeros there are kept in the pattern)."""
        if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
            raise ValueError(f"weight: expected a 2-D tensor (out_features, in_features), got "
                             f"{getattr(weight, 'shape', type(weight).__name__)}")
        if weight.dtype not in _FLOATS:
            raise TypeError(f"weight: expected a float dtype, got {weight.dtype}")
        if mask is None:
            mask = weight != 0
        elif not isinstance(mask, torch.Tensor) or mask.shape != weight.shape or mask.dtype != torch.bool:
            raise ValueError(f"mask: expected a bool tensor of shape {tuple(weight.shape)}, got "
                             f"{getattr(mask, 'dtype', type(mask).__name__)} {tuple(getattr(mask, 'shape', ()))}")
        mask = mask.to(weight.device)
        rows, cols = mask.nonzero(as_tuple=True)  # row-major: the CSR order
        bitmaps, offsets, order = _encode(rows, cols, tuple(weight.shape))
        _check_size(order.numel())
        values = weight.detach()[rows[order], cols[order]]
        return cls(bitmaps, offsets, values, tuple(weight.shape), _csr_gather=order, _csr_nnz=order.numel())

    # --- properties --------------------------------------------------------------------------
    @property
    def dtype(self) -> torch.dtype:
        return self.values.dtype

    @property
    def device(self) -> torch.device:
        return self.values.device

    @property
    def nnz(self) -> int:
        return self.values.numel()

    @property
    def nbytes(self) -> int:
        """Bytes the product reads for the weight: bitmaps + offsets + values."""
        return sum(t.numel() * t.element_size() for t in (self.bitmaps, self.offsets, self.values))

    def __repr__(self) -> str:
        density = self.nnz / max(1, self.shape[0] * self.shape[1])
        return (f"BitmapWeight(shape={self.shape}, nnz={self.nnz} ({density:.1%}), dtype={self.dtype}, "
                f"device={self.device}, nbytes={self.nbytes})")

    # --- conversions -------------------------------------------------------------------------
    def to(self, device=None, dtype: Optional[torch.dtype] = None) -> "BitmapWeight":
        """A copy on ``device`` (and with values of ``dtype``); the layout is unchanged."""
        def move(t):
            return None if t is None else t.to(device)
        values = self.values.detach().to(device=device, dtype=dtype)
        backward = None if self._backward is None else tuple(move(t) for t in self._backward)
        return BitmapWeight(move(self.bitmaps), move(self.offsets), values, self.shape,
                            _csr_gather=move(self._csr_gather), _csr_scatter=move(self._csr_scatter),
                            _csr_nnz=self._csr_nnz, _backward=backward)

    def to_dense(self) -> torch.Tensor:
        """The dense (out_features, in_features) weight."""
        rows, cols = _decode(self.bitmaps, self.shape)
        out = torch.zeros(self.shape, dtype=self.dtype, device=self.device)
        out[rows, cols] = self.values.detach()
        return out

    def values_from_csr(self, csr_values: torch.Tensor) -> None:
        """Refresh ``values`` in place from the values of the CSR this weight was built from (same
        pattern and entry order): one gather (a scatter-add in float64 when the CSR repeats positions)."""
        if self._csr_nnz is None:
            raise ValueError("values_from_csr: this BitmapWeight was not built from a CSR or dense weight")
        if not isinstance(csr_values, torch.Tensor) or csr_values.shape != (self._csr_nnz,):
            raise ValueError(f"csr_values: expected shape ({self._csr_nnz},), got "
                             f"{tuple(getattr(csr_values, 'shape', ()))}")
        with torch.no_grad():
            src = csr_values.to(device=self.device, dtype=self.dtype)
            if self._csr_gather is not None:
                self.values.copy_(src[self._csr_gather])
            else:
                summed = torch.zeros(self.values.shape, dtype=torch.float64, device=self.device)
                self.values.copy_(summed.index_add_(0, self._csr_scatter, csr_values.to(self.device).double()))

    # --- autograd ----------------------------------------------------------------------------
    def prepare_backward(self) -> tuple:
        """Builds (once) what the backward of :func:`bitmap_linear` needs: W^T in this layout with the
        index of its values in ``values`` (grad x), and W's CSR pattern with the CSR slot of each value
        (grad values, an SDDMM). Called by bitmap_linear when autograd records; call it before
        ``torch.compile`` so that the traced graph finds it built."""
        if self._backward is None:
            m, k = self.shape
            rows, cols = _decode(self.bitmaps, self.shape)
            t_bitmaps, t_offsets, t_order = _encode(cols, rows, (k, m))
            perm = torch.argsort(rows * k + cols)  # CSR slot e holds packed value perm[e]
            csr_index = torch.empty_like(perm)
            csr_index[perm] = torch.arange(perm.numel(), device=perm.device)
            crow = torch.zeros(m + 1, dtype=torch.int64, device=rows.device)
            torch.cumsum(torch.bincount(rows, minlength=m), 0, out=crow[1:])
            self._backward = (t_bitmaps, t_offsets, t_order.int(), crow.int(), cols[perm].int(), csr_index.int())
        return self._backward


def _check_size(nnz: int) -> None:
    if nnz >= 2**31:
        raise ValueError(f"weight: {nnz} nonzeros; the bitmap layout's int32 offsets take at most 2^31 - 1")


def bitmap_linear(x: torch.Tensor, weight: BitmapWeight, bias: Optional[torch.Tensor] = None,
                  activation: Optional[str] = None, negative_slope: float = 0.01) -> torch.Tensor:
    """``act(x @ W.T + bias)`` for x (..., in_features) and W a :class:`BitmapWeight`: on CUDA the
    tensor-core kernel (bfloat16/float16, fp32 accumulation, bias and activation fused), on the CPU the
    reference kernel. Differentiable in x, ``weight.values`` and bias."""
    if not isinstance(weight, BitmapWeight):
        raise TypeError(f"weight: expected a BitmapWeight, got {type(weight).__name__}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() < 1 or x.shape[-1] != weight.shape[1]:
        raise ValueError(f"x: expected shape (..., {weight.shape[1]}) for a weight of shape {weight.shape}, "
                         f"got {tuple(x.shape)}")
    act = _activation_name(activation)
    slope = float(negative_slope)
    w = weight
    if _records_grad(x, w.values, bias):
        extra = w.prepare_backward()
        if act != "none":
            z = ops.bitmap_linear(x, w.bitmaps, w.offsets, w.values, w.shape[0], bias, "none", slope, *extra)
            return ops.activation(z, act, slope)
        return ops.bitmap_linear(x, w.bitmaps, w.offsets, w.values, w.shape[0], bias, act, slope, *extra)
    return ops.bitmap_linear(x, w.bitmaps, w.offsets, w.values, w.shape[0], bias, act, slope)


# --- fake kernel and autograd of the op ----------------------------------------------------------

@torch.library.register_fake("sparsetorch::bitmap_linear")
def _bitmap_linear_fake(x, bitmaps, offsets, values, out_features, bias=None, activation="none",
                        negative_slope=0.01, t_bitmaps=None, t_offsets=None, t_index=None, csr_crow=None,
                        csr_col=None, csr_index=None):
    torch._check(values.dtype == x.dtype, lambda: "x and values must have the same dtype")
    return x.new_empty((*x.shape[:-1], out_features))


def _setup(ctx, inputs, output):
    x, bitmaps, offsets, values, out_features, bias, activation, slope, *extra = inputs
    extra = list(extra) + [None] * (6 - len(extra))
    ctx.save_for_backward(x, bitmaps, offsets, values, bias, *extra)
    ctx.out_features, ctx.activation, ctx.slope = out_features, activation, slope


def _needs(ctx, i: int) -> bool:
    return i < len(ctx.needs_input_grad) and ctx.needs_input_grad[i]


def _backward(ctx, grad):
    x, bitmaps, offsets, values, bias, t_bitmaps, t_offsets, t_index, crow, col, csr_index = ctx.saved_tensors
    m, k = ctx.out_features, x.shape[-1]
    gz = grad.reshape(-1, m)
    x2 = x.reshape(-1, k)
    if ctx.activation != "none":
        z = ops.bitmap_linear(x2, bitmaps, offsets, values, m, bias, "none", ctx.slope)
        gz, _, _ = ops.bias_act_backward(gz.contiguous(), z, None, None, ctx.activation, ctx.slope,
                                         [True, False, False])
    g_x = g_values = g_bias = None
    if _needs(ctx, 0):
        if t_bitmaps is None:
            raise RuntimeError("bitmap_linear: grad of x needs the transposed layout; call through "
                               "sparsetorch.bitmap_linear (or pass BitmapWeight.prepare_backward())")
        g_x = ops.bitmap_linear(gz, t_bitmaps, t_offsets, values[t_index.long()], k).reshape(x.shape)
    if _needs(ctx, 3):
        if crow is None:
            raise RuntimeError("bitmap_linear: grad of values needs the CSR pattern; call through "
                               "sparsetorch.bitmap_linear (or pass BitmapWeight.prepare_backward())")
        sampled = ops.sddmm(crow, col, gz.t().contiguous(), x2.t().contiguous(), 1.0, "auto")
        g_values = sampled[csr_index.long()]
    if bias is not None and _needs(ctx, 5):
        g_bias = gz.sum(0)
    return g_x, None, None, g_values, None, g_bias, None, None, None, None, None, None, None, None


torch.library.register_autograd("sparsetorch::bitmap_linear", _backward, setup_context=_setup)
