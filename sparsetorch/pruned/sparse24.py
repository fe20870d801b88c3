"""2:4 semi-structured sparsity: pruning to 2:4, and a CSR weight split into a 2:4 part plus a CSR residual,
multiplied on 2:4 sparse tensor cores through cuSPARSELt (csrc/cuda/cusparselt_linear.cu).

Any CSR weight W (out x in) is W24 + Wres exactly: within each group of 4 consecutive columns of a row, the
first two stored entries (by column, then by storage order) go to W24, the others to the residual Wres. The
split depends on the pattern only, so training (new values every step) re-gathers values but never re-splits.
A weight pruned to 2:4 has no residual; an unstructured one at 90% sparsity has ~0.1% of its positions in the
residual (groups holding 3 or 4 entries are rare), which a small kernel multiplies and cuSPARSELt adds in its
epilogue. On the CPU the same split runs as a dense reference (W24 expanded, the residual through the SpMM).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Optional

import torch

from sparsetorch import _build_info
from sparsetorch._cache import register_clear
from sparsetorch._ops import ops
from sparsetorch._transpose import row_indices

__all__ = ["available", "check_2to4", "prune_2to4_mask", "Sparse24Split", "Sparse24Weight", "sparse24_applies"]

# cuSPARSELt's minimum for the structured operand's dimensions (16-bit types).
DIM_MULTIPLE = 16
# SparseLinear times the 2:4 form only while the residual holds at most this fraction of the positions
# (uniformly pruned weights: 9.4% spill over at 50% sparsity, 2.3% at 70%, 0.094% at 90%, 0.047% at 95%).
# H100, bf16, N = 2048 (`python -m benchmarks --suites pruned`, 2026-11-24): the 2:4 form took 1.34 ms at 70%
# on 4096 x 4096 (dense 0.09 ms), 0.17 ms at 90% and 0.14 ms at 95% (a pure 2:4 weight: 0.068 ms).
MAX_RESIDUAL_DENSITY = 0.005


# cuSPARSELt makes a plan per token count padded to this (csrc/cuda/cusparselt_linear.cu, kPadN), and keeps
# at most PLAN_CACHE_ENTRIES of them (kMaxPlans).
PLAN_PAD_TOKENS = 8
PLAN_CACHE_ENTRIES = 256


class PlanSightings:
    """How often each cuSPARSELt plan has been asked for in this process, keyed as the native plan cache is
    (device, dtype, out and in features, the padded token count, a residual, the bias's address, the
    algorithm code), bounded as it is. SparseLinear reads it to run a token count's first 2:4 call on its
    dense form instead of making a plan (see SparseLinear's module docstring). Listed in st.clear_caches,
    which empties the native plans too."""

    def __init__(self, max_entries: int = PLAN_CACHE_ENTRIES):
        self.max_entries = int(max_entries)
        self._counts: "OrderedDict[tuple, int]" = OrderedDict()
        self._lock = threading.Lock()

    @staticmethod
    def key(x: torch.Tensor, shape, residual: bool, bias: Optional[torch.Tensor], alg: int) -> tuple:
        # a bias not 16-byte aligned is copied for every call (a new address each time): keyed as one
        address = 0 if bias is None else bias.data_ptr() if bias.data_ptr() % 16 == 0 else -1
        n_pad = -(-max(int(x.shape[0]), 1) // PLAN_PAD_TOKENS) * PLAN_PAD_TOKENS
        return (x.device.index, x.dtype, int(shape[0]), int(shape[1]), n_pad, bool(residual), address, int(alg))

    def seen(self, key: tuple) -> int:
        """How many requests for ``key``'s plan were counted."""
        return self._counts.get(key, 0)

    def sight(self, key: tuple) -> int:
        """Count one more request for ``key``'s plan; returns how many there have been (1: the first)."""
        with self._lock:
            count = self._counts.pop(key, 0) + 1
            self._counts[key] = count
            while len(self._counts) > self.max_entries:
                self._counts.popitem(last=False)
            return count

    def clear(self) -> None:
        with self._lock:
            self._counts.clear()

    def __len__(self) -> int:
        return len(self._counts)


PLANS = PlanSightings()
register_clear("cusparselt_plan_sightings", PLANS.clear, PLANS.__len__)


def available() -> bool:
    """True when this build has cuSPARSELt (the 2:4 ops run on CUDA) and a GPU is present."""
    return ops.cusparselt_version() > 0 and torch.cuda.is_available()


def prune_2to4_mask(weight: torch.Tensor) -> torch.Tensor:
    """The mask keeping the 2 largest |w| of every group of 4 consecutive entries along the last dimension
    (a trailing group of fewer than 4 keeps its 2 largest); ties go to the lower position."""
    if weight.dim() != 2:
        raise ValueError(f"weight: expected a 2-D (out_features, in_features) tensor, got shape {tuple(weight.shape)}")
    out_f, in_f = weight.shape
    groups = -(-in_f // 4)
    # float64 scores stay float64 (a rounding to float32 could tie or reorder them)
    dtype = torch.float64 if weight.dtype == torch.float64 else torch.float32
    magnitude = torch.full((out_f, groups * 4), -1.0, dtype=dtype, device=weight.device)
    magnitude[:, :in_f] = weight.detach().abs().to(dtype)
    magnitude = torch.nan_to_num(magnitude, nan=float("inf"))  # a NaN weight is kept, not silently dropped
    order = torch.argsort(magnitude.view(out_f, groups, 4), dim=-1, descending=True, stable=True)
    mask = torch.zeros(out_f, groups, 4, dtype=torch.bool, device=weight.device)
    mask.scatter_(-1, order[..., :2], True)
    return mask.view(out_f, groups * 4)[:, :in_f].clone()


def check_2to4(weight: torch.Tensor, name: str = "weight") -> None:
    """ValueError naming ``name`` and the first group of 4 consecutive columns of a row that holds more than 2
    nonzeros (NaN counts as nonzero; a trailing group of fewer than 4 columns counts too). One host sync."""
    m, k = weight.shape
    counts = (torch.nn.functional.pad(weight.detach(), (0, -k % 4)).reshape(m, -1, 4) != 0).sum(-1)
    over = counts > 2
    if weight.numel() and bool(over.any()):
        r, g = (int(i) for i in over.nonzero()[0])
        raise ValueError(f"{name}: not 2:4 sparse: row {r}, columns {4 * g}..{4 * g + 3} hold {int(counts[r, g])} "
                         "nonzeros (at most 2 of every 4 consecutive columns; prune_2to4_mask keeps 2)")


def sparse24_applies(shape, dtype: torch.dtype, device: torch.device) -> Optional[str]:
    """None when a weight of this shape/dtype/device can run on cuSPARSELt, else the reason it cannot."""
    if device.type != "cuda":
        return "the 2:4 tensor-core path is CUDA-only (the CPU runs a dense reference)"
    if dtype not in (torch.float16, torch.bfloat16):
        return f"2:4 tensor cores take float16/bfloat16 here, not {dtype}"
    out_f, in_f = shape
    if out_f % DIM_MULTIPLE or in_f % DIM_MULTIPLE or out_f == 0 or in_f == 0:
        return f"cuSPARSELt needs out_features and in_features multiples of {DIM_MULTIPLE}, got {out_f} x {in_f}"
    if ops.cusparselt_version() == 0:
        return ("this build of sparsetorch has no cuSPARSELt (install the nvidia-cusparselt package matching "
                "your CUDA and rebuild)")
    if torch.cuda.is_available() and not _build_info.loaded_cuda_features(device)["cusparselt"]:
        return "cuSPARSELt cannot run on this GPU with this build (it needs sm_80 or newer)"
    return None


class Sparse24Split:
    """Which stored entries of a CSR weight (out x in) form its 2:4 part and which its residual.

    Kept per pattern: ``in24`` (a bool per slot; None when every slot is in the 2:4 part, as for a weight
    pruned to 2:4), the residual's slots in CSR order (``slots_res``) and its pattern ``res_crow`` /
    ``res_col`` (int32 when it fits). The flat positions of the 2:4 entries are recomputed from the pattern
    when values change, so the split holds about a byte per entry. Entries with a column outside [0, in)
    are dropped (the SpMM kernels skip them too).
    """

    def __init__(self, crow: torch.Tensor, col: torch.Tensor, shape):
        out_f, in_f = int(shape[0]), int(shape[1])
        self.crow, self.col, self.shape = crow, col, (out_f, in_f)
        rows, cols, valid = self._entries()
        slots = torch.arange(col.shape[-1], device=col.device)
        position = rows * in_f + cols
        # Stable sort by position (invalid slots last): a group's entries become adjacent, repeated
        # positions keep their storage order.
        position = torch.where(valid, position, torch.full_like(position, out_f * in_f))
        if bool((position[1:] >= position[:-1]).all()):  # a CSR with sorted columns: in order already
            order = slots
        else:
            position, order = torch.sort(position, stable=True)
        group = torch.div(position, in_f, rounding_mode="floor") * (-(-in_f // 4)) + torch.div(
            position % max(in_f, 1), 4, rounding_mode="floor")
        starts = torch.ones_like(group, dtype=torch.bool)
        starts[1:] = group[1:] != group[:-1]
        index = torch.arange(group.numel(), device=group.device)
        first = torch.cummax(torch.where(starts, index, torch.zeros_like(index)), 0).values
        keep = ((index - first) < 2) & valid[order]
        in24 = torch.zeros_like(valid)
        in24[order] = keep
        res = ~keep & valid[order]
        self.slots_res = slots[order][res]  # sorted by position: CSR order
        self.in24 = None if bool(in24.all()) else in24
        res_rows = torch.div(position[res], in_f, rounding_mode="floor")
        counts = torch.bincount(res_rows, minlength=out_f)
        index_dtype = torch.int32 if max(out_f, in_f, int(self.slots_res.numel())) < 2**31 - 1 else torch.int64
        res_crow = torch.zeros(out_f + 1, dtype=torch.int64, device=col.device)
        torch.cumsum(counts, 0, out=res_crow[1:])
        self.res_crow, self.res_col = res_crow.to(index_dtype), (position[res] % in_f).to(index_dtype)

    def _entries(self):
        """Every slot's row and column (int64) and whether it holds an entry."""
        rows, valid = row_indices(self.crow, self.col.shape[-1])
        cols = self.col.long()
        return rows[0], cols, valid[0] & (cols >= 0) & (cols < self.shape[1])

    @property
    def residual_nnz(self) -> int:
        return int(self.slots_res.numel())

    @property
    def nbytes(self) -> int:
        held = [self.in24, self.slots_res, self.res_crow, self.res_col]
        return sum(t.numel() * t.element_size() for t in held if t is not None)

    def dense24(self, values: torch.Tensor) -> torch.Tensor:
        """W24 as a dense (out x in) matrix for these values (repeated positions summed)."""
        out_f, in_f = self.shape
        rows, cols, valid = self._entries()
        take = valid if self.in24 is None else self.in24
        dense = torch.zeros(out_f * in_f, dtype=values.dtype, device=values.device)
        dense.index_add_(0, (rows * in_f + cols)[take], values[take])
        return dense.view(out_f, in_f)

    def residual_values(self, values: torch.Tensor) -> torch.Tensor:
        return values[self.slots_res]


class Sparse24Weight:
    """A CSR weight as W24 (compressed by cuSPARSELt on CUDA, dense on the CPU) + a CSR residual.

    Built once per pattern; :meth:`set_values` re-derives the value-dependent parts (one expansion and one
    compression) when the layer's values change. Calls compute ``act(x @ W^T + bias)`` for x (N, in).
    """

    def __init__(self, split: Optional[Sparse24Split], values: Optional[torch.Tensor], *,
                 w24: Optional[torch.Tensor] = None):
        self.split = split
        source = values if w24 is None else w24
        self.shape = split.shape if split is not None else (int(w24.shape[0]), int(w24.shape[1]))
        self.device, self.dtype = source.device, source.dtype
        self.compressed = None   # CUDA: cuSPARSELt's compressed W24 (uint8)
        self.dense = None        # CPU: W24 expanded (the reference path)
        self.res_values = None
        self.algs = {}           # token-count bucket -> algorithm code found by cuSPARSELt's search
        if w24 is None:
            self.set_values(values)
        else:
            self._store(w24)

    @classmethod
    def from_dense(cls, w24: torch.Tensor) -> "Sparse24Weight":
        """A weight that is 2:4 already, given dense (out x in): compressed as it is, no residual and no
        split to build (a sort per entry); :meth:`set_values` is not available. ValueError when a group of
        4 consecutive entries of a row holds more than 2 nonzeros (prune_2to4_mask makes such a weight)."""
        if w24.dim() != 2:
            raise ValueError(f"w24: expected a 2-D (out_features, in_features) tensor, got shape {tuple(w24.shape)}")
        check_2to4(w24, "w24")
        return cls(None, None, w24=w24.detach())

    @property
    def residual_nnz(self) -> int:
        return self.split.residual_nnz if self.split is not None else 0

    @property
    def nbytes(self) -> int:
        held = [self.compressed, self.dense, self.res_values]
        split = self.split.nbytes if self.split is not None else 0
        return sum(t.numel() * t.element_size() for t in held if t is not None) + split

    def _store(self, w24: torch.Tensor) -> None:
        if self.device.type == "cuda":
            self.compressed = ops.sparse24_compress(w24)
        else:
            self.dense = w24

    def set_values(self, values: torch.Tensor) -> None:
        if self.split is None:
            raise ValueError("values: this Sparse24Weight was made from a dense 2:4 weight (no CSR order to take "
                             "values in); build it from a Sparse24Split")
        with torch.no_grad():
            self._store(self.split.dense24(values.detach()))
            self.res_values = self.split.residual_values(values.detach()) if self.residual_nnz else None

    def _residual(self):
        if self.res_values is None:
            return None, None, None
        return self.split.res_crow, self.split.res_col, self.res_values

    def search(self, x: torch.Tensor, bias: Optional[torch.Tensor], bucket: Optional[int] = None) -> int:
        """Let cuSPARSELt time its algorithms for this x (N rows); the best one's code, kept for ``bucket``."""
        code = int(ops.sparse24_search(x, self.compressed, self.shape[0], self.res_values is not None, bias, "none"))
        if bucket is not None:
            self.algs[bucket] = code
        self.count_plan(x, bias, code)
        return code

    def count_plan(self, x: torch.Tensor, bias: Optional[torch.Tensor], alg: int) -> None:
        """Count the plan a CUDA call (or search) on x makes or reuses (PLANS)."""
        if self.compressed is not None and x.shape[0] > 0 and not torch.compiler.is_compiling():
            PLANS.sight(PLANS.key(x, self.shape, self.res_values is not None, bias, alg))

    def alg_for(self, x: torch.Tensor, bias: Optional[torch.Tensor], bucket: Optional[int]) -> int:
        """The algorithm code for x's token-count bucket, searched on the bucket's first call (-1: cuSPARSELt's
        default, where no search can run: no bucket, or a CUDA graph being captured). Every path into the 2:4
        form asks here, so a layer forced to format="2:4" is tuned as the "auto" one is: on an H100 the default
        algorithm took 2.2x the searched one's time at 11008 x 4096, N = 2048 (392 vs 179 us)."""
        code = self.algs.get(bucket) if bucket is not None else -1
        if code is None:
            if self.compressed is None or torch.cuda.is_current_stream_capturing():
                return -1
            code = self.search(x, bias, bucket)
        return code

    def __call__(self, x: torch.Tensor, bias: Optional[torch.Tensor] = None, activation: str = "none",
                 negative_slope: float = 0.01, bucket: Optional[int] = None) -> torch.Tensor:
        crow, col, vals = self._residual()
        if self.compressed is not None:
            alg = self.alg_for(x, bias, bucket)
            self.count_plan(x, bias, alg)
            return ops.sparse24_linear.default(x, self.compressed, self.shape[0], crow, col, vals, bias, activation,
                                       float(negative_slope), alg)
        y = x @ self.dense.t()  # CPU reference
        if vals is not None:
            y = y + ops.spmm(crow, col, vals, x.t(), 1.0, None, 0.0, None, "none", 0.01, "auto").t()
        if bias is not None or activation != "none":
            y = ops.bias_act(y, None, bias, activation, float(negative_slope))
        return y


@torch.library.register_fake("sparsetorch::sparse24_linear")
def _sparse24_linear_fake(x, compressed, out_features, residual_crow=None, residual_col=None, residual_values=None,
                          bias=None, activation="none", negative_slope=0.01, alg=-1):
    return x.new_empty((x.shape[0], out_features))
