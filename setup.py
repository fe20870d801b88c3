"""Build sparsetorch: one extension module, ``sparsetorch._C``.

C++ sources (OpenMP) are always compiled. CUDA sources are added when torch was built with
CUDA and a CUDA compiler is found; override with SPARSETORCH_CUDA=1 (force) or =0 (CPU only).
The CUDA targets, by the ecosystem's rules (cuda_targets below): SPARSETORCH_CUDA_ARCH (an override), else
TORCH_CUDA_ARCH_LIST (torch.utils.cpp_extension's convention), else the GPUs visible at build time, else
(no GPU) the fat list 7.5;8.0;8.6;8.9;9.0+PTX. Nothing older than compute capability 7.5 (nvcc 13's oldest).
A CUDA build links cuSPARSELt (2:4 sparse tensor cores) when it finds it: SPARSETORCH_CUSPARSELT_HOME, the
nvidia-cusparselt pip package (a dependency of torch's CUDA wheels), or CUDA_HOME; SPARSETORCH_CUSPARSELT=0
leaves it out (the 2:4 ops then raise a clear error on the GPU).
"""
import glob
import os
import re
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


# --- CUDA targets -------------------------------------------------------------------------------------------
# A target is (compute capability, SASS, PTX): "8.0" with SASS is -gencode=arch=compute_80,code=sm_80 (runs on
# 8.x GPUs), with PTX -gencode=arch=compute_80,code=compute_80 (JIT-compiled by the driver for any newer GPU).
MIN_CC = (7, 5)  # nvcc 13 builds nothing older
FAT_LIST = "7.5;8.0;8.6;8.9;9.0+PTX"  # no GPU at build time: Turing (T4) to Hopper, PTX for newer GPUs
# torch.utils.cpp_extension's named architectures, from the oldest we build.
NAMED = {"Turing": "7.5+PTX", "Ampere": "8.0;8.6+PTX", "Ada": "8.9+PTX", "Hopper": "9.0+PTX"}


class TargetError(ValueError):
    pass


def _cc(text: str, source: str):
    """ "8.0", "80", "9.0a", "90a" -> ("8.0" style string, (major, minor)) ."""
    m = re.fullmatch(r"(\d+)\.(\d)([a-z]?)|(\d+)(\d)([a-z]?)", text)
    if not m:
        raise TargetError(f"sparsetorch: {source}: cannot read the CUDA target '{text}' (write 8.0, 8.0+PTX or 80)")
    major, minor, suffix = (m.group(1), m.group(2), m.group(3)) if m.group(1) else (m.group(4), m.group(5), m.group(6))
    cc = (int(major), int(minor))
    if cc < MIN_CC:
        raise TargetError(f"sparsetorch: {source}: compute capability {major}.{minor} is older than "
                          f"{MIN_CC[0]}.{MIN_CC[1]}, the oldest GPU sparsetorch's CUDA code (and nvcc 13) targets; "
                          "leave it out")
    return f"{major}.{minor}{suffix}", cc


def parse_targets(text: str, source: str, ptx_for_newest: bool) -> list:
    """[(cc, sass, ptx)] from a list such as "8.0;8.6;9.0+PTX" (TORCH_CUDA_ARCH_LIST's form; ';', ',' or spaces
    between entries; names such as "Ampere"), "80 90" (SPARSETORCH_CUDA_ARCH's older form), "compute_80" (PTX
    only) or "sm_80" (SASS only). ptx_for_newest: add PTX of the newest entry when no entry asks for PTX."""
    for name, value in NAMED.items():
        text = re.sub(rf"\b{name}\b", value, text)
    entries = {}
    for item in re.split(r"[;,\s]+", text.strip()):
        if not item:
            continue
        sass, ptx = True, item.endswith("+PTX")
        item = item[:-4] if ptx else item
        if item.startswith("compute_"):
            item, sass, ptx = item[len("compute_"):], False, True
        elif item.startswith("sm_"):
            item = item[len("sm_"):]
        cc, order = _cc(item, source)
        had_sass, had_ptx = entries.get(cc, (order, False, False))[1:]
        entries[cc] = (order, had_sass or sass, had_ptx or ptx)
    if not entries:
        raise TargetError(f"sparsetorch: {source} is set but names no CUDA target")
    targets = [(cc, sass, ptx) for cc, (_, sass, ptx) in sorted(entries.items(), key=lambda e: (e[1][0], e[0]))]
    if ptx_for_newest and not any(ptx for _, _, ptx in targets):
        cc, sass, _ = targets[-1]
        targets[-1] = (cc, sass, True)
    return targets


