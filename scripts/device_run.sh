#!/usr/bin/env bash
# On a lent GPU machine (see README, "Working on the GPU"): build with CUDA (or reuse a carried module),
# run tests and benchmarks, write logs and results under $OUT.
#   bash scripts/device_run.sh [tests] [main] [suites=a,b] [profile] [examples]
#     tests      the whole test suite (PYTEST_ARGS picks a subset)
#     main       the main job, python -m sparsetorch.bench (MAIN_ARGS adds options, e.g. --full)
#     results    the main job over every one-GPU suite into benchmarks/results/<device kind>/ (the folder the
#                README cites), copied to $OUT/results; it writes after every job, so a run cut short keeps
#                its rows: finish it with RESULT_SUITES=<the rest> MAIN_ARGS=--append (~9.5 min on an H100)
#     suites=..  the main job on these suites only (into $OUT/suites)
#     profile    torch.profiler over fresh-graph training steps (suites/minibatch.py)
#     examples   every script in examples/ on the GPU
# A built module is stripped and gzipped to $OUT/module.so.gz: gunzip it into sparsetorch/ and carry it
# to the next call (the build takes ~4 minutes on 16 cores); a carried module newer than every source
# is reused.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sparsetorch-out}
mkdir -p "$OUT"
# The image's default CXX links libstdc++ statically into the module, whose iostreams then crash
# against the process's libstdc++: build with the system compiler.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
export SPARSETORCH_CUDA=1 MAX_JOBS=${MAX_JOBS:-16} PYTHONUNBUFFERED=1 SPARSETORCH_CUDA_ARCH=${SPARSETORCH_CUDA_ARCH:-90}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONFAULTHANDLER=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"

module=$(python3 -c "import sysconfig; print('sparsetorch/_C' + sysconfig.get_config_var('EXT_SUFFIX'))")
newest_source=$(find csrc setup.py -type f -newer "$module" 2>/dev/null | head -n1)
if [ -f "$module" ] && [ -z "$newest_source" ]; then
  echo "build: reusing the carried $module"
else
  start=$(date +%s)
  rm -rf build "$module"
  if ! python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
    grep -E "error" "$OUT/build.log" | head -40
    exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s"
  strip -s -o /tmp/module.so "$module" && gzip -c /tmp/module.so > "$OUT/module.so.gz"
fi
python3 -c "import sparsetorch as st; print(st.build_info())" 2>&1 | tee -a "$OUT/device.txt" || exit 1

# The data (../shared/data does not travel): carry a copy in .devdata.
if [ -d .devdata ]; then export SPARSETORCH_DATA=$PWD/.devdata; fi
mkdir -p "$OUT/logs"
rc=0
# DEADLINE (seconds since the script started, default 570): each step gets what is left of it, so the
# results come back packed even when a step runs long.
script_start=${SECONDS}
left() { echo $(( ${DEADLINE:-570} - (SECONDS - script_start) )); }
for what in "$@"; do
  if [ "$(left)" -le 5 ]; then echo "device_run: no time left for $what"; rc=1; continue; fi
  case "$what" in
    tests)
      timeout "$(left)" python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests} > "$OUT/logs/tests.log" 2>&1 || rc=1
      grep -E "^(FAILED|ERROR)" "$OUT/logs/tests.log" | head -30
      tail -2 "$OUT/logs/tests.log" ;;
    main)
      timeout "$(left)" python3 -m sparsetorch.bench ${MAIN_ARGS:-} --out "$OUT/main" > "$OUT/logs/main.log" 2>&1 || rc=1
      tail -25 "$OUT/logs/main.log" ;;
    results)
      slug=$(python3 -c "import torch; from sparsetorch.bench.__main__ import device_slug; print(device_slug(torch.device('cuda')))")
      [[ " ${MAIN_ARGS:-} " == *" --append "* ]] || rm -rf "benchmarks/results/$slug"
      timeout "$(left)" python3 -m sparsetorch.bench ${MAIN_ARGS:-} \
        --suites "${RESULT_SUITES:-density,graphs,batched,elementwise,gnn,fresh,pruned,skew}" \
        --out "benchmarks/results/$slug" > "$OUT/logs/results.log" 2>&1 || rc=1
      mkdir -p "$OUT/results" && cp -r "benchmarks/results/$slug" "$OUT/results/"
      tail -30 "$OUT/logs/results.log" ;;
    suites=*)
      name=${what#suites=}; name=${name//,/_}
      timeout "$(left)" python3 -m sparsetorch.bench ${MAIN_ARGS:-} --suites "${what#suites=}" --out "$OUT/$name" \
        > "$OUT/logs/$name.log" 2>&1 || rc=1
      tail -30 "$OUT/logs/$name.log" ;;
    profile)
      timeout "$(left)" python3 -m sparsetorch.bench.suites.minibatch > "$OUT/logs/profile.log" 2>&1 || rc=1
      grep -E "per step" "$OUT/logs/profile.log" ;;
    examples)
      for ex in examples/*.py; do
        echo "== $ex" >> "$OUT/logs/examples.log"
        python3 "$ex" >> "$OUT/logs/examples.log" 2>&1 || { rc=1; echo "FAILED: $ex"; }
      done
      tail -30 "$OUT/logs/examples.log" ;;
    *) echo "device_run: unknown step $what"; rc=1 ;;
  esac
done
# The device tool brings back at most 8 files, 2 folders deep: one archive of everything but the module.
tar czf /tmp/results.tgz -C "$OUT" --exclude module.so.gz . && find "$OUT" -mindepth 1 ! -name module.so.gz -delete \
  && mv /tmp/results.tgz "$OUT/results.tgz"
exit $rc
