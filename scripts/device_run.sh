#!/usr/bin/env bash
# On the GPU machine: build with CUDA, run the whole test suite, then the CUDA benchmarks.
# Logs and results go under $OUT (the device tool brings that folder back).
#   bash scripts/device_run.sh [tests] [bench] [dense] [all] [tiled] [densify] [graphs] [sddmm] [examples] [ffn] [harness] [safety] [skew] [gnn] [residual] [slots] [sanitizer]
#   (bench: SpMM, dense: elementwise/linear/crossover, all: those three; sddmm: SDDMM and SpMM
#   backward; tiled: the tiled SpMM density sweep (TILED_ARGS=--quick); graphs: every SpMM backend on the
#   graph suite (GRAPHS_ARGS=--quick); densify: the densify route against the others (DENSIFY_ARGS=--quick); examples: GCN on Cora + pruned FFN; ffn: the pruned FFN alone. DENSE_SUITES=elementwise,linear picks dense suites)
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sparsetorch-out}
mkdir -p "$OUT"
what=" ${*:-all} "
want() { [[ "$what" == *" $1 "* || "$what" == *" all "* ]]; }
# The device image sets CXX=/opt/gcc/bin/g++, a wrapper that links libstdc++ statically into the
# module; its iostreams then crash against the process's libstdc++ (seen: segfault in
# ostream::_M_insert<long> on the first formatted message). Build with the system compiler.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
export SPARSETORCH_CUDA=1 MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1 SPARSETORCH_CUDA_ARCH=${SPARSETORCH_CUDA_ARCH:-90}
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm --format=csv | tee "$OUT/device.txt"
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)" | tee -a "$OUT/device.txt"

start=$(date +%s)
# SKIP_BUILD=1 reuses the module a previous call built on this (still warm) machine.
if [ "${SKIP_BUILD:-0}" = 1 ] && ls sparsetorch/_C*.so >/dev/null 2>&1; then
  echo "build: reusing $(ls sparsetorch/_C*.so)"
else
  rm -rf build sparsetorch/_C*.so
  if ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
    grep -E "error|Error" "$OUT/build.log" | head -40
    tail -20 "$OUT/build.log"
    exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s"
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONFAULTHANDLER=1
if ! python3 -c "import sparsetorch as st; print(st.build_info())" 2>&1 | tee -a "$OUT/device.txt"; then
  echo "import failed"; ldd sparsetorch/_C*.so | grep -E "cusparse|cublas|cudart|torch|gomp|not found"
  cuda-gdb -batch -ex run -ex bt --args python3 -c "import sparsetorch as st; print(st.build_info())" 2>&1 | tail -25
  exit 1
fi

# The real matrices: ../shared/data does not travel to the GPU machine; carry a copy in .devdata.
if [ -d .devdata/matrices ]; then export SPARSETORCH_DATA=$PWD/.devdata; fi
rc=0
if want tests; then
  # PYTEST_ARGS picks a subset (default: the whole suite).
  python3 -m pytest -q -p no:cacheprovider --junitxml="$OUT/junit.xml" ${PYTEST_ARGS:-tests} > "$OUT/tests.log" 2>&1 || rc=1
  grep -E "^(FAILED|ERROR)" "$OUT/tests.log" | head -40
  tail -3 "$OUT/tests.log"
fi
if want dense; then
  python3 benchmarks/elementwise_dense_cuda.py --out "$OUT" ${DENSE_SUITES:+--suites "$DENSE_SUITES"} 2>&1 | tee "$OUT/dense.log" | tail -60 || rc=1
fi
if want bench; then
  python3 benchmarks/spmm_cuda.py --out "$OUT" 2>&1 | tee "$OUT/bench.log" | tail -40 || rc=1
  python3 -m sparsetorch.bench --out "$OUT/main_job.json" 2>&1 | tee "$OUT/main_job.log" || rc=1
fi
if [[ "$what" == *" tiled "* ]]; then
  python3 benchmarks/spmm_tiled_cuda.py --out "$OUT" ${TILED_ARGS:-} 2>&1 | tee "$OUT/tiled.log" | tail -60 || rc=1
fi
if [[ "$what" == *" densify "* ]]; then
  python3 benchmarks/spmm_densify_cuda.py --out "$OUT" ${DENSIFY_ARGS:-} 2>&1 | tee "$OUT/densify.log" | tail -100 || rc=1
fi
if [[ "$what" == *" graphs "* ]]; then
  python3 benchmarks/spmm_graphs_cuda.py --out "$OUT" ${GRAPHS_ARGS:-} 2>&1 | tee "$OUT/graphs.log" | tail -80 || rc=1
fi
if [[ "$what" == *" sddmm "* ]]; then
  python3 benchmarks/sddmm_cuda.py --out "$OUT" 2>&1 | tee "$OUT/sddmm.log" | tail -20 || rc=1
