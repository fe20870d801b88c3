"""int64 indices past 2^31 stored entries (issue 8): every CUDA route gives the exact answer.

A has 2^22 rows of 513 entries = 2^31 + 2^22 + ... > 2^31 stored entries (17 GB of int64 column
indices + 8.6 GB of float32 values), column j % k at storage position j (distinct within a row, as
cuSPARSE needs nnz <= m k), value 1; B[c, :] = c % 8. Every output is then an integer below 2^24
(exact in float32) with a closed form per row, so the whole result is compared exactly. Offsets
above 2^31 are reached by the last ~0.2% of the rows. Needs a GPU with >= 60 GB free; skipped
otherwise (CI has no GPU).
"""
import pytest
import torch

import sparsetorch as st
from conftest import CUDA_READY

M, K, N, PER_ROW = 2**22, 1024, 8, 513
NNZ = M * PER_ROW


def _free_bytes():
    if not CUDA_READY:
        return 0
    free, _ = torch.cuda.mem_get_info()
    return free


pytestmark = pytest.mark.skipif(_free_bytes() < 60 * 2**30, reason="needs a CUDA device with 60 GB free")


def _prefix_mod8(x):
    """sum of (j % 8) for 0 <= j < x."""
    return (x // 8) * 28 + (x % 8) * (x % 8 - 1) // 2


@pytest.fixture(scope="module")
def big():
    crow = torch.arange(M + 1, dtype=torch.int64) * PER_ROW
    col = torch.arange(NNZ, device="cuda", dtype=torch.int64)
    col.remainder_(K)
    values = torch.ones(NNZ, device="cuda")
    expected_row = (_prefix_mod8(crow[1:]) - _prefix_mod8(crow[:-1])).to(torch.float32)
    expected = expected_row.unsqueeze(1).expand(M, N).cuda()
    b = (torch.arange(K, device="cuda") % 8).to(torch.float32).unsqueeze(1).expand(K, N).contiguous()
    yield st.CSR(crow.cuda(), col, values, (M, K)), b, expected
    del col, values
    torch.cuda.empty_cache()


@pytest.mark.parametrize("backend", ["native", "balanced", "tiled", "cusparse"])
def test_nnz_above_2_pow_31(big, backend):
    A, b, expected = big
    assert A.values.numel() > 2**31 and A.col_indices.dtype == torch.int64
    out = st.spmm(A, b, backend=backend)
    assert torch.equal(out, expected), (out - expected).abs().max()


def test_int32_indices_refused_past_2_pow_31(big):
    A, b, _ = big
    with pytest.raises((ValueError, RuntimeError), match="int32|int64|overflow|2\\^31|too many"):
        A.to(index_dtype=torch.int32)