def cuda_targets(env=None, visible=None):
    """(targets, where they came from): SPARSETORCH_CUDA_ARCH, else TORCH_CUDA_ARCH_LIST, else the compute
    capabilities `visible` [(major, minor)] of the GPUs at build time (those older than 7.5 left out, with PTX for
    the newest, as torch.utils.cpp_extension does), else FAT_LIST."""
    env = os.environ if env is None else env
    own = env.get("SPARSETORCH_CUDA_ARCH", "").strip()
    if own:
        return parse_targets(own, "SPARSETORCH_CUDA_ARCH", ptx_for_newest=True), "SPARSETORCH_CUDA_ARCH"
    torch_list = env.get("TORCH_CUDA_ARCH_LIST", "").strip()
    if torch_list and torch_list != "native":
        return parse_targets(torch_list, "TORCH_CUDA_ARCH_LIST", ptx_for_newest=False), "TORCH_CUDA_ARCH_LIST"
    usable = sorted({cc for cc in (visible or []) if tuple(cc) >= MIN_CC})
    if usable:
        text = ";".join(f"{major}.{minor}" for major, minor in usable) + "+PTX"
        return parse_targets(text, "the visible GPUs", ptx_for_newest=False), "the GPUs visible at build time"
    fat = parse_targets(FAT_LIST, "the default list", ptx_for_newest=False)
    return fat, "no GPU of compute capability 7.5 or newer visible: the default list"


def _digits(cc: str) -> str:
    return cc.replace(".", "")


def gencode_flags(targets) -> list:
    flags = []
    for cc, sass, ptx in targets:
        if sass:
            flags.append(f"-gencode=arch=compute_{_digits(cc)},code=sm_{_digits(cc)}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{_digits(cc)},code=compute_{_digits(cc)}")
    return flags


def target_names(targets) -> list:
    """nvcc's names: ["sm_80", "sm_90", "compute_90"] (what st.build_info()["cuda_targets"] lists)."""
    return [f"sm_{_digits(cc)}" for cc, sass, _ in targets if sass] + \
           [f"compute_{_digits(cc)}" for cc, _, ptx in targets if ptx]


def visible_capabilities() -> list:
    """Compute capabilities of the GPUs this build can see, clamped to the newest torch was built for (what
    torch.utils.cpp_extension does: the nvcc at hand may not know a newer GPU)."""
    if not torch.cuda.is_available():
        return []
    built = [int(a.split("_")[1]) for a in torch.cuda.get_arch_list() if a.startswith("sm_") and a[3:].isdigit()]
    newest = max(((sm // 10, sm % 10) for sm in built), default=(99, 9))
    return sorted({min(torch.cuda.get_device_capability(i), newest) for i in range(torch.cuda.device_count())})


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


def announce(sources) -> None:
    """What the build is about to compile: ninja then prints [n/N] per file (N counts only files that changed)."""
    cuda = sum(src.endswith(".cu") for src in sources)
    jobs = os.environ.get("MAX_JOBS") or os.cpu_count()
    kinds = f"{cuda} of them CUDA, a minute or more of a core each" if cuda else "C++"
    print(f"sparsetorch: {len(sources)} source files ({kinds}), {jobs} parallel jobs", flush=True)


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
        announce(sources)
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
    announce(sources)
    define_macros.append(("SPARSETORCH_WITH_CUDA", None))
    try:
        targets, origin = cuda_targets(visible=visible_capabilities())
    except TargetError as e:
        sys.exit(str(e))
    names = target_names(targets)
    print(f"sparsetorch: CUDA targets {', '.join(names)} ({origin}; SPARSETORCH_CUDA_ARCH overrides)")
    # One identifier (no quotes or separators for a shell or ninja to take apart): csrc/cuda/build_targets.h.
    define_macros.append(("SPARSETORCH_CUDA_TARGETS", "_".join(n.replace("_", "") for n in names)))
    nvcc_flags = [
        "-O3",
        "-lineinfo",
        "--expt-relaxed-constexpr",
        "-Xcompiler=-fopenmp",
    ] + gencode_flags(targets)
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


if __name__ == "__main__":  # pip and `python setup.py` run it so; tests/test_build_targets.py imports the rules
    setup(
        name="sparsetorch",
        version="0.1.0",
        description="Sparse (CSR) and dense linear algebra for PyTorch on NVIDIA GPUs and CPUs",
        packages=find_packages(include=["sparsetorch", "sparsetorch.*"]),
        python_requires=">=3.9",
        install_requires=["torch>=2.11", "numpy", "scipy"],
        extras_require={
            "test": ["pytest", "hypothesis", "torch-geometric"],
            "bench": ["tqdm", "matplotlib", "scikit-learn"],
        },
        ext_modules=[get_extension()],
        cmdclass={"build_ext": BuildExt},
        zip_safe=False,
    )
