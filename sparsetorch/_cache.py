"""Every cache sparsetorch keeps, in one registry: bounded, listed (:func:`cache_info`) and resettable
(:func:`clear_caches`, exported as ``st.clear_caches``).

Most of them hold *derived data of tensors* (a transpose, a propagation matrix, a view): valid while the
same tensor objects come back unmodified. :class:`TensorCache` is the one helper for that: an entry is
keyed on its tensors' identities (plus any extra hashable key), checked against their in-place version
counters on every hit, dropped when one of its tensors is freed, and the least recently used entry goes
first once ``max_entries`` are held. Nothing is cached while torch.compile traces (fake tensors) or for
inference-mode tensors, which have no version counter.

The native caches (matrix analyses, descriptors, the tuning table, plans) register their reset here too,
from sparsetorch/_ops.py.
"""
from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterable, Tuple

import torch

__all__ = ["TensorCache", "register_clear", "clear_caches", "cache_info", "tensor_version", "MISS"]

_registry: Dict[str, Tuple[Callable[[], None], Callable[[], int]]] = {}


def register_clear(name: str, clear: Callable[[], None], size: Callable[[], int]) -> None:
    """List a cache: ``clear()`` empties it, ``size()`` counts its entries."""
    _registry[name] = (clear, size)


def clear_caches() -> None:
    """Forget everything sparsetorch derived and kept: cached analyses and transposes, propagation
    matrices, descriptors and plans, and the tuning table of this process (a tuning cache *file* is not
    touched). What a layer holds as its own state (SparseLinear's forms and decided buckets) stays."""
    for clear, _ in list(_registry.values()):
        clear()


def cache_info() -> Dict[str, int]:
    """Each registered cache's name and how many entries it holds now."""
    return {name: size() for name, (_, size) in sorted(_registry.items())}


class _Miss:
    __slots__ = ()

    def __repr__(self) -> str:
        return "MISS"


MISS = _Miss()


def tensor_version(t: torch.Tensor) -> int:
    """The in-place version counter, or -1 where there is none (a tensor made in inference mode, some sparse
    layouts): such a tensor can only be known by identity."""
    try:
        return t._version
    except RuntimeError:
        return -1


class TensorCache:
    """Derived data of tensors (see the module docstring). ``unversioned=True`` also caches tensors that
    have no version counter at all (torch sparse tensors), by identity alone."""

    def __init__(self, name: str, max_entries: int, *, unversioned: bool = False):
        self.name = name
        self.max_entries = int(max_entries)
        self.unversioned = unversioned
        self._entries: "OrderedDict[tuple, tuple]" = OrderedDict()
        self._lock = threading.Lock()
        register_clear(name, self.clear, self.__len__)

    def __len__(self) -> int:
        return len(self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def cacheable(self, tensors: Iterable[torch.Tensor], extra: tuple = ()) -> bool:
        """Whether entries can be kept for these tensors: real (not fake, functional or other subclass)
        tensors with version counters, plain hashable extras, and nothing being traced."""
        if torch.compiler.is_compiling():
            return False
        for t in tensors:
            if type(t) is not torch.Tensor or t.is_inference():
                return False
            if not self.unversioned and tensor_version(t) < 0:
                return False
        return not any(isinstance(e, (torch.SymInt, torch.SymFloat, torch.SymBool)) for e in extra)

    def lookup(self, tensors: tuple, extra: tuple = ()) -> Any:
        """The value stored for these tensors and ``extra``, or :data:`MISS`."""
        key = tuple(map(id, tensors)) + tuple(extra)
        try:
            entry = self._entries.get(key)
        except TypeError:  # an unhashable extra (a symbolic size while tracing): never stored
            return MISS
        if entry is None:
            return MISS
        refs, versions, value = entry
        if len(refs) != len(tensors):
            return MISS
        for ref, t, version in zip(refs, tensors, versions):
            if ref() is not t or tensor_version(t) != version:
                return MISS
        try:
            self._entries.move_to_end(key)  # least recently used first out
        except KeyError:  # dropped meanwhile (its tensor freed in another thread)
            pass
        return value

    def store(self, tensors: tuple, extra: tuple, value: Any) -> Any:
        """Keep ``value`` for these tensors and ``extra`` (ignored where :meth:`cacheable` says no)."""
        if not self.cacheable(tensors, extra):
            return value
        key = tuple(map(id, tensors)) + tuple(extra)
        entries = self._entries

        def drop(ref, key=key, entries=entries):  # bound here: callbacks may run at interpreter exit
            entry = entries.get(key)
            if entry is not None and any(r is ref for r in entry[0]):
                entries.pop(key, None)

        refs = tuple(weakref.ref(t, drop) for t in tensors)
        with self._lock:
            entries[key] = (refs, tuple(map(tensor_version, tensors)), value)
            entries.move_to_end(key)
            while len(entries) > self.max_entries:
                entries.popitem(last=False)
        return value

    def get(self, tensors: tuple, extra: tuple, build: Callable[[], Any]) -> Any:
        """The stored value, else ``build()`` stored (where cacheable) and returned. A hit costs a dictionary
        lookup and an identity and version check per tensor."""
        if torch.compiler.is_compiling():
            return build()
        value = self.lookup(tensors, extra)
        if value is not MISS:
            return value
        return self.store(tensors, extra, build()) if self.cacheable(tensors, extra) else build()

    def discard(self, tensors: tuple, extra: tuple = ()) -> None:
        with self._lock:
            self._entries.pop(tuple(map(id, tensors)) + tuple(extra), None)

    def values(self):
        """The values held now (live entries only)."""
        return [entry[2] for entry in list(self._entries.values())]
