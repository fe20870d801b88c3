"""How the halo rows move: the process group's all-to-all (NCCL, gloo), or, between GPUs of one
host that can address each other's memory, copy-engine writes into the receiver's buffer.

Why the copy engines: NCCL's all-to-all runs as kernels on the SMs, so an exchange that overlaps
the local product competes with it for SMs. On 2 H200s (NV18), power-law graph of 134M entries,
n = 256: the two products alone took 19.1 ms, the product with NCCL's exchange 22.7 ms, with the
copy-engine push 20.0 ms (benchmarks/distributed_overlap_cuda.py).

An exchange is given by a count matrix ``C`` (``C[r][p]``: rows rank r receives from rank p) and
this rank's send buffer, its rows grouped by destination rank. A rank receives its rows grouped
by source rank, in rank order (as ``all_to_all_single`` delivers them).

The copy-engine protocol (PyTorch's symmetric memory: a buffer every rank can write into, and a
signal slot per (channel, source rank) in each rank's signal pad; each signal is a stream-ordered
kernel, so nothing waits on the host):

    receiver, current stream:  "free" to every rank that sends to it (after its last read of the buffer)
    sender, a side stream per receiver (after the send rows are ready):
                               wait "free"; cudaMemcpyAsync of its rows into the receiver's buffer
                               at the receiver's offset for it; "ready"
    receiver, current stream:  before reading a sender's rows, wait its "ready" (one sender at a
                               time, so its rows can be multiplied while others are in flight);
                               at the end, join the side streams

Rank r sends to r+1, r+2, ... (mod the group size), each copy on its own stream: the copies run at
once on the GPU's copy engines and no receiver is written by every sender at the same time. In the
order of 0, 1, 2, ... for every sender, on 4 H200s the exchange of 3.2 GB per rank took 18.5 ms
against NCCL's 11.2 ms (2026-11-27, benchmarks/results/nvidia-h200-x4).

The buffer is reused by every exchange of the plan: a received block is valid until the next
exchange of the same plan (callers that keep it, e.g. for a backward, copy it).
"""
from __future__ import annotations

import os
import socket
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from sparsetorch.distributed._comm import Comm

__all__ = ["TRANSPORTS", "AllToAll", "CopyEngine", "arrival_order", "copy_plan", "make_transport"]

TRANSPORTS = ("auto", "all_to_all", "copy_engine")
_ENV = "SPARSETORCH_HALO_TRANSPORT"  # overrides "auto" (benchmarks compare the two)
_FREE, _READY = 0, 1  # signal channels


def _prefix(counts: Sequence[int]) -> List[int]:
    out = [0]
    for c in counts:
        out.append(out[-1] + c)
    return out


def copy_plan(counts: List[List[int]], me: int) -> List[Tuple[int, int, int, int]]:
    """The copies rank ``me`` makes in an exchange with count matrix ``counts`` (``counts[r][p]``: rows
    rank r receives from p): per receiving peer p, ``(p, rows, first row in me's send buffer, first row
    in p's receive buffer)``. The send buffer is grouped by destination in rank order; a receive
    buffer by source in rank order, as ``all_to_all_single`` lays them out."""
    send_offsets = _prefix([counts[p][me] for p in range(len(counts))])
    return [(p, counts[p][me], send_offsets[p], sum(counts[p][:me]))
            for p in range(len(counts)) if p != me and counts[p][me]]


class AllToAll:
    """The process group's variable-size all-to-all (``all_to_all_single``)."""

    name = "all_to_all"
    bytes_held = bytes_outside_allocator = 0

    def __init__(self, comm: Comm):
        self.comm = comm

    def start(self, send: torch.Tensor, counts: List[List[int]], what: str):
        """Begin moving ``send`` (rows grouped by destination) as ``counts`` says; returns
        (received rows, pending)."""
        me = self.comm.rank
        recv_counts = list(counts[me])
        send_counts = [counts[p][me] for p in range(self.comm.size)]
        recv = send.new_empty((sum(recv_counts), send.shape[1]))
        work = self.comm.all_to_all(recv, send, recv_counts, send_counts, what, async_op=True)
        return recv, (work, send, what)

    def finish(self, pending) -> None:
        work, _keep_alive, what = pending  # the send buffer lives until the collective is done
        self.comm.wait(work, what)


