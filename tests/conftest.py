import pytest
import torch

import sparsetorch as st

CUDA_READY = st.build_info()["cuda_available"]
DEVICES = ["cpu"] + (["cuda"] if CUDA_READY else [])
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]


def pytest_report_header(config):
    info = st.build_info()
    return (f"sparsetorch build: cpu={info['cpu']} cuda={info['cuda']} openmp={info.get('openmp')} "
            f"torch={info['torch']} devices under test: {DEVICES}")


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def rng(request):
    # A fresh, reproducible stream per test: the seed comes from the test's own name.
    import numpy as np
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
