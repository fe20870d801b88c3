#!/usr/bin/env bash
# Set-up for a fresh machine (Python, pip and a C++ compiler): torch if missing, the Python
# dependencies, then sparsetorch itself built against that torch.
#   bash scripts/install.sh [test|bench]
# CUDA sources are compiled when torch has CUDA and nvcc is found (SPARSETORCH_CUDA=0/1 overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
extra=${1:-}

# Any torch >= 2.4 works. Where none is installed, take 2.13.0: on CPU-only machines like CI's this
# is the CPU wheel (no CUDA packages to download); elsewhere PyPI's default build.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install "torch==2.13.0"
fi
deps=(numpy scipy ninja)
case "$extra" in
  # torch_geometric (pure Python) for the drop-in equivalence tests; the version the GPU machines have.
  test) deps+=(pytest hypothesis "torch-geometric==2.8.0.post1") ;;
  # scikit-learn: examples/pruned_ffn.py's dataset (handwritten digits, shipped inside the wheel).
  bench) deps+=(tqdm matplotlib scikit-learn) ;;
esac
"$PY" -m pip install "${deps[@]}"

# --no-build-isolation: the extension must be compiled against the torch installed above. The objects stay in
# build/ (setup.py's BuildExt), so a second run, e.g. `install.sh test` after `install.sh bench`, compiles only
# what changed since (nothing, on an unchanged tree: it links the module again, in seconds).
MAX_JOBS=${MAX_JOBS:-$(nproc)} "$PY" -m pip install --no-build-isolation --no-deps -e .
"$PY" -c "import sparsetorch as st; print('sparsetorch', st.__version__, st.build_info())"
