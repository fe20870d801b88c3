"""SparseLinear: a pruned linear layer ``y = act(x @ W.T + bias)`` whose weight is stored sparse, run in the
fastest of its forms (sparsetorch/pruned/forms.py) for each token count.

**Modes.** A new layer holds its weight as CSR (``values`` is the trainable parameter) and derives the forms
its calls choose, lazily; that is the training mode, and it holds the CSR plus every form some token count
uses (``layer.memory()`` says how much). ``layer.compact()`` (``st.nn.compact(model)``) turns it into an
inference layer that holds ONE stored form and nothing else: 2:4 decode for a 2:4 weight, the slot layout
for other half-precision weights, else the CSR. Token counts the stored form does not serve well (prefill
chunks) expand it to the dense weight for the call and free it after (``memory()["peak_transient"]``).

**Choosing a form** per token-count bucket (powers of two) is the tuner's job (sparsetorch/tuning.py, the
"linear" table): the first call of a bucket takes the rule (sparsetorch/pruned/rule.py); in eager inference
a form whose build costs more than many calls' gain is built once the calls that wanted it would have repaid
it, and they run dense until then (``build_when_repaid``); later calls of an undecided bucket sample the forms the layer already holds,
as the real calls, timed without a sync, until one is decided. Decisions are keyed on the weight's
signature (GPU, dtype, shape, pattern kind and density, epilogue) and shared by layers of that signature;
they persist in the tuning cache file (``st.set_tuning_cache``). A bucket decided for the 2:4 (cuSPARSELt)
form runs a token count's first call on the dense form where the layer holds one: cuSPARSELt makes a plan
per token count, which costs several dense calls, so it is made the second time that count comes.
``layer.prepare(token_counts)`` /
``st.nn.prepare(model, token_counts)`` builds and times every form for those buckets now (a server does
this at load), and searches cuSPARSELt's algorithm for the 2:4 form.

**Compile and CUDA graphs.** The choice lives inside one custom op, ``sparsetorch::sparse_linear_inference``
(``sparsetorch::sparse_linear`` when autograd records: the bare product, with its backward), which
torch.compile sees as one opaque call: compiled code runs the form the bucket decided, and a CUDA graph
(``mode="reduce-overhead"``, ``torch.cuda.graph``) captures it. Nothing is sampled or built during a
capture: a bucket still undecided there takes its rule among the forms the layer holds. Forms are built
on a side stream, so a graph's private memory pool never holds them.

Forms other than the CSR multiply the weight's zeros, so a NaN/Inf in x reaches every output of its token,
as in ``nn.Linear`` (the CSR route follows SciPy and skips structural zeros).
"""
from __future__ import annotations

import sys
import time
import weakref
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F_torch
from torch import nn

from sparsetorch import functional as F
from sparsetorch import timing
from sparsetorch._autograd import call_op, spmm_call
from sparsetorch._cache import tensor_version
from sparsetorch._ops import ops
from sparsetorch._transpose import transpose_pattern, transpose_values
from sparsetorch._validate import ensure_valid
from sparsetorch.csr import CSR, as_csr
from sparsetorch.pruned import forms as _forms
from sparsetorch.pruned import rule as _rule
from sparsetorch.pruned import sparse24 as _sparse24
from sparsetorch.pruned.wanda import prune_mask
from sparsetorch.tuning import tuner

__all__ = ["SparseLinear", "FORMATS", "compact", "prepare"]

FORMATS = ("auto", "csr", "dense", "2:4", "bitmap", "slots", "csr16")
# format="2:4" runs a pure 2:4 weight on the decode kernel (mma.sp) up to this many tokens and on cuSPARSELt
# above (H100: the decode kernel 1.45-1.70x dense up to N = 16; see sparsetorch/pruned/rule.py).
SPARSE24_DECODE_TOKENS = 16
# Buckets prepare() decides when not told: decode and prefill sizes up to 2048 tokens.
DEFAULT_TOKEN_COUNTS = tuple(2 ** i for i in range(12))
_STORED_CODES = {name: i for i, name in enumerate(_forms.COMPACT_FORMS)}
_DTYPE_CODES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _bucket(n: int) -> int:
    """Token-count bucket: the next power of two (0 for an empty input)."""
    return 0 if n <= 0 else 1 << (n - 1).bit_length()


def _index_dtype_for(*sizes: int) -> torch.dtype:
    return torch.int32 if max(sizes, default=0) < 2**31 - 1 else torch.int64


# --- the layers behind the op's integer handle ---------------------------------------------------------

_LAYERS: Dict[int, "weakref.ref[SparseLinear]"] = {}
_next_handle = [0]


def _register(layer: "SparseLinear") -> int:
    _next_handle[0] += 1
    handle = _next_handle[0]
    _LAYERS[handle] = weakref.ref(layer, lambda _ref, h=handle: _LAYERS.pop(h, None))
    return handle


def _layer(handle: int) -> "SparseLinear":
    ref = _LAYERS.get(int(handle))
    layer = ref() if ref is not None else None
    if layer is None:
        raise RuntimeError(f"sparse_linear: no live SparseLinear for handle {handle} (the layer was freed)")
    return layer


_side_streams: Dict[int, torch.cuda.Stream] = {}


def _outside_graph_pool(build, device: torch.device):
    """build() on a side stream when on CUDA: a graph's warm-up routes the current stream's allocations to
    its private pool, whose blocks later replays reuse; a form must never live there."""
    if device.type != "cuda":
        return build()
    index = device.index if device.index is not None else torch.cuda.current_device()
    side = _side_streams.get(index)
    if side is None:
        side = _side_streams[index] = torch.cuda.Stream(device=index)
    current = torch.cuda.current_stream(index)
    side.wait_stream(current)
    with torch.cuda.stream(side):
        form = build()
    current.wait_stream(side)
    for t in _tensors_of(form):
        t.record_stream(current)
    return form


def _tensors_of(form) -> Iterable[torch.Tensor]:
    """The CUDA tensors a form holds: its state and what its weight object keeps beside it (maps)."""
    inner = getattr(form, "weight", None)
    found = list(form.tensors().values()) + (list(vars(inner).values()) if hasattr(inner, "__dict__") else [])
    return list({id(t): t for t in found if isinstance(t, torch.Tensor) and t.is_cuda}.values())


class _Derived:
    """A layer's derived state (not in its state_dict): the pattern's summary, the forms it holds, the
    choice per bucket and the bound call per decided bucket. A copied or unpickled layer starts afresh."""

    def __init__(self):
        self.key = None            # what the forms were made from (tensor identities and versions)
        self.pattern: Optional[_forms.Pattern] = None
        self.forms: Dict[str, Any] = {}
        self.choices: Dict[int, str] = {}   # bucket -> the route its calls take now (decided or rule)
        self.decided: Dict[int, bool] = {}
        self.runners: Dict[int, Any] = {}   # bucket -> bound call, once decided (the fast path of its token counts)
        self.algs: Dict[int, int] = {}      # bucket -> cuSPARSELt algorithm of the 2:4 form (prepare())
        self.skipped: Dict[str, str] = {}   # form -> why it was not built
        self.peak_transient = 0
        self.values_meta = None            # (shape, dtype, device) of the values the forms were made from
        self.signature = None              # the tuner's signature of this weight (without the bucket)
        self.stamp = None                  # (tensor, version, data_ptr) of the state the fast path checks
        self.check = None                  # x -> whether the fast path may run x (SparseLinear._stamp)
        self.trained = False               # the values changed since the forms were built: keep refresh maps
        self.rules: Dict[int, str] = {}    # bucket -> the rule's form (an undecided bucket samples around it)
        self.rent: Dict[str, float] = {}   # form not built yet -> what it would have gained so far (dense calls)
        self.renting: Dict[int, str] = {}  # bucket -> the form it runs dense for until that form repays its build
        self.pinned: set = set()           # forms a CUDA graph capture ran: held for the layer's life
        self.plan_requests: set = set()    # cuSPARSELt plan keys this layer ran dense once (_sparse24_call)

    def __getstate__(self):
        return {}

    def __setstate__(self, state):
        self.__init__()


