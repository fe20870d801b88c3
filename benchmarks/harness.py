"""What every suite uses to time and check a call: the run's timers, the ceilings, input rotation and the
float64 check.

Every timed call goes through :mod:`sparsetorch.timing` (the library's one timing rule); this module only
chooses its options per kind of call:

* :func:`make_timer`, a kernel-sized call: on CUDA ``device_time(l2="flush")`` (the L2 zeroed before each
  repetition, as ``triton.testing.do_bench`` does), on the CPU ``wall_time``.
* :func:`make_clean_l2_timer`, a call that streams a large weight (the pruned and decode suites):
  ``device_time(l2="clean")`` (the L2 read, not zeroed, before each call, as a layer meets it in a model
  step; sparsetorch.timing says what the zeroing costs a memory-bound call).
* :func:`make_step_timer`, a whole training or decode step, whose host time is part of what is measured:
  ``wall_time`` with a synchronize (device events behind a queued wait would hide the host's time).
* :func:`once` (a first call, a set-up phase) and :func:`host_seconds` (the host's time alone, no
  synchronize inside) for the rest.

Timers take a zero-argument callable and return seconds.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Dict, List, Tuple

import torch

from sparsetorch import timing

Timer = Callable[[Callable[[], object]], float]


def make_timer(device: torch.device, quick: bool) -> Timer:
    """The run's timer: the median time of ``fn()`` in seconds (see the module docstring)."""
    device = torch.device(device)
    if device.type == "cuda":
        budget_ms, max_reps = (40.0, 100) if quick else (100.0, 250)
        return lambda fn: 1e-3 * timing.device_time(fn, device=device, l2="flush", budget_ms=budget_ms,
                                                   max_reps=max_reps, warmup=10)
    reps, budget_s = (3, 2.0) if quick else (7, 10.0)  # slow baselines stop at the budget (>= 2 repetitions)
    return lambda fn: 1e-3 * timing.wall_time(fn, device=device, reps=reps, warmup=1, budget_s=budget_s)


def make_clean_l2_timer(device: torch.device, quick: bool) -> Timer:
    """On CUDA, the median time of ``fn()`` in seconds with the L2 read (clean) before each call; on the
    CPU, :func:`make_timer`'s."""
    device = torch.device(device)
    if device.type != "cuda":
        return make_timer(device, quick)
    budget_ms, max_reps = (20.0, 100) if quick else (50.0, 250)
    return lambda fn: 1e-3 * timing.device_time(fn, device=device, l2="clean", budget_ms=budget_ms,
                                               max_reps=max_reps)


def make_step_timer(device: torch.device, quick: bool) -> Timer:
    """A whole step (forward, backward, optimiser; a decode step): the median wall time of ``fn()`` in
    seconds with a synchronize before each clock read, about 40 ms (quick) or 100 ms of steps after 5
    warm-up steps; on the CPU, :func:`make_timer`'s."""
    device = torch.device(device)
    if device.type != "cuda":
        return make_timer(device, quick)
    budget_s = 0.04 if quick else 0.1
    return lambda fn: 1e-3 * timing.wall_time(fn, device=device, reps=250, warmup=5, budget_s=budget_s)


def once(fn: Callable[[], object], device: torch.device) -> Tuple[object, float]:
    """(what ``fn()`` returned, its wall seconds): one call, no warm-up, the device synchronized before
    and after (a first call, a set-up phase)."""
    out = []
    ms = timing.wall_time(lambda: out.append(fn()), device=device, reps=1, warmup=0)
    return out[0], 1e-3 * ms


