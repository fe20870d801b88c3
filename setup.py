"""Build sparsetorch: one extension module, ``sparsetorch._C``.

C++ sources (OpenMP) are always compiled. CUDA sources are added when torch was built with
CUDA and a CUDA compiler is found; override with SPARSETORCH_CUDA=1 (force) or =0 (CPU only).
SPARSETORCH_CUDA_ARCH sets the -gencode targets (default: sm_90 plus compute_90 PTX).
"""
import glob
import os

from setuptools import find_packages, setup

import torch
from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CppExtension, CUDAExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def want_cuda() -> bool:
    flag = os.environ.get("SPARSETORCH_CUDA", "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    return torch.version.cuda is not None and CUDA_HOME is not None


def gencode_flags() -> list:
    archs = os.environ.get("SPARSETORCH_CUDA_ARCH", "90").replace(";", " ").replace(",", " ").split()
    flags = [f"-gencode=arch=compute_{a},code=sm_{a}" for a in archs]
    newest = max(archs, key=lambda a: int("".join(ch for ch in a if ch.isdigit())))
    flags.append(f"-gencode=arch=compute_{newest},code=compute_{newest}")  # PTX for newer GPUs
    return flags


def rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def get_extension():
    use_cuda = want_cuda()
    sources = rel(glob.glob(os.path.join(ROOT, "csrc", "*.cpp")))
    sources += rel(glob.glob(os.path.join(ROOT, "csrc", "common", "*.cpp")))
    sources += rel(glob.glob(os.path.join(ROOT, "csrc", "cpu", "*.cpp")))
    # No -std flag: torch.utils.cpp_extension adds the standard its headers need (C++17 or C++20).
    cxx_flags = ["-O3", "-fopenmp", "-fdiagnostics-color=always"]
    define_macros = []
    extra_link_args = ["-fopenmp"]
    if not use_cuda:
        return CppExtension(
            "sparsetorch._C",
            sources,
            include_dirs=[os.path.join(ROOT, "csrc")],
            extra_compile_args={"cxx": cxx_flags},
            extra_link_args=extra_link_args,
        )
    sources += rel(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cu")))
    sources += rel(glob.glob(os.path.join(ROOT, "csrc", "cuda", "*.cpp")))
    define_macros.append(("SPARSETORCH_WITH_CUDA", None))
    nvcc_flags = [
        "-O3",
        "-lineinfo",
        "--expt-relaxed-constexpr",
        "-Xcompiler=-fopenmp",
    ] + gencode_flags()
    return CUDAExtension(
        "sparsetorch._C",
        sources,
        include_dirs=[os.path.join(ROOT, "csrc")],
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        extra_link_args=extra_link_args,
        libraries=["cusparse", "cublas", "cublasLt"],
    )


setup(
    name="sparsetorch",
    version="0.1.0",
    description="Sparse (CSR) and dense linear algebra for PyTorch on NVIDIA GPUs and CPUs",
    packages=find_packages(include=["sparsetorch", "sparsetorch.*"]),
    python_requires=">=3.9",
    install_requires=["torch>=2.4", "numpy", "scipy"],
    extras_require={
        "test": ["pytest", "hypothesis"],
        "bench": ["tqdm", "matplotlib"],
    },
    ext_modules=[get_extension()],
    cmdclass={"build_ext": BuildExtension},
    zip_safe=False,
)
