#!/usr/bin/env bash
# Build sparsetorch with CUDA on a GPU machine, then run the steps given, with logs and results under $OUT.
#   bash scripts/gpu_run.sh [tests] [main] [results] [suites=a,b] [profile] [examples]
#     tests      the whole test suite (PYTEST_ARGS picks a subset or adds options, e.g. "-n 4 tests")
#     main       the main job, python -m benchmarks (MAIN_ARGS adds options, e.g. --full), into $OUT/main
#     results    the main job over every one-GPU suite into benchmarks/results/<device kind>/ (the folder the
#                README cites), copied to $OUT/results; it writes after every job, so a run cut short keeps
#                its rows: finish it with RESULT_SUITES=<the rest> MAIN_ARGS=--append
#     suites=..  the main job on these suites only, into $OUT/<suites>
#     profile    torch.profiler over fresh-graph mini-batch steps (python -m benchmarks.gnn_profile --minibatch)
#     examples   every script in examples/
# Environment:
#   OUT              where logs and results go (default /tmp/sparsetorch-out)
#   SPARSETORCH_DATA the real data (matrices/, Planetoid); without it the data-dependent cases are left out
#   TORCH_CUDA_ARCH_LIST / SPARSETORCH_CUDA_ARCH, MAX_JOBS   the build's targets and parallelism (setup.py)
#   DEADLINE         seconds for all the steps together: each step gets what is left (default: no limit)
#   RESUME           a tests_done.txt of an earlier call: its tests are left out (a suite split over calls that
#                    each end at a time limit); every call writes $OUT/tests_done.txt, RESUME's ids included
#   PACK=1           pack $OUT into one $OUT/results.tgz at the end (to copy back from a remote machine)
# The built module is also saved stripped and gzipped as $OUT/module.so.gz: gunzip it into sparsetorch/ of
# a later copy of the same tree and the build is skipped (a module newer than every source is reused).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/sparsetorch-out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
# The system compiler where there is one: a toolchain that links libstdc++ statically into the module makes
# the module's iostreams crash against the libstdc++ that torch loaded.
if [ -x /usr/bin/g++ ]; then export CC=/usr/bin/gcc CXX=/usr/bin/g++; fi
export SPARSETORCH_CUDA=1 MAX_JOBS=${MAX_JOBS:-$(nproc)} PYTHONUNBUFFERED=1 PYTHONFAULTHANDLER=1
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$OUT/device.txt"

module=$("$PY" -c "import sysconfig; print('sparsetorch/_C' + sysconfig.get_config_var('EXT_SUFFIX'))")
newest_source=$(find csrc setup.py -type f -newer "$module" 2>/dev/null | head -n1)
if [ -f "$module" ] && [ -z "$newest_source" ]; then
  echo "build: reusing $module"
else
  start=$(date +%s)
  rm -rf build "$module"
  if ! "$PY" setup.py build_ext --inplace > "$OUT/build.log" 2>&1; then
    grep -E "error" "$OUT/build.log" | head -40
    exit 1
  fi
  echo "build: $(( $(date +%s) - start )) s"
  strip -s -o "$OUT/module.so" "$module" && gzip -f "$OUT/module.so"
fi
"$PY" -c "import sparsetorch as st; print(st.build_info())" 2>&1 | tee -a "$OUT/device.txt" || exit 1

mkdir -p "$OUT/logs"
rc=0
script_start=${SECONDS}
left() {
  if [ -n "${DEADLINE:-}" ]; then echo $(( DEADLINE - (SECONDS - script_start) )); else echo 1000000; fi
}
for what in "$@"; do
  if [ "$(left)" -le 5 ]; then echo "gpu_run: no time left for $what"; rc=1; continue; fi
  case "$what" in
    tests)
      # -v: each finished test's id is in the log (with -n: "[gw3] [ 12%] PASSED tests/...::name"), so a call
      # cut short by the deadline says which ran; RESUME's ids are left out of this call and kept in the list
      if [ -n "${RESUME:-}" ]; then export SPARSETORCH_TESTS_DONE=$RESUME; cp "$RESUME" "$OUT/tests_done.prev"; fi
      timeout "$(left)" "$PY" -m pytest -v -p no:cacheprovider ${PYTEST_ARGS:-tests} > "$OUT/logs/tests.log" 2>&1 || rc=1
      { cat "$OUT/tests_done.prev" 2>/dev/null
        sed -nE -e 's/^\[gw[0-9]+\] \[ *[0-9]+%\] (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) (tests\/.*[^ ]) *$/\2/p' \
          -e 's/^(tests\/.*[^ ]) (PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS)( +\[ *[0-9]+%\])? *$/\1/p' "$OUT/logs/tests.log"
      } | sort -u > "$OUT/tests_done.txt"
      rm -f "$OUT/tests_done.prev"
      grep -E "^(FAILED|ERROR)|[] ](FAILED|ERROR) tests/" "$OUT/logs/tests.log" | head -30
      echo "tests finished so far: $(wc -l < "$OUT/tests_done.txt") (\$OUT/tests_done.txt: RESUME= of the next call)"
      tail -2 "$OUT/logs/tests.log" ;;
    main)
      timeout "$(left)" "$PY" -m benchmarks ${MAIN_ARGS:-} --out "$OUT/main" > "$OUT/logs/main.log" 2>&1 || rc=1
      tail -25 "$OUT/logs/main.log" ;;
    results)
      slug=$("$PY" -c "import torch; from benchmarks.run import device_slug; print(device_slug(torch.device('cuda')))")
      [[ " ${MAIN_ARGS:-} " == *" --append "* ]] || rm -rf "benchmarks/results/$slug"
      timeout "$(left)" "$PY" -m benchmarks ${MAIN_ARGS:-} \
        --suites "${RESULT_SUITES:-density,graphs,batched,elementwise,gnn,fresh,pruned,skew}" \
        --out "benchmarks/results/$slug" > "$OUT/logs/results.log" 2>&1 || rc=1
      mkdir -p "$OUT/results" && cp -r "benchmarks/results/$slug" "$OUT/results/"
      tail -30 "$OUT/logs/results.log" ;;
    suites=*)
      name=${what#suites=}; name=${name//,/_}
      timeout "$(left)" "$PY" -m benchmarks ${MAIN_ARGS:-} --suites "${what#suites=}" --out "$OUT/$name" \
        > "$OUT/logs/$name.log" 2>&1 || rc=1
      tail -30 "$OUT/logs/$name.log" ;;
    profile)
      timeout "$(left)" "$PY" -m benchmarks.gnn_profile \
        --minibatch GCNConv:sparsetorch,GCNConv:pyg,SAGEConv:sparsetorch,SAGEConv:pyg > "$OUT/logs/profile.log" 2>&1 || rc=1
      grep -E "per step" "$OUT/logs/profile.log" ;;
    examples)
      for ex in examples/*.py; do
        echo "== $ex" >> "$OUT/logs/examples.log"
        timeout "$(left)" "$PY" "$ex" >> "$OUT/logs/examples.log" 2>&1 || { rc=1; echo "FAILED: $ex"; }
      done
      tail -30 "$OUT/logs/examples.log" ;;
    *) echo "gpu_run: unknown step $what"; rc=1 ;;
  esac
done
if [ "${PACK:-0}" = 1 ]; then
  tar czf /tmp/sparsetorch-results.tgz -C "$OUT" --exclude module.so.gz . \
    && find "$OUT" -mindepth 1 ! -name module.so.gz -delete && mv /tmp/sparsetorch-results.tgz "$OUT/results.tgz"
fi
exit $rc