class CopyEngine:
    """Copy-engine writes into the receivers' symmetric buffers (see the module docstring).
    ``max_rows``: the most rows any rank receives in one exchange (the buffer's size, identical on
    every rank, as symmetric memory requires)."""

    name = "copy_engine"

    def __init__(self, comm: Comm, max_rows: int, timeout_ms: int):
        self.comm = comm
        self.max_rows = max_rows
        self.timeout_ms = timeout_ms
        self.buffer: Optional[torch.Tensor] = None
        self.handle = None
        self.peers: List[Optional[torch.Tensor]] = []
        self.sides: Dict[int, torch.cuda.Stream] = {}  # per receiving peer: the stream of its copies
        self.counted_by_allocator = True

    @property
    def bytes_held(self) -> int:
        """Bytes of this rank's symmetric buffer."""
        return 0 if self.buffer is None else self.buffer.numel()

    @property
    def bytes_outside_allocator(self) -> int:
        """The buffer's bytes where the caching allocator's statistics (and its memory fraction cap)
        do not see them (symmetric memory is mapped by PyTorch's own allocator for it)."""
        return 0 if self.counted_by_allocator else self.bytes_held

    def _reserve(self, nbytes: int) -> None:
        """A symmetric buffer of at least ``nbytes`` (collective: every rank asks for the same size)."""
        if self.buffer is not None and self.buffer.numel() >= nbytes:
            return
        import torch.distributed._symmetric_memory as symm_mem

        device = self.comm.device
        if self.buffer is not None:  # kernels of earlier exchanges may still read or write it
            torch.cuda.synchronize(device)
        self.buffer = self.handle = None
        self.peers = []
        before = torch.cuda.memory_allocated(device)
        buffer = symm_mem.empty(nbytes, dtype=torch.uint8, device=device)
        self.counted_by_allocator = torch.cuda.memory_allocated(device) - before >= nbytes
        try:
            handle = symm_mem.rendezvous(buffer, self.comm.group)
        except Exception as e:  # noqa: BLE001 - named below, with the way out
            raise RuntimeError(f"rank {self.comm.rank}: the copy-engine halo exchange could not map the peers' "
                               f"buffers ({type(e).__name__}: {e}); build the matrix with "
                               f"transport=\"all_to_all\" (or set {_ENV}=all_to_all)") from e
        self.buffer, self.handle = buffer, handle
        self.peers = [None if p == self.comm.rank else handle.get_remote_tensor(p, (nbytes,), torch.uint8)
                      for p in range(self.comm.size)]

    @staticmethod
    def _rows(buffer: torch.Tensor, first: int, rows: int, n: int, dtype: torch.dtype) -> torch.Tensor:
        row_bytes = n * dtype.itemsize
        return buffer[first * row_bytes:(first + rows) * row_bytes].view(dtype).view(rows, n)

    def start(self, send: torch.Tensor, counts: List[List[int]], what: str):
        me, size = self.comm.rank, self.comm.size
        n, dtype = send.shape[1], send.dtype
        self._reserve(self.max_rows * n * send.element_size())
        recv_counts = counts[me]
        main = torch.cuda.current_stream(self.comm.device)
        for p in range(size):
            if p != me and recv_counts[p]:
                self.handle.put_signal(p, _FREE, self.timeout_ms)
        sides = []
        for p, rows, first, at in sorted(copy_plan(counts, me), key=lambda c: (c[0] - me) % size):
            side = self.sides.get(p)
            if side is None:
                side = self.sides[p] = torch.cuda.Stream(device=self.comm.device, priority=-1)
            side.wait_stream(main)
            with torch.cuda.stream(side):
                self.handle.wait_signal(p, _FREE, self.timeout_ms)
                self._rows(self.peers[p], at, rows, n, dtype).copy_(send[first:first + rows])
                self.handle.put_signal(p, _READY, self.timeout_ms)
            send.record_stream(side)
            sides.append(side)
        recv = self._rows(self.buffer, 0, sum(recv_counts), n, dtype)
        return recv, {"waiting": arrival_order(recv_counts, me), "sides": sides}

    def finish_from(self, pending, p: int) -> None:
        """Wait (on the current stream) for the rows from rank ``p`` only."""
        if p in pending["waiting"]:
            self.handle.wait_signal(p, _READY, self.timeout_ms)
            pending["waiting"].remove(p)

    def finish(self, pending) -> None:
        for p in list(pending["waiting"]):
            self.finish_from(pending, p)
        main = torch.cuda.current_stream(self.comm.device)
        for side in pending["sides"]:  # the caller may change its send rows after this (an optimizer step)
            main.wait_stream(side)


