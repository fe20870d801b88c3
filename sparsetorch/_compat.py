"""The private torch APIs sparsetorch uses, each with a public fallback, in one place.

Each one was measured to matter (the numbers are next to it); ``tests/test_compat.py`` fails when a torch
release removes or renames one, so the fallback is never taken silently in CI. Nothing else in sparsetorch
(or benchmarks/) reaches into ``torch._C`` or an op's ``_op``.
"""
from __future__ import annotations

from typing import Callable

import torch

__all__ = ["below_autograd", "BelowAutograd", "op_entry", "sleep_cycles", "clear_cublas_workspaces", "HAS_BELOW_AUTOGRAD", "HAS_OP_ENTRY",
           "HAS_SLEEP", "HAS_CLEAR_CUBLAS_WORKSPACES"]

# Dispatching below the Autograd key: a custom op called this way skips torch.library's Python autograd
# wrapper, which only finds that nothing requires grad and redispatches (4-10 us per call on a 2-core CPU,
# the whole host cost of a small graph's SpMM). Fallback: torch.no_grad(), which records nothing either
# but still enters the wrapper.
_below = getattr(getattr(torch, "_C", None), "_AutoDispatchBelowAutograd", None)
HAS_BELOW_AUTOGRAD = _below is not None


def below_autograd():
    """Context manager: dispatch below the Autograd key (see the module docstring)."""
    return _below() if _below is not None else torch.no_grad()


# The context manager's class itself, for the per-call paths: calling below_autograd() costs one more Python
# frame (~0.08 us on a 2-core CPU, a tenth of what a small product's path may add).
BelowAutograd = _below if _below is not None else torch.no_grad


def op_entry(overload) -> Callable:
    """The callable an ``OpOverload.__call__`` forwards to (saves a Python frame, ~0.35 us per call on a
    2-core CPU); the overload itself where torch has no such attribute."""
    return getattr(overload, "_op", overload)


HAS_OP_ENTRY = hasattr(torch.ops.aten.add.Tensor, "_op")

# A device-side busy wait, so that the host enqueues a batch of timed calls before the device reaches
# them (plain ~10 us calls on a small graph would otherwise time the host's launch rate). Fallback: none
# (the timings then include host gaps between short calls; timing.device_time says so).
_sleep = getattr(torch.cuda, "_sleep", None)
HAS_SLEEP = _sleep is not None


def sleep_cycles(cycles: int) -> None:
    """Keep the current CUDA stream busy for about ``cycles`` clock cycles (no-op without torch's helper)."""
    if _sleep is not None:
        _sleep(int(cycles))


# Freeing cuBLAS's workspaces (torch keeps one per handle and stream, 32 MiB each on an H100): the gnn
# benchmark releases them between the implementations it compares, so that the one timed first does not
# pay for workspaces the later ones find allocated. Fallback: none (the workspaces stay).
_clear_workspaces = getattr(getattr(torch, "_C", None), "_cuda_clearCublasWorkspaces", None)
HAS_CLEAR_CUBLAS_WORKSPACES = _clear_workspaces is not None


def clear_cublas_workspaces() -> None:
    """Free torch's cached cuBLAS workspaces (no-op without torch's helper)."""
    if _clear_workspaces is not None:
        _clear_workspaces()
