"""The CUDA targets a build compiles (setup.py's rules), what st.build_info() and cuda_features() say about
them, and the error of a GPU the build has no code for (simulated on a GPU; the message checked everywhere)."""
import importlib.util
import os
import re

import pytest
import torch

import sparsetorch as st
from sparsetorch._build_info import CUDA_FEATURES, cuda_features

from conftest import CUDA_READY

testing = torch.ops.sparsetorch_testing
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(scope="module")
def setup_py():
    """setup.py as a module: its target rules without running setup() (guarded by __name__)."""
    spec = importlib.util.spec_from_file_location("sparsetorch_setup", os.path.join(ROOT, "setup.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def names(setup_py, env, visible=()):
    targets, origin = setup_py.cuda_targets(env, list(visible))
    return setup_py.target_names(targets), origin


# --- setup.py: which targets ---------------------------------------------------------------------------------

def test_no_gpu_no_variables_builds_the_fat_list(setup_py):
    got, origin = names(setup_py, {})
    assert got == ["sm_75", "sm_80", "sm_86", "sm_89", "sm_90", "compute_90"]
    assert "default" in origin


def test_visible_gpus_are_the_targets(setup_py):
    assert names(setup_py, {}, [(9, 0)])[0] == ["sm_90", "compute_90"]
    # several kinds: each one's SASS, PTX of the newest (torch.utils.cpp_extension's rule)
    assert names(setup_py, {}, [(8, 6), (8, 0), (8, 6)])[0] == ["sm_80", "sm_86", "compute_86"]
    # a GPU older than 7.5 is left out; none left: the fat list
    assert names(setup_py, {}, [(7, 0), (8, 9)])[0] == ["sm_89", "compute_89"]
    assert names(setup_py, {}, [(6, 0)])[0][0] == "sm_75"
    # TORCH_CUDA_ARCH_LIST=native means the visible GPUs, as in torch
    assert names(setup_py, {"TORCH_CUDA_ARCH_LIST": "native"}, [(8, 0)])[0] == ["sm_80", "compute_80"]


def test_visible_capabilities_reads_the_gpus_torch_sees(setup_py, monkeypatch):
    """What a build on a GPU machine with no variable set targets: setup.py asks torch for the GPUs' compute
    capabilities, clamped to the newest torch was built for (faked here: no GPU on the CPU machine)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_arch_list", lambda: ["sm_80", "sm_90", "compute_90"])
    caps = {0: (9, 0), 1: (12, 0)}  # an H100 and a GPU newer than torch's build knows
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda i: caps[i])
    visible = setup_py.visible_capabilities()
    assert visible == [(9, 0)]  # (12, 0) clamped to torch's newest, 9.0
    assert names(setup_py, {}, visible) == (["sm_90", "compute_90"], "the GPUs visible at build time")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert setup_py.visible_capabilities() == []


def test_torch_cuda_arch_list_convention(setup_py):
    env = {"TORCH_CUDA_ARCH_LIST": "8.0;8.6;9.0+PTX"}
    got, origin = names(setup_py, env, [(7, 5)])  # the list wins over the visible GPU
    assert got == ["sm_80", "sm_86", "sm_90", "compute_90"] and origin == "TORCH_CUDA_ARCH_LIST"
    assert names(setup_py, {"TORCH_CUDA_ARCH_LIST": "9.0a"})[0] == ["sm_90a"]  # no PTX unless +PTX
    assert names(setup_py, {"TORCH_CUDA_ARCH_LIST": "7.5 8.9"})[0] == ["sm_75", "sm_89"]
    assert names(setup_py, {"TORCH_CUDA_ARCH_LIST": "Ampere"})[0] == ["sm_80", "sm_86", "compute_86"]


def test_sparsetorch_cuda_arch_overrides(setup_py):
    env = {"SPARSETORCH_CUDA_ARCH": "80 90", "TORCH_CUDA_ARCH_LIST": "7.5"}
    got, origin = names(setup_py, env, [(8, 9)])
    assert got == ["sm_80", "sm_90", "compute_90"] and origin == "SPARSETORCH_CUDA_ARCH"  # PTX of the newest
    assert names(setup_py, {"SPARSETORCH_CUDA_ARCH": "8.0"})[0] == ["sm_80", "compute_80"]
    assert names(setup_py, {"SPARSETORCH_CUDA_ARCH": "8.6+PTX;8.0"})[0] == ["sm_80", "sm_86", "compute_86"]
    # PTX only (the pre-Hopper device code JIT-compiled on a Hopper GPU) and SASS only
    assert names(setup_py, {"SPARSETORCH_CUDA_ARCH": "compute_80"})[0] == ["compute_80"]
    assert names(setup_py, {"SPARSETORCH_CUDA_ARCH": "compute_75"})[0] == ["compute_75"]
    assert names(setup_py, {"SPARSETORCH_CUDA_ARCH": "sm_90,compute_90"})[0] == ["sm_90", "compute_90"]


@pytest.mark.parametrize("var", ["SPARSETORCH_CUDA_ARCH", "TORCH_CUDA_ARCH_LIST"])
@pytest.mark.parametrize("value,match", [("7.0;8.0", "7.0 is older than 7.5"), ("6.1+PTX", "6.1 is older"),
                                         ("8.x", "cannot read the CUDA target '8.x'"), (";", "names no CUDA target")])
def test_bad_lists_are_refused_naming_the_variable(setup_py, var, value, match):
    with pytest.raises(setup_py.TargetError, match=match) as e:
        setup_py.cuda_targets({var: value}, [])
    assert var in str(e.value)


def test_gencode_flags_match_the_names(setup_py):
    targets, _ = setup_py.cuda_targets({"TORCH_CUDA_ARCH_LIST": "7.5;8.0;9.0a+PTX"}, [])
    assert setup_py.gencode_flags(targets) == [
        "-gencode=arch=compute_75,code=sm_75", "-gencode=arch=compute_80,code=sm_80",
        "-gencode=arch=compute_90a,code=sm_90a", "-gencode=arch=compute_90a,code=compute_90a"]
    assert setup_py.target_names(targets) == ["sm_75", "sm_80", "sm_90a", "compute_90a"]


def test_targets_reach_the_library_intact(setup_py):
    """setup.py passes the names as one identifier (SPARSETORCH_CUDA_TARGETS); the library reads them back."""
    for env in [{}, {"TORCH_CUDA_ARCH_LIST": "8.0;9.0a+PTX"}, {"SPARSETORCH_CUDA_ARCH": "compute_75"}]:
        targets, _ = setup_py.cuda_targets(env, [])
        listed = setup_py.target_names(targets)
        encoded = "_".join(n.replace("_", "") for n in listed)
        assert re.fullmatch(r"\w+", encoded)
        assert list(testing.parse_build_targets(encoded)) == listed
    assert list(testing.parse_build_targets("")) == []


# --- what the build says about itself ------------------------------------------------------------------------

def test_build_info_lists_the_targets():
    info = st.build_info()
    assert isinstance(info["cuda_targets"], list)
    if not info["cuda"]:
        assert info["cuda_targets"] == []
    else:
        assert info["cuda_targets"], "a CUDA build lists what it compiled"
        assert all(re.fullmatch(r"(sm|compute)_\d+a?", t) for t in info["cuda_targets"]), info["cuda_targets"]


def test_cuda_features_without_a_gpu_is_all_false():
    if CUDA_READY:
        pytest.skip("this machine has a GPU (the GPU tests below cover it)")
    f = cuda_features()
    assert f == {"arch": 0, "binary": 0, **{k: False for k in CUDA_FEATURES}}
    assert cuda_features("cpu") == f


def test_loaded_features_are_asked_once_per_device(monkeypatch):
    """What the pruned forms read on every undecided call (forms.applicable, sparse24_applies) is cuda_features
    asked once per device; st.clear_caches() forgets it. Off CUDA it is cuda_features' all-False answer."""
    from sparsetorch import _build_info

    assert _build_info.loaded_cuda_features("cpu") == cuda_features("cpu")
    if not CUDA_READY:
        return
    asked = []
    real = _build_info.cuda_features
    monkeypatch.setattr(_build_info, "cuda_features", lambda d=None: asked.append(d) or real(d))
    st.clear_caches()
    first = _build_info.loaded_cuda_features(torch.device("cuda", 0))
    assert first == real(0) and _build_info.loaded_cuda_features("cuda:0") is first and len(asked) == 1
    st.clear_caches()
    _build_info.loaded_cuda_features(0)
    assert len(asked) == 2


def test_route_availability_on_the_cpu():
    for route in ["native", "balanced", "split", "tiled", "densify", "cusparse", "blocked"]:
        for dtype in [torch.float32, torch.bfloat16]:
            assert torch.ops.sparsetorch.spmm_route_unavailable(route, dtype, torch.device("cpu")) == ""
    if not st.build_info()["cuda"]:
        reason = torch.ops.sparsetorch.spmm_route_unavailable("native", torch.float32, torch.device("cuda"))
        assert "no CUDA code" in reason


# --- the error of a GPU without code ---------------------------------------------------------------------------

def test_no_kernel_image_message():
    msg = testing.no_kernel_image_message(1, "NVIDIA A100-SXM4-80GB", 8, 0, ["sm_90", "compute_90"])
    for part in ["cuda:1", "NVIDIA A100-SXM4-80GB", "compute capability 8.0", "sm_90, compute_90",
                 "SPARSETORCH_CUDA_ARCH=8.0", "TORCH_CUDA_ARCH_LIST"]:
        assert part in msg, (part, msg)
    old = testing.no_kernel_image_message(0, "Tesla V100", 7, 0, ["sm_75"])
    assert "compute capability 7.0" in old and "7.5 or newer" in old and "SPARSETORCH_CUDA_ARCH=" not in old


def test_old_device_code_message():
    msg = testing.old_device_code_message("bitmap_linear", "mma.sync", 80, 75, 0, 9, 0, ["compute_75"])
    for part in ["bitmap_linear", "compute capability 8.0 or newer", "mma.sync", "compute_75", "cuda:0",
                 "compute capability 9.0", "SPARSETORCH_CUDA_ARCH=9.0"]:
        assert part in msg, (part, msg)
    t4 = testing.old_device_code_message("slot_linear", "mma.sync", 80, 75, 0, 7, 5, ["sm_75"])
    assert "This GPU lacks the instructions" in t4


# --- on a GPU ----------------------------------------------------------------------------------------------------

cuda_only = pytest.mark.skipif(not CUDA_READY, reason="needs a CUDA build and a GPU")


@pytest.fixture
def no_image():
    testing.simulate_no_kernel_image(True)
    try:
        yield
    finally:
        testing.simulate_no_kernel_image(False)


@cuda_only
def test_simulated_missing_image_raises_the_clear_error(no_image):
    cap = torch.cuda.get_device_capability()
    a = torch.eye(4, device="cuda").to_sparse_csr()
    b = torch.randn(4, 3, device="cuda")
    x = torch.randn(8, device="cuda")
    for call in [lambda: st.spmm(a, b), lambda: st.bias_act(x, bias=x, activation="relu"),
                 lambda: torch.ops.sparsetorch.csr_stats(a.crow_indices(), a.col_indices(), 4),
                 lambda: cuda_features()]:
        with pytest.raises(RuntimeError) as e:
            call()
        msg = str(e.value)
        assert f"compute capability {cap[0]}.{cap[1]}" in msg and "SPARSETORCH_CUDA_ARCH" in msg, msg
        assert ", ".join(st.build_info()["cuda_targets"]) in msg
        assert "no kernel image is available" not in msg  # not the bare CUDA error


@cuda_only
def test_after_the_simulation_ops_run_again():
    testing.simulate_no_kernel_image(True)
    testing.simulate_no_kernel_image(False)
    a = torch.eye(4, device="cuda").to_sparse_csr()
    b = torch.randn(4, 3, device="cuda")
    torch.testing.assert_close(st.spmm(a, b), b)


@cuda_only
def test_loaded_code_arch_is_what_the_device_code_saw():
    """kernel_arch (cudaFuncAttributes::ptxVersion) against the __CUDA_ARCH__ a probe kernel writes from the GPU:
    they agree on every build, including PTX that the driver JIT-compiled for a newer GPU."""
    for device in range(torch.cuda.device_count()):
        cuda_arch, kernel_arch = testing.device_code_probe(device)
        assert cuda_arch == 10 * kernel_arch, (cuda_arch, kernel_arch)
        f = cuda_features(device)
        assert f["arch"] == kernel_arch
        cap = torch.cuda.get_device_capability(device)
        assert f["arch"] <= 10 * cap[0] + cap[1]
        assert any(re.fullmatch(rf"(sm|compute)_{f['arch']}a?", t) for t in st.build_info()["cuda_targets"])
        for key in ["mma", "mma_sp", "cp_async", "bf16"]:
            assert f[key] == (f["arch"] >= 80)
        assert f["clusters"] == (f["arch"] >= 90)
        assert not f["cusparselt"] or cap >= (8, 0)


@cuda_only
def test_tensor_core_forms_refuse_code_without_mma():
    """On a build whose loaded code lacks sm_80 (compute_75 on any GPU), the tensor-core forms raise the clear
    error instead of running a trapping kernel; on the others they run (their own tests check the results)."""
    if cuda_features()["mma"]:
        pytest.skip("this build's loaded code has the tensor-core instructions")
    from sparsetorch.pruned.bitmap import BitmapWeight, bitmap_linear

    w = torch.randn(32, 64).bfloat16() * (torch.rand(32, 64) < 0.3)
    weight = BitmapWeight.from_dense(w.cuda())
    with pytest.raises(RuntimeError, match="needs device code for compute capability 8.0"):
        bitmap_linear(torch.randn(2, 64, device="cuda").bfloat16(), weight)


@cuda_only
def test_routing_keeps_to_the_available_routes():
    """Every route "auto" picks or times can run here; a route that cannot is refused by name."""
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    dense = (torch.rand(2048, 2048, generator=g) < 0.4) * torch.randn(2048, 2048, generator=g)
    for dtype in [torch.float32, torch.bfloat16]:
        a = dense.to(dtype).to_sparse_csr().to(dev)
        b = torch.randn(2048, 1024, generator=g).to(dtype).to(dev)
        picked = st.spmm_route(a, b)
        assert torch.ops.sparsetorch.spmm_route_unavailable(picked, dtype, dev) == ""
        candidates = torch.ops.sparsetorch.spmm_route_candidates(a.crow_indices(), a.col_indices(), a.values(), b)
        assert all(torch.ops.sparsetorch.spmm_route_unavailable(r, dtype, dev) == "" for r in candidates)
        for route in ["native", "balanced", "split", "tiled", "densify", "cusparse"]:
            reason = torch.ops.sparsetorch.spmm_route_unavailable(route, dtype, dev)
            if reason:
                with pytest.raises(RuntimeError, match=f"backend '{route}' cannot run"):
                    st.spmm(a, b, backend=route)
            else:
                ref = (a.to_dense().double() @ b.double())
                err = (st.spmm(a, b, backend=route).double() - ref).abs().max() / ref.abs().max()
                assert err < (3e-2 if dtype == torch.bfloat16 else 1e-4), (route, err)
