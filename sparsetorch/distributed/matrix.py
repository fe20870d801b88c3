"""DistributedCSR: a sparse matrix partitioned by rows over the ranks of a torch.distributed group.

Rank r holds rows ``[row_bounds[r], row_bounds[r+1])`` of A and rows ``[col_bounds[r],
col_bounds[r+1])`` of every B it is multiplied with (for a square adjacency both are the node range
of the rank, so a GNN's node features and outputs stay where they are). Its rows are stored as two
CSR matrices: ``local`` (the columns of its own rows of B, renumbered from 0) and ``remote`` (the
columns other ranks own, renumbered into the halo: the distinct rows of B it receives). The split
and the exchange plan are built once per graph; ``st.spmm(A, B_r)`` then moves only the halo rows.
"""
from __future__ import annotations

from typing import Any, List, Optional, Sequence

import torch

from sparsetorch._ops import ops
from sparsetorch._validate import validate_csr
from sparsetorch.csr import CSR, as_csr, sum_dtype
from sparsetorch.distributed._comm import Comm
from sparsetorch.distributed._spmm import DistributedSpmm, product
from sparsetorch.distributed.halo import DENSE_FRACTION, HaloPlan
from sparsetorch.distributed.transport import TRANSPORTS
from sparsetorch.distributed.partition import (append_diagonal, balanced_row_bounds, check_bounds, entry_rows,
                                               even_bounds, split_block)
from sparsetorch.functional import _activation_name, scale
from sparsetorch.plan import SPMM_BACKENDS

__all__ = ["DistributedCSR", "halo_volume"]


def _on(a: CSR, device: torch.device) -> CSR:
    return a if a.device == device else a.to(device=device)


def _row_block(a: CSR, start: int, end: int) -> CSR:
    crow = a.crow_indices
    first, last = int(crow[start]), int(crow[end])
    return CSR(crow[start:end + 1] - crow[start], a.col_indices[first:last], a.values[first:last],
               (end - start, a.shape[1]))


_P = 2147483647  # 2^31 - 1: every product below stays under 2^62


def _fingerprint(a: CSR, chunk: int = 1 << 24) -> List[int]:
    """Three ints that differ, all but surely, when two matrices of the same sizes differ in their row
    pointers, columns or values (bit patterns): sum_i w_i x_i mod p with p = 2^31 - 1 and weights
    w_i = 48271 (i mod (p - 1) + 1) mod p, never 0 (period p - 1: tensors below 2^31 entries), in exact int64 arithmetic (the same on every device and thread count; sums stay below 2^63 up to 2^32
    entries per chunk). In chunks, so the temporaries stay small next to the matrix."""
    out = []
    for t in (a.crow_indices, a.col_indices, a.values):
        if t.is_floating_point():  # the values' bit patterns, as integers
            t = t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
        flat, total = t.reshape(-1), 0
        for i in range(0, flat.numel(), chunk):
            x = flat[i:i + chunk].long() % _P
            w = (torch.arange(i, i + x.numel(), device=x.device, dtype=torch.int64) % (_P - 1) + 1) * 48271 % _P
            total = (total + int((x * w % _P).sum())) % _P
        out.append(total)
    return out


