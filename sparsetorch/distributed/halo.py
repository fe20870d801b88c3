"""The halo exchange: which rows of B each rank sends to which, built once per partitioned pattern,
and the variable-size all-to-all (``all_to_all_single`` with split sizes) that moves them forward
and moves their gradients back in the backward.

A rank receives, from each peer, the distinct rows of B its remote columns reference there, sorted;
or, when it references at least ``dense_fraction`` (default 1/1.05 = 0.952) of the peer's rows, the
peer's whole block. The whole block costs at most 1.05x the minimum bytes, and the peer then
sends its block of B as it is: no gather into a send buffer (with two ranks, no copy at all), and
in the backward the returned gradient is the accumulate operand of the local product (no scatter).
The halo rows are in global order either way, so a remote column's halo index is its rank in it.
The rows move through the plan's transport (transport.py): the group's all-to-all, or copy-engine
writes between GPUs of one host.
"""
from __future__ import annotations

from typing import Dict, List, Optional, Sequence, Tuple

import torch

from sparsetorch.distributed._comm import Comm
from sparsetorch.distributed.transport import arrival_order, make_transport

__all__ = ["HaloPlan", "DENSE_FRACTION", "received_counts"]

# A peer's whole block is received when at least this fraction of it is needed: at most 1.05x the
# minimum bytes (the partition's distinct remote rows) from any peer, so from all of them together.
DENSE_FRACTION = 1 / 1.05


def received_counts(needed_counts: Sequence[int], block_rows: Sequence[int],
                    dense_fraction: float = DENSE_FRACTION) -> List[int]:
    """Rows received from each peer p: its whole block (``block_rows[p]``) when the distinct rows
    needed from it (``needed_counts[p]``) are at least ``dense_fraction`` of it, else those rows.
    The rule :class:`HaloPlan` applies (and ``partition.halo_counts`` off line)."""
    return [int(rows) if c and c >= dense_fraction * rows else int(c) for c, rows in zip(needed_counts, block_rows)]


