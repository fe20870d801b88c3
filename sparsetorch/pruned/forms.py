"""The forms a pruned weight W (out_features, in_features) can be multiplied in, behind one interface: the
one place that knows each format's API (SparseLinear, sparsetorch/nn/linear.py, chooses among them).

Every form ``f`` has ``f.name``, ``f.nbytes`` (what it holds), ``f(x, bias, activation, negative_slope)``
(``act(x @ W.T + bias)`` for x (N, in), recording no gradient), ``f.tensors()`` (what it holds, by name:
its state in a compact layer's state_dict) and ``f.to_dense()`` (W, for a transient expansion). Forms
built from a CSR also take ``f.set_values(values)`` (new CSR values, same pattern: the layer trained)
where ``f.refreshable``; the layouts that need maps from the CSR's order for that (slots: 8 bytes per
entry, bitmap: 8, 2:4 decode: its 2:4 split) are built without them unless asked (``keep_maps``), and a
layer that trains builds them again with their maps. A 2:4 pruning's own CSR (the pair layout) needs no map:
its decode form repacks new values with the CSR's columns.

Which forms apply (``applicable``) depends on the weight (dtype, shape, pattern) and on what the loaded
build can run on the device (tensor-core forms need mma: sm_80 code, see sparsetorch._build_info).
"""
from __future__ import annotations

from typing import Dict, Optional, Tuple

import torch
import torch.nn.functional as F_torch

from sparsetorch import _build_info
from sparsetorch._autograd import spmm_call, without_autograd
from sparsetorch._ops import ops
from sparsetorch.csr import CSR
from sparsetorch.pruned import csr16 as _csr16
from sparsetorch.pruned import slots as _slots
from sparsetorch.pruned.bitmap import BitmapWeight
from sparsetorch.pruned.sparse24 import MAX_RESIDUAL_DENSITY, Sparse24Split, Sparse24Weight, sparse24_applies
from sparsetorch.pruned.sparse24_decode import (Sparse24DecodeWeight, decode_applies, dense_from_pairs,
                                               expand_sparse24_decode, is_pair_layout, nibbles_of_pairs)

__all__ = ["FORM_NAMES", "COMPACT_FORMS", "CsrForm", "DenseForm", "Sparse24Form", "Sparse24DecodeForm", "BitmapForm",
           "SlotsForm", "Csr16Form", "Pattern", "applicable", "build", "from_tensors",
           "residual_24", "MAX_TOKENS"]

FORM_NAMES = ("csr", "dense", "2:4", "2:4 decode", "bitmap", "slots", "csr16")
# Forms that can be a compact layer's one stored form (each also expands to dense for large token counts).
COMPACT_FORMS = ("2:4 decode", "slots", "csr")
_HALF = (torch.bfloat16, torch.float16)