def host_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds the host spends in ``fn()``, with no synchronize inside (the device's queue is drained
    before and after): what a call costs the host while the device keeps up."""
    timing.synchronize(device)
    seconds = 1e-3 * timing.wall_time(fn, device="cpu", reps=1, warmup=0)  # the CPU clock alone
    timing.synchronize(device)
    return seconds


def rotation(device: torch.device, working_set_bytes: int) -> int:
    """How many copies of the inputs to cycle through so that one call's inputs are not still in L2
    from the previous call: enough copies to span 3x the L2 size (at most 8); 1 on the CPU."""
    l2 = timing.l2_bytes(device)
    if l2 == 0 or working_set_bytes <= 0 or working_set_bytes >= 3 * l2:
        return 1
    return int(min(8, -(-3 * l2 // working_set_bytes)))


class Rotating:
    """Calls ``fn(*inputs[i])`` for i = 0, 1, ... cyclically."""

    def __init__(self, fn: Callable, inputs: List[tuple]):
        self.fn, self.inputs, self.i = fn, inputs, 0

    def __call__(self):
        args = self.inputs[self.i]
        self.i = (self.i + 1) % len(self.inputs)
        return self.fn(*args)


def copy_elements(device: torch.device) -> int:
    """float32 elements of the copy that measures the bandwidth ceiling, also the size of the elementwise
    suites' tensors: far past the last-level cache (64 MiB a side on the CPU, 256 MiB on CUDA), so that no
    row can beat the ceiling by running from cache."""
    return 2**24 if device.type == "cpu" else 2**26


@dataclass
class Ceilings:
    """Measured once per run (and device): copy bandwidth (bytes/s, read + write) and GEMM rates (flop/s).
    Every floor of the run comes from these; ``copy_numel`` / ``copy_seconds`` are the copy that gave the
    bandwidth (float32 elements, median seconds)."""

    bandwidth: float
    gemm: Dict[str, float] = field(default_factory=dict)  # "float32", "tf32", "bfloat16", ...
    copy_numel: int = 0
    copy_seconds: float = 0.0

    def floor(self, bytes_moved: float, flops: float, rate_key: str = "float32") -> float:
        """max(bytes / bandwidth, flops / peak): the time no implementation can beat."""
        return max(bytes_moved / self.bandwidth, flops / self.gemm.get(rate_key, self.gemm["float32"]))


def measure_ceilings(device: torch.device, timer: Timer, quick: bool) -> Ceilings:
    cpu = device.type == "cpu"
    x = torch.randn(copy_elements(device), device=device)
    y = torch.empty_like(x)
    copy_seconds = timer(lambda: y.copy_(x))
    bandwidth = 2 * x.numel() * 4 / copy_seconds
    del x, y
    s = 1024 if cpu else 8192
    rates = {}
    keys = [("float32", torch.float32, False)]
    if not cpu:
        keys += [("tf32", torch.float32, True), ("bfloat16", torch.bfloat16, False)]
    for key, dtype, tf32 in keys:
        a = torch.randn(s, s, device=device, dtype=dtype)
        b = torch.randn(s, s, device=device, dtype=dtype)
        with tf32_mode(tf32):
            rates[key] = 2 * s**3 / timer(lambda: torch.mm(a, b))
    return Ceilings(bandwidth, rates, copy_elements(device), copy_seconds)


class tf32_mode:
    """Context manager: TF32 tensor cores for fp32 matmul on or off (restored on exit)."""

    def __init__(self, enabled: bool):
        self.enabled = enabled

    def __enter__(self):
        self.prev = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = self.enabled

    def __exit__(self, *exc):
        torch.backends.cuda.matmul.allow_tf32 = self.prev


def relative_error(out, ref: torch.Tensor) -> float:
    """Relative Frobenius error, computed on the reference's device (large outputs stay on the GPU)."""
    got = out if isinstance(out, torch.Tensor) else torch.as_tensor(out)
    got = got.detach().to(device=ref.device, dtype=torch.float64)
    denom = ref.norm().item()
    return (got - ref).norm().item() / (denom if denom > 0 else 1.0)


def check(out, ref: torch.Tensor, name: str, tol: float) -> float:
    """Raise if ``out`` is not ``ref`` (float64) within a relative Frobenius error ``tol``."""
    err = relative_error(out, ref)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.2e} > {tol:.0e} against the float64 reference")
    return err