class HaloPlan:
    """Built from ``needed``: the sorted distinct global rows of B (columns of A) outside this rank's
    block that its rows reference. ``halo``: the global rows received, in order (``remap[i]`` is
    ``needed[i]``'s index in it); ``recv_counts[p]`` / ``send_counts[p]``: rows received from / sent
    to rank p; ``send_index``: the rows of this rank's block sent, grouped by destination.
    ``active`` is False when no rank receives anything (then nothing is sent either).
    ``transport``: "auto", "all_to_all" or "copy_engine" (transport.py)."""

    def __init__(self, comm: Comm, needed: torch.Tensor, col_bounds: Sequence[int],
                 dense_fraction: float = DENSE_FRACTION, transport: str = "auto"):
        self.comm = comm
        rank, size = comm.rank, comm.size
        c0, c1 = col_bounds[rank], col_bounds[rank + 1]
        device = comm.device
        needed = needed.to(device=device, dtype=torch.int64)
        starts = torch.tensor(list(col_bounds[1:]), dtype=torch.int64, device=device)
        owners = torch.searchsorted(starts, needed, right=True)
        counts = torch.zeros(size, dtype=torch.int64, device=device).index_add_(0, owners, torch.ones_like(owners))
        counts = counts.tolist()
        if counts[rank] != 0:
            raise AssertionError("the halo holds a row this rank owns")
        pieces, self.dense_peers = [], []
        block_rows = [col_bounds[p + 1] - col_bounds[p] for p in range(size)]
        received = received_counts(counts, block_rows, dense_fraction)
        for p in range(size):
            if counts[p] and received[p] == block_rows[p]:
                self.dense_peers.append(p)
                pieces.append(torch.arange(col_bounds[p], col_bounds[p + 1], device=device))
                counts[p] = received[p]
            elif counts[p]:
                pieces.append(needed[owners == p])
        self.halo = torch.cat(pieces) if pieces else needed[:0]
        self.remap = torch.searchsorted(self.halo, needed)  # needed[i] == halo[remap[i]]
        self.recv_counts: List[int] = counts
        if size == 1:
            self.send_counts, wanted = [0], needed[:0]
        else:
            recv = torch.tensor(counts, dtype=torch.int64, device=device)
            send = torch.empty_like(recv)
            comm.all_to_all(send, recv, [1] * size, [1] * size, "building the halo exchange (counts)")
            self.send_counts = send.tolist()
            wanted = torch.empty(sum(self.send_counts), dtype=torch.int64, device=device)
            comm.all_to_all(wanted, self.halo, self.send_counts, self.recv_counts, "building the halo exchange (rows)")
        self.send_index = wanted - c0  # rows of this rank's block of B, grouped by the rank they go to
        self.halo_size = self.halo.numel()
        self.send_size = wanted.numel()
        self.block_rows = c1 - c0
        # Two ranks (or one receiver) taking this rank's whole block: B is the send buffer as it is.
        receivers = [p for p in range(size) if self.send_counts[p]]
        self.sends_whole_block = len(receivers) == 1 and self.send_size == self.block_rows
        sizes = comm.all_gather_ints([self.halo_size, self.send_size, needed.numel()] + self.recv_counts,
                                     "building the halo exchange (sizes)")
        self.halo_sizes = [s[0] for s in sizes]    # per rank: rows received per product
        self.needed_sizes = [s[2] for s in sizes]  # per rank: the minimum (distinct remote rows referenced)
        # counts[r][p]: rows rank r receives from rank p in the forward exchange (the backward's is its transpose)
        self.counts = [s[3:] for s in sizes]
        self.counts_reverse = [[self.counts[p][r] for p in range(size)] for r in range(size)]
        self.active = sum(self.halo_sizes) > 0
        max_rows = max(max(s[0], s[1]) for s in sizes)
        self.transport = make_transport(comm, transport, max_rows) if self.active else make_transport(
            comm, "all_to_all", 0)
        # The dtype the products' rows move in (DistributedCSR.exchange_dtype; None: B's own). Degree
        # vectors and other exact exchanges (:meth:`exchange`) always move in their own dtype.
        self.exchange_dtype: Optional[torch.dtype] = None
        self.stats: Dict[str, int] = {}
        self.reset_stats()

    def check_indices(self) -> None:
        """The rows peers asked for lie in this rank's block (a corrupt plan must not gather out of bounds)."""
        if self.send_size and (int(self.send_index.min()) < 0 or int(self.send_index.max()) >= self.block_rows):
            raise IndexError(f"halo exchange: a peer asked for a row outside this rank's block of {self.block_rows} rows")

    def reset_stats(self) -> None:
        """Zero the byte counters (``stats``: calls and bytes received / sent, forward and backward)."""
        self.stats = {"forward_calls": 0, "forward_bytes_received": 0, "forward_bytes_sent": 0,
                      "backward_calls": 0, "backward_bytes_received": 0, "backward_bytes_sent": 0}

    def _count(self, direction: str, received: int, sent: int, row_bytes: int) -> None:
        self.stats[f"{direction}_calls"] += 1
        self.stats[f"{direction}_bytes_received"] += received * row_bytes
        self.stats[f"{direction}_bytes_sent"] += sent * row_bytes

    @property
    def halo_is_transient(self) -> bool:
        """The received rows live in the transport's buffer until the next exchange of this plan."""
        return self.transport.name == "copy_engine"

    def start(self, b_block: torch.Tensor, dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, object]:
        """Begin receiving the halo rows of B, moved in ``dtype`` (default: B's); returns (halo rows, in
        that dtype; pending). Call :meth:`finish` before reading the rows; the product of the local columns
        can run in between."""
        n = b_block.shape[1]
        send = b_block.contiguous() if self.sends_whole_block else b_block.index_select(0, self.send_index)
        send = send if dtype is None else send.to(dtype)
        recv, pending = self.transport.start(send, self.counts, "halo exchange of B")
        self._count("forward", self.halo_size, self.send_size, n * send.element_size())
        return recv, pending

    def start_reverse(self, grad_halo: torch.Tensor, dtype: Optional[torch.dtype] = None) -> Tuple[torch.Tensor, object]:
        """Begin sending the gradients of the halo rows back to their owners, in ``dtype`` (default:
        theirs); returns (the gradient rows this rank's block receives, in ``send_index`` order; pending)."""
        n = grad_halo.shape[1]
        send = grad_halo.contiguous() if dtype is None else grad_halo.to(dtype).contiguous()
        recv, pending = self.transport.start(send, self.counts_reverse, "halo exchange of the gradient of B")
        self._count("backward", self.send_size, self.halo_size, n * send.element_size())
        return recv, pending

    @property
    def senders(self) -> List[int]:
        """The ranks this rank receives rows from, in the order their rows land (see transport.py)."""
        return arrival_order(self.recv_counts, self.comm.rank)

    @property
    def per_sender(self) -> bool:
        """Whether each sender's rows can be waited for on their own (:meth:`finish_from`)."""
        return hasattr(self.transport, "finish_from")

    def finish_from(self, pending, p: int) -> None:
        """Wait for the rows from rank ``p`` only (transports with ``per_sender``)."""
        self.transport.finish_from(pending, p)

    def finish(self, pending) -> None:
        self.transport.finish(pending)

    def exchange(self, b_block: torch.Tensor) -> torch.Tensor:
        """The halo rows of ``b_block`` (blocking; a tensor of its own, also with the copy engines)."""
        recv, pending = self.start(b_block)
        self.finish(pending)
        return recv.clone() if self.halo_is_transient else recv