def residual_24(crow: torch.Tensor, col: torch.Tensor, shape: Tuple[int, int]) -> int:
    """Stored entries beyond 2 per group of 4 consecutive columns of a row (0: a 2:4 pattern), counted as
    Sparse24Split splits: one device-to-host read. Where the columns do not decrease within a row (every
    from_dense layer), a group's entries are adjacent, so an entry is beyond 2 when the entry two back is in
    its group: one pass, no histogram (a bincount over every group took 1-2 ms of a 14336 x 4096 layer's
    first call on an H100); otherwise a bincount."""
    m, k = int(shape[0]), int(shape[1])
    nnz = col.numel()
    if nnz < 3:
        return 0  # no group can hold more than 2
    groups_per_row = -(-k // 4)
    index = torch.int32 if m * groups_per_row < 2**31 else torch.int64
    rows = torch.repeat_interleave(torch.arange(m, device=col.device, dtype=index), crow.long().diff(),
                                   output_size=nnz)
    group = rows * groups_per_row + (col // 4).to(index)
    ordered, beyond = torch.stack([(group[1:] >= group[:-1]).all().long(), (group[2:] == group[:-2]).sum()]).tolist()
    if ordered:
        return int(beyond)
    counts = torch.bincount(group, minlength=m * groups_per_row)
    return int((counts - 2).clamp_(min=0).sum())


class Pattern:
    """What the choice of form reads of a weight's pattern, computed once per pattern: shape, dtype,
    device, stored entries, density, and (half types) how far it is from 2:4: the entries beyond 2 per
    group of 4 consecutive columns (one pass and one device-to-host read). The 2:4 split (a sort) is made
    when a 2:4 form is first built."""

    def __init__(self, crow: torch.Tensor, col: torch.Tensor, shape: Tuple[int, int], dtype: torch.dtype,
                 device: torch.device, residual24: Optional[int] = None, pairs: Optional[bool] = None):
        # residual24, pairs: given where the pattern is known (a 2:4 pruning made it), else counted / checked
        self.shape = (int(shape[0]), int(shape[1]))
        self.dtype, self.device = dtype, torch.device(device)
        self.nnz = int(col.numel())
        self.density = self.nnz / max(1, self.shape[0] * self.shape[1])
        self._crow, self._col = crow, col
        self._split: Optional[Sparse24Split] = None
        self.applicable_forms: Optional[Dict[str, str]] = None  # applicable()'s answer for the weight, once
        if dtype not in _HALF:
            self.residual24: Optional[int] = None
        else:
            self.residual24 = residual_24(crow, col, self.shape) if residual24 is None else int(residual24)
        self._pairs: Optional[bool] = None if pairs is None else bool(pairs) and self.is_24

    @property
    def split(self) -> Sparse24Split:
        if self._split is None:
            self._split = Sparse24Split(self._crow, self._col, self.shape)
        return self._split

    @property
    def pairs(self) -> bool:
        """A 2:4 pattern stored as a 2:4 pruning stores it: two entries per group of 4, in column order
        (sparse24_decode.is_pair_layout; checked once per pattern)."""
        if self._pairs is None:
            self._pairs = self.is_24 and is_pair_layout(self._crow, self._col, self.shape)
        return self._pairs

    @property
    def is_24(self) -> bool:
        """A pure 2:4 pattern (no entry beyond 2 per group of 4)."""
        return self.residual24 == 0

    def kind(self) -> str:
        return "2:4" if self.is_24 else "unstructured"


def applicable(p: Pattern, tokens: Optional[int] = None) -> Dict[str, str]:
    """Every form's name -> None when it applies to this weight (and to ``tokens`` rows of x when given),
    else why not. The weight's part is worked out once per pattern (every undecided call asks)."""
    if p.applicable_forms is None:
        p.applicable_forms = _applicable_to_weight(p)
    out = dict(p.applicable_forms)
    if tokens is not None:
        for name, limit in MAX_TOKENS.items():
            if out.get(name) is None and tokens > limit:
                out[name] = f"{tokens} tokens: past {limit} the kernel reads the weight again per tile"
    return out


def _applicable_to_weight(p: Pattern) -> Dict[str, str]:
    half, cuda = p.dtype in _HALF, p.device.type == "cuda"
    features = _build_info.loaded_cuda_features(p.device) if cuda else {}  # asked once per device
    mma = features.get("mma", not cuda)
    out = {"csr": None, "dense": None}
    reason24 = sparse24_applies(p.shape, p.dtype, p.device)
    if reason24 is None and p.residual24 is not None and p.residual24 > MAX_RESIDUAL_DENSITY * p.shape[0] * p.shape[1]:
        reason24 = f"{p.residual24} entries beyond 2 per group of 4 (more than {MAX_RESIDUAL_DENSITY:.1%} of positions)"
    out["2:4"] = reason24
    reason = decode_applies(p.shape, p.dtype)
    if reason is None and not p.is_24:
        reason = "the pattern is not 2:4 (the decode form holds no residual)"
    if reason is None and cuda and not features.get("mma_sp", False):
        reason = "this build's kernels for the GPU have no mma.sp (needs sm_80 code)"
    out["2:4 decode"] = reason
    need_mma = None if mma else "this build's kernels for the GPU have no tensor-core mma (needs sm_80 code)"
    out["bitmap"] = (None if half else f"dtype {p.dtype}: the bitmap kernel takes bfloat16/float16") or need_mma
    out["slots"] = _slots.applies(p.shape, p.dtype, p.nnz) or need_mma
    out["csr16"] = _csr16.applies(p.shape, p.dtype, p.nnz)
    return out


# Token counts past which a form is never a candidate: its kernel reads the weight again for every tile of
# tokens (CSR16: 8 tokens per pass; slots and bitmap: 64 per tile; 2:4 decode: 16 per mma tile, up to 64).
MAX_TOKENS = {"csr16": 64, "slots": 512, "bitmap": 512, "2:4 decode": 64}


# --- the forms ---------------------------------------------------------------------------------------

class CsrForm:
    """The CSR itself, through st.spmm's routes (its own route tuner picks among them)."""

    name = "csr"
    refreshable = True

    def __init__(self, crow, col, values, shape, backend: str = "auto"):
        self.crow, self.col, self.values, self.shape, self.backend = crow, col, values, tuple(shape), backend

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.crow, self.col, self.values))

    def set_values(self, values):
        self.values = values

    def tensors(self):
        return {"crow_indices": self.crow, "col_indices": self.col, "values": self.values}

    def to_dense(self):
        return CSR(self.crow, self.col, self.values.detach(), self.shape).to_dense()

    def __call__(self, x, bias=None, activation="none", negative_slope=0.01):
        y_t = spmm_call(self.crow, self.col, self.values.detach(), x.t(), 1.0, None, 0.0, None, "none", 0.01,
                        self.backend)
        if bias is not None or activation != "none":
            return without_autograd(ops.bias_act.default, y_t.t(), None, bias, activation, float(negative_slope))
        return y_t.t().contiguous()


