#!/usr/bin/env bash
# One device call for a one-GPU machine (when no multi-GPU kind is lent): the soak and
# the DLRM comparison as 2 virtual machines x 1 GPU, both ranks sharing the GPU.
# Summary last; logs, JSON and the loss plot in $OUT.
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1"
timeout "${SOAK_S:-280}" $E --mode loopback --script benchmarks/soak.py -- \
  --calls "${SOAK_CALLS:-10000}" --min-bytes 65536 --json "$OUT/soak.json" > "$OUT/soak.log" 2>&1
echo "soak exit $?" >> "$OUT/soak.log"
timeout "${DLRM_S:-240}" $E --script benchmarks/dlrm.py -- --modes nccl,hook,backend \
  --steps 30 --warmup 5 --json "$OUT/dlrm_capped_2x1.json" --plot "$OUT/dlrm_capped_2x1.png" \
  > "$OUT/dlrm.log" 2>&1
echo "dlrm exit $?" >> "$OUT/dlrm.log"
grep -E "^# soak|wrong_elements|soak exit|FAILED" "$OUT/soak.log" | cut -c1-400 | tail -8
grep -vE "Warning|warn|^W1|^\s*$|socket.cpp" "$OUT/dlrm.log" | tail -25
