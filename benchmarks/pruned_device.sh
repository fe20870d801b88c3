#!/usr/bin/env bash
# On the GPU machine (device tool), in one call: build with CUDA and cuSPARSELt, run the 2:4 and SparseLinear
# tests (plus torch.compile of a model holding one), the pruned suite with issue 19's summary, and the
# pruned-FFN example. Results under $OUT in at most 8 files. The built module comes back gzipped (C.so.gz +
# its name in device.txt): put it at .prebuilt/_C.so.gz with the name in .prebuilt/name and a later call on
# the same tree skips the ~90 s build.
#   TEST_T / BENCH_T / EX_T: time limits (s) of the three parts, BENCH_BUDGET: no new suite job after it;
#   PYTEST_K: the tests' -k filter.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sparsetorch-out}
mkdir -p "$OUT"
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi  # see scripts/device_run.sh
export SPARSETORCH_CUDA=1 MAX_JOBS=${MAX_JOBS:-16} SPARSETORCH_CUDA_ARCH=90 PYTHONUNBUFFERED=1 PYTHONPATH=$PWD
D=$OUT/device.txt
{ nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
  python3 -c "import nvidia.cusparselt as p, glob; print('cusparselt wheel', list(p.__path__), glob.glob(p.__path__[0] + '/lib/*'))"
} > "$D" 2>&1
if [ -f .prebuilt/_C.so.gz ]; then
  gunzip -c .prebuilt/_C.so.gz > "sparsetorch/$(cat .prebuilt/name)" && echo "build: prebuilt $(cat .prebuilt/name)" | tee -a "$D"
else
  t0=$(date +%s)
  rm -rf build sparsetorch/_C*.so
  if ! python3 setup.py build_ext --inplace > /tmp/build.log 2>&1; then
    grep -E "error|Error" /tmp/build.log | head -40 | tee -a "$D"; tail -20 /tmp/build.log | tee -a "$D"; exit 1
  fi
  so=$(ls sparsetorch/_C*.so)
  echo "build: $(( $(date +%s) - t0 )) s; $(grep -E 'cuSPARSELt' /tmp/build.log | head -2); so_name $(basename "$so")" | tee -a "$D"
  gzip -c "$so" > "$OUT/C.so.gz"
fi
python3 -c "import sparsetorch as st; print(st.build_info()); print('cusparselt_version', st._ops.ops.cusparselt_version())" 2>&1 | tee -a "$D"
timeout "${TEST_T:-150}" python3 -m pytest -q -p no:cacheprovider tests/test_sparse24.py tests/test_nn.py \
  -k "${PYTEST_K:-(sparse or compile) and not cpu}" > "$OUT/tests.log" 2>&1
grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -20; tail -2 "$OUT/tests.log"
timeout "${BENCH_T:-200}" python3 benchmarks/pruned_cuda.py --out "$OUT/pruned" --budget "${BENCH_BUDGET:-150}" \
  > "$OUT/bench.log" 2>&1
rm -f "$OUT/pruned/results.csv"
grep -E "TFLOP|budget" "$OUT/bench.log"; sed -n '/^| weight/,$p' "$OUT/bench.log" | cut -c1-230
timeout "${EX_T:-90}" python3 examples/pruned_ffn.py --device cuda --out /tmp/ffn.json > "$OUT/example.log" 2>&1
cat /tmp/ffn.json >> "$OUT/example.log" 2>/dev/null
grep -E "accuracy|trained" "$OUT/example.log" | cut -c1-200