class DenseForm:
    """The dense weight (cuBLAS through torch's linear; cuBLASLt's fused epilogue for an activation)."""

    name = "dense"
    refreshable = True

    def __init__(self, weight: torch.Tensor):
        self.weight = weight

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size()

    def tensors(self):
        return {"weight": self.weight}

    def to_dense(self):
        return self.weight

    def __call__(self, x, bias=None, activation="none", negative_slope=0.01):
        if activation == "none":
            return F_torch.linear(x, self.weight, bias)
        return without_autograd(ops.linear.default, x, self.weight, bias, activation, float(negative_slope))


class _WeightForm:
    """A form that wraps one pruned-weight object (``weight``) with ``nbytes`` and ``set_values`` of its own."""

    refreshable = True

    def __init__(self, weight):
        self.weight = weight

    @property
    def nbytes(self) -> int:
        return int(self.weight.nbytes)

    def set_values(self, values):
        self.weight.set_values(values)


class Sparse24Form(_WeightForm):
    """The 2:4 part on cuSPARSELt plus a CSR residual (any pattern close to 2:4); ``alg`` per token-count
    bucket is cuSPARSELt's searched algorithm (-1: its default)."""

    name = "2:4"

    def __init__(self, split: Optional[Sparse24Split], values: Optional[torch.Tensor], *,
                 w24: Optional[torch.Tensor] = None):
        # w24: a weight the pattern's statistics show to be 2:4 (Pattern.is_24): not checked again
        super().__init__(Sparse24Weight(split, values.detach()) if w24 is None else
                         Sparse24Weight(None, None, w24=w24.detach()))

    @property
    def refreshable(self) -> bool:
        return self.weight.split is not None

    def tensors(self):
        return {k: v for k, v in (("compressed", self.weight.compressed), ("dense", self.weight.dense),
                                  ("residual_values", self.weight.res_values)) if v is not None}

    def to_dense(self):
        raise NotImplementedError("the 2:4 form's compressed layout is cuSPARSELt's own")

    def __call__(self, x, bias=None, activation="none", negative_slope=0.01, alg: int = -1):
        w = self.weight
        crow, col, vals = w._residual()
        if w.compressed is None:  # the CPU reference
            return w(x, bias, activation, negative_slope, None)
        w.count_plan(x, bias, int(alg))
        return without_autograd(ops.sparse24_linear.default, x, w.compressed, w.shape[0], crow, col, vals, bias,
                                activation, float(negative_slope), int(alg))

    def search(self, x, bias) -> int:
        """cuSPARSELt's fastest algorithm for this x (it times them all: tens of calls)."""
        return -1 if self.weight.compressed is None else self.weight.search(x, bias)


