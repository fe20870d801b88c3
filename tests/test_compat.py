"""sparsetorch/_compat.py: the private torch APIs sparsetorch relies on exist in this torch and still do what
they were measured to do. A torch release that removes or changes one fails here, instead of sparsetorch
silently taking the slower public fallback. And no other module reaches into torch's private APIs."""
import os
import re

import pytest
import torch

import sparsetorch as st
from sparsetorch import _compat
from conftest import CUDA_READY, ROOT

ops = torch.ops.sparsetorch


def _operands(requires_grad=False):
    A = st.CSR(torch.tensor([0, 1, 2]), torch.tensor([1, 0]), torch.tensor([2.0, 3.0], requires_grad=requires_grad),
               (2, 2))
    return A, torch.tensor([[1.0, 10.0], [100.0, 1000.0]])


def test_below_autograd_skips_the_autograd_key():
    """Below the Autograd key a custom op runs its kernel without recording, even on inputs that require
    grad: what saves torch.library's Python autograd wrapper on calls that record nothing."""
    assert _compat.HAS_BELOW_AUTOGRAD
    A, B = _operands(requires_grad=True)
    with _compat.below_autograd():
        y = ops.spmm.default(A.crow_indices, A.col_indices, A.values, B)
    assert not y.requires_grad and y.grad_fn is None
    torch.testing.assert_close(y, torch.tensor([[200.0, 2000.0], [3.0, 30.0]]))
    with _compat.BelowAutograd():
        assert not ops.spmm.default(A.crow_indices, A.col_indices, A.values, B).requires_grad
    assert ops.spmm.default(A.crow_indices, A.col_indices, A.values, B).requires_grad  # and outside it, it does


def test_op_entry_is_the_overloads_own_callable():
    assert _compat.HAS_OP_ENTRY
    entry = _compat.op_entry(ops.spmm.default)
    assert entry is not ops.spmm.default and callable(entry)
    A, B = _operands()
    with _compat.below_autograd():  # the dispatcher fills in the schema's defaults from four tensors
        torch.testing.assert_close(entry(A.crow_indices, A.col_indices, A.values, B),
                                   ops.spmm.default(A.crow_indices, A.col_indices, A.values, B))


def test_the_fallbacks_still_work(monkeypatch):
    """What sparsetorch does on a torch without them: the public equivalents, the same results."""
    A, B = _operands(requires_grad=True)
    monkeypatch.setattr(_compat, "_below", None)
    with _compat.below_autograd():  # torch.no_grad
        assert not ops.spmm(A.crow_indices, A.col_indices, A.values, B).requires_grad

    class NoEntry:
        pass

    overload = NoEntry()
    assert _compat.op_entry(overload) is overload


def test_the_cuda_helpers_exist():
    assert _compat.HAS_SLEEP
    if torch.version.cuda is not None:  # a CPU-only torch has no cuBLAS to free
        assert _compat.HAS_CLEAR_CUBLAS_WORKSPACES


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_sleep_cycles_keeps_the_stream_busy():
    torch.cuda.synchronize()
    _compat.sleep_cycles(200_000_000)  # ~0.1 s at 2 GHz
    assert not torch.cuda.current_stream().query()
    torch.cuda.synchronize()
    _compat.clear_cublas_workspaces()


def test_no_other_module_uses_private_torch_apis():
    """The issue's check, `git grep -nE 'torch\\._C\\.|"_op"|\\._op\\b|_sleep' -- sparsetorch benchmarks`, finds
    _compat.py only."""
    pattern = re.compile(r'torch\._C\.|"_op"|\._op\b|_sleep')
    found = []
    for top in ("sparsetorch", "benchmarks"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in files:
                path = os.path.join(folder, name)
                if not name.endswith(".py") or path.endswith(os.path.join("sparsetorch", "_compat.py")):
                    continue
                with open(path, encoding="utf-8") as f:
                    found += [f"{os.path.relpath(path, ROOT)}:{i}" for i, line in enumerate(f, 1) if pattern.search(line)]
    assert not found, found
