"""One reset for every cache: st.clear_caches() empties the Python caches and the native ones
(csrc/common/native_caches.h: the analysis cache, the checks in flight, the tuning table, and on CUDA the
cuSPARSE descriptors, CSR16 occupancy answers, cuSPARSELt plans and tuning samples), and st.cache_info()
lists each by name. tests/conftest.py clears them around every test."""
import threading

import pytest
import torch

import sparsetorch as st
from sparsetorch._compat import sleep_cycles
from _helpers import random_csr
from conftest import CUDA_READY

ops = torch.ops.sparsetorch
NATIVE_EVERYWHERE = {"native.csr_analysis", "native.pending_checks", "native.spmm_tuning"}
NATIVE_CUDA = {"native.cusparse_descriptors", "native.csr16_occupancy", "native.spmm_tuning_samples"}


def test_every_native_cache_is_listed():
    info = st.cache_info()
    assert NATIVE_EVERYWHERE <= set(info)
    if st.build_info()["cuda"]:
        assert NATIVE_CUDA <= set(info)
    assert "csr.torch_views" in info
    assert all(isinstance(v, int) and v >= 0 for v in info.values())


def test_clear_caches_empties_the_analyses_and_the_torch_views(rng):
    A = st.to_torch(st.from_scipy(random_csr(rng, 8, 6, 0.5), dtype=torch.float32))
    st.transpose(A)  # a view of A (csr.torch_views) and its analysis
    st.spmm(st.from_torch(A), torch.randn(6, 2))
    before = st.cache_info()
    assert before["native.csr_analysis"] >= 1 and before["csr.torch_views"] == 1
    st.clear_caches()
    after = st.cache_info()
    assert after["native.csr_analysis"] == 0 and after["csr.torch_views"] == 0
    st.spmm(st.from_torch(A), torch.randn(6, 2))  # analysed again, as a new matrix
    assert st.cache_info()["native.csr_analysis"] >= 1


def test_one_native_cache_by_name_and_a_wrong_name():
    a = st.CSR(torch.tensor([0, 1]), torch.tensor([0]), torch.ones(1), (1, 1))
    st.spmm(a, torch.ones(1, 1))
    ops._clear_native_caches("csr_analysis")
    assert dict(zip(*ops._native_cache_sizes()))["csr_analysis"] == 0
    with pytest.raises(ValueError, match="no native cache called 'nope'; there are: csr_analysis"):
        ops._clear_native_caches("nope")


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_thread_local_caches_reset_in_every_thread(rng):
    """cuSPARSE's descriptors are kept per thread: a reset empties the calling thread's at once and another
    thread's at its next use (its size reads 0 before any new call)."""
    A = st.from_scipy(random_csr(rng, 64, 64, 0.1), device="cuda", dtype=torch.float32)
    B = torch.randn(64, 8, device="cuda")
    ready, cleared, sizes = threading.Event(), threading.Event(), []

    def worker():
        st.spmm(A, B, backend="cusparse")
        sizes.append(dict(zip(*ops._native_cache_sizes()))["cusparse_descriptors"])
        ready.set()
        cleared.wait(30)
        sizes.append(dict(zip(*ops._native_cache_sizes()))["cusparse_descriptors"])

    t = threading.Thread(target=worker)
    t.start()
    ready.wait(30)
    st.spmm(A, B, backend="cusparse")
    assert st.cache_info()["native.cusparse_descriptors"] >= 1
    st.clear_caches()
    assert st.cache_info()["native.cusparse_descriptors"] == 0
    cleared.set()
    t.join(30)
    assert sizes[0] >= 1 and sizes[1] == 0


@pytest.mark.skipif(not CUDA_READY, reason="needs CUDA")
def test_tuning_samples_in_flight_are_dropped(rng):
    previous = st.set_autotune(True)
    try:
        A = st.from_scipy(random_csr(rng, 2000, 2000, 0.01), device="cuda", dtype=torch.float32)
        B = torch.randn(2000, 32, device="cuda")
        sleep_cycles(10**8)  # the samples below stay in flight
        for _ in range(4):
            st.spmm(A, B)
        st.clear_caches()
        info = st.cache_info()
        assert info["native.spmm_tuning_samples"] == 0 and info["native.spmm_tuning"] == 0
        torch.testing.assert_close(st.spmm(A, B), A.to_dense() @ B, rtol=1e-4, atol=1e-4)
    finally:
        st.set_autotune(previous)
