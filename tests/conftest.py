import os
import sys

import pytest
import torch

# The checkout's root, for the harness's tests (benchmarks/ is not installed with the package).
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
# The real data: $SPARSETORCH_DATA when set; else a data folder beside the checkout, where there is one
# (tests that need data skip, naming the folder, when none is found).
_BESIDE = os.path.join(os.path.dirname(ROOT), "shared", "data")
if not os.environ.get("SPARSETORCH_DATA") and os.path.isdir(_BESIDE):
    os.environ["SPARSETORCH_DATA"] = _BESIDE

import sparsetorch as st  # noqa: E402

CUDA_READY = st.build_info()["cuda_available"]
DEVICES = ["cpu"] + (["cuda"] if CUDA_READY else [])
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]


def pytest_report_header(config):
    info = st.build_info()
    return (f"sparsetorch build: cpu={info['cpu']} cuda={info['cuda']} openmp={info.get('openmp')} "
            f"torch={info['torch']} devices under test: {DEVICES}")


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Every test starts and ends with nothing cached (st.clear_caches(): analyses, transposes, views,
    descriptors, plans and the tuning tables, Python and native alike), so that no test sees another's."""
    st.clear_caches()
    yield
    st.clear_caches()


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def rng(request):
    # A fresh, reproducible stream per test: the seed comes from the test's own name.
    import numpy as np
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
