"""Timing done one way for every suite: device events (triton's do_bench when present) with warm-up
and medians on CUDA (the pruned-weight suites with a clean L2 instead: make_clean_l2_timer), wall-clock
medians on the CPU; inputs rotated through copies when they would otherwise stay in the GPU's L2;
ceilings (copy bandwidth, GEMM rate per dtype) measured in the run.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List

import torch


def call_seconds(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of one call of ``fn``: between two CUDA events on the current stream (then waited for),
    or by the wall clock on the CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def make_timer(device: torch.device, quick: bool) -> Callable[[Callable[[], object]], float]:
    """A function that returns the median time of ``fn()`` in seconds."""
    if device.type == "cuda":
        try:
            import triton.testing

            rep = 40 if quick else 100
            return lambda fn: triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median") * 1e-3
        except ImportError:
            pass

        def cuda_time(fn, reps=20 if quick else 50):
            for _ in range(3):
                fn()
            return statistics.median(call_seconds(fn, device) for _ in range(reps))

        return cuda_time

    def cpu_time(fn, reps=3 if quick else 7):
        fn()  # warm-up
        times = []
        budget = time.perf_counter() + (2.0 if quick else 10.0)
        for i in range(reps):
            times.append(call_seconds(fn, device))
            if i >= 1 and time.perf_counter() > budget:  # slow baselines: fewer repetitions
                break
        return statistics.median(times)

    return cpu_time


def make_clean_l2_timer(device: torch.device, quick: bool) -> Callable[[Callable[[], object]], float]:
    """On CUDA, the median time of ``fn()`` in seconds with the L2 read (clean) before each call instead
    of zeroed as do_bench does: how a pruned layer runs in a decoder step, where the layer before it
    streamed its weights (plan._device_time says what the zeroing costs a memory-bound call). On the
    CPU, make_timer's."""
    if device.type != "cuda":
        return make_timer(device, quick)
    from sparsetorch.plan import _device_time, _l2_scratch

    scratch = _l2_scratch(device)
    budget_ms, reps = (20.0, 100) if quick else (50.0, 250)
    return lambda fn: _device_time(fn, scratch, clean=True, budget_ms=budget_ms, max_reps=reps) * 1e-3


def l2_bytes(device: torch.device) -> int:
    if device.type != "cuda":
        return 0
    return int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20))


def rotation(device: torch.device, working_set_bytes: int) -> int:
    """How many copies of the inputs to cycle through so that one call's inputs are not still in L2
    from the previous call: enough copies to span 3x the L2 size (at most 8); 1 on the CPU."""
    l2 = l2_bytes(device)
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


def measure_ceilings(device: torch.device, timer, quick: bool) -> Ceilings:
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
    """Raise if ``out`` is not ``ref`` (float64, CPU) within a relative Frobenius error ``tol``."""
    err = relative_error(out, ref)
    if not err <= tol:
        raise AssertionError(f"{name}: relative error {err:.2e} > {tol:.0e} against the float64 reference")
    return err