fi
if [[ "$what" == *" examples "* ]]; then
  python3 examples/gcn_cora.py --device cuda --seeds 10 --out "$OUT/gcn_cora_cuda.json" 2>&1 | tee "$OUT/gcn_cora.log" || rc=1
fi
if [[ "$what" == *" examples "* || "$what" == *" ffn "* ]]; then
  python3 examples/pruned_ffn.py --device cuda --out "$OUT/pruned_ffn_fp32.json" 2>&1 | tee "$OUT/pruned_ffn.log" || rc=1
  python3 examples/pruned_ffn.py --device cuda --dtype bfloat16 --out "$OUT/pruned_ffn_bf16.json" 2>&1 \
    | tee -a "$OUT/pruned_ffn.log" || rc=1
fi
if [[ "$what" == *" harness "* ]]; then
  # No cpu suite here: this machine's CPU timings came back quantised to 8 ms (a CPU quota).
  python3 -m sparsetorch.bench --full --suites density,graphs,batched,elementwise --out "$OUT/harness" \
    2>&1 | tee "$OUT/harness.log" | tail -40 || rc=1
fi
if [[ "$what" == *" safety "* ]]; then
  # Safe by default: every corruption x entry point, counted by outcome (CUDA in worker processes), then
  # the CUDA safety tests under compute-sanitizer memcheck (every child process is checked).
  python3 benchmarks/safety_probe.py --device cuda --out "$OUT/safety.json" 2>&1 | tee "$OUT/safety.log" | head -30
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
  if [ -n "$SAN" ]; then
    timeout ${SAFETY_SANITIZER_S:-240} "$SAN" --tool memcheck --target-processes all --error-exitcode 99 --print-limit 20 \
      python3 -m pytest -q -p no:cacheprovider tests/test_safety.py -k "cuda and int64" > "$OUT/safety_sanitizer.log" 2>&1
    echo "compute-sanitizer exit: $?" | tee -a "$OUT/safety_sanitizer.log"
    grep -E "ERROR SUMMARY|passed|failed" "$OUT/safety_sanitizer.log" | tail -3
  fi
fi
if [[ "$what" == *" skew "* ]]; then
  # Fast by default: the skew suite of the main job (the default call against every route and torch.sparse.mm).
  python3 -m sparsetorch.bench ${SKEW_ARGS:-} --suites skew --no-plots --out "$OUT/skew" 2>&1 \
    | tee "$OUT/skew.log" | tail -8 || rc=1
fi
if [[ "$what" == *" gnn "* ]]; then
  python3 -m sparsetorch.bench ${GNN_ARGS:-} --suites gnn --no-plots --out "$OUT/gnn" 2>&1 | tee "$OUT/gnn.log" | tail -12 || rc=1
fi
if [[ "$what" == *" residual "* ]]; then
  # Where the 2:4 + residual form's time goes (issue 19): per-kernel GPU times of a layer forced to 2:4.
  python3 benchmarks/sparse24_residual_cuda.py --out "$OUT" 2>&1 | tee "$OUT/sparse24_residual.log" | tail -80 || rc=1
fi
if [[ "$what" == *" slots "* ]]; then
  # The slot form against the bitmap, CSR16 and dense forms, issue 19's shapes (SLOTS_ARGS=--quick).
  python3 benchmarks/slots_cuda.py --out "$OUT" ${SLOTS_ARGS:-} 2>&1 | tee "$OUT/slots.log" | tail -120 || rc=1
fi
if [[ "$what" == *" sanitizer "* ]]; then
  # compute-sanitizer memcheck over a representative subset (every CUDA route, malformed indices,
  # graph capture, threads); slow, so not the whole suite.
  SAN=$(command -v compute-sanitizer || ls /usr/local/cuda*/bin/compute-sanitizer 2>/dev/null | head -n1)
  if [ -n "$SAN" ]; then
    timeout 300 "$SAN" --tool memcheck --error-exitcode 99 --print-limit 20 python3 -m pytest -q -p no:cacheprovider \
      tests/test_cuda.py tests/test_hardening.py tests/test_densify.py -k "not memory_flat and not properties" > "$OUT/sanitizer.log" 2>&1
    echo "compute-sanitizer exit: $?" | tee -a "$OUT/sanitizer.log"
    grep -E "ERROR SUMMARY|passed|failed" "$OUT/sanitizer.log" | tail -3
  else
    echo "compute-sanitizer not found" | tee "$OUT/sanitizer.log"
  fi
fi
# The device tool brings back at most 8 files: pack everything into one archive when there are more.
if [ "$(find "$OUT" -type f | wc -l)" -gt 8 ]; then
  tar czf /tmp/device_out.tgz -C "$OUT" . && find "$OUT" -mindepth 1 -delete && mv /tmp/device_out.tgz "$OUT/all.tgz"
fi
exit $rc
