"""Build sparsetorch: one extension module, ``sparsetorch._C``.

C++ sources (OpenMP) are always compiled. CUDA sources are added when torch was built with
CUDA and a CUDA compiler is found; override with SPARSETORCH_CUDA=1 (force) or =0 (CPU only).
SPARSETORCH_CUDA_ARCH sets the -gencode targets (default: sm_90 plus compute_90 PTX).
A CUDA build links cuSPARSELt (2:4 sparse tensor cores) when it finds it: SPARSETORCH_CUSPARSELT_HOME, the
nvidia-cusparselt pip package (a dependency of torch's CUDA wheels), or CUDA_HOME; SPARSETORCH_CUSPARSELT=0
leaves it out (the 2:4 ops then raise a clear error on the GPU).
"""
import glob
import os
import sys
import sysconfig

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


def find_cusparselt():
    """(include dir, library file) of cuSPARSELt, or None."""
    if os.environ.get("SPARSETORCH_CUSPARSELT", "").strip().lower() in ("0", "false", "no", "off"):
        return None
    roots = [os.environ.get("SPARSETORCH_CUSPARSELT_HOME", "")]
    try:
        import nvidia.cusparselt as pkg  # the wheel torch's CUDA builds load it from

        roots += list(pkg.__path__)
    except ImportError:
        pass
    roots.append(CUDA_HOME or "")
    for root in filter(None, roots):
        if not os.path.isfile(os.path.join(root, "include", "cusparseLt.h")):
            continue
        for libdir in ("lib", "lib64", os.path.join("lib", "x86_64-linux-gnu")):
            libs = sorted(glob.glob(os.path.join(root, libdir, "libcusparseLt.so*")))
            if libs:
                return os.path.join(root, "include"), libs[0]
    return None


def rel(paths):
    return sorted(os.path.relpath(p, ROOT) for p in paths)


def headers() -> list:
    """Every header under csrc/, listed as the module's dependencies (ninja tracks them itself; this is for a
    build without ninja)."""
    return rel(p for ext in ("h", "hpp", "cuh") for p in glob.glob(os.path.join(ROOT, "csrc", "**", f"*.{ext}"),
                                                                  recursive=True))


# One folder for the compiled objects, whoever builds: `pip install -e .` (whose editable build would otherwise
# compile everything in a fresh temporary folder every time) and `python setup.py build_ext --inplace` alike use
# the folder the latter uses by default, so ninja recompiles only what changed since the last build of this
# checkout, and nothing when nothing did (scripts/install.sh run a second time only links the module again).
BUILD_TEMP = os.path.join(ROOT, "build", f"temp.{sysconfig.get_platform()}-{sys.implementation.cache_tag}")


class BuildExt(BuildExtension):
    def finalize_options(self) -> None:
        super().finalize_options()
        self.build_temp = BUILD_TEMP


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
            depends=headers(),
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
    include_dirs = [os.path.join(ROOT, "csrc")]
    cusparselt = find_cusparselt()
    if cusparselt is not None:
        include, library = cusparselt
        print(f"sparsetorch: cuSPARSELt from {library}")
        define_macros.append(("SPARSETORCH_WITH_CUSPARSELT", None))
        include_dirs.append(include)
        # By file (the wheel ships only libcusparseLt.so.0), found at run time through the rpath (torch
        # has usually loaded it already).
        extra_link_args += [library, f"-Wl,-rpath,{os.path.dirname(library)}"]
    else:
        print("sparsetorch: cuSPARSELt not found; building without 2:4 support on the GPU")
    return CUDAExtension(
        "sparsetorch._C",
        sources,
        include_dirs=include_dirs,
        define_macros=define_macros,
        extra_compile_args={"cxx": cxx_flags, "nvcc": nvcc_flags},
        extra_link_args=extra_link_args,
        libraries=["cusparse", "cublas", "cublasLt"],
        depends=headers(),
    )


setup(
    name="sparsetorch",
    version="0.1.0",
    description="Sparse (CSR) and dense linear algebra for PyTorch on NVIDIA GPUs and CPUs",
    packages=find_packages(include=["sparsetorch", "sparsetorch.*"]),
    python_requires=">=3.9",
    install_requires=["torch>=2.4", "numpy", "scipy"],
    extras_require={
        "test": ["pytest", "hypothesis", "torch-geometric"],
        "bench": ["tqdm", "matplotlib", "scikit-learn"],
    },
    ext_modules=[get_extension()],
    cmdclass={"build_ext": BuildExt},
    zip_safe=False,
)