class Sparse24DecodeForm(_WeightForm):
    """A pure 2:4 weight in the mma.sp decode kernel's layout (1.125 bytes per position in bf16)."""

    name = "2:4 decode"

    @classmethod
    def from_csr(cls, split: Sparse24Split, values: torch.Tensor) -> "Sparse24DecodeForm":
        return cls(Sparse24DecodeWeight.from_split(split, values.detach()))

    @property
    def refreshable(self) -> bool:
        return self.weight.split is not None or self.weight.pair_col is not None

    def tensors(self):
        return {"values": self.weight.values, "meta": self.weight.meta}

    def compact(self) -> None:
        self.weight.split = self.weight.pair_col = None  # the CSR order is gone with the CSR: no set_values after

    def to_dense(self):
        return expand_sparse24_decode(self.weight.values, self.weight.meta, self.weight.shape)

    def __call__(self, x, bias=None, activation="none", negative_slope=0.01):
        w = self.weight
        return without_autograd(ops.sparse24_decode_linear.default, x, w.values, w.meta, w.shape[0], w.shape[1], bias,
                                activation, float(negative_slope))


class BitmapForm:
    name = "bitmap"

    def __init__(self, csr: CSR, keep_maps: bool = True):
        self.weight = BitmapWeight.from_csr(csr)
        if not keep_maps:
            self.weight._csr_gather = self.weight._csr_scatter = None

    @property
    def nbytes(self) -> int:
        w = self.weight
        maps = [t for t in (w._csr_gather, w._csr_scatter) if t is not None]
        return int(w.nbytes) + sum(t.numel() * t.element_size() for t in maps)

    @property
    def refreshable(self) -> bool:
        return self.weight._csr_gather is not None or self.weight._csr_scatter is not None

    def set_values(self, values):
        self.weight.values_from_csr(values.detach())

    def tensors(self):
        return {"bitmaps": self.weight.bitmaps, "offsets": self.weight.offsets, "values": self.weight.values}

    def to_dense(self):
        return self.weight.to_dense()

    def __call__(self, x, bias=None, activation="none", negative_slope=0.01):
        w = self.weight
        return without_autograd(ops.bitmap_linear.default, x, w.bitmaps, w.offsets, w.values, w.shape[0], bias,
                                activation, float(negative_slope))


class SlotsForm(_WeightForm):
    name = "slots"

    @classmethod
    def from_csr(cls, crow, col, values, shape, keep_maps: bool = True) -> "SlotsForm":
        form = cls(_slots.SlotWeight(crow, col, values.detach(), shape))
        if not keep_maps:
            form.compact()
        return form

    @property
    def refreshable(self) -> bool:
        return self.weight._into is not None

    def tensors(self):
        return {"offsets": self.weight.offsets, "entries": self.weight.entries}

    def compact(self) -> None:
        self.weight.drop_refresh_maps()

    def to_dense(self):
        return self.weight.to_dense()

    def __call__(self, x, bias=None, activation="none", negative_slope=0.01):
        w = self.weight
        return without_autograd(ops.slot_linear.default, x, w.offsets, w.entries, w.shape[0], bias, activation,
                                float(negative_slope), w.banded)


class Csr16Form(_WeightForm):
    name = "csr16"

    def __init__(self, crow, col, values, shape):
        super().__init__(_csr16.Csr16Weight(crow, col, values.detach(), shape))
        self._shared_crow = crow

    @property
    def nbytes(self) -> int:
        w = self.weight
        shared = w.crow.data_ptr() == self._shared_crow.data_ptr()  # int32 row pointers shared with the CSR
        return w.nbytes - (w.crow.numel() * 4 if shared else 0)


    def tensors(self):
        return {"crow": self.weight.crow, "entries": self.weight.entries}

    def to_dense(self):
        return self.weight.to_dense()

    def __call__(self, x, bias=None, activation="none", negative_slope=0.01):
        w = self.weight
        return without_autograd(ops.csr16_linear.default, x, w.crow, w.entries, bias, activation, float(negative_slope))


