#!/usr/bin/env bash
# On the GPU machine: build the harness against a csrc tree (CSRC, default the repository's) and run it;
# output under $OUT/$LOG.log (environment of the run: see bench.cu's main).
set -uo pipefail
cd "$(dirname "$0")"
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
CSRC=${CSRC:-../../csrc}
BIN=/tmp/slot_walk_$(echo "$CSRC" | tr -c 'a-zA-Z0-9\n' '_')
TORCH_INC=$(python3 -c "import torch.utils.cpp_extension as c; print(' '.join('-I' + p for p in c.include_paths()))")
[ -x "$BIN" ] || nvcc -O3 -std=c++17 -arch=sm_90 -lineinfo -Xptxas -v -I"$CSRC" $TORCH_INC bench.cu -lcublas -o "$BIN" \
  > "$OUT/build_$(basename "$BIN").log" 2>&1 || { tail -30 "$OUT/build_$(basename "$BIN").log"; exit 1; }
"$BIN" 2>&1 | tee "$OUT/${LOG:-bench}.log"
