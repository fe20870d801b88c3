from typing import Dict

import torch

from sparsetorch import _C
from sparsetorch._cache import register_clear

# cuda_features' keys besides arch / binary, in the order the op lists them (csrc/device_ops.cpp).
CUDA_FEATURES = ("mma", "mma_sp", "clusters", "cp_async", "bf16", "cusparselt")


def build_info() -> dict:
    """What this build compiled in (backends, OpenMP, CUDA library versions, the CUDA targets) and what it runs
    on. ``cuda_targets`` lists the compiled targets in nvcc's names: ``sm_XY`` is code for compute capability
    X.Y GPUs, ``compute_XY`` PTX that the driver compiles for X.Y and newer ones (empty without CUDA)."""
    info = {}
    for line in _C.build_info().splitlines():
        key, _, value = line.partition("=")
        info[key] = int(value) if value.lstrip("-").isdigit() else value
    info["cpu"] = bool(info.get("cpu"))
    info["cuda"] = bool(info.get("cuda"))
    info["cuda_targets"] = [t for t in str(info.get("cuda_targets", "")).split(",") if t]
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cpu_threads"] = torch.get_num_threads()
    info["cuda_available"] = bool(info["cuda"] and torch.cuda.is_available())
    if info["cuda_available"]:
        info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info


def cuda_features(device=None) -> dict:
    """What this build's loaded CUDA code can do on ``device`` (a CUDA device, index or name; default the
    current one), asked of the loaded kernels rather than of the GPU's compute capability: a build for
    compute_80 runs its pre-Hopper code on an H100.

    ``arch``: the virtual architecture the loaded code was compiled from (80 for compute_80; 0 without CUDA),
    ``binary``: what it runs as (the GPU's, when the driver JIT-compiled PTX); then booleans: ``mma``
    (tensor-core mma.sync on bf16/fp16: the bitmap and slot forms), ``mma_sp`` (the 2:4 sparse tensor cores:
    the 2:4 decode kernel), ``clusters`` (thread-block clusters), ``cp_async``, ``bf16`` (bf16 tensor-core
    arithmetic; bf16 elsewhere is computed in float32), ``cusparselt`` (linked in, and the GPU has what it
    needs). All False where there is no CUDA code or no GPU. Raises a clear error when the build has no
    code this GPU can load."""
    features = {"arch": 0, "binary": 0, **{name: False for name in CUDA_FEATURES}}
    if "cuda=1" not in _C.build_info().splitlines() or not torch.cuda.is_available():
        return features
    device = torch.device("cuda") if device is None else torch.device(device)
    if device.type != "cuda":
        return features
    text = torch.ops.sparsetorch.cuda_features(torch.cuda.current_device() if device.index is None else device.index)
    for line in text.splitlines():
        key, _, value = line.partition("=")
        features[key] = int(value) if key in ("arch", "binary") else value == "1"
    return features


_LOADED: Dict[int, dict] = {}


def loaded_cuda_features(device) -> dict:
    """:func:`cuda_features` of a CUDA device, asked once per device and process (what the loaded code can
    do does not change while it is loaded; the pruned forms ask on every undecided call, where the op, its
    CUDA queries and the parse cost microseconds of host each time). Read-only; st.clear_caches() forgets it."""
    device = torch.device(device)
    if device.type != "cuda":
        return cuda_features(device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    got = _LOADED.get(index)
    if got is None:
        got = _LOADED[index] = cuda_features(index)
    return got


register_clear("cuda_features", _LOADED.clear, _LOADED.__len__)