def build(name: str, pattern: Pattern, crow, col, values, backend: str = "auto", keep_maps: bool = True,
          dense_weight: Optional[torch.Tensor] = None):
    """The form ``name`` of the CSR weight (crow, col, values); ValueError/RuntimeError when it cannot apply.
    ``keep_maps=False``: without the maps from the CSR's order (module docstring): less memory and, for a 2:4
    weight's decode layout, no split (a sort) to build. ``dense_weight``: the weight expanded already (a held
    dense form), used instead of expanding the CSR again (a scatter of every entry)."""
    shape = pattern.shape
    # A 2:4 pruning's own CSR (two entries per group of 4, in order): its values are the decode layout's kept
    # values as stored (no expansion of the CSR to build it) and, off CUDA, where no kernel expands a CSR in
    # one pass (csr.to_dense), its dense weight is two selects instead of a scatter of every entry.
    selects = (dense_weight is None and not values.is_cuda and (name == "dense" or (not keep_maps and name == "2:4"))
               and pattern.pairs)

    def dense():
        if dense_weight is not None:
            return dense_weight
        if selects:
            return dense_from_pairs(values, nibbles_of_pairs(col, shape), shape)
        return CSR(crow, col, values.detach(), shape).to_dense()

    with torch.no_grad():
        if name == "csr":
            return CsrForm(crow, col, values, shape, backend)
        if name == "dense":
            return DenseForm(dense())
        # Without maps, a 2:4 pattern is its own 2:4 part: both 2:4 forms are made from the dense weight,
        # with no split (a sort of every entry).
        if name == "2:4":
            if not keep_maps and pattern.is_24:
                return Sparse24Form(None, None, w24=dense())
            return Sparse24Form(pattern.split, values)
        if name == "2:4 decode":
            if pattern.pairs and decode_applies(shape, values.dtype) is None:  # refreshed by repacking its pairs
                return Sparse24DecodeForm(Sparse24DecodeWeight.from_pairs(values, col, shape))
            if not keep_maps and pattern.is_24:
                return Sparse24DecodeForm(Sparse24DecodeWeight(dense()))
            return Sparse24DecodeForm.from_csr(pattern.split, values)
        if name == "bitmap":
            return BitmapForm(CSR(crow, col, values.detach(), shape), keep_maps)
        if name == "slots":
            return SlotsForm.from_csr(crow, col, values, shape, keep_maps)
        if name == "csr16":
            return Csr16Form(crow, col, values, shape)
    raise ValueError(f"format: unknown form {name!r}; expected one of {', '.join(FORM_NAMES)}")


def from_tensors(name: str, tensors: Dict[str, torch.Tensor], shape: Tuple[int, int], dtype, backend="auto",
                 banded: bool = False):
    """A compact layer's stored form rebuilt from its state_dict tensors (checked: a corrupt layout
    raises ValueError naming the tensor, before any kernel reads it). ``banded``: the slot layout's variant."""
    m, k = int(shape[0]), int(shape[1])
    if name == "2:4 decode":
        values, meta = tensors["values"], tensors["meta"]
        return Sparse24DecodeForm(Sparse24DecodeWeight.from_packed(values, meta, (m, k)))
    if name == "slots":
        return SlotsForm(_slots.SlotWeight.from_packed(tensors["offsets"], tensors["entries"], (m, k), dtype, banded))
    if name == "csr":
        crow, col, values = tensors["crow_indices"], tensors["col_indices"], tensors["values"]
        from sparsetorch._validate import validate_csr

        validate_csr(CSR(crow, col, values, (m, k)))
        return CsrForm(crow, col, values, (m, k), backend)
    raise ValueError(f"format: {name!r} is not a compact form (expected one of {', '.join(COMPACT_FORMS)})")
