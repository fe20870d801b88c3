"""The benchmark suites. Each suite returns a list of jobs (one per case); a job builds its inputs,
checks every implementation's output against a float64 reference, times it, and returns rows.

Byte and flop models (the floor of a row is max(bytes / copy bandwidth, flops / GEMM rate), both
measured in the same run; sparse kernels are held to the fp32 CUDA-core/AVX rate of the dtype's
GEMM, dense GEMMs to their own dtype's rate):
  SpMM  C (m x n) = A (m x k, nnz) @ B (k x n):  bytes = nnz * (index + value) + (m + 1) * index
        + min(nnz, k) * n * value (each referenced row of B read once) + m * n * value (C written);
        flops = 2 * nnz * n. A batch sums this over its matrices.
  GEMM  bytes = (m*k + k*n + m*n) * value;  flops = 2 * m * k * n (per batch).
  elementwise: bytes = (inputs read + output written) * value; flops ignored.
"""
from __future__ import annotations

import time
from typing import Callable, Dict, List, Optional

import torch

from benchmarks.harness import (Ceilings, Rotating, Timer, check, host_seconds, make_clean_l2_timer, make_step_timer,
                                rotation)

Job = Callable[[], List[dict]]
TOL = {"float32": 1e-4, "tf32": 1e-2, "bfloat16": 3e-2, "float16": 1e-2, "float64": 1e-10}


class Context:
    """What a suite gets from the runner: the device, the run's timer (harness.make_timer), the ceilings,
    quick or full sizes, the data folder and the command line's overrides."""

    def __init__(self, device: torch.device, timer: Timer, ceilings: Ceilings, quick: bool, data_root: Optional[str],
                 widths: Optional[tuple] = None, dtypes: Optional[tuple] = None, layers: Optional[int] = None):
        self.device, self.timer, self.ceilings, self.quick = device, timer, ceilings, quick
        self.data_root = data_root
        self.widths, self.dtypes = widths, dtypes  # overrides of a suite's B widths / dtypes (--widths, --dtypes)
        self.layers = layers  # decoder layers of the decode stack (--layers)
        self.left_out: List[str] = []  # what the suites left out and why, listed at the end of the run

    def leave_out(self, what: str, why: str) -> None:
        """Record (and print now) a case or baseline left out of the run, with the reason."""
        line = f"{what}: {why}"
        if line not in self.left_out:
            self.left_out.append(line)
            print(f"\nleft out: {line}", flush=True)

    @property
    def weights_timer(self) -> Timer:
        """The timer of the suites whose calls stream a large weight (pruned, decode): a clean L2 before
        each call on CUDA (harness.make_clean_l2_timer), the run's timer on the CPU."""
        return make_clean_l2_timer(self.device, self.quick) if self.cuda else self.timer

    @property
    def step_timer(self) -> Timer:
        """The timer of whole steps (training steps, eager decode steps), whose host time counts: wall
        time with a synchronize on CUDA (harness.make_step_timer), the run's timer on the CPU."""
        return make_step_timer(self.device, self.quick) if self.cuda else self.timer

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"


def spmm_model(nnz: int, m: int, k: int, n: int, value: int, index: int, batch: int = 1):
    return (nnz * (index + value) + batch * (m + 1) * index + min(nnz, batch * k) * n * value
            + batch * m * n * value, 2.0 * nnz * n)


def gemm_model(m: int, k: int, n: int, value: int, batch: int = 1):
    return batch * (m * k + k * n + m * n) * value, 2.0 * batch * m * k * n


def densify_model(nnz: int, m: int, k: int, n: int, value: int, index: int):
    """The densify route (A expanded, then a dense GEMM): A written and read densely, its entries read
    once, B read twice (the NaN/Inf check, the GEMM), out written; dense GEMM flops."""
    return 2 * m * k * value + nnz * (index + value) + 2 * k * n * value + m * n * value, 2.0 * m * k * n


def plan_route(plan, b: torch.Tensor) -> str:
    """The route a SpmmPlan takes for `b` (autotuned by this call on CUDA): floors follow the route."""
    plan(b)
    return next(iter(plan.routes.values()), plan.backend)


def host_time_per_call(fn, b: torch.Tensor, reps: int = 200) -> float:
    """Seconds the host spends per call of fn(b) on a CUDA stream that keeps up (no sync inside)."""
    fn(b)

    def loop():
        for _ in range(reps):
            fn(b)

    return host_seconds(loop, b.device) / reps


def warm_gpu(ctx: Context, impls: Dict[str, tuple], seconds: float = 0.1) -> None:
    """Keep the GPU busy with the case's first implementation for `seconds` before anything is timed:
    after the host spent seconds building a case, the GPU's clocks have dropped, and the first timing
    (the default call's, in the skew suite) would pay their ramp (seen: 90 vs 33 us for the same route)."""
    if not ctx.cuda or not impls:
        return
    fn, inputs = next(iter(impls.values()))[:2]
    start = time.perf_counter()  # a deadline, not a measurement
    try:
        while time.perf_counter() - start < seconds:
            for _ in range(8):
                fn(*inputs[0]) if inputs else fn()
            torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - measure() reports the failure of an implementation
        pass


def measure(ctx: Context, base: dict, impls: Dict[str, tuple], ref: torch.Tensor, rotate_bytes: int,
            timer=None) -> List[dict]:
    """impls: name -> (fn(B) -> out, list of B copies or None, bytes, flops, rate key, dtype label).
    Every output is checked before timing; B is rotated through its copies while timing; ``timer``:
    ctx.timer unless given."""
    rows = []
    warm_gpu(ctx, impls)
    for name, (fn, inputs, nbytes, flops, rate_key, dtype_label) in impls.items():
        try:
            out = fn(*inputs[0]) if inputs else fn()
        except Exception as e:  # noqa: BLE001 - a baseline that cannot run this case is reported, not fatal
            if name.startswith(("sparsetorch", "st.")):
                raise
            ctx.leave_out(f"{base['suite']} {base['case']}: {name}", f"failed ({type(e).__name__}: {str(e)[:120]})")
            continue
        err = check(out, ref, f"{base['suite']} {base['case']}: {name}", TOL[dtype_label])
        del out
        timed = Rotating(fn, inputs) if inputs else fn
        seconds = (timer or ctx.timer)(timed)
        floor = ctx.ceilings.floor(nbytes, flops, rate_key)
        rows.append({**base, "impl": name, "dtype": dtype_label, "time_ms": seconds * 1e3,
                     "GBps": nbytes / seconds / 1e9, "GFLOPs": flops / seconds / 1e9, "floor_ms": floor * 1e3,
                     "of_floor": floor / seconds, "rel_err": err})
    return rows


def copies(ctx: Context, tensor: torch.Tensor, working_set: int) -> List[tuple]:
    count = rotation(ctx.device, working_set)
    return [(tensor,)] + [(tensor.clone(),) for _ in range(count - 1)]


