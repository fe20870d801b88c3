"""SparseLinear: a pruned linear layer whose weight is stored sparse (CSR) and run in the fastest of its forms.

The CSR components are the layer's state (``values`` is the trainable parameter). From them the layer
derives, lazily, the forms a product can run on (the pruned-weight formats of sparsetorch/pruned/): the CSR
itself (sparsetorch's SpMM routes), the dense weight (cuBLASLt), a 2:4 part on sparse tensor cores plus a small
CSR residual (cuSPARSELt, pruned/sparse24.py), bitmap tiles for tensor cores (pruned/bitmap.py), the slot layout
(the same tiles, each value stored with its slot in the tensor-core fragment: pruned/slots.py) and, for few
tokens on CUDA, CSR16 (CSR with each entry's value and 16-bit column in one word, multiplied on CUDA cores:
pruned/csr16.py). On the first call with a token count in a new bucket (powers of two: 1, 2, 3-4, 5-8, ...) it
times the forms that apply on that input and keeps the fastest for the bucket (CUDA: device events with a cold
L2, as SpmmPlan's autotuner; CPU: wall clock); a sparse form must beat dense by 5%, twice apart. Forms that
win no bucket are freed again; the dense copy costs out * in * element bytes (90 MB for an 11008 x 4096 bf16
weight) and is kept only when dense wins a bucket.
Derived forms are rebuilt when the pattern or the values change (their data pointers and version counters
are compared), never per call. Inside CUDA graph capture (no timing possible) a bucket never measured takes
the route of the nearest measured bucket, or the CSR; torch.compile traces the CSR route.

Forms other than the CSR multiply the weight's zeros, so a NaN/Inf in x reaches every output of its token, as
in ``nn.Linear`` (the CSR route follows SciPy and skips structural zeros).
"""
from __future__ import annotations

import math
import statistics
import time
from typing import Any, Dict, Optional

import torch
import torch.nn.functional as F_torch
from torch import nn

from sparsetorch import functional as F
from sparsetorch._ops import ops
from sparsetorch._transpose import transpose_pattern, transpose_values
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR, as_csr
from sparsetorch.plan import SpmmPlan, _autotune_candidates, _device_time, _l2_scratch
from sparsetorch.pruned.bitmap import BitmapWeight, bitmap_linear
from sparsetorch.pruned.csr16 import Csr16Weight, applies as csr16_applies, csr16_linear
from sparsetorch.pruned.slots import SlotWeight, applies as slots_applies, slot_linear
from sparsetorch.pruned.sparse24 import MAX_RESIDUAL_DENSITY, Sparse24Split, Sparse24Weight, sparse24_applies
from sparsetorch.pruned.sparse24_decode import DECODE_MAX_TOKENS, Sparse24DecodeWeight, decode_applies
from sparsetorch.pruned.wanda import prune_mask

FORMATS = ("auto", "csr", "dense", "2:4", "bitmap", "slots", "csr16")
# CSR16 is timed for token counts up to this (beyond it every token tile reads the weight again). Under
# CUDA graph capture a bucket never measured takes its nearest measured bucket's route, csr16 included:
# correct at any token count, only slower past this.
CSR16_MAX_TOKENS = 64
# The slot form is timed up to this many tokens (each 64-token tile reads the weight again; past a few
# hundred tokens the dense GEMM wins).
SLOTS_MAX_TOKENS = 512
# format="2:4" runs a pure 2:4 weight on the decode kernel (mma.sp, pruned/sparse24_decode.py) up to this many
# tokens and on cuSPARSELt above: on an H100 the decode kernel ran at 1.45-1.70x dense up to N = 16, and at
# N = 32 1.13-1.24x on tall weights but 0.77x on 4096 x 14336 (2026-11-27, Llama MLP shapes, docs/formats.md);
# "auto" times it up to DECODE_MAX_TOKENS.
SPARSE24_DECODE_TOKENS = 16
# A sparse form replaces the dense weight only when it measured at least 5% faster: one measurement
# per bucket is noisy, and not slower than dense is the aim (seen on the H100: bitmap timed at
# 45.6 us against dense 47.3 us when routing, 58.7 us in the benchmark after).
DENSE_MARGIN = 0.95