class DistributedCSR:
    """A row-partitioned sparse matrix (see the module docstring). Build it with
    :meth:`from_global`, :meth:`scatter` or :meth:`from_blocks`; multiply with ``st.spmm(A, B_r)``
    (or ``A @ B_r``), where ``B_r`` holds this rank's rows of B: the result holds this rank's rows
    of the product. Every rank of the group must make the same calls in the same order.
    """

    def __init__(self, comm: Comm, shape, row_bounds: List[int], col_bounds: List[int], local: CSR, remote: CSR,
                 halo_plan: HaloPlan):
        self.comm = comm
        self.shape = tuple(int(s) for s in shape)
        self.row_bounds, self.col_bounds = list(row_bounds), list(col_bounds)
        self.local, self.remote, self.halo_plan = local, remote, halo_plan
        self._route_plans = {}        # part -> SpmmPlan that picks its route per width of B
        self._transposed_values = {}  # part -> (values, version, values of the transpose)
        self._derived = {}            # ("gcn", loops, improved) / ("mean",) / dtype -> DistributedCSR
        self._sender_parts = None     # the remote part split by sending rank (_spmm._sender_parts)

    # --- construction ------------------------------------------------------------------------
    @classmethod
    def from_global(cls, A: Any, *, group=None, device=None, row_bounds: Optional[Sequence[int]] = None,
                    col_bounds: Optional[Sequence[int]] = None, row_weight: float = 1.0,
                    validate: bool = True, dense_fraction: float = DENSE_FRACTION,
                    transport: str = "auto") -> "DistributedCSR":
        """Every rank holds the whole matrix ``A`` (anything ``st.as_csr`` takes) and keeps its rows. The
        ranks check that they hold the same ``A`` (sizes and content fingerprints; ValueError on every rank).

        ``row_bounds`` default: blocks balanced by entries (:func:`balanced_row_bounds`, computed on
        rank 0 and broadcast); ``col_bounds`` default: ``row_bounds`` for a square matrix, else an
        even split of the columns. ``device``: where this rank's part lives (default: the current
        CUDA device for an NCCL group, the CPU for gloo). ``dense_fraction``: a rank receives a peer's
        whole block of B when it needs at least this fraction of its rows (halo.py). ``transport``:
        how the halo rows move: "all_to_all" (the group's collective), "copy_engine" (copy-engine
        writes into the peers' buffers, GPUs of one host) or "auto" (the copy engines where every
        rank's GPU reaches the others'; transport.py). ``validate``: check each block's structure
        (O(nnz)) before splitting it. The same keywords apply to :meth:`scatter` and :meth:`from_blocks`.
        """
        comm = Comm(group, device)

        def load():
            a = _on(as_csr(A, device=comm.device), comm.device)
            if a.batched:
                raise ValueError(f"A: expected a 2-D matrix, got shape {a.shape}")
            return a

        a = comm.check("DistributedCSR.from_global", load)
        comm.agree(None, "DistributedCSR.from_global", same=list(a.shape) + [a.col_indices.numel()] + _fingerprint(a),
                   same_name="A's (rows, columns, stored entries, fingerprints of row pointers, columns and values)")
        rows, cols = a.shape
        if row_bounds is None:
            row_bounds = comm.broadcast_object(
                balanced_row_bounds(a.crow_indices, comm.size, row_weight) if comm.rank == 0 else None, 0,
                "DistributedCSR.from_global")
        rb, cb = comm.check("DistributedCSR.from_global", lambda: _bounds(row_bounds, col_bounds, rows, cols, comm.size))
        block = _row_block(a, rb[comm.rank], rb[comm.rank + 1])
        return cls._build(comm, block, (rows, cols), rb, cb, validate, "DistributedCSR.from_global", dense_fraction,
                          transport)

    @classmethod
    def scatter(cls, A: Any = None, *, src: int = 0, group=None, device=None,
                row_bounds: Optional[Sequence[int]] = None, col_bounds: Optional[Sequence[int]] = None,
                row_weight: float = 1.0, validate: bool = True,
                dense_fraction: float = DENSE_FRACTION, transport: str = "auto") -> "DistributedCSR":
        """Rank ``src`` (of the group) holds ``A`` and sends each rank its rows; the others pass ``A=None``."""
        import torch.distributed as dist

        comm = Comm(group, device)
        what = "DistributedCSR.scatter"

        def plan():
            if comm.rank != src:
                return None
            a = _on(as_csr(A, device=comm.device), comm.device)
            if a.batched:
                raise ValueError(f"A: expected a 2-D matrix, got shape {a.shape}")
            rb = list(row_bounds) if row_bounds is not None else balanced_row_bounds(a.crow_indices, comm.size,
                                                                                     row_weight)
            rb, cb = _bounds(rb, col_bounds, a.shape[0], a.shape[1], comm.size)
            crow = a.crow_indices.long()
            nnz = [int(crow[rb[r + 1]] - crow[rb[r]]) for r in range(comm.size)]
            meta = (a.shape, rb, cb, str(a.dtype), str(a.index_dtype), nnz)
            return a, meta

        held = comm.check(what, plan)
        meta = comm.broadcast_object(held[1] if held else None, src, what)
        shape, rb, cb, dtype_name, index_name, nnz = meta
        dtype, index_dtype = getattr(torch, dtype_name[6:]), getattr(torch, index_name[6:])
        if comm.rank == src:
            a = held[0]
            for r in range(comm.size):
                if r == src:
                    continue
                part = _row_block(a, rb[r], rb[r + 1])
                for t in (part.crow_indices, part.col_indices, part.values):
                    comm._run(lambda t=t: dist.send(t.contiguous(), comm.global_ranks[r], group=comm.group), what,
                              comm.global_ranks)
            block = _row_block(a, rb[src], rb[src + 1])
        else:
            m = rb[comm.rank + 1] - rb[comm.rank]
            e = nnz[comm.rank]
            parts = [torch.empty(m + 1, dtype=index_dtype, device=comm.device),
                     torch.empty(e, dtype=index_dtype, device=comm.device),
                     torch.empty(e, dtype=dtype, device=comm.device)]
            for t in parts:
                comm._run(lambda t=t: dist.recv(t, comm.global_ranks[src], group=comm.group), what, comm.global_ranks)
            block = CSR(parts[0], parts[1], parts[2], (m, shape[1]))
        return cls._build(comm, block, tuple(shape), rb, cb, validate, what, dense_fraction, transport)

    @classmethod
    def from_blocks(cls, block: Any, *, group=None, device=None, col_bounds: Optional[Sequence[int]] = None,
                    validate: bool = True, dense_fraction: float = DENSE_FRACTION,
                    transport: str = "auto") -> "DistributedCSR":
        """Each rank passes its own consecutive block of rows (rank 0 the first), an (m_r, k) matrix
        with global column numbers; k is the same on every rank. The row bounds follow from the
        blocks' sizes (balancing them is the caller's part: :func:`balanced_row_bounds`)."""
        comm = Comm(group, device)
        what = "DistributedCSR.from_blocks"

        def load():
            b = _on(as_csr(block, device=comm.device), comm.device)
            if b.batched:
                raise ValueError(f"block: expected a 2-D (rows, columns) matrix, got shape {b.shape}")
            return b

        b = comm.check(what, load)
        comm.agree(None, what, same=[b.shape[1]], same_name="the number of columns of the blocks")
        rb = [0]
        for size in comm.all_gather_ints([b.shape[0]], what):
            rb.append(rb[-1] + size[0])
        rows, cols = rb[-1], b.shape[1]
        _, cb = comm.check(what, lambda: _bounds(rb, col_bounds, rows, cols, comm.size))
        return cls._build(comm, b, (rows, cols), rb, cb, validate, what, dense_fraction, transport)

    @classmethod
    def _build(cls, comm: Comm, block: CSR, shape, rb: List[int], cb: List[int], validate: bool, what: str,
               dense_fraction: float, transport: str):
        def split():
            if transport not in TRANSPORTS:
                raise ValueError(f"transport: expected one of {', '.join(TRANSPORTS)}, got {transport!r}")
            if validate:
                validate_csr(block)
            return split_block(block, cb[comm.rank], cb[comm.rank + 1])

        local, remote, needed = comm.check(what, split)
        plan = HaloPlan(comm, needed, cb, dense_fraction, transport)
        comm.check(what, plan.check_indices)
        remote = CSR(remote.crow_indices, plan.remap[remote.col_indices.long()].to(remote.index_dtype),
                     remote.values, (remote.shape[0], plan.halo_size))
        return cls(comm, shape, rb, cb, local, remote, plan)

    def _derive(self, local: CSR, remote: CSR) -> "DistributedCSR":
        """The same partition and halo (remote pattern unchanged) with other local/remote parts."""
        derived = DistributedCSR(self.comm, self.shape, self.row_bounds, self.col_bounds, local, remote,
                                 self.halo_plan)
        derived._sender_parts = self._sender_parts  # the pattern's split by sender (_spmm), if built
        return derived

    # --- properties ----------------------------------------------------------------------------
    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def world_size(self) -> int:
        return self.comm.size

    @property
    def group(self):
        return self.comm.group

    @property
    def device(self) -> torch.device:
        return self.local.device

    @property
    def dtype(self) -> torch.dtype:
        return self.local.dtype

    @property
    def row_start(self) -> int:
        return self.row_bounds[self.rank]

    @property
    def row_end(self) -> int:
        return self.row_bounds[self.rank + 1]

    @property
    def col_start(self) -> int:
        return self.col_bounds[self.rank]

    @property
    def col_end(self) -> int:
        return self.col_bounds[self.rank + 1]

    @property
    def nnz(self) -> int:
        """Entries stored on this rank."""
        return self.local.col_indices.numel() + self.remote.col_indices.numel()

    @property
    def halo_size(self) -> int:
        """Distinct rows of B this rank receives per product."""
        return self.halo_plan.halo_size

    @property
    def exchange_dtype(self) -> Optional[torch.dtype]:
        """The dtype the rows of B and their gradients move in between the ranks in a product: None (the
        default) moves them in B's dtype, exactly; ``torch.bfloat16`` or ``torch.float16`` halves an fp32
        exchange, rounding the received rows (products still sum in B's dtype; the local part is exact).
        Shared with the matrices derived from this one; every rank must set the same (checked: a
        collective on the control group)."""
        return self.halo_plan.exchange_dtype

    @exchange_dtype.setter
    def exchange_dtype(self, dtype: Optional[torch.dtype]) -> None:
        choices = (None, torch.float16, torch.bfloat16, torch.float32, torch.float64)
        if dtype not in choices:
            raise ValueError(f"exchange_dtype: expected None, torch.float16, torch.bfloat16, torch.float32 or "
                             f"torch.float64, got {dtype!r}")
        codes = self.comm.all_gather_ints([choices.index(dtype)], "setting exchange_dtype")
        if len({c[0] for c in codes}) > 1:
            raise ValueError("exchange_dtype: the ranks set different dtypes: " +
                             ", ".join(f"rank {r}: {choices[c[0]]}" for r, c in enumerate(codes)))
        self.halo_plan.exchange_dtype = dtype

    def exchange_bytes(self, n: int, dtype: Optional[torch.dtype] = None) -> int:
        """Bytes this rank receives per product with a B of width n (within 1.05x of the partition's
        minimum with the default ``dense_fraction``: :meth:`halo_volume`)."""
        element = torch.empty((), dtype=dtype or self.dtype).element_size()
        return self.halo_size * n * element

    def halo_volume(self, n: int, dtype: Optional[torch.dtype] = None) -> List[dict]:
        """Per rank of the group, what one product with a B of width n moves: ``received_rows`` /
        ``received_bytes`` (what the exchange brings it, whole peer blocks included), ``min_rows`` /
        ``min_bytes`` (the partition's minimum: the distinct remote columns its rows reference, times
        n and the element size) and ``ratio`` (received / minimum; 1.0 when both are 0). Known on
        every rank from the plan's build: no communication. The backward moves the same rows back."""
        element = torch.empty((), dtype=dtype or self.dtype).element_size()
        out = []
        for got, least in zip(self.halo_plan.halo_sizes, self.halo_plan.needed_sizes):
            out.append({"received_rows": got, "min_rows": least, "received_bytes": got * n * element,
                        "min_bytes": least * n * element,
                        "ratio": got / least if least else (1.0 if got == 0 else float("inf"))})
        return out

    def local_rows(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global tensor indexed like A's rows (the output side)."""
        return x[self.row_start:self.row_end]

    def local_cols(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global B (indexed like A's columns)."""
        return x[self.col_start:self.col_end]

    def gather_rows(self, y: torch.Tensor) -> torch.Tensor:
        """The global tensor from every rank's rows ``y`` (as returned by a product), on every rank."""
        import torch.distributed as dist

        counts = [self.row_bounds[r + 1] - self.row_bounds[r] for r in range(self.world_size)]
        if self.world_size == 1:
            return y
        width = max(counts)
        padded = y.new_zeros((width,) + tuple(y.shape[1:]))
        padded[:y.shape[0]] = y
        out = [torch.empty_like(padded) for _ in counts]
        self.comm._run(lambda: dist.all_gather(out, padded, group=self.group), "gather_rows", self.comm.global_ranks)
        return torch.cat([o[:c] for o, c in zip(out, counts)])

    def __repr__(self) -> str:
        return (f"DistributedCSR(shape={self.shape}, rank={self.rank}/{self.world_size}, rows=[{self.row_start}, "
                f"{self.row_end}), local nnz={self.local.col_indices.numel()}, remote nnz="
                f"{self.remote.col_indices.numel()}, halo={self.halo_size}, dtype={self.dtype}, device={self.device})")

    # --- derived matrices ------------------------------------------------------------------------
    def to(self, dtype: Optional[torch.dtype] = None) -> "DistributedCSR":
        """The same matrix with values of another dtype (cached)."""
        if dtype is None or dtype == self.dtype:
            return self
        if dtype not in self._derived:
            self._derived[dtype] = self._derive(self.local.to(dtype=dtype), self.remote.to(dtype=dtype))
        return self._derived[dtype]

    def with_values(self, local_values: torch.Tensor, remote_values: torch.Tensor) -> "DistributedCSR":
        """The same pattern with other values for the local and remote parts (e.g. learnable weights)."""
        return self._derive(self.local.with_values(local_values), self.remote.with_values(remote_values))

    def _row_sums(self, a_local: CSR, values_local=None, values_remote=None) -> torch.Tensor:
        m = self.row_end - self.row_start
        out = torch.zeros(m, dtype=sum_dtype(self.dtype), device=self.device)
        for part, v in ((a_local, values_local), (self.remote, values_remote)):
            nnz = part.col_indices.numel()
            if nnz:
                out.index_add_(0, entry_rows(part.crow_indices, nnz), (part.values if v is None else v).to(out.dtype))
        return out

    def gcn_normalized(self, add_self_loops: bool = True, improved: bool = False) -> "DistributedCSR":
        """GCN's propagation matrix ``D^-1/2 (A + fill I) D^-1/2`` (fill = 2 if ``improved`` else 1),
        D the row sums of ``A + fill I``, as :func:`sparsetorch.nn.gcn.gcn_normalize` on one device;
        rows of degree 0 get factor 0. Needs a square matrix whose rows and columns are partitioned
        alike. The column factors of the remote entries come from their owners through the halo
        exchange. Computed once and cached on this object (collective: every rank calls it)."""
        key = ("gcn", bool(add_self_loops), bool(improved))
        if key in self._derived:
            return self._derived[key]
        self.comm.check("gcn_normalized", self._check_square)
        local = append_diagonal(self.local, 2.0 if improved else 1.0) if add_self_loops else self.local
        degree = self._row_sums(local)
        dinv = degree.pow(-0.5)
        dinv = torch.where(torch.isinf(dinv), torch.zeros_like(dinv), dinv).to(self.dtype)
        dinv_halo = self._halo_of(dinv)
        result = self._derive(scale(local, row=dinv, col=dinv), scale(self.remote, row=dinv, col=dinv_halo))
        self._derived[key] = result
        return result

    def mean_normalized(self) -> "DistributedCSR":
        """Each row divided by its number of stored entries (mean aggregation, as torch_sparse's
        ``reduce="mean"``: stored values are kept as weights); empty rows stay empty. Cached."""
        key = ("mean",)
        if key not in self._derived:
            counts = torch.zeros(self.row_end - self.row_start, dtype=torch.int64, device=self.device)
            for part in (self.local, self.remote):
                counts += part.crow_indices[1:].long() - part.crow_indices[:-1].long()
            factor = torch.where(counts > 0, 1.0 / counts.clamp(min=1).double(), torch.zeros((), dtype=torch.float64,
                                                                                          device=self.device))
            factor = factor.to(self.dtype)
            self._derived[key] = self._derive(scale(self.local, row=factor), scale(self.remote, row=factor))
        return self._derived[key]

    def _check_square(self) -> None:
        if self.shape[0] != self.shape[1] or self.row_bounds != self.col_bounds:
            raise ValueError(f"gcn_normalized: needs a square matrix whose rows and columns are partitioned alike, "
                             f"got shape {self.shape}, row bounds {self.row_bounds}, column bounds {self.col_bounds}")

    def _halo_of(self, vector: torch.Tensor) -> torch.Tensor:
        """The entries of a vector over this rank's columns that its halo needs, from their owners."""
        if not self.halo_plan.active:
            return vector.new_zeros(0)
        return self.halo_plan.exchange(vector.unsqueeze(1)).squeeze(1)

    # --- the product -------------------------------------------------------------------------------
    def __matmul__(self, B: torch.Tensor) -> torch.Tensor:
        return self.__sparsetorch_spmm__(B)

    def __sparsetorch_spmm__(self, B: torch.Tensor, *, alpha: float = 1.0, beta: float = 0.0,
                             c: Optional[torch.Tensor] = None, bias: Optional[torch.Tensor] = None,
                             activation: Optional[str] = None, negative_slope: float = 0.01,
                             out: Optional[torch.Tensor] = None, validate: bool = False, backend: str = "auto",
                             policy: str = "sparse") -> torch.Tensor:
        """``act(alpha * A @ B + beta * c + bias)`` for this rank's rows, as ``st.spmm`` (which hands
        the call here). ``B``: this rank's rows of B, ``(col_end - col_start, n)``; ``c``/``out``:
        ``(row_end - row_start, n)``. Collective. The ranks first agree that every rank's arguments
        are valid (a rank with bad input makes every rank raise, naming it)."""
        width = B.shape[-1] if isinstance(B, torch.Tensor) and B.dim() >= 1 else -1
        element = B.element_size() if isinstance(B, torch.Tensor) else -1
        act = self.comm.check("spmm", lambda: self._check_args(B, c, bias, out, activation, backend, policy, validate),
                              same=[width, element], same_name="the width of B (n) and its element size")
        accumulate = out if out is not None else c
        records = torch.is_grad_enabled() and any(
            isinstance(t, torch.Tensor) and t.requires_grad
            for t in (B, self.local.values, self.remote.values, accumulate, bias))
        if records:
            if out is not None:
                raise RuntimeError("spmm: out= does not support autograd (an input requires grad); call without out=")
            z = DistributedSpmm.apply(B, self.local.values, self.remote.values, accumulate, bias, self, float(alpha),
                                      float(beta), backend, policy)
            return ops.activation(z, act, float(negative_slope)) if act != "none" else z
        y, _ = product(self, B, self.local.values, self.remote.values, float(alpha), float(beta), accumulate, bias,
                       act, float(negative_slope), backend, policy)
        if out is not None:
            out.copy_(y)
            return out
        return y

    def _check_args(self, B, c, bias, out, activation, backend, policy, validate) -> str:
        if not isinstance(B, torch.Tensor) or B.layout != torch.strided:
            raise TypeError(f"B: expected a dense torch.Tensor, got {type(B).__name__}")
        rows_b, rows_out = self.col_end - self.col_start, self.row_end - self.row_start
        if B.dim() != 2 or B.shape[0] != rows_b:
            raise ValueError(f"B: expected this rank's {rows_b} rows of B (rows [{self.col_start}, {self.col_end}) of "
                             f"the global B), shape ({rows_b}, n); got shape {tuple(B.shape)}")
        if B.dtype != self.dtype:
            raise TypeError(f"B: expected dtype {self.dtype} (A's values; A.to(dtype) converts A), got {B.dtype}")
        if B.device != self.device:
            raise ValueError(f"B: expected device {self.device} (where this rank's part of A lives), got {B.device}")
        n = B.shape[1]
        for name, t in (("c", c), ("out", out)):
            if t is not None and (not isinstance(t, torch.Tensor) or tuple(t.shape) != (rows_out, n)):
                raise ValueError(f"{name}: expected shape ({rows_out}, {n}) (this rank's rows of the result), got "
                                 f"{tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}")
        if c is not None and out is not None:
            raise ValueError("pass either c= or out= (out is itself the accumulate operand), not both")
        if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (n,)):
            raise ValueError(f"bias: expected shape ({n},), got "
                             f"{tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__}")
        if backend not in SPMM_BACKENDS:
            raise ValueError(f"backend: unknown SpMM backend {backend!r}; expected one of {', '.join(SPMM_BACKENDS)}")
        if policy not in ("auto", "sparse", "dense"):
            raise ValueError(f"policy: expected 'auto', 'sparse' or 'dense', got {policy!r}")
        if validate:
            validate_csr(self.local)
            validate_csr(self.remote)
        return _activation_name(activation)


def halo_volume(A: DistributedCSR, n: int = 1, dtype: Optional[torch.dtype] = None) -> List[dict]:
    """Per rank, the rows and bytes one product with a B of width n receives against the partition's
    minimum (:meth:`DistributedCSR.halo_volume`). Off line, for a whole matrix and any partition:
    :func:`sparsetorch.distributed.partition.halo_counts`."""
    return A.halo_volume(n, dtype)


def _bounds(row_bounds, col_bounds, rows: int, cols: int, parts: int):
    rb = check_bounds(row_bounds, rows, parts, "row_bounds")
    if col_bounds is None:
        col_bounds = rb if rows == cols else even_bounds(cols, parts)
    return rb, check_bounds(col_bounds, cols, parts, "col_bounds")
