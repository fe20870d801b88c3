"""The tuning table of ``backend="auto"``: what it decided, and an opt-in cache file (docs/tuning.md).

On CUDA, "auto" keys its route decisions on a *signature* of the problem (dtype, B's width and layout,
batch layout, log2 buckets of the shape and of the stored entries, the shape of the row-length
histogram, the device's name) and tunes an undecided signature online: its calls run the candidate
routes in turn as the real calls and are timed without a sync, until the fastest is known
(csrc/common/spmm_tuning.h, csrc/cuda/spmm_autotune.cu). The table lives in the process;
``set_tuning_cache(path)`` (or ``SPARSETORCH_TUNING_CACHE=path`` in the environment at import) makes its
decisions persist across runs::

    import sparsetorch as st
    st.set_tuning_cache("~/.cache/sparsetorch/tuning.json")  # loads what an earlier run decided
    ...                                                       # saved at exit, or st.save_tuning_cache()

Entries in the file are keyed by the GPU's name, sparsetorch's, torch's and CUDA's versions and the
signature layout: an entry written by another GPU model or build is ignored (and kept in the file).
"""
from __future__ import annotations

import atexit
import json
import os
import tempfile
import threading
import warnings
from typing import Dict, List, Optional

import torch

from sparsetorch._ops import ops

__all__ = ["clear_tuning", "save_tuning_cache", "set_tuning_cache", "tuning_signature", "tuning_table",
           "SIGNATURE_FIELDS"]

# The signature's fields in order (csrc/common/spmm_tuning.h, enum Field).
SIGNATURE_FIELDS = ("dtype", "n", "batch_flags", "batch_bucket", "b_layout", "rows_bucket", "cols_bucket",
                    "entries_bucket", "longest_row_bin", "share_64", "share_256", "share_4096", "empty_share")

_FORMAT = "sparsetorch-tuning"
_lock = threading.RLock()
_cache = {"path": None, "foreign": [], "generation": None, "atexit": False}


def _stats() -> dict:
    size, decided, in_flight, generation, capacity, version, fields = ops.spmm_tuning_stats()
    return dict(size=size, decided=decided, in_flight=in_flight, generation=generation, capacity=capacity,
                signature_version=version, fields=fields)


def _build_key() -> dict:
    """What an entry of the cache file must match to be used by this process."""
    import sparsetorch

    return {"sparsetorch": getattr(sparsetorch, "__version__", "unknown"), "torch": torch.__version__,
            "cuda": torch.version.cuda or "none", "signature_version": _stats()["signature_version"]}


# c10::ScalarType values of the dtypes sparsetorch routes (the signature's dtype field)
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


def _entries(decided_only: bool):
    devices, fields, routes, details = ops.spmm_tuning_export(decided_only)
    width = _stats()["fields"]
    for i, device in enumerate(devices):
        yield device, list(fields[i * width:(i + 1) * width]), routes[i], details[i]


def tuning_table(decided_only: bool = False) -> List[dict]:
    """The signatures "auto" has met in this process (least recently used first), each a dict:
    ``device`` (the GPU's name), ``signature`` (field name -> value, see ``SIGNATURE_FIELDS``; dtype as a
    name), ``route`` (the decided route, None while tuning), ``decided``, and ``candidates`` (route ->
    samples handed out, counted costs in ms normalised to the signature's first product, whether it was
    dropped). Samples whose events have completed are read first."""
    table = []
    for device, fields, route, details in _entries(decided_only):
        sig = dict(zip(SIGNATURE_FIELDS, fields))
        sig["dtype"] = _dtype_name(sig["dtype"])
        table.append({"device": device, "signature": sig, "route": route or None, "decided": bool(route),
                      "candidates": _parse_details(details)})
    return table


def tuning_signature(A, B: torch.Tensor) -> dict:
    """The signature "auto" keys its decision for ``A @ B`` on (A anything :func:`sparsetorch.as_csr`
    takes; analysed and validated on its device as an op would): ``{"device": name, field: value, ...}``."""
    from sparsetorch.csr import as_csr

    a = as_csr(A, device=B.device)
    device, fields = ops.spmm_tuning_signature(a.crow_indices, a.col_indices, a.values.to(B.dtype), B)
    sig = dict(zip(SIGNATURE_FIELDS, fields))
    sig["dtype"] = _dtype_name(sig["dtype"])
    return {"device": device, **sig}