class SparseLinear(nn.Module):
    """``y = act(x @ W.T + bias)`` with the weight ``W`` (out_features, in_features) stored sparse.

    The pattern (``crow_indices``, ``col_indices``) is a buffer; the stored values are the trainable
    parameter ``values``. Build one from a dense layer with :meth:`from_dense` (magnitude or Wanda pruning,
    also to 2:4) or from any sparse matrix with :meth:`from_sparse`. ``x`` is (..., in_features).

    ``format``: ``"auto"`` (default) chooses per token-count bucket (module docstring; ``layer.routes``
    shows the choices, ``layer.route_times`` the measurements, ``layer.memory()`` the bytes held); or one of
    ``"csr"``, ``"dense"``, ``"2:4"`` (the decode kernel up to 16 tokens for a pure 2:4 weight, cuSPARSELt
    above; any pattern: the entries beyond 2 per group of 4 run as a CSR residual), ``"bitmap"``, ``"slots"``
    and ``"csr16"`` (bfloat16/float16) to force a form. ``backend`` is the SpMM route of the CSR form
    (``"auto"``: st.spmm's own tuning).

    ``build_when_repaid`` (class attribute, or set on a layer; default True): in eager inference a form the
    layer does not hold yet and that needs more than ``rule.REPAY_AT_ONCE_CALLS`` calls to repay its build
    (the slot layout below about 80% sparsity) is built once it has (the calls that want it run dense until what it
    would have gained reaches its build cost; pruned/rule.py), so rare token counts never pay a build that
    their few calls cannot repay; meanwhile the layer holds its dense weight, and a CUDA graph captured after
    eager calls holds dense where a bucket still rents (``prepare()`` first). False: the chosen form is built
    at its first call, as compiled code (the op) and ``prepare()`` always do.
    """

    build_when_repaid = True

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
        self.stored_format: Optional[str] = None  # the compact layer's one form (None: training mode)
        self._stored_dtype = values.dtype  # a compact layer's dtype (a training layer's is its values')
        self._derived = _Derived()
        self._handle = _register(self)

    @property
    def _dtype(self) -> torch.dtype:
        """The dtype x must have: the values' (which ``.to(dtype)`` converts) or a compact layer's stored one."""
        values = self._parameters.get("values")
        return values.dtype if values is not None else self._stored_dtype

    # Copies (copy.deepcopy, pickle) get their own handle and derived state.
    def __setstate__(self, state):
        if "_stored_dtype" not in state and "_dtype" in state:  # pickled before the dtype followed the values
            state = dict(state, _stored_dtype=state.pop("_dtype"))
        super().__setstate__(state)
        self._derived = _Derived()
        self._handle = _register(self)

    def _apply(self, fn, recurse=True):
        # .to() / .cuda() move the index tensors: a pruning's known pattern stays known (and the old tensors
        # are not held by it)
        known = self.__dict__.pop("_known_residual", None)
        before = (self._buffers.get("crow_indices"), self._buffers.get("col_indices"))
        out = super()._apply(fn, recurse)
        after = (self._buffers.get("crow_indices"), self._buffers.get("col_indices"))
        if known is not None and None not in after and _same_tensors(known[0], before):
            stamps = _stamps_if_versioned(after)
            if stamps is not None:
                self.__dict__["_known_residual"] = (stamps, known[1])
        return out

    # Setting what a bound call captured (the epilogue, the format, the state tensors) drops the fast path.
    _CAPTURED = frozenset({"activation", "negative_slope", "format", "backend", "values", "bias", "crow_indices",
                           "col_indices", "build_when_repaid"})

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in ("crow_indices", "col_indices"):
            self.__dict__.pop("_known_residual", None)
        if name in SparseLinear._CAPTURED:
            derived = self.__dict__.get("_derived")
            if derived is not None:
                derived.stamp, derived.check, derived.key = None, None, None
                derived.runners = {}

    def _state_tensors(self):
        if self.stored_format is None:
            return (self._parameters["values"], self._buffers["crow_indices"], self._buffers["col_indices"])
        return tuple(self._stored_buffers().values())

    def _make_stamp(self):
        return _stamps_if_versioned(self._state_tensors())  # None for inference tensors: no fast path

    def _stamp(self, derived: _Derived) -> None:
        """Record the state tensors the bound calls were made from, and the fast path's test of a call: x is
        (N, in_features) of the layer's dtype, the state tensors are the same objects at the same versions
        and addresses, and autograd records nothing (one closure: about half the time of a general loop)."""
        stamp = derived.stamp = self._make_stamp()
        derived.check = None
        if stamp is None:
            return
        dtype, in_f, grad_enabled = self._dtype, self.in_features, torch.is_grad_enabled
        params, buffers = self._parameters, self._buffers  # the module's dicts, read live (no reference to it)

        def records_grad(x) -> bool:
            values, bias = params.get("values"), params.get("bias")
            return grad_enabled() and (x.requires_grad or (values is not None and values.requires_grad)
                                       or (bias is not None and bias.requires_grad))

        if self.stored_format is None and len(stamp) == 3:
            (v, v_version, v_ptr), (crow, crow_version, crow_ptr), (col, col_version, col_ptr) = stamp

            def check(x):
                return (x.dtype == dtype and x.dim() == 2 and x.shape[1] == in_f
                        and params["values"] is v and buffers["crow_indices"] is crow and buffers["col_indices"] is col
                        and v._version == v_version and crow._version == crow_version and col._version == col_version
                        and v.data_ptr() == v_ptr and crow.data_ptr() == crow_ptr and col.data_ptr() == col_ptr
                        and not records_grad(x))
        else:
            keys = tuple(k for k in buffers if k.startswith("stored_") and k != "stored_summary")

            def check(x):
                if x.dtype != dtype or x.dim() != 2 or x.shape[1] != in_f:
                    return False
                now = tuple(buffers.get(k) for k in keys)
                return _same_tensors(stamp, now) and not records_grad(x)

        derived.check = check

    # --- construction --------------------------------------------------------------------------------

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
        matrix; ``"row"`` keeps the ``round((1 - sparsity) * in)`` highest of each row; ``"2:4"`` keeps the 2
        highest of every group of 4 consecutive weights of a row (2:4 semi-structured sparsity), and a
        ``sparsity`` above 0.5 then removes the lowest kept scores of the whole matrix as well. The score
        is |w|, or with ``importance`` (in_features,) |w_ij| * importance_j: Wanda pruning when importance
        holds the L2 norms of the input channels over calibration data
        (:func:`sparsetorch.pruned.input_norms`). The mask is :func:`sparsetorch.pruned.prune_mask`'s.
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
        layer = cls(in_f, out_f, crow.to(index_dtype), cols.to(index_dtype), weight[rows, cols].clone(),
                    None if bias is None else bias.clone(), **kwargs)
        # The entries beyond 2 per group of 4 (forms.residual_24), read off the mask now rather than counted on
        # the CSR at the first call (a pass and a device sync there: 0.4-0.7 ms per 14336 x 4096 layer, H100);
        # "2:4" keeps at most 2 of every 4 by construction.
        stamps = _stamps_if_versioned((layer.crow_indices, layer.col_indices))
        if stamps is not None:
            layer.__dict__["_known_residual"] = (stamps, 0 if scheme == "2:4" else _entries_beyond_2_per_4(mask))
        return layer

    # --- what it holds -------------------------------------------------------------------------------

    @property
    def weight(self) -> CSR:
        """The weight as a :class:`sparsetorch.CSR` (sharing this layer's tensors; training mode only)."""
        self._require_csr("weight")
        return CSR(self.crow_indices, self.col_indices, self.values, (self.out_features, self.in_features))

    @property
    def nnz(self) -> int:
        if self.stored_format is not None:
            return self._pattern_summary()[0]
        return int(self.col_indices.numel())

    @property
    def density(self) -> float:
        return self.nnz / max(1, self.in_features * self.out_features)

    @property
    def routes(self) -> Dict[int, str]:
        """Token-count bucket (a power of two) -> the form its calls run now (decided or the rule's)."""
        return dict(self._derived.choices)

    @property
    def route_times(self) -> Dict[int, Dict[str, float]]:
        """Token-count bucket -> form -> milliseconds measured (the smallest counted sample, which decides, or
        prepare()'s time)."""
        out = {}
        table = tuner("linear")
        for bucket in self._derived.choices:
            for e in table.entries():
                if e["key"] == self._tuning_key(bucket):
                    out[bucket] = {n: min(c["costs_ms"]) for n, c in e["candidates"].items() if c["costs_ms"]}
        return out

    def memory(self) -> Dict[str, int]:
        """Bytes held: the CSR state ("csr", 0 for a compact layer), each form ("stored" for a compact
        layer's one form), the bias, their total ("held"), the dense weight's bytes for comparison
        ("dense_weight") and the largest transient buffer a call has made ("peak_transient": a compact
        layer's dense expansion)."""
        out: Dict[str, int] = {}
        if self.stored_format is None:
            out["csr"] = sum(t.numel() * t.element_size() for t in (self.crow_indices, self.col_indices, self.values))
        for name, form in self._derived.forms.items():
            if name == "csr":
                continue
            out["stored" if name == self.stored_format else name] = int(form.nbytes)
        if self.stored_format is not None and "stored" not in out:
            out["stored"] = sum(t.numel() * t.element_size() for t in self._stored_buffers().values())
        if self.bias is not None:
            out["bias"] = self.bias.numel() * self.bias.element_size()
        out["held"] = sum(out.values())
        out["dense_weight"] = self.out_features * self.in_features * torch.empty((), dtype=self._dtype).element_size()
        out["peak_transient"] = int(self._derived.peak_transient)
        return out

    def to_dense(self) -> torch.Tensor:
        """The dense (out_features, in_features) weight (differentiable w.r.t. ``values`` in training mode)."""
        if self.stored_format is not None:
            return self._stored_form().to_dense().clone()
        return self.weight.to_dense()

    # --- compact (inference) mode --------------------------------------------------------------------

    def compact(self, format: Optional[str] = None) -> "SparseLinear":
        """Keep one stored form and drop the CSR and every other form (inference only: ``values`` is no
        longer a parameter). ``format``: one of "2:4 decode", "slots", "csr"; default by the weight (see
        the module docstring). Returns self."""
        if self.stored_format is not None:
            return self
        pattern = self._pattern()
        available = _forms.applicable(pattern)
        name = format or (self.format if self.format in _forms.COMPACT_FORMS else None) or _rule.compact_form(
            pattern, available)
        if name not in _forms.COMPACT_FORMS:
            raise ValueError(f"format: expected one of {', '.join(_forms.COMPACT_FORMS)}, got {name!r}")
        if available.get(name) is not None:
            raise ValueError(f"format {name!r}: {available[name]}")
        with torch.no_grad():
            # the form held already (built from these values; not the CSR form, which holds the trainable
            # values), else built without the maps from the CSR's order that only training refreshes need
            # (a 2:4 split is a sort of every entry)
            form = self._derived.forms.get(name) if name != "csr" else None
            if form is None:
                form = self._build(name, keep_maps=False)
            if hasattr(form, "compact"):
                form.compact()
        tensors = {k: v.detach() for k, v in form.tensors().items()}
        banded = int(getattr(form.weight, "banded", False)) if name == "slots" else 0
        summary = torch.tensor([_STORED_CODES[name], banded, pattern.nnz, _DTYPE_CODES.index(self._dtype)],
                               dtype=torch.int64)
        self._become_compact(name, tensors, summary, self._dtype, form)
        return self

    def _become_compact(self, name: str, tensors: Dict[str, torch.Tensor], summary: torch.Tensor, dtype: torch.dtype,
                        form=None):
        self._stored_dtype = dtype
        self.__dict__.pop("_known_residual", None)
        for attr in ("crow_indices", "col_indices"):
            self._buffers.pop(attr, None)
        self._parameters.pop("values", None)
        for key in [k for k in self._buffers if k.startswith("stored_")]:
            del self._buffers[key]
        for key, t in tensors.items():
            self.register_buffer("stored_" + key, t)
        self.register_buffer("stored_summary", summary)
        if self.bias is not None:
            self.bias.requires_grad_(False)  # inference only: nothing of the layer trains
        self.stored_format = name
        derived = self._derived = _Derived()
        if form is not None:
            derived.forms[name] = form
            derived.key = self._compact_key()
            self._stamp(derived)

    def _stored_buffers(self) -> Dict[str, torch.Tensor]:
        return {k[len("stored_"):]: v for k, v in self._buffers.items()
                if k.startswith("stored_") and k != "stored_summary"}

    def _pattern_summary(self):
        """(stored entries, banded slot layout) of a compact layer."""
        summary = self._buffers["stored_summary"].tolist()
        return int(summary[2]), bool(summary[1])

    def _compact_key(self):
        return tuple((k, t.data_ptr(), t.device, tensor_version(t))
                     for k, t in sorted(self._stored_buffers().items()))

    def _stored_form(self):
        derived = self._derived
        key = self._compact_key()
        if derived.key != key or self.stored_format not in derived.forms:
            tensors = self._stored_buffers()
            _, banded = self._pattern_summary()
            form = _forms.from_tensors(self.stored_format, tensors, (self.out_features, self.in_features), self._dtype,
                                       self.backend, banded)
            self._derived = derived = _Derived()
            derived.forms[self.stored_format] = form
            derived.key = key
            self._stamp(derived)
        return derived.forms[self.stored_format]

    def _require_csr(self, what: str) -> None:
        if self.stored_format is not None:
            raise RuntimeError(f"{what}: this SparseLinear is compact (it holds only its {self.stored_format!r} form, "
                               "no CSR); build a new layer from the dense or sparse weight to train")

    # --- the derived state of a training-mode layer ---------------------------------------------------

    def _refresh(self) -> _Derived:
        """The derived state, rebuilt where the layer's tensors changed (new pattern, dtype or device:
        everything; new values: the forms repack them in place)."""
        derived = self._derived
        if self.stored_format is not None:
            self._stored_form()
            return self._derived
        v, crow, col = self._parameters["values"], self._buffers["crow_indices"], self._buffers["col_indices"]
        key = (tensor_version(v), tensor_version(crow), tensor_version(col), v.data_ptr(), crow.data_ptr(),
               col.data_ptr())
        key += (id(self._parameters.get("bias")), self.activation, self.negative_slope, self.format, self.backend)
        if key == derived.key:
            return derived
        old = derived.key or ()
        meta = (tuple(v.shape), v.dtype, v.device)
        if key[1:3] + key[4:6] != old[1:3] + old[4:6] or meta != derived.values_meta:
            derived = self._derived = _Derived()
        else:
            derived.runners = {}
            if key[:6] != old[:6]:
                derived.trained = True  # the layer trains: forms built from now on keep their refresh maps
                with torch.no_grad():
                    for name, form in list(derived.forms.items()):
                        if name == "dense":
                            form.weight = self.weight.to_dense().detach()
                        elif not getattr(form, "refreshable", True):
                            del derived.forms[name]  # built again, with its maps, when next used
                        elif hasattr(form, "set_values"):
                            form.set_values(v.detach())
        derived.key = key
        derived.values_meta = meta
        self._stamp(derived)
        return derived

    def _pattern(self, derived: Optional[_Derived] = None) -> _forms.Pattern:
        """The pattern's analysis. ``derived``: the state a caller has just refreshed (the slow path refreshes
        once per call: each refresh reads 6 tensors' versions and addresses, ~2.7 us on the CI CPU)."""
        derived = self._refresh() if derived is None else derived
        if derived.pattern is None:
            if self.stored_format is not None:
                raise RuntimeError("a compact layer has no pattern to analyse")
            crow, col = self.crow_indices, self.col_indices
            known = self.__dict__.pop("_known_residual", None)  # from_dense: (these index tensors, residual)
            residual = pairs = None
            if known is not None and _same_tensors(known[0], (crow, col)):
                # columns increase in each row (mask.nonzero): with at most 2 of every 4 kept and half the
                # positions kept, every group holds exactly 2 in order, the pair layout (no check pass, no sync)
                residual = known[1]
                m, k = self.out_features, self.in_features
                pairs = residual == 0 and k % 4 == 0 and col.numel() == m * k // 2
                self.__dict__["_known_residual"] = known  # kept only while it holds (it holds the tensors it names)
            derived.pattern = _forms.Pattern(crow, col, (self.out_features, self.in_features), self.values.dtype,
                                             self.values.device, residual, pairs)
        return derived.pattern

    def _tuning_key(self, bucket: int) -> tuple:
        """The "linear" tuner's signature of a call in this bucket (module docstring)."""
        derived = self._derived
        sig = derived.signature
        if sig is None:
            device = self._weight_device()
            name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
            if self.stored_format is not None:
                nnz, _ = self._pattern_summary()
                kind = "compact:" + self.stored_format
            else:
                p = self._pattern()
                nnz, kind = p.nnz, p.kind()
            density = round(nnz / max(1, self.out_features * self.in_features), 2)
            sig = derived.signature = (name, str(self._dtype).replace("torch.", ""), self.out_features,
                                       self.in_features, kind, density, self.bias is not None, self.activation)
        return sig + (bucket,)

    def _weight_device(self) -> torch.device:
        """Where the weight lives: a compact layer's stored form, else the CSR's values."""
        return self.stored_buffer_device() if self.stored_format else self.values.device

    def stored_buffer_device(self) -> torch.device:
        return next(iter(self._stored_buffers().values())).device

    # --- choosing and running -----------------------------------------------------------------------

    def _candidates(self, n: int, rule: str, pattern: _forms.Pattern) -> List[str]:
        """What an undecided call of n tokens may sample without building anything: the rule's form and the
        forms the neighbouring buckets (n/2, 2n) take, where the layer holds them and they apply at n
        (crossovers fall between neighbours, and a form never sampled far from where it wins costs no more
        than a few steady calls). A compact layer samples nothing (_choose)."""
        derived = self._derived
        available = _forms.applicable(pattern, n)
        bucket = _bucket(n)
        out = [rule]
        for neighbour in (bucket // 2, bucket * 2):
            name = derived.choices.get(neighbour) if neighbour not in derived.renting else None
            if name is not None and name not in out and name in derived.forms and available.get(name) is None:
                out.append(name)
        return out

    def _rule(self, n: int, pattern: Optional[_forms.Pattern] = None) -> str:
        if self.stored_format is not None:
            if self.stored_format == "csr":
                return "csr" if self.stored_buffer_device().type != "cuda" else "expand"
            return _rule.compact_choice(self.stored_format, _StoredPattern(self), n)
        if self.format != "auto":
            return self._forced(n)
        pattern = self._pattern() if pattern is None else pattern
        return _rule.first_choice(pattern, n, _forms.applicable(pattern, n))

    def _forced(self, n: int) -> str:
        fmt = self.format
        if fmt == "2:4":
            p = self._pattern()
            if n <= SPARSE24_DECODE_TOKENS and _forms.applicable(p, n).get("2:4 decode") is None:
                return "2:4 decode"
            # forced: cuSPARSELt with whatever residual the pattern has (the residual limit is "auto"'s)
            reason = _sparse24.sparse24_applies(p.shape, p.dtype, p.device)
            if reason is not None and self.values.device.type == "cuda":
                raise ValueError(f"format '2:4': {reason}")
        return fmt

    def _form(self, name: str, device: torch.device, derived: Optional[_Derived] = None):
        """The form ``name``, built now if the layer does not hold it (never during a graph capture).
        ``derived``: as for _pattern."""
        # current (a first use replaces it), so the form is stored where it is read
        derived = self._refresh() if derived is None else derived
        form = derived.forms.get(name)
        if form is not None:
            return form
        if name == "csr":
            form = _forms.CsrForm(self.crow_indices, self.col_indices, self.values, (self.out_features, self.in_features),
                                  self.backend)
        else:
            keep = derived.trained or self.format != "auto"
            form = _outside_graph_pool(lambda: self._build(name, keep), device)
        derived.forms[name] = form
        return form

    def _build(self, name: str, keep_maps: bool):
        """The form ``name`` built from the layer's CSR, or from its dense form where it holds one (no second
        expansion of the CSR). ``keep_maps``: with the maps from the CSR's order that training refreshes use."""
        held = self._derived.forms.get("dense")
        return _forms.build(name, self._pattern(), self.crow_indices, self.col_indices, self.values.detach(),
                            self.backend, keep_maps, held.weight if held is not None else None)

    def _choose(self, x: torch.Tensor, bucket: int, rent: bool = False):
        """(route, sample or None) for this call; sets the bucket's current choice. ``rent``: a form not
        held yet is built only once it has repaid its build (_renting); until then the call runs dense."""
        derived = self._derived
        n = x.shape[0]
        capturing = x.is_cuda and torch.cuda.is_current_stream_capturing()
        if self.format != "auto" and self.stored_format is None:
            route, sample = self._forced(n), None
            derived.decided[bucket] = True
        elif self.stored_format is not None:
            # a compact layer's route is its rule's alone: a sample of the dense expansion where the stored
            # form serves costs tens of its calls, and no table means no decision of another build or
            # version (a cache file) overrides the rule
            route, sample = self._rule(n), None
            derived.rules[bucket] = route
            derived.decided[bucket] = True
        else:
            key = self._tuning_key(bucket)
            pattern = self._pattern(derived)  # _run refreshed the derived state
            rule = self._rule(n, pattern)
            table = tuner("linear")
            decided = table.decided(key)
            if decided is not None and not self._runs_here(decided, pattern):
                decided = None  # e.g. a cache file's, of a build with other GPU code: the rule decides instead
            derived.rules[bucket] = rule
            if derived.renting.pop(bucket, None) is not None:  # its bound rent call goes with it
                derived.runners.pop(bucket, None)
            want = (decided or rule).partition("#")[0]
            if rent and not capturing and self._renting(want, pattern):
                derived.decided[bucket] = False
                derived.renting[bucket] = want  # _run binds a call that pays the rent (_rent_runner)
                derived.choices[bucket] = "dense"
                return "dense", None
            if decided is not None:
                route, sample = decided, None
            else:
                route, sample = table.choose(key, self._candidates(n, rule, pattern), rule, x.device, size=n)
            decided = table.decided(key) is not None
            derived.decided[bucket] = decided
        if capturing and route.partition("#")[0] not in derived.forms and route not in ("csr", "expand"):
            # no build inside a capture: the rule among the held forms
            route, sample = self._held_fallback(n), None
        derived.choices[bucket] = route.partition("#")[0]
        if capturing:  # a graph holds this form's tensors now: never freed (_release_unused)
            derived.pinned.add(route.partition("#")[0])
        return route, sample

    def _runs_here(self, route: str, pattern: Optional[_forms.Pattern] = None) -> bool:
        """Whether a decided route names a form this layer can run with this build on this device (a tuning
        cache file may hold another build's decisions for the same GPU and signature). Token limits are speed
        rules, not checked here; off CUDA the 2:4 form runs as its reference, as a forced format="2:4" does."""
        name = route.partition("#")[0]
        if name not in _forms.FORM_NAMES:
            return False
        available = _forms.applicable(self._pattern() if pattern is None else pattern)
        return available.get(name) is None or (name == "2:4" and not self.values.is_cuda)

    def _renting(self, name: str, pattern: _forms.Pattern) -> bool:
        """Whether this call runs dense because the form ``name``, not held yet, has not repaid its
        build: each call that wants it adds what it would have gained (pruned/rule.py: build_cost, gain), and
        it is built once that reaches its build cost. A form that repays its build within a few calls
        (rule.rents) or has no cost model is built at once."""
        derived = self._derived
        if name in derived.forms:
            return False
        if not _rule.rents(name, pattern):
            return False
        return _pay_rent(derived, name, _rule.gain(name, pattern), _rule.build_cost(name, pattern))

    def _held_fallback(self, n: int) -> str:
        derived = self._derived
        available = _forms.applicable(self._pattern(), n)
        held = [name for name in derived.forms if available.get(name) is None]
        for name in ("dense", "2:4 decode", "slots", "csr16", "bitmap", "2:4"):
            if name in held:
                return name
        return "csr"

    def _runner(self, route: str, x: torch.Tensor, bucket: int, decided: bool = False):
        """The call of ``route`` with the layer's epilogue bound: y = call(x2). ``decided``: the bucket's
        bound call (not a sample, not prepare()'s timing), where the 2:4 form defers new cuSPARSELt plans."""
        name, _, alg = route.partition("#")
        derived = self._derived  # current: both callers (_run, prepare) refreshed it
        bias, act, slope = self._parameters.get("bias"), self.activation, self.negative_slope
        if name == "2:4" and decided and self.stored_format is None and self.format == "auto":
            return self._sparse24_call(int(alg) if alg else derived.algs.get(bucket, -1), bias, act, slope)
        if name == "expand":
            form = self._stored_form()
            derived = self._derived  # _stored_form replaces the state where the stored tensors changed

            def expand_call(a, form=form, derived=derived):
                dense = form.to_dense()
                derived.peak_transient = max(derived.peak_transient, dense.numel() * dense.element_size())
                return _forms.DenseForm(dense)(a, bias, act, slope)

            return expand_call
        form = self._stored_form() if name == self.stored_format else self._form(name, x.device, derived)
        if name == "2:4":
            code = int(alg) if alg else derived.algs.get(bucket, -1)
            return lambda a: form(a, bias, act, slope, code)
        if name == "dense" and act == "none":  # torch's linear with positional arguments (0.2 us less than a
            return _linear_call(form.weight, bias)  # partial's keywords on this CPU)
        return lambda a: form(a, bias, act, slope)

    def _sparse24_call(self, code: int, bias, act: str, slope: float):
        """The 2:4 (cuSPARSELt) form's call for a decided bucket. cuSPARSELt makes a plan per token count
        (padded to 8): on an H100 a 14336 x 4096 call at a new count of 136-2001 tokens took 1.4-1.7 ms against
        0.2-0.8 ms repeated, and the dense form 0.3-0.5 ms (docs/performance.md, the serving sequence). So where
        the layer holds its dense form, a count's first call runs on it and the plan is made the second time
        that count comes to this layer (a server's ever-new prefill sizes stay on dense; a repeated size pays one
        dense call; a plan another layer of the same shape made is used at once: in the serving profile's prepared
        2:4 block, gate's first call at a new count had made up's the plan-making second, 1.1-1.5 ms, H200); the
        2:4 form itself is built at its first use. During a CUDA graph capture nothing is built:
        a form not held yet runs on the dense one."""
        derived = self._derived
        shape = (self.out_features, self.in_features)
        residual = bool(self._pattern(derived).residual24)

        def call(a):
            dense = derived.forms.get("dense")
            form = derived.forms.get("2:4")
            if dense is not None and _plans_per_token_count(a):
                capturing = a.is_cuda and torch.cuda.is_current_stream_capturing()
                key = _sparse24.PLANS.key(a, shape, residual, bias, code)
                # no 2:4 call made this plan yet (layers of one shape share plans: gate and up) and this
                # layer's own first request for it: dense, and the layer's second request makes the plan
                first = not capturing and _sparse24.PLANS.seen(key) == 0 and key not in derived.plan_requests
                if first or (capturing and form is None):
                    if first:
                        if len(derived.plan_requests) >= _sparse24.PLAN_CACHE_ENTRIES:
                            derived.plan_requests.clear()
                        derived.plan_requests.add(key)
                    return F_torch.linear(a, dense.weight, bias) if act == "none" else dense(a, bias, act, slope)
            if form is None:
                form = self._form("2:4", a.device)
            return form(a, bias, act, slope, code)

        return call

    def _run(self, x: torch.Tensor, bias_act: bool = True, rent: bool = False) -> torch.Tensor:
        """The forward on the chosen form, recording no gradient: x (N, in) -> (N, out). ``bias_act``: with
        the layer's bias and activation (else the bare product, for the training path). ``rent``: forms are
        built once they repay their build (the eager inference call); without it (the ops: compiled code,
        training) the chosen form is built at once, and a bucket's bound rent call is passed by."""
        derived = self._refresh()
        n = x.shape[0]
        bucket = _bucket(n)
        if bias_act:
            call = derived.runners.get(bucket)
            if call is not None and (rent or not getattr(call, "renting", False)):
                return call(x)
        route, sample = self._choose(x, bucket, rent)
        call = self._runner(route, x, bucket, decided=sample is None) if bias_act else self._bare(route, x, bucket)
        if sample is None:
            y = call(x)
        else:
            sample.start()
            try:
                y = call(x)
            except (RuntimeError, ValueError, NotImplementedError) as e:
                tuner("linear").fail(self._tuning_key(bucket), route)
                derived.skipped[route] = f"{type(e).__name__}: {e}"
                raise
            sample.stop()
            tuner("linear").submit(self._tuning_key(bucket), route, sample, size=n)
        if bias_act and not (x.is_cuda and torch.cuda.is_current_stream_capturing()):
            renting = derived.renting.get(bucket)
            if renting is not None:  # bound too, so the calls that pay the rent take the fast path
                call = self._rent_runner(bucket, renting, call)
            if renting is not None or derived.decided.get(bucket):
                derived.runners[bucket] = call
            if renting is None and derived.decided.get(bucket):
                self._release_unused()
        return y

    def _rent_runner(self, bucket: int, name: str, dense_call):
        """The bound call of a bucket that runs dense until the form ``name`` repays its build (_renting):
        each call pays its gain; the call that would repay it (or that finds the form built meanwhile, by
        prepare() or a compiled call) drops the bound calls of every bucket renting ``name`` and goes back
        through _run, which builds or takes the form. Holds the layer weakly (no reference cycle)."""
        derived = self._derived
        pattern = self._pattern()
        cost, gain = _rule.build_cost(name, pattern), _rule.gain(name, pattern)
        layer = weakref.ref(self)

        def call(a):
            owner = layer()
            if name not in derived.forms and owner.build_when_repaid and _pay_rent(derived, name, gain, cost):
                if a.is_cuda and torch.cuda.is_current_stream_capturing():
                    derived.pinned.add("dense")  # a graph holds the dense weight now: never freed (_release_unused)
                return dense_call(a)
            derived.runners = {b: c for b, c in derived.runners.items()
                               if b != bucket and derived.renting.get(b) != name}
            return owner._run(a, rent=owner.build_when_repaid)

        call.renting = True
        return call

    def _bare(self, route: str, x: torch.Tensor, bucket: int):
        name, _, alg = route.partition("#")
        if name == "expand":
            raise RuntimeError("a compact layer does not train")
        form = self._form(name, x.device)
        if name == "2:4":
            code = int(alg) if alg else self._derived.algs.get(bucket, -1)
            return lambda a: form(a, None, "none", 0.0, code)
        return lambda a: form(a, None, "none", 0.0)

    def _release_unused(self) -> None:
        """Free the forms no bucket takes now and no undecided bucket samples (its rule's form and its
        neighbours' choices, which are buckets' choices themselves), but never one a CUDA graph captured
        (``pinned``: the graph reads its memory at every replay)."""
        derived = self._derived
        if self.stored_format is not None:
            return
        used = set(derived.choices.values()) | derived.pinned
        used.update(rule for b, rule in derived.rules.items() if not derived.decided.get(b))
        for name in [n for n in derived.forms if n not in used and n != "csr"]:
            del derived.forms[name]
            derived.runners = {b: c for b, c in derived.runners.items() if derived.choices.get(b) != name}

    # --- prepare: decide buckets now ------------------------------------------------------------------

    def prepare(self, token_counts: Optional[Iterable[int]] = None, *, budget_ms: float = 0.5,
                remeasure: bool = False, _shared: bool = False) -> Dict[int, str]:
        """Decide the form of every bucket of ``token_counts`` (default 1, 2, 4, ..., 2048) now: build every
        form that applies (but the CSR SpMM of a half-precision CUDA weight: ``rule.timed_forms``), time each
        on random input (clean L2, about ``budget_ms`` of device time per form), search cuSPARSELt's
        algorithm for the 2:4 form, record the decisions in the tuner (and so in the tuning cache file), and
        free the forms no bucket takes. A bucket an earlier ``prepare()`` decided, in this process or in
        the one that saved a loaded tuning cache file, keeps that decision and only has its form built (a
        second process starts in milliseconds); ``remeasure=True`` times it again. Returns bucket -> form.
        ``_shared`` (st.nn.prepare): a layer of this signature was just prepared; take its decisions, whatever
        made them, and time nothing."""
        counts = _buckets(token_counts)
        device = self._weight_device()
        derived = self._refresh()
        table = tuner("linear")
        result = {}
        with torch.no_grad():
            for bucket in counts:
                if self.format != "auto" and self.stored_format is None:
                    route = result[bucket] = derived.choices[bucket] = self._forced(bucket)
                    if route == "2:4":  # cuSPARSELt's algorithm for this bucket (the forced form's only choice)
                        derived.algs[bucket] = self._form("2:4", device).search(self._random_input(bucket, device),
                                                                                self._parameters.get("bias"))
                        derived.runners.pop(bucket, None)
                    continue
                key = self._tuning_key(bucket)
                # prepare()'s own decisions are kept, here or through a cache file; the online samples' are not (a
                # few real calls among the rule's form and its neighbours', no cuSPARSELt search), nor a compact
                # layer's (its one candidate, its rule, is timed again: one form)
                kept = None
                if _shared or (not remeasure and self.stored_format is None and table.measured(key)):
                    kept = table.decided(key)
                # (a compact layer's decision is its stored form or the expansion: its own rule's, no form to check)
                if kept is not None and (self.stored_format is not None or self._runs_here(kept)):
                    result[bucket] = self._take_decision(bucket, kept, device)
                    continue
                if _shared:
                    continue
                names = self._all_candidates(bucket)
                x = self._random_input(bucket, device)
                times, failed = {}, {}
                for name in names:
                    try:
                        route = name
                        if name == "2:4":
                            form = self._form(name, device)
                            derived.algs[bucket] = form.search(x, self._parameters.get("bias"))
                            route = f"2:4#{derived.algs[bucket]}"
                        call = self._runner(route, x, bucket)
                        times[route] = timing.time_call(lambda: call(x), device, l2="clean", budget_ms=budget_ms,
                                                        min_reps=3, max_reps=20)
                    except (RuntimeError, ValueError, NotImplementedError, TypeError) as e:
                        failed[name] = f"{type(e).__name__}: {e}"
                derived.skipped.update(failed)
                if not times:
                    continue
                best = min(times, key=times.get)
                table.decide(key, best, times)
                result[bucket] = self._take_decision(bucket, best, device)
        self._release_unused()
        return result

    def _random_input(self, n: int, device: torch.device) -> torch.Tensor:
        return torch.randn(n, self.in_features, device=device).to(self._dtype)

    def _take_decision(self, bucket: int, route: str, device: torch.device) -> str:
        """A bucket decided now (prepare): its form built and held (a training-mode layer), any call bound to
        the bucket dropped (it is bound again on its next call), no rent left to pay. Returns the form."""
        derived = self._derived
        name = route.partition("#")[0]
        if self.stored_format is None:
            self._form(name, device)
        derived.choices[bucket] = name
        derived.decided[bucket] = True
        derived.renting.pop(bucket, None)
        derived.runners.pop(bucket, None)
        return name

    def _all_candidates(self, n: int) -> Sequence[str]:
        if self.stored_format is not None:
            return [self._rule(n)]
        pattern = self._pattern()
        available = _forms.applicable(pattern, n)
        return _rule.timed_forms(pattern, n, [name for name in _forms.FORM_NAMES if available.get(name) is None])

    # --- forward -------------------------------------------------------------------------------------

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The steady inference call: a decided bucket's bound call (_run binds it), which holds while the state
        # tensors are the same objects at the same versions and addresses (_stamp; setting an attribute the call
        # captured drops every bound call: __setattr__). A renting bucket's call is bound only in eager calls
        # that rent, as these are (build_when_repaid is captured).
        if not torch.compiler.is_compiling():
            derived = self._derived
            call = derived.runners.get(_bucket(x.shape[0]))
            if call is not None:
                check = derived.check
                if check is not None and check(x):
                    return call(x)
        return self._forward(x)

    def _param_requires_grad(self) -> bool:
        params = self._parameters
        values, bias = params.get("values"), params.get("bias")
        return (values is not None and values.requires_grad) or (bias is not None and bias.requires_grad)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        in_f = self.in_features
        if x.shape[-1] != in_f:
            raise ValueError(f"x: expected last dimension {in_f} (in_features), got shape {tuple(x.shape)}")
        params = self._parameters
        values, bias = params.get("values"), params.get("bias")
        dtype = values.dtype if values is not None else self._dtype
        if x.dtype != dtype:
            raise TypeError(f"x: expected dtype {dtype} (the layer's), got {x.dtype}")
        x2 = x if x.dim() == 2 else x.reshape(-1, in_f)
        training = torch.is_grad_enabled() and (x2.requires_grad or (values is not None and values.requires_grad)
                                                or (bias is not None and bias.requires_grad))
        if training and values is None:
            raise RuntimeError("x: requires grad, but this SparseLinear is compact (inference only: it holds its "
                               f"{self.stored_format!r} form, no CSR to train); run it under torch.no_grad()")
        if torch.compiler.is_compiling():
            y = self._forward_op(x2, values, bias, training)
        elif training:
            self._require_csr("backward")
            y = _epilogue(self, torch.ops.sparsetorch.sparse_linear(x2, values, self._handle))
        else:
            y = self._run(x2, rent=self.build_when_repaid)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)

    def _forward_op(self, x2, values, bias, training):
        """The traced forward: one opaque op (the choice happens inside it, at run time)."""
        if training:
            self._require_csr("backward")
            return _epilogue(self, torch.ops.sparsetorch.sparse_linear(x2, values, self._handle))
        return torch.ops.sparsetorch.sparse_linear_inference(x2, self._handle)

    # --- state_dict ----------------------------------------------------------------------------------

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        self.__dict__.pop("_known_residual", None)  # another pattern may come in (copied into the same tensors)
        summary = state_dict.get(prefix + "stored_summary")
        if summary is not None:  # a compact layer's state: its stored form
            self._load_compact(state_dict, prefix, summary)
        elif state_dict.get(prefix + "crow_indices") is not None or state_dict.get(prefix + "col_indices") is not None:
            self._load_csr(state_dict, prefix)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
        if self.stored_format is not None:
            self._derived = _Derived()
            self._stored_form()  # checks the layout before any kernel reads it
        else:
            self._derived = _Derived()  # a new weight: its buckets are decided again

    def _load_csr(self, state_dict, prefix):
        if self.stored_format is not None:
            raise RuntimeError("load_state_dict: a compact layer loads a compact state_dict (its stored form); load "
                               "this CSR state into a training-mode SparseLinear, then compact() it")
        # A corrupt weight is refused before anything of the layer changes.
        crow = state_dict.get(prefix + "crow_indices", self.crow_indices)
        col = state_dict.get(prefix + "col_indices", self.col_indices)
        values = state_dict.get(prefix + "values")
        values = torch.zeros(col.shape, dtype=self.values.dtype) if values is None else values
        ensure_valid(CSR(crow, col, values, (self.out_features, self.in_features)))
        # Another sparsity means another nnz: take the incoming shapes.
        for name in ("crow_indices", "col_indices"):
            t = state_dict.get(prefix + name)
            if t is not None and t.shape != getattr(self, name).shape:
                setattr(self, name, torch.empty_like(t, device=getattr(self, name).device))
        t = state_dict.get(prefix + "values")
        if t is not None and t.shape != self.values.shape:
            self.values = nn.Parameter(torch.empty_like(t, device=self.values.device),
                                       requires_grad=self.values.requires_grad)

    def _load_compact(self, state_dict, prefix, summary):
        fields = summary.tolist() if isinstance(summary, torch.Tensor) and summary.numel() == 4 else None
        if fields is None or not 0 <= fields[0] < len(_forms.COMPACT_FORMS) or not 0 <= fields[3] < len(_DTYPE_CODES):
            raise ValueError(f"stored_summary: expected (form code, banded, entries, dtype code), got {summary}")
        name = _forms.COMPACT_FORMS[int(fields[0])]
        incoming = {k[len(prefix) + len("stored_"):]: v for k, v in state_dict.items()
                    if k.startswith(prefix + "stored_") and k != prefix + "stored_summary"}
        device = self._weight_device()
        tensors = {k: torch.empty_like(v, device=device) for k, v in incoming.items()}
        self._become_compact(name, tensors, torch.empty_like(summary, device="cpu"), _DTYPE_CODES[int(fields[3])])

    def extra_repr(self) -> str:
        routes = ", ".join(f"{b}: {r}" for b, r in sorted(self._derived.choices.items()))
        mode = f", compact={self.stored_format!r}" if self.stored_format else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, nnz={self.nnz} "
                f"(density {self.density:.3g}), bias={self.bias is not None}, activation={self.activation!r}, "
                f"format={self.format!r}{mode}" + (f", routes={{{routes}}}" if routes else ""))


