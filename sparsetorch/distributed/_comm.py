"""Process-group plumbing shared by the distributed code: which device a group's collectives take,
the control group on which ranks agree that an input is valid, and errors that name the rank.

Why a control group: a rank that rejects its input must not leave the others waiting in a
collective. Every entry point checks its arguments locally and then *agrees* with the other ranks
(one small all-reduce); if any rank failed, every rank raises the same exception class, naming the
failing rank(s) and their messages. The agreement runs on a gloo group over the same ranks (the group
itself when it is gloo), so it costs a host round-trip and never a GPU synchronisation. A rank that
never arrives (crashed, stuck elsewhere) is caught by the process group's timeout; the error raised
then names the ranks that were waited for.
"""
from __future__ import annotations

import os
from typing import Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

__all__ = ["DistributedError", "Comm", "NO_MULTICAST_ENV", "set_no_multicast_env", "nccl_options"]

# NVLink multicast (NVLS) stays off in every process: on the lent multi-GPU machines a program that
# uses it can put the host's GPUs out of service (the device README); NCCL, PyTorch's symmetric
# memory and NVSHMEM each have their own switch.
NO_MULTICAST_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def set_no_multicast_env() -> None:
    """Set the three variables of :data:`NO_MULTICAST_ENV` in this process (before NCCL starts)."""
    os.environ.update(NO_MULTICAST_ENV)


def nccl_options():
    """``pg_options`` for an NCCL group whose streams have high priority, so the halo exchange's
    kernels are scheduled while the local product fills the GPU (None where torch lacks the option)."""
    try:
        options = dist.ProcessGroupNCCL.Options()
        options.is_high_priority_stream = True
        return options
    except (AttributeError, TypeError, RuntimeError):
        return None


class DistributedError(RuntimeError):
    """A collective did not complete (a peer failed, left, or timed out); the message names the ranks."""


# Exception classes a failing rank's error is re-raised as on every rank (others: RuntimeError).
_KINDS = {cls.__name__: cls for cls in (ValueError, TypeError, IndexError, RuntimeError, DistributedError)}

_control_groups: Dict[int, object] = {}


