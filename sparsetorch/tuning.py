"""One mechanism for "pick the fastest of several ways to run this call" (docs/tuning.md).

A decision is keyed on a **signature** of the call (not on one tensor: similar calls share it), has a
**rule** that decides the first call without timing, and is refined online within a **budget**: while a
signature is undecided, its calls run the candidates in turn *as the real calls*, each timed by a pair of
device events read later without a sync (:class:`sparsetorch.timing.Sample`). The policy, the same in
both implementations below:

* the first sample of each candidate is a warm-up and is discarded (cold code, workspaces);
* after one counted sample each, candidates slower than ``PRUNE_FACTOR`` x the best are dropped, but for the
  rule's: one sample can carry a one-time cost (a library kernel loaded on its first use), and only the rule's
  candidate is a choice the signature falls back on;
* once every survivor has ``SAMPLES`` counted samples, the signature is decided for the fastest *minimum*
  (ties: the rule's): a disturbance of a sample run as a real call (the GPU idle while the host launches,
  a kernel loaded lazily, another stream's work) only adds time, so the smallest sample is the nearest to
  the candidate's own cost (docs/tuning.md, item 3, gives the case that showed it);
* the candidate handed out is the one with the fewest handed out, ties in an order that turns by one every
  round: signatures called at fixed places in a step (a model's gate and up layers share one) have each
  candidate sampled at each place, not one candidate always first on an idle GPU;
* calls of one signature may differ in size (SparseLinear: the token counts of a bucket), and a candidate's
  time grows with the size at its own rate: only samples of sizes within ``SIZE_WINDOW`` of the largest
  size the signature has run count, smaller calls take the best so far without a sample, and a candidate
  pruned on samples that no longer count is offered again;
* no call synchronises, and no call costs more than one run of one candidate;
* the table is bounded (least recently used signatures dropped first) and thread-safe;
* inside CUDA graph capture nothing is sampled: the decided choice, else the rule.

Three tables use it:

* ``"spmm"``: the routes of ``st.spmm(backend="auto")``, whose bookkeeping runs in C++ on every call
  (csrc/common/spmm_tuning.h, the events in csrc/cuda/spmm_autotune.cu): the host cost of a small product
  is a few microseconds, so its hot path stays native. Its signature: dtype, B's width and layout, batch
  layout, log2 buckets of the shape and entries, the row-length histogram's shape, the GPU.
* ``"linear"``: SparseLinear's forms per token-count bucket (sparsetorch/nn/linear.py). Signature: the
  GPU, dtype, shape, the pattern's kind and density, the epilogue, the bucket.
* ``"plan"``: SpmmPlan's prebuilt layouts against the route "auto" takes (sparsetorch/plan.py).

Decisions persist in an opt-in **cache file** (one file for the three tables)::

    import sparsetorch as st
    st.set_tuning_cache("~/.cache/sparsetorch/tuning.json")  # loads what an earlier run decided
    ...                                                       # saved at exit, or st.save_tuning_cache()

Entries are grouped by build (sparsetorch's, torch's and CUDA's versions and the signature layouts); a
group of another build is ignored and kept. Every signature names its GPU model, so entries of other
GPUs never match.
"""
from __future__ import annotations

import atexit
import json
import os
import tempfile
import threading
import warnings
from collections import OrderedDict
from typing import Dict, Hashable, List, Optional, Sequence, Tuple

import torch

from sparsetorch._cache import register_clear
from sparsetorch._ops import ops
from sparsetorch._version import __version__
from sparsetorch.timing import Sample

__all__ = ["Tuner", "tuner", "TUNER_KINDS", "clear_tuning", "save_tuning_cache", "set_tuning_cache",
           "tuning_signature", "tuning_table", "SIGNATURE_FIELDS", "SAMPLES", "WARMUP_SAMPLES", "PRUNE_FACTOR",
           "SIZE_WINDOW"]

# The policy (the same constants as csrc/common/spmm_tuning.h: kWarmupSamples, kSamples, kPruneFactor).
WARMUP_SAMPLES = 1
SAMPLES = 3
PRUNE_FACTOR = 2.0
DEFAULT_CAPACITY = 4096
MAX_IN_FLIGHT = 64  # samples whose events are not read yet, per table; beyond it calls take the best so far
# Samples count from this fraction of the largest size a signature has run. SparseLinear's bucket (n/2, n]
# spans 2x in tokens, and the 2:4 decode kernel's time steps per 8 tokens while dense's is flat (it takes
# 0.71-0.88x dense's time at 16 tokens, 1.3x at 32 on a wide weight: pruned/rule.py), so samples at mixed
# counts decide by which counts came. Sparse forms lose ground to dense as tokens grow: judged near the
# largest count so far, a form is kept only where it wins there.
SIZE_WINDOW = 0.75