class _StoredPattern:
    """What compact_choice reads of a compact layer (no CSR): device, dtype, density."""

    def __init__(self, layer: SparseLinear):
        self.device = layer.stored_buffer_device()
        self.dtype = layer._dtype
        self.density = layer.density


def _epilogue(layer: SparseLinear, y: torch.Tensor) -> torch.Tensor:
    """Bias + activation with autograd (one fused pass that also restores the row-major layout)."""
    if layer.bias is not None or layer.activation != "none":
        return F.bias_act(y, bias=layer.bias, activation=layer.activation, negative_slope=layer.negative_slope)
    return y.contiguous()


# --- the op torch.compile sees, and the backward ------------------------------------------------------

def _backward(layer: SparseLinear, grad: torch.Tensor, x: torch.Tensor, values: torch.Tensor, need_x: bool,
              need_values: bool):
    """(grad_x, grad_values) of y = x @ W^T: grad_x from the dense form when the layer holds one, else the
    cached transpose of the pattern (st.transpose's cache); grad_values by the SDDMM on the pattern."""
    gy = grad.contiguous()
    crow, col = layer.crow_indices, layer.col_indices
    grad_x = grad_values = None
    if need_x:
        dense = layer._derived.forms.get("dense")
        if dense is not None and dense.weight.dtype == gy.dtype:
            grad_x = gy @ dense.weight
        else:
            crow_t, col_t, perm = transpose_pattern(crow, col, layer.in_features)
            grad_x = spmm_call(crow_t, col_t, transpose_values(values.detach(), perm), gy.t()).t().contiguous()
    if need_values:
        grad_values = call_op(ops.sddmm, (), crow, col, gy.t().contiguous(), x.t().contiguous(), 1.0, "auto", True)
    return grad_x, grad_values