def clear_tuning() -> None:
    """Forgets every signature (decided or tuning) of this process; the cache file is not touched until
    the next save."""
    ops.spmm_tuning_clear()


def _read(path: str) -> List[dict]:
    with open(path, "r", encoding="utf-8") as f:
        doc = json.load(f)
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or not isinstance(doc.get("builds"), list):
        raise ValueError(f"{path}: not a sparsetorch tuning cache")
    return [b for b in doc["builds"] if isinstance(b, dict) and isinstance(b.get("entries"), list)]


def _load(path: str) -> int:
    """Imports the entries of `path` that match this build; keeps the others for the next save."""
    key = _build_key()
    width = _stats()["fields"]
    try:
        builds = _read(path)
    except FileNotFoundError:
        builds = []
    except (OSError, ValueError) as e:  # a corrupt or foreign file must not break the import of sparsetorch
        warnings.warn(f"sparsetorch: tuning cache {path} ignored: {e}", RuntimeWarning, stacklevel=3)
        builds = []
    foreign, taken = [], 0
    for build in builds:
        if {k: build.get(k) for k in key} != key:
            foreign.append(build)
            continue
        devices, fields, routes = [], [], []
        for entry in build["entries"]:
            try:
                device, sig, route = entry
                sig = [int(v) for v in sig]
            except (TypeError, ValueError):
                continue
            if not isinstance(device, str) or not isinstance(route, str) or len(sig) != width:
                continue
            devices.append(device)
            fields.extend(sig)
            routes.append(route)
        taken += int(ops.spmm_tuning_import(devices, fields, routes, False))
    _cache["foreign"] = foreign
    return taken


def set_tuning_cache(path: Optional[str], *, load: bool = True) -> int:
    """Makes the tuning table persistent in the file ``path`` (``~`` expanded; created on the first save):
    its decided entries for this GPU model and build are loaded now (``load=True``) and the table's
    decided entries are written back at interpreter exit and on :func:`save_tuning_cache`. ``None`` stops
    saving (the table stays). Returns how many entries were loaded. The environment variable
    ``SPARSETORCH_TUNING_CACHE`` does the same at import."""
    with _lock:
        if path is None:
            _cache.update(path=None, foreign=[], generation=None)
            return 0
        path = os.path.abspath(os.path.expanduser(os.fspath(path)))
        _cache.update(path=path, foreign=[])
        taken = _load(path) if load else 0
        _cache["generation"] = _stats()["generation"]
        if not _cache["atexit"]:
            atexit.register(_save_at_exit)
            _cache["atexit"] = True
        return taken


def save_tuning_cache(path: Optional[str] = None) -> int:
    """Writes the table's decided entries to ``path`` (default: the file of :func:`set_tuning_cache`),
    atomically (a temporary file in the same directory, then a rename), keeping the entries of other
    builds the file held. Returns how many entries of this build were written."""
    with _lock:
        target = _cache["path"] if path is None else os.path.abspath(os.path.expanduser(os.fspath(path)))
        if target is None:
            raise ValueError("save_tuning_cache: no path given and no cache set (st.set_tuning_cache(path))")
        entries = [[device, fields, route] for device, fields, route, _ in _entries(True)]
        key = _build_key()
        foreign = _cache["foreign"] if target == _cache["path"] else []
        if target != _cache["path"]:
            try:
                foreign = [b for b in _read(target) if {k: b.get(k) for k in key} != key]
            except (OSError, ValueError):
                foreign = []
        doc = {"format": _FORMAT, "builds": foreign + [dict(key, entries=entries)]}
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
            _cache["generation"] = _stats()["generation"]
        return len(entries)


def _save_at_exit() -> None:
    try:
        if _cache["path"] is not None and _stats()["generation"] != _cache["generation"]:
            save_tuning_cache()
    except Exception as e:  # never fail the interpreter's exit
        warnings.warn(f"sparsetorch: tuning cache not saved: {e}", RuntimeWarning)


if os.environ.get("SPARSETORCH_TUNING_CACHE"):
    set_tuning_cache(os.environ["SPARSETORCH_TUNING_CACHE"])