class Comm:
    """A process group as the distributed matrices use it: rank, size, data device, control group."""

    def __init__(self, group=None, device: Optional[torch.device] = None):
        if not dist.is_available() or not dist.is_initialized():
            raise RuntimeError("torch.distributed is not initialised: call torch.distributed.init_process_group "
                               "(or launch with torchrun) before building a distributed matrix")
        self.group = group if group is not None else dist.group.WORLD
        self.rank = dist.get_rank(self.group)
        self.size = dist.get_world_size(self.group)
        self.global_ranks: List[int] = dist.get_process_group_ranks(self.group)
        self.backend = str(dist.get_backend(self.group)).lower()
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if self.backend == "nccl" else torch.device("cpu")
        self.device = torch.device(device)
        if self.device.type == "cuda" and self.device.index is None:
            self.device = torch.device("cuda", torch.cuda.current_device())
        if self.backend == "nccl" and self.device.type != "cuda":
            raise ValueError(f"device: the group's backend is NCCL, which moves CUDA tensors; got device {self.device}")
        if self.backend == "gloo" and self.device.type != "cpu":
            raise ValueError(f"device: the group's backend is gloo, whose all-to-all moves CPU tensors; got device "
                             f"{self.device} (use an NCCL group for CUDA tensors)")
        self._control = None

    # --- the control group -------------------------------------------------------------------
    @property
    def control(self):
        """A gloo group over the same ranks (the group itself when it is gloo), made once per group."""
        if self._control is None:
            if self.backend == "gloo":
                self._control = self.group
            else:
                key = id(self.group)
                if key not in _control_groups:
                    _control_groups[key] = dist.new_group(self.global_ranks, backend="gloo",
                                                          use_local_synchronization=True)
                self._control = _control_groups[key]
        return self._control

    def agree(self, error: Optional[BaseException], what: str, same: Sequence[int] = (), same_name: str = "") -> None:
        """Raise on every rank if ``error`` is set on any rank, or if the ints ``same`` (as many on
        every rank) differ between ranks (see the module docstring)."""
        same = [int(v) for v in same]
        if self.size == 1:
            if error is not None:
                raise error
            return
        flags = torch.tensor([0 if error is None else 1] + same + [-v for v in same], dtype=torch.int64)
        self._run(lambda: dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self.control), what, self.global_ranks)
        k = len(same)
        flags = flags.tolist()
        if flags[0] == 0 and all(flags[1 + i] == -flags[1 + k + i] for i in range(k)):
            return
        mine = None if error is None else (type(error).__name__, str(error))
        everyone: List[Optional[tuple]] = [None] * self.size
        self._run(lambda: dist.all_gather_object(everyone, (mine, same), group=self.control), what, self.global_ranks)
        failed = [(r, m) for r, (m, _) in enumerate(everyone) if m is not None]
        if failed:
            kind = _KINDS.get(failed[0][1][0], RuntimeError)
            detail = "; ".join(f"rank {r}: {msg}" for r, (_, msg) in failed)
            ranks = ", ".join(str(r) for r, _ in failed)
            exc = kind(f"{what} failed on rank {ranks} (raised on rank {self.rank} too): {detail}")
        else:
            detail = ", ".join(f"rank {r}: {v[0] if len(v) == 1 else tuple(v)}" for r, (_, v) in enumerate(everyone))
            exc = ValueError(f"{what}: {same_name or 'the arguments'} must be the same on every rank, got {detail}")
        if error is not None:
            raise exc from error
        raise exc

    def check(self, what: str, fn, same: Sequence[int] = (), same_name: str = "") -> object:
        """Run the local check ``fn()`` and agree on its outcome (and on ``same``); returns ``fn()``'s result."""
        error, result = None, None
        try:
            result = fn()
        except (ValueError, TypeError, IndexError, RuntimeError) as e:
            error = e
        self.agree(error, what, same, same_name)
        return result

    # --- collectives with errors that name the ranks -----------------------------------------
    def _run(self, fn, what: str, peers: Sequence[int]):
        try:
            return fn()
        except DistributedError:
            raise
        except RuntimeError as e:  # gloo: timeout or closed connection; NCCL: an aborted communicator
            raise DistributedError(f"rank {self.rank}: {what}: the collective with group ranks "
                                   f"{list(range(self.size))} did not complete ({type(e).__name__}: {e}); a peer "
                                   f"failed, left or is stuck elsewhere (or the process "
                                   f"group's timeout passed)") from e

    def wait(self, work, what: str) -> None:
        """``work.wait()`` (an async collective), with the error naming the ranks."""
        if work is not None:
            self._run(work.wait, what, self.global_ranks)

    def all_to_all(self, output: torch.Tensor, input: torch.Tensor, output_splits: List[int],
                   input_splits: List[int], what: str, async_op: bool = False):
        """Variable-size all-to-all (rows of ``input`` to peers, rows from peers into ``output``)."""
        return self._run(lambda: dist.all_to_all_single(output, input, output_splits, input_splits,
                                                        group=self.group, async_op=async_op), what, self.global_ranks)

    def all_gather_ints(self, values: Sequence[int], what: str) -> List[List[int]]:
        """Every rank's list of ints (same length on every rank), through the control group."""
        t = torch.tensor(list(values), dtype=torch.int64)
        out = [torch.empty_like(t) for _ in range(self.size)]
        if self.size == 1:
            return [list(values)]
        self._run(lambda: dist.all_gather(out, t, group=self.control), what, self.global_ranks)
        return [o.tolist() for o in out]

    def broadcast_object(self, obj, src: int, what: str):
        if self.size == 1:
            return obj
        box = [obj]
        self._run(lambda: dist.broadcast_object_list(box, src=self.global_ranks[src], group=self.control), what,
                  self.global_ranks)
        return box[0]