# The spmm signature's fields in order (csrc/common/spmm_tuning.h, enum Field).
SIGNATURE_FIELDS = ("dtype", "n", "batch_flags", "batch_bucket", "b_layout", "rows_bucket", "cols_bucket",
                    "entries_bucket", "longest_row_bin", "share_64", "share_256", "share_4096", "empty_share")


class _Candidate:
    __slots__ = ("issued", "returned", "costs", "sizes", "dropped", "pruned_top")

    def __init__(self):
        self.issued = 0     # samples handed out, warm-up included
        self.returned = 0   # samples that came back, warm-up included
        self.costs: List[float] = []  # counted samples (ms)
        self.sizes: List[float] = []  # the size of each counted sample's call
        self.dropped = False
        self.pruned_top: Optional[float] = None  # dropped by pruning while the signature's top size was this

    def pending(self) -> int:
        """Counted samples handed out and not back yet."""
        return max(0, self.issued - WARMUP_SAMPLES) - max(0, self.returned - WARMUP_SAMPLES)


class _Entry:
    __slots__ = ("decided", "candidates", "rule", "in_flight", "source", "measured", "top")

    def __init__(self, rule: str):
        self.decided: Optional[str] = None
        self.candidates: Dict[str, _Candidate] = OrderedDict()
        self.rule = rule
        self.in_flight = 0
        self.source = "rule"  # "sampled", "measured" (decide()), "cache" (a cache file)
        self.measured = False  # decided by an explicit measurement, here or in the process that saved the file
        self.top = 0.0  # the largest size a call of this signature has had

    def costs(self, cand: _Candidate) -> List[float]:
        """A candidate's counted samples that count now: those of sizes within SIZE_WINDOW of the top."""
        floor = SIZE_WINDOW * self.top
        return [ms for ms, size in zip(cand.costs, cand.sizes) if size >= floor]


