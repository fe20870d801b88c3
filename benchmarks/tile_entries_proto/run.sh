#!/usr/bin/env bash
# On the GPU machine: build the prototype and run it; output under $OUT.
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo -Xptxas -v bench.cu -lcublas -o /tmp/tile_bench > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
/tmp/tile_bench "$@" 2>&1 | tee "$OUT/bench.log"