def arrival_order(recv_counts: Sequence[int], me: int) -> List[int]:
    """The senders to rank ``me`` (those with rows for it) in the order their copies start: rank s
    sends to s+1 first, so me-1's rows come first, then me-2's, ... (mod the group size)."""
    size = len(recv_counts)
    return [s for s in ((me - d) % size for d in range(1, size)) if recv_counts[s]]


def _peer_reachable(comm: Comm) -> bool:
    """Every rank on this host, its GPU able to address every other rank's (agreed by all ranks)."""
    import torch.distributed as dist

    ok = True
    try:
        import torch.distributed._symmetric_memory  # noqa: F401
    except ImportError:
        ok = False
    where = [None] * comm.size
    comm._run(lambda: dist.all_gather_object(where, (socket.gethostname(), comm.device.index), group=comm.control),
              "choosing the halo transport", comm.global_ranks)
    if ok:
        hosts = {h for h, _ in where}
        mine = comm.device.index
        ok = len(hosts) == 1 and all(d == mine or torch.cuda.can_device_access_peer(mine, d) for _, d in where)
    flags = comm.all_gather_ints([int(ok)], "choosing the halo transport")
    return all(f[0] for f in flags)


def _timeout_ms(comm: Comm) -> int:
    """The group's timeout (a signal not answered within it stops the kernel waiting for it)."""
    import datetime

    try:
        timeout = comm.group._get_backend(comm.device).options._timeout
    except Exception:  # noqa: BLE001 - private API: NCCL's default then
        timeout = datetime.timedelta(minutes=10)
    return max(1, int(timeout.total_seconds() * 1000))


def make_transport(comm: Comm, transport: str, max_rows: int):
    """The transport for a plan: ``transport`` as asked, or for "auto" the copy engines for two GPUs
    of one host that reach each other (``SPARSETORCH_HALO_TRANSPORT`` overrides "auto"), else the
    all-to-all. Collective (every rank decides the same). Two ranks only: on 4 H200s the all-to-all
    was faster at 3 and 4 ranks (2026-11-27, before the copies ran per receiver; docs/distributed.md)."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport: expected one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if transport == "auto":
        transport = os.environ.get(_ENV, "auto")
        if transport not in TRANSPORTS:
            raise ValueError(f"{_ENV}: expected one of {', '.join(TRANSPORTS)}, got {transport!r}")
    if transport == "auto":
        cuda = comm.backend == "nccl" and comm.device.type == "cuda" and comm.size == 2
        transport = "copy_engine" if cuda and _peer_reachable(comm) else "all_to_all"
    if transport == "copy_engine":
        if comm.device.type != "cuda" or comm.size == 1:
            raise ValueError(f"transport: 'copy_engine' needs a group of CUDA ranks, got {comm.size} rank(s) on "
                             f"{comm.device}")
        return CopyEngine(comm, max_rows, _timeout_ms(comm))
    return AllToAll(comm)