class Tuner:
    """A bounded table of signatures -> the fastest way to run a call (see the module docstring).

    ``choose(key, candidates, rule, device, size)`` returns ``(choice, sample)``: run ``choice``; when
    ``sample`` is not None, bracket that run with ``sample.start()`` / ``sample.stop()`` and hand it back
    with ``submit(key, choice, sample, size)``. ``size``: the call's size where calls of one signature
    differ (SIZE_WINDOW), else leave it 1. A decided key returns its choice (when among ``candidates``) and no
    sample. ``decide(key, choice)`` records an explicit measurement (e.g. SparseLinear.prepare)."""

    def __init__(self, kind: str, capacity: int = DEFAULT_CAPACITY):
        self.kind = kind
        self.capacity = int(capacity)
        self.enabled = True
        self._entries: "OrderedDict[Hashable, _Entry]" = OrderedDict()
        self._pending: List[Tuple[Hashable, str, Sample]] = []
        self._lock = threading.RLock()
        self.generation = 0  # bumped by every decision, import and clear (a cache file is saved when it moved)
        register_clear(f"tuning.{kind}", self.clear, self.__len__)

    def __len__(self) -> int:
        return len(self._entries)

    # -- the online loop --

    def choose(self, key: Hashable, candidates: Sequence[str], rule: str, device="cuda", size: float = 1.0
               ) -> Tuple[str, Optional[Sample]]:
        with self._lock:
            self._poll()
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                if entry.decided is not None:
                    return (entry.decided if entry.decided in candidates else rule), None
            capturing = torch.device(device).type == "cuda" and torch.cuda.is_current_stream_capturing()
            if len(candidates) == 1:
                if entry is None and self.enabled and not capturing:
                    self._decide(key, self._new(key, candidates[0]), candidates[0], "sampled")
                return candidates[0], None
            if not self.enabled or capturing or not candidates:
                return rule, None
            if entry is None:
                entry = self._new(key, rule)
            entry.top = max(entry.top, float(size))
            for name in candidates:
                cand = entry.candidates.setdefault(name, _Candidate())
                if cand.pruned_top is not None and SIZE_WINDOW * entry.top > cand.pruned_top:
                    cand.dropped, cand.pruned_top = False, None  # pruned by samples that no longer count
            offered = [name for name in candidates if not entry.candidates[name].dropped]
            if not offered:
                return rule, None
            if len(self._pending) >= MAX_IN_FLIGHT or size < SIZE_WINDOW * entry.top:
                return self._best(entry, offered, rule), None
            # the candidate that still needs samples and has had the fewest handed out; ties in the order
            # rule first, then the others, turned by one every round of handouts (the module docstring)
            wanted = self._wanted(entry)
            need = [name for name in offered if entry.candidates[name].issued < WARMUP_SAMPLES
                    or len(entry.costs(entry.candidates[name])) + entry.candidates[name].pending() < wanted]
            if not need:
                return self._best(entry, offered, rule), None
            names = [rule] + [c for c in entry.candidates if c != rule]
            turn = sum(c.issued for c in entry.candidates.values()) // len(names)
            order = {name: (i - turn) % len(names) for i, name in enumerate(names)}
            name = min(need, key=lambda c: (entry.candidates[c].issued, order.get(c, len(order))))
            entry.candidates[name].issued += 1
            entry.in_flight += 1
            return name, Sample(device)

    def submit(self, key: Hashable, choice: str, sample: Sample, size: float = 1.0) -> None:
        """A sample handed out by :meth:`choose`, recorded around the run of ``choice`` (a call of ``size``)."""
        with self._lock:
            self._pending.append((key, choice, sample, float(size)))

    def fail(self, key: Hashable, choice: str) -> None:
        """``choice`` raised on this signature's call: no longer a candidate."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None and choice in entry.candidates:
                entry.candidates[choice].dropped = True
                entry.in_flight = max(0, entry.in_flight - 1)
                self._maybe_decide(key, entry)

    def record(self, key: Hashable, choice: str, ms: float, size: float = 1.0) -> None:
        """A finished sample of ``choice`` took ``ms`` on a call of ``size`` (the first of each candidate is
        the warm-up)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None or entry.decided is not None:
                return
            cand = entry.candidates.setdefault(choice, _Candidate())
            entry.in_flight = max(0, entry.in_flight - 1)
            cand.returned += 1
            if cand.returned > WARMUP_SAMPLES:
                cand.costs.append(float(ms))
                cand.sizes.append(float(size))
            self._maybe_decide(key, entry)

    def _wanted(self, entry: _Entry) -> int:
        """Counted samples wanted of each candidate: one until every candidate has one, then SAMPLES."""
        live = [c for c in entry.candidates.values() if not c.dropped]
        return 1 if any(not entry.costs(c) for c in live) else SAMPLES

    def _maybe_decide(self, key, entry: _Entry) -> None:
        live = {n: entry.costs(c) for n, c in entry.candidates.items() if not c.dropped}
        if not live:
            self._decide(key, entry, entry.rule, "sampled")
            return
        if any(not costs for costs in live.values()):
            return
        best = min(min(costs) for costs in live.values())
        for name, costs in list(live.items()):  # pruning after one counted sample each, never the rule's
            if name != entry.rule and min(costs) > PRUNE_FACTOR * best:
                entry.candidates[name].dropped, entry.candidates[name].pruned_top = True, entry.top
                del live[name]
        if all(len(costs) >= SAMPLES for costs in live.values()):
            self._decide(key, entry, self._fastest(entry, {n: min(c) for n, c in live.items()}), "sampled")

    @staticmethod
    def _fastest(entry: _Entry, least: Dict[str, float]) -> str:
        """The candidate of the smallest minimum sample; the rule's on ties."""
        return min(least, key=lambda n: (least[n], n != entry.rule))

    def _best(self, entry: _Entry, offered: Sequence[str], rule: str) -> str:
        timed = {}
        for name in offered:
            costs = entry.costs(entry.candidates[name])
            if costs:
                timed[name] = min(costs)
        return self._fastest(entry, timed) if timed else rule

    def _poll(self) -> None:
        if not self._pending:
            return
        waiting = []
        for key, choice, sample, size in self._pending:
            if sample.done():
                self.record(key, choice, sample.ms(), size)
            else:
                waiting.append((key, choice, sample, size))
        self._pending = waiting

    def _new(self, key, rule: str) -> _Entry:
        entry = self._entries[key] = _Entry(rule)
        while len(self._entries) > self.capacity:
            self._entries.popitem(last=False)
        return entry

    def _decide(self, key, entry: _Entry, choice: str, source: str, measured: bool = False) -> None:
        entry.decided, entry.source, entry.measured = choice, source, measured
        self.generation += 1

    # -- explicit decisions, inspection, persistence --

    def decided(self, key: Hashable) -> Optional[str]:
        with self._lock:
            self._poll()
            entry = self._entries.get(key)
            return None if entry is None else entry.decided

    def source(self, key: Hashable) -> Optional[str]:
        """How ``key`` was decided ("sampled", "measured", "cache"); None while it is undecided."""
        with self._lock:
            self._poll()
            entry = self._entries.get(key)
            return None if entry is None or entry.decided is None else entry.source

    def measured(self, key: Hashable) -> bool:
        """Whether ``key`` holds a decision an explicit measurement made (``decide()``), in this process or
        in the one that saved the cache file it came from (online samples are not one)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry is not None and entry.decided is not None and entry.measured

    def decide(self, key: Hashable, choice: str, times: Optional[Dict[str, float]] = None,
               source: str = "measured", measured: Optional[bool] = None) -> None:
        """Record a decision made outside the online loop (an explicit measurement, a cache file).
        ``measured``: whether an explicit measurement made it (default: ``source == "measured"``)."""
        with self._lock:
            entry = self._entries.get(key) or self._new(key, choice)
            for name, ms in (times or {}).items():
                cand = entry.candidates.setdefault(name, _Candidate())
                cand.costs.append(float(ms))
                cand.sizes.append(entry.top)
            self._entries.move_to_end(key)
            self._decide(key, entry, choice, source, source == "measured" if measured is None else bool(measured))

    def forget(self, key: Hashable) -> None:
        with self._lock:
            self._entries.pop(key, None)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()
            self._pending = []
            self.generation += 1

    def entries(self, decided_only: bool = False) -> List[dict]:
        with self._lock:
            self._poll()
            out = []
            for key, e in self._entries.items():
                if decided_only and e.decided is None:
                    continue
                out.append({"kind": self.kind, "key": key, "route": e.decided, "decided": e.decided is not None,
                            "rule": e.rule, "source": e.source, "measured": e.measured, "top_size": e.top,
                            "candidates": {n: {"issued": c.issued, "costs_ms": list(c.costs), "sizes": list(c.sizes),
                                               "dropped": c.dropped}
                                           for n, c in e.candidates.items()}})
            return out

    def export(self) -> Tuple[List[list], List[list]]:
        """The decided entries as JSON-able ``[key as a list, choice]`` pairs, and the keys (as lists) of those
        an explicit measurement made: a list of their own, so that a reader that knows only pairs keeps
        reading the pairs (and drops only the marks when it saves)."""
        decided = self.entries(decided_only=True)
        return [[list(e["key"]), e["route"]] for e in decided], [list(e["key"]) for e in decided if e["measured"]]

    def load(self, entries: List[list], measured: Sequence[list] = ()) -> int:
        """Decisions of a cache file; those whose key is in ``measured`` count as measured (SparseLinear's
        prepare() keeps them; the others it times again)."""
        marked = set()
        for key in measured if isinstance(measured, list) else ():
            try:
                marked.add(tuple(key))
            except TypeError:
                continue
        taken = 0
        for item in entries:
            try:
                key, choice = item
                key = tuple(key)
                hash(key)
            except (TypeError, ValueError):
                continue
            if isinstance(choice, str):
                self.decide(key, choice, source="cache", measured=key in marked)
                taken += 1
        return taken


class _SpmmRoutes:
    """The ``"spmm"`` table: st.spmm's route decisions, kept and sampled in C++ (see the module docstring);
    the same inspection, clearing and persistence as :class:`Tuner`."""

    kind = "spmm"  # (its reset is listed with the native caches: st.clear_caches clears it)

    def __len__(self) -> int:
        return int(ops.spmm_tuning_stats()[0])

    @property
    def generation(self) -> int:
        return int(ops.spmm_tuning_stats()[3])

    @property
    def signature_version(self) -> int:
        return int(ops.spmm_tuning_stats()[5])

    def clear(self) -> None:
        ops.spmm_tuning_clear()

    def _raw(self, decided_only: bool):
        devices, fields, routes, details = ops.spmm_tuning_export(decided_only)
        width = int(ops.spmm_tuning_stats()[6])
        for i, device in enumerate(devices):
            yield device, list(fields[i * width:(i + 1) * width]), routes[i], details[i]

    def entries(self, decided_only: bool = False) -> List[dict]:
        table = []
        for device, fields, route, details in self._raw(decided_only):
            sig = dict(zip(SIGNATURE_FIELDS, fields))
            sig["dtype"] = _dtype_name(sig["dtype"])
            table.append({"kind": "spmm", "device": device, "signature": sig, "route": route or None,
                          "decided": bool(route), "candidates": _parse_details(details)})
        return table

    def export(self) -> List[list]:
        return [[device, fields, route] for device, fields, route, _ in self._raw(True)]

    def load(self, entries: List[list]) -> int:
        width = int(ops.spmm_tuning_stats()[6])
        devices, fields, routes = [], [], []
        for entry in entries:
            try:
                device, sig, route = entry
                sig = [int(v) for v in sig]
            except (TypeError, ValueError):
                continue
            if isinstance(device, str) and isinstance(route, str) and len(sig) == width:
                devices.append(device)
                fields.extend(sig)
                routes.append(route)
        return int(ops.spmm_tuning_import(devices, fields, routes, False))


_TABLES = {"spmm": _SpmmRoutes(), "linear": Tuner("linear"), "plan": Tuner("plan")}
TUNER_KINDS = tuple(_TABLES)


def tuner(kind: str):
    """The table of one kind ("spmm", "linear", "plan")."""
    try:
        return _TABLES[kind]
    except KeyError:
        raise ValueError(f"kind: expected one of {', '.join(TUNER_KINDS)}, got {kind!r}") from None


# c10::ScalarType values of the dtypes sparsetorch routes (the spmm signature's dtype field)
_DTYPE_NAMES = {5: "float16", 6: "float32", 7: "float64", 15: "bfloat16"}


def _dtype_name(code: int) -> str:
    return _DTYPE_NAMES.get(code, str(code))


def _parse_details(text: str) -> Dict[str, dict]:
    out = {}
    for part in filter(None, text.split(";")):
        route, issued, costs, flag = part.split(":")
        out[route] = {"issued": int(issued), "costs_ms": [float(c) for c in costs.split(",") if c],
                      "dropped": flag in ("dropped", "failed"), "failed": flag == "failed"}
    return out


def tuning_table(decided_only: bool = False, kind: Optional[str] = None) -> List[dict]:
    """What the tables hold in this process (least recently used first within a table), each entry a
    dict with ``kind``, ``route`` (the decision, None while tuning), ``decided`` and ``candidates``
    (samples handed out, counted costs in ms, dropped). "spmm" entries also have ``device`` and
    ``signature`` (field name -> value, see ``SIGNATURE_FIELDS``); the others ``key`` (their signature
    tuple), ``rule``, ``source`` ("sampled", "measured", "cache") and ``measured`` (an explicit
    measurement made it, here or in the process that saved the cache file)."""
    kinds = TUNER_KINDS if kind is None else (tuner(kind).kind,)
    return [e for k in kinds for e in _TABLES[k].entries(decided_only)]


def tuning_signature(A, B: torch.Tensor) -> dict:
    """The signature st.spmm's "auto" keys its decision for ``A @ B`` on (A anything
    :func:`sparsetorch.as_csr` takes; analysed and validated on its device as an op would):
    ``{"device": name, field: value, ...}``."""
    from sparsetorch.csr import as_csr

    a = as_csr(A, device=B.device)
    device, fields = ops.spmm_tuning_signature(a.crow_indices, a.col_indices, a.values.to(B.dtype), B)
    sig = dict(zip(SIGNATURE_FIELDS, fields))
    sig["dtype"] = _dtype_name(sig["dtype"])
    return {"device": device, **sig}


def clear_tuning() -> None:
    """Forgets every decision and sample of this process, in every table; a cache file is not touched
    until the next save."""
    for table in _TABLES.values():
        table.clear()


# --- the cache file ---------------------------------------------------------------------------------

_FORMAT = "sparsetorch-tuning"
# The layout of the "linear" and "plan" signatures (nn/linear.py, plan.py): bumped when they change.
PY_SIGNATURE_VERSION = 1
_lock = threading.RLock()
_cache = {"path": None, "foreign": [], "generation": None, "atexit": False}


def _generation() -> tuple:
    return tuple(t.generation for t in _TABLES.values())


def _build_key() -> dict:
    """What a group of the cache file must match to be used by this process."""
    return {"sparsetorch": __version__, "torch": torch.__version__,
            "cuda": torch.version.cuda or "none", "signature_version": _TABLES["spmm"].signature_version,
            "py_signature_version": PY_SIGNATURE_VERSION}


def _same_build(group: dict, key: dict) -> bool:
    # a group written before the Python tables existed has no py_signature_version: its spmm entries still match
    return all(group.get(k) == v for k, v in key.items() if k != "py_signature_version") and \
        group.get("py_signature_version", PY_SIGNATURE_VERSION) == key["py_signature_version"]


def _read(path: str) -> List[dict]:
    with open(path, "r", encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or not isinstance(doc.get("builds"), list):
        raise ValueError(f"{path}: not a sparsetorch tuning cache")
    return [b for b in doc["builds"] if isinstance(b, dict) and isinstance(b.get("entries", []), list)]


def _load(path: str) -> int:
    """Imports the entries of `path` that match this build; keeps the others for the next save."""
    key = _build_key()
    try:
        builds = _read(path)
    except FileNotFoundError:
        builds = []
    except (OSError, ValueError) as e:  # a corrupt or foreign file must not break the import of sparsetorch
        warnings.warn(f"sparsetorch: tuning cache {path} ignored: {e}", RuntimeWarning, stacklevel=3)
        builds = []
    foreign, taken = [], 0
    for build in builds:
        if not _same_build(build, key):
            foreign.append(build)
            continue
        taken += _TABLES["spmm"].load(build.get("entries", []))
        for kind in ("linear", "plan"):
            if isinstance(build.get(kind), list):
                taken += _TABLES[kind].load(build[kind], build.get(kind + "_measured", []))
    _cache["foreign"] = foreign
    return taken


def set_tuning_cache(path: Optional[str], *, load: bool = True) -> int:
    """Makes the tuning tables persistent in the file ``path`` (``~`` expanded; created on the first
    save): its decided entries for this build are loaded now (``load=True``) and the tables' decided
    entries are written back at interpreter exit and on :func:`save_tuning_cache`. ``None`` stops saving
    (the tables stay). Returns how many entries were loaded. ``SPARSETORCH_TUNING_CACHE`` in the
    environment does the same at import."""
    with _lock:
        if path is None:
            _cache.update(path=None, foreign=[], generation=None)
            return 0
        path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        _cache.update(path=path, foreign=[])
        taken = _load(path) if load else 0
        _cache["generation"] = _generation()
        if not _cache["atexit"]:
            atexit.register(_save_at_exit)
            _cache["atexit"] = True
        return taken


def save_tuning_cache(path: Optional[str] = None) -> int:
    """Writes the tables' decided entries to ``path`` (default: the file of :func:`set_tuning_cache`),
    atomically (a temporary file in the same directory, then a rename), keeping the groups of other
    builds the file held. Returns how many entries of this build were written."""
    with _lock:
        target = _cache["path"] if path is None else os.path.abspath(os.path.expanduser(os.fspath(path)))
        if target is None:
            raise ValueError("save_tuning_cache: no path given and no cache set (st.set_tuning_cache(path))")
        key = _build_key()
        group = dict(key, entries=_TABLES["spmm"].export())
        for kind in ("linear", "plan"):
            group[kind], group[kind + "_measured"] = _TABLES[kind].export()
        count = len(group["entries"]) + len(group["linear"]) + len(group["plan"])
        if target == _cache["path"]:
            foreign = _cache["foreign"]
        else:
            try:
                foreign = [b for b in _read(target) if not _same_build(b, key)]
            except (OSError, ValueError):
                foreign = []
        doc = {"format": _FORMAT, "builds": foreign + [group]}
        directory = os.path.dirname(target) or "."
        os.makedirs(directory, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tuning-", suffix=".tmp", dir=directory)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(doc, f, separators=(",", ":"))
                f.write("\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        if target == _cache["path"]:
            _cache["generation"] = _generation()
        return count


def _save_at_exit() -> None:
    try:
        if _cache["path"] is not None and _generation() != _cache["generation"]:
            save_tuning_cache()
    except Exception as e:  # never fail the interpreter's exit
        warnings.warn(f"sparsetorch: tuning cache not saved: {e}", RuntimeWarning)


if os.environ.get("SPARSETORCH_TUNING_CACHE"):
    set_tuning_cache(os.environ["SPARSETORCH_TUNING_CACHE"])
