#!/usr/bin/env bash
# Set-up for a fresh machine (Python, pip and a C++ compiler): torch if missing, the Python
# dependencies, then sparsetorch itself built against that torch.
#   bash scripts/install.sh [test|bench]
# CUDA sources are compiled when torch has CUDA and nvcc is found (SPARSETORCH_CUDA=0/1 overrides).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
extra=${1:-}

# The torch versions tested are 2.13 (CPU, CI) and 2.11 (CUDA 13.0, the GPU machines): an installed torch of
# 2.11 or newer is kept, an older one stops here (sparsetorch is built against the installed torch). Where none
# is installed, take 2.13.0: on CPU-only machines like CI's this is the CPU wheel (no CUDA packages to
# download); elsewhere PyPI's default build.
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  "$PY" -m pip install "torch==2.13.0"
fi
if ! "$PY" -c "import sys, torch; v = tuple(int(x) for x in torch.__version__.split('+')[0].split('.')[:2]); sys.exit(v < (2, 11))"; then
  echo "install.sh: torch $("$PY" -c 'import torch; print(torch.__version__)') is installed; sparsetorch is tested" \
       "with torch 2.11 and 2.13. Upgrade it (pip install 'torch>=2.11') and run this again." >&2
  exit 1
fi
deps=(numpy scipy ninja)
case "$extra" in
  # torch_geometric (pure Python) for the drop-in equivalence tests; the version the GPU machines have.
  test) deps+=(pytest hypothesis "torch-geometric==2.8.0.post1") ;;
  # scikit-learn: examples/pruned_ffn.py's dataset (handwritten digits, shipped inside the wheel).
  bench) deps+=(tqdm matplotlib scikit-learn) ;;
esac
"$PY" -m pip install "${deps[@]}"

# The compile, through setup.py itself so that its progress shows: ninja prints each file as it starts it
# ([12/54] ...), which pip would hide behind "still running" for the many minutes a CUDA build takes on few
# cores. The objects stay in build/ (setup.py's BuildExt), so the editable install after it only links the
# module again, and a second run, e.g. `install.sh test` after `install.sh bench`, compiles only what changed
# since. --no-build-isolation: the extension must be compiled against the torch installed above.
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
"$PY" setup.py build_ext --inplace
"$PY" -m pip install --no-build-isolation --no-deps -e .
"$PY" -c "import sparsetorch as st; print('sparsetorch', st.__version__, st.build_info())"
