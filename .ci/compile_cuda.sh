#!/usr/bin/env bash
# Compile every CUDA source against the installed torch's headers, so a .cu file that does not compile fails
# CI even on a machine without a GPU or a CUDA build of torch. Each .cu file is assembled (ptxas, not PTX alone,
# which would skip it and hide errors) for sm_90 and the pre-Hopper targets sm_80 and sm_75 in one nvcc call:
# -O1, files in parallel, one job per core. ARCHS="90 80 75" (the default) chooses the targets; arguments, if
# any, are the files to compile instead of all of them.
#
# The CPU torch wheel ships the ATen/c10 CUDA headers except the generated
# c10/cuda/impl/cuda_cmake_macros.h (a one-line stand-in is written below); cusparse.h, cublas_v2.h,
# cublasLt.h and cusolverDn.h come from the NVIDIA wheels, of which only the headers are unpacked; cusparseLt.h
# likewise (so the 2:4 code is compiled as a build that found cuSPARSELt compiles it).
set -euo pipefail
cd "$(dirname "$0")/.."
NVCC=${NVCC:-nvcc}
if ! command -v "$NVCC" >/dev/null 2>&1; then
  if [ -n "${CI:-}" ]; then echo "compile_cuda: nvcc not found" >&2; exit 1; fi
  echo "compile_cuda: nvcc not found; skipping the CUDA compile check (it is required in CI)"; exit 0
fi

CACHE=.ci/cache
HDR=$CACHE/cuda-headers
if [ ! -f "$HDR/nvidia/cu13/include/cusparse.h" ] || [ ! -f "$HDR/nvidia/cu13/include/cusolverDn.h" ] \
   || [ ! -f "$HDR/nvidia/cu13/include/cublasLt.h" ] || [ ! -f "$HDR/nvidia/cusparselt/include/cusparseLt.h" ]; then
  mkdir -p "$CACHE/wheels" "$HDR"
  python -m pip download -q --no-deps --only-binary=:all: -d "$CACHE/wheels" \
    nvidia-cusparse==12.6.3.3 nvidia-cublas==13.1.1.3 nvidia-cusolver==12.0.4.66 nvidia-cusparselt-cu13==0.8.1
  for whl in "$CACHE"/wheels/nvidia_cusparse-*.whl "$CACHE"/wheels/nvidia_cublas-*.whl \
             "$CACHE"/wheels/nvidia_cusolver-*.whl "$CACHE"/wheels/nvidia_cusparselt_cu13-*.whl; do
    python - "$whl" "$HDR" <<'PY'
import sys, zipfile
whl, dest = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if "/include/" in name and name.endswith(".h"):
            z.extract(name, dest)
PY
  done
  rm -rf "$CACHE/wheels"
fi
mkdir -p "$HDR/stub/c10/cuda/impl"
echo '#define C10_CUDA_BUILD_SHARED_LIBS' > "$HDR/stub/c10/cuda/impl/cuda_cmake_macros.h"

TORCH_INC=$(python -c "from torch.utils.cpp_extension import include_paths; print(' '.join('-I'+p for p in include_paths()))")
PY_INC=$(python -c "import sysconfig; print(sysconfig.get_paths()['include'])")
# nvcc's own include directory (nvcc may be a wrapper script, so ask it rather than its path).
CUDA_INC=$("$NVCC" --dryrun -c -x cu /dev/null 2>&1 | sed -n 's/.*INCLUDES="-I\([^"]*\)".*/\1/p' | head -n1)
# The C++ standard torch.utils.cpp_extension builds extensions with (C++20 for torch >= 2.10).
STD=$(python -c "import inspect, torch.utils.cpp_extension as c; print('c++20' if \"'c++20'\" in inspect.getsource(c) else 'c++17')")
INCLUDES="-Icsrc $TORCH_INC -I$PY_INC -I$HDR/nvidia/cu13/include -I$HDR/nvidia/cusparselt/include -I$HDR/stub -I$CUDA_INC"
ARCHS=${ARCHS:-90 80 75}
TARGETS=$(for a in $ARCHS; do printf 'sm%s_' "$a"; done)  # setup.py's SPARSETORCH_CUDA_TARGETS form
DEFINES="-DSPARSETORCH_WITH_CUDA -DSPARSETORCH_WITH_CUSPARSELT -DSPARSETORCH_CUDA_TARGETS=${TARGETS%_}"
DEFINES="$DEFINES -DTORCH_API_INCLUDE_EXTENSION_H -DTORCH_EXTENSION_NAME=_C"
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

GENCODE=""
for a in $ARCHS; do GENCODE="$GENCODE -gencode=arch=compute_$a,code=sm_$a"; done
export NVCC INCLUDES DEFINES OUT STD GENCODE
compile_one() {
  src=$1
  case "$src" in
    *.cu) "$NVCC" -c "$src" -o "$OUT/$(basename "$src").o" -std=$STD --expt-relaxed-constexpr -O1 \
            $GENCODE $DEFINES $INCLUDES ;;
    *.cpp) ${CXX:-g++} -fsyntax-only -std=$STD "$src" $DEFINES $INCLUDES ;;
  esac && echo "compile_cuda: ok   $src" || { echo "compile_cuda: FAIL $src" >&2; return 1; }
}
export -f compile_one
# Every CUDA-side source of the library, and the C++ files with a CUDA-only part (#ifdef SPARSETORCH_WITH_CUDA;
# the CPU build compiles the rest of them). A glob that matched nothing would fail this pipeline (pipefail).
if [ $# -gt 0 ]; then
  printf '%s\n' "$@"
else
  ls csrc/cuda/*.cu csrc/cuda/*.cpp
  grep -l SPARSETORCH_WITH_CUDA csrc/*.cpp csrc/common/*.cpp
fi | xargs -P "${COMPILE_JOBS:-$(nproc)}" -I{} bash -c 'compile_one {}'
echo "compile_cuda: all CUDA sources compile (targets: $ARCHS)"
