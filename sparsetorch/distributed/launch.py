"""Start a process group of fresh local processes and run a function on every rank: what the tests
and the benchmark use instead of torchrun (scripts use torchrun).

``spawn(fn, nprocs, *args)`` runs ``fn(rank, world_size, *args)`` in ``nprocs`` processes (start
method "spawn"), each already in one process group (gloo on the CPU, or NCCL with one GPU per rank)
with the given timeout, and returns their return values by rank. A process that raises, dies or
outlives ``join_timeout`` makes ``spawn`` raise (with the rank's traceback) after the others are
stopped, so a test never hangs.
"""
from __future__ import annotations

import datetime
import queue as queue_module
import socket
import time
import traceback
from typing import Any, Callable, List, Optional

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sparsetorch.distributed._comm import nccl_options, set_no_multicast_env

__all__ = ["free_port", "spawn", "SpawnError"]


class SpawnError(RuntimeError):
    """A spawned rank raised, died or did not finish in time."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (for the process group's rendezvous)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a rank reports: its result, its error, or a rendezvous that failed for the port (taken by another
# process between free_port() and the store's bind: two spawns at once race for ports), which spawn() retries.
_DONE, _FAILED, _PORT_FAILURE = "done", "failed", "port"
_PORT_ERRORS = ("DistNetworkError", "EADDRINUSE", "address already in use")
SPAWN_TRIES = 3
# The rendezvous (every rank reaching the store) has its own timeout, longer than a group's: starting a
# process and importing torch took over 4 s on a 16-core machine running two test suites at once, so a group
# timeout of a few seconds (the fault tests') also timed out its rendezvous.
RENDEZVOUS_TIMEOUT_S = 120.0


def _entry(rank, world_size, fn, args, backend, port, timeout, threads, results):
    set_no_multicast_env()
    if threads:
        torch.set_num_threads(threads)
    try:
        try:
            if backend == "nccl":
                torch.cuda.set_device(rank)
            store = dist.TCPStore("127.0.0.1", port, world_size, is_master=rank == 0,
                                  timeout=datetime.timedelta(seconds=max(timeout, RENDEZVOUS_TIMEOUT_S)))
            dist.init_process_group(backend, store=store, rank=rank, world_size=world_size,
                                    timeout=datetime.timedelta(seconds=timeout),
                                    pg_options=nccl_options() if backend == "nccl" else None)
        except BaseException:  # noqa: BLE001 - reported to the parent
            text = traceback.format_exc()
            results.put((rank, _PORT_FAILURE if any(e in text for e in _PORT_ERRORS) else _FAILED, text))
            return
        try:
            results.put((rank, _DONE, fn(rank, world_size, *args)))
        except BaseException:  # noqa: BLE001 - reported to the parent
            results.put((rank, _FAILED, traceback.format_exc()))
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def spawn(fn: Callable[..., Any], nprocs: int, *args, backend: str = "gloo", timeout: float = 60.0,
          join_timeout: Optional[float] = None, threads: Optional[int] = 1) -> List[Any]:
    """Run ``fn(rank, nprocs, *args)`` on ``nprocs`` fresh ranks; return the results by rank.

    ``fn`` must be importable (a module-level function) and its arguments and results picklable.
    ``timeout``: the process group's (a collective waiting longer raises); ``join_timeout``: the
    whole run's (default ``4 * timeout + 60`` s; the rendezvous has its own, ``RENDEZVOUS_TIMEOUT_S``); ``threads``: torch threads per rank (None: torch's default).
    A run whose ranks all failed their rendezvous for the port (another process took it after
    :func:`free_port` found it free) runs again on a new port, up to ``SPAWN_TRIES`` runs in all.
    """
    set_no_multicast_env()  # inherited by the children, and NCCL in this process never sees NVLS either
    for attempt in range(SPAWN_TRIES):
        got, failures = _run(fn, nprocs, args, backend, timeout, join_timeout, threads)
        if failures and all(kind == _PORT_FAILURE for _, kind, _ in failures) and attempt + 1 < SPAWN_TRIES:
            continue  # every failure was the rendezvous port: again on a new one
        break
    if failures:
        failures.sort(key=lambda f: f[0])
        raise SpawnError("\n".join(f"--- rank {r} ---\n{text}" for r, _, text in failures))
    return [got[r] for r in range(nprocs)]


def _run(fn, nprocs, args, backend, timeout, join_timeout, threads):
    """One run of every rank on a fresh port: (results by rank, [(rank, failure kind, text)])."""
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, nprocs, fn, args, backend, port, timeout, threads, results),
                         daemon=True) for r in range(nprocs)]
    for p in procs:
        p.start()
    deadline = time.time() + (join_timeout if join_timeout is not None else 4 * timeout + 60)
    got, failures = {}, []
    try:
        while len(got) + len(failures) < nprocs:
            try:
                rank, kind, value = results.get(timeout=0.2)
            except queue_module.Empty:
                reported = set(got) | {r for r, _, _ in failures}
                dead = [r for r, p in enumerate(procs) if r not in reported and p.exitcode not in (None, 0)]
                if dead:
                    failures += [(r, _FAILED, f"rank {r} died with exit code {procs[r].exitcode}") for r in dead]
                elif time.time() > deadline:
                    missing = [r for r in range(nprocs) if r not in reported]
                    raise SpawnError(f"ranks {missing} did not finish within the join timeout")
                continue
            if kind == _DONE:
                got[rank] = value
            else:
                failures.append((rank, kind, value))
                if kind == _PORT_FAILURE:  # that rank never joins: the others wait for it in vain
                    reported = set(got) | {r for r, _, _ in failures}
                    failures += [(r, _PORT_FAILURE, "stopped: another rank's rendezvous failed")
                                 for r in range(nprocs) if r not in reported]
                    for p in procs:
                        p.kill()
    finally:
        for p in procs:
            p.join(timeout=max(0.0, min(10.0, deadline - time.time())))
            if p.is_alive():
                p.kill()
                p.join()
    return got, failures