def _buckets(token_counts: Optional[Iterable[int]]) -> List[int]:
    """The buckets prepare() decides for ``token_counts`` (default DEFAULT_TOKEN_COUNTS), in order."""
    return sorted({_bucket(int(n)) for n in (token_counts or DEFAULT_TOKEN_COUNTS) if int(n) > 0})


def _pay_rent(derived: _Derived, name: str, gain: float, cost: float) -> bool:
    """One more call that wanted form ``name`` adds its ``gain`` to the form's rent (in dense calls); True while
    the rent falls short of the build ``cost`` (the call runs dense), False once repaid (the form is built)."""
    paid = derived.rent[name] = derived.rent.get(name, 0.0) + gain
    return paid < cost


def _linear_call(weight: torch.Tensor, bias: Optional[torch.Tensor]):
    linear = F_torch.linear
    return lambda a: linear(a, weight, bias)


def _entries_beyond_2_per_4(mask: torch.Tensor) -> int:
    """forms.residual_24 of the CSR of a pruning mask (out, in), from the mask: the kept positions beyond 2 in
    each group of 4 consecutive columns of a row (the last group may be shorter)."""
    m, k = mask.shape
    full = k // 4 * 4
    counts = mask[:, :full].reshape(m, full // 4, 4).sum(-1, dtype=torch.int16)
    if full < k:
        counts = torch.cat([counts, mask[:, full:].sum(-1, dtype=torch.int16, keepdim=True)], dim=1)
    return int((counts - 2).clamp_(min=0).sum())


def _tensor_stamps(tensors) -> tuple:
    return tuple((t, t._version, t.data_ptr()) for t in tensors)


def _stamps_if_versioned(tensors) -> Optional[tuple]:
    """_tensor_stamps, or None where a tensor was made in inference mode (no version counter: nothing can tell
    whether it changed, so nothing is recorded about it)."""
    return None if any(tensor_version(t) < 0 for t in tensors) else _tensor_stamps(tensors)


def _same_tensors(stamps, tensors) -> bool:
    """Whether ``tensors`` are the ones ``_tensor_stamps`` recorded, unmodified (same objects, versions, data)."""
    return len(stamps) == len(tensors) and all(held is t and t._version == version and t.data_ptr() == ptr
                                               for (held, version, ptr), t in zip(stamps, tensors))


def _plans_per_token_count(x: torch.Tensor) -> bool:
    """Whether the 2:4 form's calls on x make a plan per token count (cuSPARSELt, on CUDA; the CPU runs a
    reference)."""
    return x.is_cuda


def _op_input(handle: int, x: torch.Tensor, op: str) -> SparseLinear:
    """The layer under ``handle``, once ``x`` is what its ops take: (N, in_features) of the layer's dtype
    (the layer's forward reshapes and checks before it calls them; a direct call is checked here)."""
    layer = _layer(handle)
    if x.dim() != 2 or x.shape[1] != layer.in_features or x.dtype != layer._dtype:
        raise ValueError(f"{op}: x: expected (N, {layer.in_features}) of {layer._dtype} (the layer's in_features "
                         f"and dtype), got {tuple(x.shape)} of {x.dtype}")
    return layer


@torch.library.custom_op("sparsetorch::sparse_linear", mutates_args=())
def _sparse_linear_op(x: torch.Tensor, values: torch.Tensor, handle: int) -> torch.Tensor:
    """x @ W^T (no bias, no activation) for the training-mode SparseLinear registered under ``handle``, on the
    form its token-count bucket takes; ``values`` is the layer's CSR values parameter, an input so that
    autograd reaches it. Other values on the layer's pattern (a functional call, gradcheck) run the CSR
    route on them: the op is a function of its inputs."""
    layer = _op_input(handle, x, "sparse_linear")
    if layer.stored_format is not None:
        raise RuntimeError("sparse_linear: the layer is compact (no CSR values to differentiate); run it under "
                           "torch.no_grad()")
    if values.data_ptr() != layer.values.data_ptr():
        return _forms.CsrForm(layer.crow_indices, layer.col_indices, values, (layer.out_features, layer.in_features))(x)
    return layer._run(x, bias_act=False)


@_sparse_linear_op.register_fake
def _(x, values, handle):
    return x.new_empty((x.shape[0], _layer(handle).out_features))


# The inference op: the layer's bias and activation fused, no autograd formula. Defined with torch.library
# directly (one dispatcher hop into Python per call, where custom_op adds a Python autograd layer and a
# redispatch): compiled decode pays it once per layer and step.
_LIB = torch.library.Library("sparsetorch", "FRAGMENT")
_LIB.define("sparse_linear_inference(Tensor x, int handle) -> Tensor")


def _sparse_linear_inference(x: torch.Tensor, handle: int) -> torch.Tensor:
    """act(x @ W^T + bias) for the SparseLinear under ``handle`` (training mode or compact), on the form its
    token-count bucket takes; records no gradient."""
    return _op_input(handle, x, "sparse_linear_inference")._run(x)


_LIB.impl("sparse_linear_inference", _sparse_linear_inference, "CompositeExplicitAutograd")


@torch.library.register_fake("sparsetorch::sparse_linear_inference", lib=_LIB)
def _(x, handle):
    return x.new_empty((x.shape[0], _layer(handle).out_features))


@torch.library.custom_op("sparsetorch::sparse_linear_backward", mutates_args=())
def _sparse_linear_backward_op(grad: torch.Tensor, x: torch.Tensor, values: torch.Tensor, handle: int, need_x: bool,
                               need_values: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """(grad_x, grad_values) of sparse_linear without epilogue; an empty tensor for a gradient not needed."""
    gx, gv = _backward(_layer(handle), grad, x, values, need_x, need_values)
    return (gx if gx is not None else x.new_empty(0)), (gv if gv is not None else values.new_empty(0))


@_sparse_linear_backward_op.register_fake
def _(grad, x, values, handle, need_x, need_values):
    return (x.new_empty(x.shape) if need_x else x.new_empty(0)), (values.new_empty(values.shape) if need_values
                                                                   else values.new_empty(0))


def _setup(ctx, inputs, output):
    x, values, handle = inputs
    ctx.save_for_backward(x, values)
    ctx.handle = handle


def _op_backward(ctx, grad):
    x, values = ctx.saved_tensors
    need_x, need_values = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
    gx, gv = torch.ops.sparsetorch.sparse_linear_backward(grad, x, values, ctx.handle, need_x, need_values)
    return (gx if need_x else None), (gv if need_values else None), None


_sparse_linear_op.register_autograd(_op_backward, setup_context=_setup)


# --- whole models -----------------------------------------------------------------------------------

def _layers(model: nn.Module):
    return [(name, m) for name, m in model.named_modules() if isinstance(m, SparseLinear)]


def compact(model: nn.Module, format: Optional[str] = None) -> nn.Module:
    """:meth:`SparseLinear.compact` on every SparseLinear of ``model``; returns the model."""
    for _, layer in _layers(model):
        layer.compact(format)
    return model


def prepare(model: nn.Module, token_counts: Optional[Iterable[int]] = None, *, progress: bool = True,
            budget_ms: float = 0.5, remeasure: bool = False) -> Dict[str, Dict[int, str]]:
    """:meth:`SparseLinear.prepare` on every SparseLinear of ``model`` (format "auto" and compact layers of
    one signature share the decisions: each signature is timed once; with a tuning cache file of an earlier
    run, none is; a layer forced to a format is prepared alone), with a progress line on stderr. Returns
    name -> bucket -> form."""
    layers = _layers(model)
    done, out, start = set(), {}, time.perf_counter()
    for i, (name, layer) in enumerate(layers):
        sig = layer._tuning_key(0)[:-1]
        # a layer forced to one format records nothing in the tuner (its prepare() searches its own 2:4
        # algorithms): it neither shares nor lends decisions
        shares = layer.format == "auto" or layer.stored_format is not None
        taken = shares and sig in done  # a layer of this signature decided: this one takes it and builds the forms
        out[name] = layer.prepare(token_counts, budget_ms=budget_ms, remeasure=remeasure, _shared=taken)
        if shares:
            done.add(sig)
        if progress:
            bar = "#" * (20 * (i + 1) // len(layers))
            sys.stderr.write(f"\rsparsetorch prepare [{bar:<20}] {i + 1}/{len(layers)} layers, "
                             f"{time.perf_counter() - start:.1f} s")
            sys.stderr.flush()
    if progress and layers:
        sys.stderr.write("\n")
    return out
