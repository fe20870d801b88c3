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
# Whether the loaded CUDA code has tensor-core mma (sm_80 code): a compute_75 build on any GPU has not, and its
# tensor-core forms (bitmap, slots, 2:4 decode) refuse with the error below instead of running.
CUDA_MMA = CUDA_READY and st.cuda_features()["mma"]
NO_MMA_REFUSAL = "needs device code for compute capability 8.0 or newer"


def python_env(**extra):
    """os.environ plus ``extra`` for a subprocess, with this suite's sparsetorch first on its PYTHONPATH (a
    subprocess imports the build under test, installed or in place)."""
    env = dict(os.environ, **extra)
    first = os.path.dirname(os.path.dirname(os.path.abspath(st.__file__)))
    env["PYTHONPATH"] = os.pathsep.join([first] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


DEVICES = ["cpu"] + (["cuda"] if CUDA_READY else [])
FLOAT_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INDEX_DTYPES = [torch.int32, torch.int64]


def pytest_report_header(config):
    info = st.build_info()
    return (f"sparsetorch build: cpu={info['cpu']} cuda={info['cuda']} openmp={info.get('openmp')} "
            f"torch={info['torch']} cuda targets={info.get('cuda_targets')} tensor-core mma={CUDA_MMA} "
            f"devices under test: {DEVICES}")


def pytest_collection_modifyitems(config, items):
    """A run split over several calls (a GPU machine lent for minutes at a time: scripts/gpu_run.sh's
    RESUME): the test ids listed in the file $SPARSETORCH_TESTS_DONE (one per line) finished in an earlier
    call and are deselected."""
    path = os.environ.get("SPARSETORCH_TESTS_DONE")
    if not path:
        return
    if not os.path.isfile(path):
        raise pytest.UsageError(f"SPARSETORCH_TESTS_DONE={path}: no such file (the test ids an earlier run finished)")
    with open(path) as f:
        done = {line.strip() for line in f if line.strip()}
    dropped = [item for item in items if item.nodeid in done]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = [item for item in items if item.nodeid not in done]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """On a build whose code for the GPU has no tensor-core mma, a test of a tensor-core form that the op
    refused with its documented error is reported as skipped, with that reason (the refusal itself is tested
    by test_build_targets.py); any other failure stays a failure."""
    outcome = yield
    report = outcome.get_result()
    if (CUDA_READY and not CUDA_MMA and report.failed and call.excinfo is not None
            and NO_MMA_REFUSAL in str(call.excinfo.value)):
        report.outcome = "skipped"
        report.longrepr = (str(item.fspath), item.location[1] or 0,
                           "Skipped: this build's code for the GPU has no tensor-core mma (a compute_75 build): "
                           "the op refused the tensor-core form, as documented")


@pytest.fixture(autouse=True)
def _fresh_caches():
    """Every test starts and ends with nothing cached (st.clear_caches(): analyses, transposes, views,
    descriptors, plans and the tuning tables, Python and native alike), so that no test sees another's."""
    st.clear_caches()
    yield
    st.clear_caches()


@pytest.fixture(autouse=True)
def _forms_built_at_first_call(request, monkeypatch):
    """SparseLinear's tests check the forms a call chose, so the chosen form is built at its first call;
    tests marked ``repaid_builds`` (the policy's own tests, the benchmark suites and the README's tour) run
    the default, where eager calls run dense until a form has repaid its build."""
    if request.node.get_closest_marker("repaid_builds") is None:
        from sparsetorch.nn.linear import SparseLinear

        monkeypatch.setattr(SparseLinear, "build_when_repaid", False)


@pytest.fixture(params=DEVICES)
def device(request):
    return request.param


@pytest.fixture
def rng(request):
    # A fresh, reproducible stream per test: the seed comes from the test's own name.
    import numpy as np
    import zlib

    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