def _index_dtype_for(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) < 2**31 - 1 else torch.int64


def _bucket(n: int) -> int:
    """Token-count bucket: the next power of two (0 for an empty input)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()




def _host_time(call, reps: int = 5) -> float:
    """Median wall milliseconds of call() after one warm-up (the CPU's measurement)."""
    call()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        call()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def _time_routes(calls: Dict[str, Any], x: torch.Tensor) -> Dict[str, float]:
    """Milliseconds of each candidate call on this input (tests replace this function): the smaller of
    two rounds, the second in reverse order, so that a moment when the device or host ran slow spoils
    one round, not the choice (seen on the H100: one round timed dense at 343 us and the CSR at 176 us
    for a call whose dense time is 23 us; the layer kept a CSR route 7x slower than dense)."""
    if x.is_cuda:
        scratch = _l2_scratch(x.device)
        # A clean L2, as the layer meets it in a decoder step (plan._device_time).
        time_one = lambda call: _device_time(call, scratch, clean=True)  # noqa: E731
    else:
        time_one = _host_time
    times = {name: time_one(call) for name, call in calls.items()}
    for name in reversed(list(calls)):
        times[name] = min(times[name], time_one(calls[name]))
    best = min(times, key=times.get)
    if "dense" in calls and best != "dense":
        # Two rounds were not enough once: dense timed at 253 us in both for a call of 23 us (H100, 2026-11-27,
        # 4096^2 at 70%, N = 128; cause not found), and the layer kept slots, 2.4x slower than dense. The two
        # finalists once more, after all the others, before a form is preferred to dense.
        for name in (best, "dense"):
            times[name] = min(times[name], time_one(calls[name]))
    return times


class _BitmapForm:
    """Adapter to sparsetorch.pruned.bitmap: the one place that knows its API."""

    def __init__(self, csr: CSR):
        self.weight = BitmapWeight.from_csr(csr)  # the pattern once, with these values

    def set_values(self, values: torch.Tensor) -> None:
        self.weight.values_from_csr(values.detach())  # in place: one gather

    @property
    def nbytes(self) -> int:
        return int(self.weight.nbytes)

    def __call__(self, x, bias, activation, negative_slope):
        return bitmap_linear(x, self.weight, bias=bias, activation=activation, negative_slope=negative_slope)


class _Forms:
    """A SparseLinear's derived forms and its route per token-count bucket (not part of the state_dict)."""

    def __init__(self):
        self.key = self.pattern_key = None
        self._reset()

    # Derived state (and bound calls, which do not pickle): a copied or unpickled layer starts afresh.
    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()

    def _reset(self):
        self.routes: Dict[int, str] = {}               # bucket -> route ("dense", "2:4", "bitmap", "csr:<backend>")
        self.times: Dict[int, Dict[str, float]] = {}   # bucket -> route -> ms, as measured
        self.skipped: Dict[str, str] = {}              # route -> why it could not be built
        self.dense = None
        self.split24 = None
        self.residual24 = None  # entries the 2:4 part cannot hold, once counted
        self.sparse24 = None
        self.decode24 = None  # the pure 2:4 weight packed for the decode kernel ("2:4 decode")
        self.bitmap = None
        self.csr16 = None
        self.slots = None
        self.blocked = None
        self.runners: Dict[int, Any] = {}  # bucket -> the inference call of its route, arguments bound

    # -- keeping the forms in step with the layer's tensors --

    def refresh(self, layer: "SparseLinear", v=None, crow=None, col=None) -> None:
        if v is None:
            v, crow, col = layer.values, layer.crow_indices, layer.col_indices
        try:  # the cheap test first: nothing written in place, nothing swapped (.to(), load_state_dict)
            key = (v._version, crow._version, col._version, v.data_ptr(), crow.data_ptr(), col.data_ptr())
        except RuntimeError:  # inference tensors have no version counter
            key = (-1, -1, -1, v.data_ptr(), crow.data_ptr(), col.data_ptr())
        bias = layer._parameters.get("bias")
        # What the bound calls also capture: the bias and the epilogue settings.
        key += (id(bias), layer.activation, layer.negative_slope, layer.format, layer.backend)
        if key == self.key:
            return
        self.runners = {}
        if key[:6] == (self.key or ())[:6]:  # only the bias or a setting changed: the forms still hold
            self.key = key
            return
        pattern = key[1:3] + key[4:6] + (tuple(v.shape), v.dtype, v.device)
        if pattern != self.pattern_key:
            self._reset()
            self.pattern_key = pattern
        else:
            with torch.no_grad():
                if self.dense is not None:
                    self.dense = layer.weight.to_dense().detach()
                if self.sparse24 is not None:
                    self.sparse24.set_values(v)
                if self.decode24 is not None:
                    self.decode24.set_values(v)
                if self.bitmap is not None:
                    self.bitmap.set_values(v)
                if self.csr16 is not None:
                    self.csr16.set_values(v)
                if self.slots is not None:
                    self.slots.set_values(v)
                if self.blocked is not None:
                    self.blocked._blocked_values = None  # the plan re-derives its pair values on the next call
        self.key = key

    def has(self, route: str) -> bool:
        if route == "dense":
            return self.dense is not None
        if route == "2:4":
            return self.sparse24 is not None
        if route == "2:4 decode":
            return self.decode24 is not None
        if route == "bitmap":
            return self.bitmap is not None
        if route == "csr16":
            return self.csr16 is not None
        if route == "slots":
            return self.slots is not None
        return route != "csr:blocked" or self.blocked is not None

    def build(self, layer: "SparseLinear", route: str) -> None:
        """Make the form `route` runs on (raises ValueError/RuntimeError/TypeError when it cannot apply)."""
        if self.has(route):
            return
        v = layer.values.detach()
        with torch.no_grad():
            if route == "dense":
                self.dense = layer.weight.to_dense().detach()
            elif route == "2:4":
                reason = sparse24_applies((layer.out_features, layer.in_features), v.dtype, v.device)
                if reason is not None and v.device.type == "cuda":
                    raise ValueError(f"format '2:4': {reason}")
                if self.split24 is None:
                    self.split24 = Sparse24Split(layer.crow_indices, layer.col_indices,
                                                 (layer.out_features, layer.in_features))
                self.sparse24 = Sparse24Weight(self.split24, v)
            elif route == "2:4 decode":
                if v.device.type != "cuda":
                    raise ValueError("format '2:4': the decode kernel runs on CUDA")
                self.decode24 = Sparse24DecodeWeight.from_split(self._split24(layer), v)  # ValueError if not 2:4
            elif route == "bitmap":
                self.bitmap = _BitmapForm(layer.weight.with_values(v))
            elif route == "csr16":
                self.csr16 = Csr16Weight(layer.crow_indices, layer.col_indices, v,
                                         (layer.out_features, layer.in_features))
            elif route == "slots":
                self.slots = SlotWeight(layer.crow_indices, layer.col_indices, v, (layer.out_features, layer.in_features))
            elif route == "csr:blocked":
                self.blocked = SpmmPlan(layer.weight, backend="blocked", validate=False, autotune=False)

    def _split24(self, layer: "SparseLinear") -> Sparse24Split:
        if self.split24 is None:  # counted once per pattern
            self.split24 = Sparse24Split(layer.crow_indices, layer.col_indices, (layer.out_features, layer.in_features))
            self.residual24 = self.split24.residual_nnz
        return self.split24

    def decode24_applies(self, layer: "SparseLinear", x: torch.Tensor) -> bool:
        """Whether the 2:4 decode kernel can run this weight on x: CUDA, bf16/fp16, out % 16, in % 32, a pure 2:4
        pattern."""
        if not x.is_cuda or decode_applies((layer.out_features, layer.in_features), layer.values.dtype) is not None:
            return False
        if self.residual24 is None:
            self._split24(layer)
        return self.residual24 == 0

    # -- choosing --

    def candidates(self, layer: "SparseLinear", x: torch.Tensor):
        """The routes worth timing for this input."""
        if not x.is_cuda:
            return ["csr", "dense"]
        csr = layer.weight
        if layer.backend != "auto":
            routes = ["csr:" + layer.backend]
        else:  # densify is left out: the dense form keeps what it re-expands per call
            routes = ["csr:" + r for r in _autotune_candidates(csr, x.shape[0], 2) if r != "densify"]
        routes.append("dense")
        if x.shape[0] <= DECODE_MAX_TOKENS and self.decode24_applies(layer, x):
            routes.append("2:4 decode")
        if sparse24_applies((layer.out_features, layer.in_features), csr.dtype, x.device) is None:
            if self.residual24 is None:
                self._split24(layer)
            if self.residual24 <= MAX_RESIDUAL_DENSITY * layer.out_features * layer.in_features:
                routes.append("2:4")
            else:
                self.skipped["2:4"] = (f"{self.residual24} entries beyond 2 per group of 4 (more than "
                                       f"{MAX_RESIDUAL_DENSITY:.1%} of the positions)")
        if csr.dtype in (torch.float16, torch.bfloat16):
            routes.append("bitmap")
        if x.shape[0] <= SLOTS_MAX_TOKENS and slots_applies((layer.out_features, layer.in_features), csr.dtype,
                                                             csr.nnz) is None:
            routes.append("slots")
        if x.shape[0] <= CSR16_MAX_TOKENS and csr16_applies((layer.out_features, layer.in_features), csr.dtype,
                                                             csr.nnz) is None:
            routes.append("csr16")
        return routes

    def route(self, layer: "SparseLinear", x: torch.Tensor) -> str:
        if layer.format == "2:4" and x.shape[0] <= SPARSE24_DECODE_TOKENS and self.decode24_applies(layer, x):
            return "2:4 decode"
        if layer.format != "auto":
            return "csr:" + layer.backend if layer.format == "csr" else layer.format
        bucket = _bucket(x.shape[0])
        route = self.routes.get(bucket)
        if route is not None and (self.has(route) or not _capturing(x)):
            return route
        if bucket == 0 or _capturing(x):
            return self._rule(bucket)
        return self._measure(layer, x, bucket)

    def _rule(self, bucket: int) -> str:
        """Without measuring: the route of the nearest measured bucket whose form exists, else the CSR."""
        measured = [b for b, r in self.routes.items() if self.has(r)]
        if measured and bucket > 0:
            nearest = min(measured, key=lambda b: abs(math.log2(b) - math.log2(bucket)))
            return self.routes[nearest]
        return "csr"

    def _measure(self, layer: "SparseLinear", x: torch.Tensor, bucket: int) -> str:
        calls = {}
        with torch.no_grad():
            for route in self.candidates(layer, x):
                try:
                    self.build(layer, route)
                    # A candidate that fails on this input is left out; the 2:4 form searches its algorithm here.
                    self.run(layer, route, x, bucket)
                except (RuntimeError, ValueError, TypeError, NotImplementedError) as e:
                    self.skipped[route] = f"{type(e).__name__}: {e}"
                    continue
                calls[route] = lambda route=route: self.run(layer, route, x, bucket)
            times = _time_routes(calls, x) if calls else {"csr": float("nan")}
        best = min(times, key=times.get)
        if best != "dense" and times.get("dense", math.inf) * DENSE_MARGIN < times[best]:
            best = "dense"
        self.routes[bucket], self.times[bucket] = best, times
        self._release_unused()
        return best

    def _release_unused(self) -> None:
        used = set(self.routes.values())
        if "dense" not in used:
            self.dense = None
        if "2:4 decode" not in used:
            self.decode24 = None
        if "2:4" not in used:
            self.sparse24 = None
            if self.decode24 is None:
                self.split24 = None  # the split (a byte per entry and more) is rebuilt if needed
        if "bitmap" not in used:
            self.bitmap = None
        if "csr16" not in used:
            self.csr16 = None
        if "slots" not in used:
            self.slots = None
        if "csr:blocked" not in used:
            self.blocked = None

    # -- running --

    def run(self, layer: "SparseLinear", route: str, x: torch.Tensor, bucket: Optional[int] = None,
            bias: Any = "layer", activation: Optional[str] = None) -> torch.Tensor:
        """act(x @ W^T + bias) on one form, without autograd. x (N, in)."""
        bias = layer.bias if isinstance(bias, str) else bias
        act = layer.activation if activation is None else activation
        slope = layer.negative_slope
        self.build(layer, route)
        if route == "dense":  # torch's F.linear has the lower host overhead where no activation is fused
            return F_torch.linear(x, self.dense, bias) if act == "none" else ops.linear(x, self.dense, bias, act, slope)
        if route == "2:4":
            return self.sparse24(x, bias, act, slope, bucket)
        if route == "2:4 decode":
            return self.decode24(x, bias, act, slope)
        if route == "bitmap":
            return self.bitmap(x, bias, act, slope)
        if route == "csr16":
            return csr16_linear(x, self.csr16, bias, act, slope)
        if route == "slots":
            return slot_linear(x, self.slots, bias, act, slope)
        backend = route.partition(":")[2] or layer.backend
        if backend == "blocked":
            y_t = self.blocked(x.t())
        else:
            y_t = F._without_autograd(ops.spmm.default, layer.crow_indices, layer.col_indices, layer.values, x.t(),
                                      1.0, None, 0.0, None, "none", 0.01, backend)
        if bias is not None or act != "none":
            return F._without_autograd(ops.bias_act.default, y_t.t(), None, bias, act, slope)
        return y_t.t().contiguous()

    def runner(self, layer: "SparseLinear", x: torch.Tensor, bucket: int):
        """The inference call for this bucket with its operands bound (kept until the forms change), so a
        steady-state call does no route logic in Python."""
        call = self.runners.get(bucket)
        if call is not None:
            return call
        route = self.route(layer, x)
        self.build(layer, route)
        bias, act, slope = layer.bias, layer.activation, layer.negative_slope
        if route == "dense":
            dense = self.dense
            if act == "none":  # torch's F.linear: the lowest host overhead
                call = lambda a: F_torch.linear(a, dense, bias)  # noqa: E731
            else:
                call = lambda a: ops.linear.default(a, dense, bias, act, slope)  # noqa: E731
        elif route == "2:4" and self.sparse24.compressed is not None:
            w = self.sparse24
            alg = w.alg_for(x, bias, bucket)
            args = (w.compressed, w.split.shape[0], *w._residual(), bias, act, slope, alg)
            call = lambda a: ops.sparse24_linear.default(a, *args)  # noqa: E731
            if bucket not in w.algs:  # captured before any search: the runner would pin the default algorithm
                return call
        elif route in ("bitmap", "slots", "csr16", "2:4 decode"):  # the op below autograd: no wrapper per call
            if route == "2:4 decode":
                w = self.decode24
                op, args = ops.sparse24_decode_linear.default, (w.values, w.meta, w.shape[0], w.shape[1], bias, act,
                                                                 slope)
            elif route == "bitmap":
                w = self.bitmap.weight
                op, args = ops.bitmap_linear.default, (w.bitmaps, w.offsets, w.values, w.shape[0], bias, act, slope)
            elif route == "slots":
                w = self.slots
                op, args = ops.slot_linear.default, (w.offsets, w.entries, w.shape[0], bias, act, slope, w.banded)
            else:
                op, args = ops.csr16_linear.default, (self.csr16.crow, self.csr16.entries, bias, act, slope)
            call = lambda a: F._without_autograd(op, a, *args)  # noqa: E731
        else:
            call = lambda a: self.run(layer, route, a, bucket)  # noqa: E731
        if layer.format != "auto" or bucket in self.routes:  # not a stand-in rule: keep it
            self.runners[bucket] = call
        return call

    def memory(self, state_crow: torch.Tensor) -> Dict[str, int]:
        """Bytes held by the derived forms (the CSR itself is the layer's state: row pointers a form shares
        with it, state_crow, are not counted again)."""
        out = {}
        if self.dense is not None:
            out["dense"] = self.dense.numel() * self.dense.element_size()
        if self.sparse24 is not None:
            out["2:4"] = self.sparse24.nbytes
        elif self.split24 is not None:
            out["2:4 split"] = self.split24.nbytes
        if self.decode24 is not None:  # its split is counted above ("2:4" or "2:4 split") when shared
            shared = self.decode24.split is not None and self.decode24.split is self.split24 and (
                self.sparse24 is not None or "2:4 split" in out)
            out["2:4 decode"] = self.decode24.nbytes - (self.split24.nbytes if shared else 0)
        if self.bitmap is not None:
            out["bitmap"] = self.bitmap.nbytes
        if self.slots is not None:
            out["slots"] = self.slots.nbytes
        if self.csr16 is not None:
            shared = self.csr16.crow.data_ptr() == state_crow.data_ptr()
            out["csr16"] = self.csr16.nbytes - (self.csr16.crow.numel() * 4 if shared else 0)
        return out


def _capturing(x: torch.Tensor) -> bool:
    return x.is_cuda and torch.cuda.is_current_stream_capturing()


class _FormMatmul(torch.autograd.Function):
    """x @ W^T on a derived form, with the gradients of x and of the CSR values: grad_x from the dense copy
    when the layer holds one, else from the cached transpose of the pattern (st.transpose's cache);
    grad_values by the SDDMM on the pattern, as for the CSR route."""

    @staticmethod
    def forward(ctx, x, values, layer, route, bucket):
        ctx.save_for_backward(x, values)
        ctx.layer = layer
        with torch.no_grad():
            return layer._forms.run(layer, route, x, bucket, bias=None, activation="none")

    @staticmethod
    def backward(ctx, grad):
        x, values = ctx.saved_tensors
        layer = ctx.layer
        gy = grad.contiguous()
        crow, col = layer.crow_indices, layer.col_indices
        grad_x = grad_values = None
        if ctx.needs_input_grad[0]:
            dense = layer._forms.dense
            if dense is not None and dense.dtype == gy.dtype:
                grad_x = gy @ dense
            else:
                crow_t, col_t, perm = transpose_pattern(crow, col, layer.in_features)
                grad_x = ops.spmm(crow_t, col_t, transpose_values(values, perm), gy.t(), 1.0, None, 0.0, None,
                                  "none", 0.01, "auto").t()
        if ctx.needs_input_grad[1]:
            grad_values = ops.sddmm(crow, col, gy.t().contiguous(), x.t().contiguous(), 1.0, "auto")
        return grad_x, grad_values, None, None, None


class SparseLinear(nn.Module):
    """``y = act(x @ W.T + bias)`` with the weight ``W`` (out_features, in_features) stored in CSR.

    The pattern (``crow_indices``, ``col_indices``) is a buffer; the stored values are the trainable
    parameter ``values``. Build one from a dense layer with :meth:`from_dense` (magnitude pruning, also to
    2:4) or from any sparse matrix with :meth:`from_sparse`. ``x`` is (..., in_features).

    ``format``: ``"auto"`` (default) times the forms that apply on the first call of each token-count
    bucket and keeps the fastest (see the module docstring; ``layer.routes`` shows the choices,
    ``layer.route_times`` the measurements, ``layer.memory()`` the bytes of the derived forms); or one of
    ``"csr"``, ``"dense"``, ``"2:4"`` (cuSPARSELt on CUDA, a dense reference on the CPU; any pattern: the
    entries beyond 2 per group of 4 run as a CSR residual), ``"bitmap"``, ``"slots"`` (bfloat16/float16) and
    ``"csr16"`` (bfloat16/float16, in_features <= 65535) to force a form. ``backend``
    is the SpMM route of the CSR form (``"auto"``: every applicable route is a candidate).
    """

    def __init__(self, in_features: int, out_features: int, crow_indices: torch.Tensor,
                 col_indices: torch.Tensor, values: torch.Tensor, bias: Optional[torch.Tensor] = None,
                 activation: Optional[str] = None, negative_slope: float = 0.01, backend: str = "auto",
                 format: str = "auto"):
        super().__init__()
        CSR(crow_indices, col_indices, values, (out_features, in_features))  # checks the components
        if bias is not None and (bias.shape != (out_features,) or bias.dtype != values.dtype
                                 or bias.device != values.device):
            raise ValueError(f"bias: expected shape ({out_features},) with the values' dtype {values.dtype} and "
                             f"device {values.device}, got {tuple(bias.shape)} {bias.dtype} on {bias.device}")
        if format not in FORMATS:
            raise ValueError(f"format: expected one of {', '.join(FORMATS)}, got {format!r}")
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.register_buffer("crow_indices", crow_indices)
        self.register_buffer("col_indices", col_indices)
        self.values = nn.Parameter(values)
        self.bias = nn.Parameter(bias) if bias is not None else None
        self.activation = F._activation_name(activation)
        self.negative_slope = float(negative_slope)
        self.backend = backend
        self.format = format
        self._forms = _Forms()

    @classmethod
    def from_sparse(cls, weight: Any, bias: Optional[torch.Tensor] = None, dtype: Optional[torch.dtype] = None,
                    **kwargs) -> "SparseLinear":
        """From a sparse (out_features, in_features) weight: anything :func:`sparsetorch.as_csr` takes
        (``dtype`` converts the values; the bias is converted to the values' dtype)."""
        w = as_csr(weight)
        ensure_valid(w)
        if dtype is not None:
            w = w.to(dtype=dtype)
        if bias is not None:
            bias = bias.to(dtype=w.dtype, device=w.device)
        if w.batched:
            raise ValueError(f"weight: expected a 2-D (out_features, in_features) matrix, got shape {w.shape}")
        out_f, in_f = w.shape
        return cls(in_f, out_f, w.crow_indices, w.col_indices, w.values.detach().clone(),
                   None if bias is None else bias.detach().clone(), **kwargs)

    @classmethod
    def from_dense(cls, linear: Any, sparsity: Optional[float] = None, scheme: str = "global",
                   bias: Optional[torch.Tensor] = None, importance: Optional[torch.Tensor] = None,
                   **kwargs) -> "SparseLinear":
        """Prune a dense layer (an ``nn.Linear`` or an (out, in) weight tensor) by magnitude, or Wanda-style.

        ``sparsity`` is the fraction of weights removed (default 0.9; 0.5 for ``"2:4"``).
        ``scheme="global"`` keeps the ``round((1 - sparsity) * out * in)`` highest scores of the whole
        matrix; ``"row"`` keeps the ``round((1 - sparsity) * in)`` highest of each row (the same nnz per
        row, which balances the SpMM's work); ``"2:4"`` keeps the 2 highest of every group of 4
        consecutive weights of a row (2:4 semi-structured sparsity, for sparse tensor cores), and a
        ``sparsity`` above 0.5 then removes the lowest kept scores of the whole matrix as well (the
        pattern stays 2:4). The score is |w|, or with ``importance`` (in_features,) |w_ij| * importance_j:
        Wanda pruning when importance holds the L2 norms of the input channels over calibration data
        (:func:`sparsetorch.pruned.input_norms`). Ties are broken by position. The mask is
        :func:`sparsetorch.pruned.prune_mask`'s. The bias (of the ``nn.Linear``, or ``bias=``) is copied.
        """
        if isinstance(linear, nn.Linear):
            weight = linear.weight.detach()
            bias = linear.bias.detach() if linear.bias is not None else None
        elif isinstance(linear, torch.Tensor) and linear.dim() == 2 and linear.layout == torch.strided:
            weight = linear.detach()
        else:
            raise TypeError(f"linear: expected an nn.Linear or a 2-D dense weight tensor, got {type(linear).__name__}")
        out_f, in_f = weight.shape
        mask = prune_mask(weight, sparsity, scheme, importance=importance)
        rows, cols = mask.nonzero(as_tuple=True)  # row-major order: sorted columns per row
        counts = torch.bincount(rows, minlength=out_f)
        index_dtype = _index_dtype_for(out_f, in_f, int(rows.numel()))
        crow = torch.zeros(out_f + 1, dtype=torch.int64, device=weight.device)
        torch.cumsum(counts, 0, out=crow[1:])
        return cls(in_f, out_f, crow.to(index_dtype), cols.to(index_dtype), weight[rows, cols].clone(),
                   None if bias is None else bias.clone(), **kwargs)

    @property
    def weight(self) -> CSR:
        """The weight as a :class:`sparsetorch.CSR` (sharing this layer's tensors)."""
        return CSR(self.crow_indices, self.col_indices, self.values, (self.out_features, self.in_features))

    @property
    def nnz(self) -> int:
        return int(self.col_indices.numel())

    @property
    def density(self) -> float:
        return self.nnz / max(1, self.in_features * self.out_features)

    @property
    def routes(self) -> Dict[int, str]:
        """Token-count bucket (a power of two) -> the route chosen for it."""
        return dict(self._forms.routes)

    @property
    def route_times(self) -> Dict[int, Dict[str, float]]:
        """Token-count bucket -> route -> milliseconds, as measured when the bucket was first seen."""
        return {b: dict(t) for b, t in self._forms.times.items()}

    def memory(self) -> Dict[str, int]:
        """Bytes: the CSR state ("csr") and each derived form the layer holds now."""
        state = [self.crow_indices, self.col_indices, self.values] + ([self.bias] if self.bias is not None else [])
        return {"csr": sum(t.numel() * t.element_size() for t in state), **self._forms.memory(self.crow_indices)}

    def to_dense(self) -> torch.Tensor:
        """The dense (out_features, in_features) weight (differentiable w.r.t. ``values``)."""
        return self.weight.to_dense()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        params = self._parameters  # read directly: nn.Module.__getattr__ costs microseconds per call
        values, bias = params["values"], params.get("bias")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x: expected last dimension {self.in_features} (in_features), got shape {tuple(x.shape)}")
        if x.dtype != values.dtype:
            raise TypeError(f"x: expected dtype {values.dtype} (the layer's), got {x.dtype}")
        x2 = x if x.dim() == 2 else x.reshape(-1, self.in_features)
        if torch.compiler.is_compiling():  # traced: the CSR op (its C++ rules pick the kernel), no timing
            y = self._epilogue(F.spmm(self.weight, x2.t(), backend=self.backend).t())
        else:
            forms = self._forms
            forms.refresh(self, values, self._buffers["crow_indices"], self._buffers["col_indices"])
            bucket = _bucket(x2.shape[0])
            if not (torch.is_grad_enabled() and (x2.requires_grad or values.requires_grad
                                                 or (bias is not None and bias.requires_grad))):
                y = forms.runner(self, x2, bucket)(x2)
            else:
                route = forms.route(self, x2)
                if (route == "csr" or route.startswith("csr:")) and route != "csr:blocked":
                    y_t = F.spmm(self.weight, x2.t(), backend=route.partition(":")[2] or self.backend)  # (out, N)
                    y = self._epilogue(y_t.t())
                else:
                    y = self._epilogue(_FormMatmul.apply(x2, values, self, route, bucket))
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def _epilogue(self, y: torch.Tensor) -> torch.Tensor:
        """Bias + activation with autograd (one fused pass that also restores the row-major layout)."""
        if self.bias is not None or self.activation != "none":
            return F.bias_act(y, bias=self.bias, activation=self.activation, negative_slope=self.negative_slope)
        return y.contiguous()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        # A corrupt weight is refused before anything of the layer changes.
        crow, col = state_dict.get(prefix + "crow_indices"), state_dict.get(prefix + "col_indices")
        if crow is not None or col is not None:
            crow = self.crow_indices if crow is None else crow
            col = self.col_indices if col is None else col
            values = state_dict.get(prefix + "values")
            values = torch.zeros(col.shape, dtype=self.values.dtype) if values is None else values
            ensure_valid(CSR(crow, col, values, (self.out_features, self.in_features)))
        # A different sparsity means different nnz: take the incoming shapes so that any
        # SparseLinear of the same in/out features loads any other's state_dict.
        for name in ("crow_indices", "col_indices"):
            t = state_dict.get(prefix + name)
            if t is not None and t.shape != getattr(self, name).shape:
                setattr(self, name, torch.empty_like(t, device=getattr(self, name).device))
        t = state_dict.get(prefix + "values")
        if t is not None and t.shape != self.values.shape:
            self.values = nn.Parameter(torch.empty_like(t, device=self.values.device),
                                       requires_grad=self.values.requires_grad)
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._forms = _Forms()  # a new weight: its routes are measured again

    def extra_repr(self) -> str:
        routes = ", ".join(f"{b}: {r}" for b, r in sorted(self._forms.routes.items()))
        return (f"in_features={self.in_features}, out_features={self.out_features}, nnz={self.nnz} "
                f"(density {self.density:.3g}), bias={self.bias is not None}, activation={self.activation!r}, "
                f"format={self.format!r}" + (f", routes={{{routes}}}" if routes else ""))
