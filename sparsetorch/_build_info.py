import torch

from sparsetorch import _C


def build_info() -> dict:
    """What this build compiled in (backends, OpenMP, CUDA library versions) and what it runs on."""
    info = {}
    for line in _C.build_info().splitlines():
        key, _, value = line.partition("=")
        info[key] = int(value) if value.lstrip("-").isdigit() else value
    info["cpu"] = bool(info.get("cpu"))
    info["cuda"] = bool(info.get("cuda"))
    info["torch"] = torch.__version__
    info["torch_cuda"] = torch.version.cuda
    info["cpu_threads"] = torch.get_num_threads()
    info["cuda_available"] = bool(info["cuda"] and torch.cuda.is_available())
    if info["cuda_available"]:
        info["cuda_devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    return info
