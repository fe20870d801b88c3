"""How sparsetorch times a call: one rule, used by the tuner (SparseLinear's forms, SpmmPlan's layouts),
the benchmark harness (benchmarks/) and the tests that check timing itself.

* **Device time** (CUDA): each repetition has its own pair of CUDA events around the call; the median is
  reported. Before each repetition the L2 is put in a known state (``l2=``):

  - ``"clean"`` (the default): a scratch buffer of twice the L2 is *read*, so the call meets an L2 holding
    nothing of its own and nothing dirty, as a layer does in a model step (the layer before it streamed
    its own weights). This is the mode every tuning decision uses.
  - ``"flush"``: the scratch is *zeroed*, as ``triton.testing.do_bench`` does; the call then also writes
    ~L2-size dirty lines back, which slows a memory-bound call by up to 20% (H100, 14336 x 4096 bf16,
    N = 1: ``F.linear`` 54 us after the zeroing, 44 us after a read; ``benchmarks/run.py --suites pruned``
    reproduces it).
  - ``"warm"``: nothing in between (inputs that stay in the L2 are timed from the L2).

  A device-side wait is queued first, so the host enqueues every repetition before the device reaches the
  first (a ~10 us call would otherwise time the host's launch rate). Short calls get more repetitions, up
  to ``max_reps`` and about ``budget_ms`` of device time in all.
* **Wall time** (CPU, and whole steps on CUDA): ``time.perf_counter`` around the call, with a device
  synchronize before reading the clock when the call runs on CUDA; the median over repetitions.
* **Online samples** (:class:`Sample`): an event pair recorded around a *real* call, read later without a
  sync. The C++ route sampler of ``st.spmm`` (csrc/cuda/spmm_autotune.cu) follows the same rule: device
  events around real calls, read when complete, the L2 left as the caller's workload leaves it, the
  median of the samples (docs/tuning.md).
"""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional

import torch

from sparsetorch import _compat
from sparsetorch._cache import register_clear

__all__ = ["L2_MODES", "device_time", "wall_time", "time_call", "l2_bytes", "l2_scratch", "Sample", "synchronize"]

L2_MODES = ("clean", "flush", "warm")

_scratch: dict = {}  # device index -> the scratch buffer (2 x L2), made on first use
register_clear("timing.l2_scratch", _scratch.clear, lambda: len(_scratch))


def l2_bytes(device) -> int:
    """The L2 size of a CUDA device (0 for the CPU)."""
    device = torch.device(device)
    if device.type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20))


def l2_scratch(device) -> torch.Tensor:
    """Bytes, twice the device's L2, that "clean" reads and "flush" zeroes (one buffer per device)."""
    device = torch.device(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    buf = _scratch.get(index)
    if buf is None:
        buf = _scratch[index] = torch.zeros(2 * l2_bytes(device), dtype=torch.int8, device=f"cuda:{index}")
    return buf


def synchronize(device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def _prepare_l2(scratch: Optional[torch.Tensor], l2: str) -> None:
    if l2 == "clean":
        scratch.sum(dtype=torch.int32)
    elif l2 == "flush":
        scratch.zero_()


def device_time(call: Callable[[], object], *, device=None, l2: str = "clean", budget_ms: float = 1.0,
                min_reps: int = 5, max_reps: int = 40, warmup: int = 1) -> float:
    """Median device milliseconds of ``call()`` on the current CUDA stream (see the module docstring)."""
    if l2 not in L2_MODES:
        raise ValueError(f"l2: expected one of {', '.join(L2_MODES)}, got {l2!r}")
    device = torch.device("cuda") if device is None else torch.device(device)
    scratch = l2_scratch(device) if l2 != "warm" else None
    for _ in range(warmup):  # workspaces, descriptors, lazy module loads
        call()

    def timed(reps: int) -> float:
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        # ~150 us of device time per repetition: longer than enqueuing one (a Python-level call with an
        # L2 pass before it takes 40-80 us of host time)
        _compat.sleep_cycles(300_000 * reps)
        for start, end in events:
            if scratch is not None:
                _prepare_l2(scratch, l2)
            start.record()
            call()
            end.record()
        events[-1][1].synchronize()
        return statistics.median(start.elapsed_time(end) for start, end in events)

    first = timed(min_reps)
    reps = int(min(max_reps, max(min_reps, budget_ms / max(first, 1e-3))))
    return first if reps <= min_reps else timed(reps)


def wall_time(call: Callable[[], object], *, device=None, reps: int = 5, warmup: int = 1,
              budget_s: Optional[float] = None) -> float:
    """Median wall milliseconds of ``call()``, synchronizing ``device`` (when CUDA) before each clock read.
    ``budget_s`` stops early (after at least 2 repetitions) once that much time has passed."""
    device = torch.device("cpu") if device is None else torch.device(device)
    for _ in range(warmup):
        call()
    synchronize(device)
    times = []
    stop = None if budget_s is None else time.perf_counter() + budget_s
    for i in range(reps):
        t0 = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - t0)
        if stop is not None and i >= 1 and time.perf_counter() > stop:
            break
    return 1e3 * statistics.median(times)


def time_call(call: Callable[[], object], device, **kwargs) -> float:
    """Milliseconds of ``call()`` by the rule of ``device``: :func:`device_time` on CUDA (``kwargs`` are
    its options), :func:`wall_time` on the CPU."""
    device = torch.device(device)
    if device.type == "cuda":
        return device_time(call, device=device, **kwargs)
    return wall_time(call, device=device, reps=min(5, kwargs.get("max_reps", 5)))


class Sample:
    """One timed real call, read later without a sync: ``s = Sample(); s.start(); call(); s.stop()``, then
    ``s.ms()`` once ``s.done()`` (None before). On the CPU the wall clock is read at stop."""

    __slots__ = ("_cuda", "_start", "_end", "_ms")

    def __init__(self, device):
        self._cuda = torch.device(device).type == "cuda"
        self._ms = None
        if self._cuda:
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def start(self) -> None:
        if self._cuda:
            self._start.record()
        else:
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self._cuda:
            self._end.record()
        else:
            self._ms = 1e3 * (time.perf_counter() - self._start)

    def done(self) -> bool:
        return self._ms is not None or (self._cuda and self._end.query())

    def ms(self) -> Optional[float]:
        if self._ms is None and self._cuda and self._end.query():
            self._ms = self._start.elapsed_time(self._end)
        return self._ms
