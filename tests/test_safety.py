"""Safe by default: every kind of corrupt CSR matrix through every entry point that takes one.

By default each pair must raise ValueError / IndexError / TypeError naming the argument, leave the
caller's tensors unchanged, and leave the device able to compute a correct product right after. With
validate=False the caller vouches for the matrix: a wrong answer is then allowed, a crash or a dead
CUDA context never is. The corruptions and entry points are in tests/_corruptions.py.

On the CPU every pair runs in this process. On CUDA each corruption runs in a subprocess, so that a
crash or an illegal memory access (which kills the CUDA context for the whole process) is reported as
that test's failure instead of ending the run.
"""
import pytest
import torch

import _corruptions as C
from conftest import CUDA_READY

LAYOUTS = ("single", "batched")


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64], ids=["int32", "int64"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_corruption_on_the_cpu(layout, index_dtype):
    failures = []
    for corruption, entry in C.pairs(layout):
        record = C.run_one("cpu", index_dtype, layout, corruption, entry)
        problem = C.verdict(entry, record)
        if problem:
            failures.append(f"{corruption} / {entry}: {problem}")
    assert not failures, "\n".join(failures)


@pytest.mark.cuda
@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
@pytest.mark.parametrize("index_dtype", ["int32", "int64"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_every_corruption_on_cuda(layout, index_dtype):
    failures = [f"{r['corruption']} / {r['entry']}: {r['verdict']}"
                for r in C.run_isolated("cuda", index_dtype, layout) if r["verdict"]]
    assert not failures, "\n".join(failures)
