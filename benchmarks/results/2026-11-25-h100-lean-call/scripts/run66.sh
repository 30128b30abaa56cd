#!/usr/bin/env bash
# Session 30, device call 7: run 62's caller measurement twice more on the final code
# (caller_path.py, 2x2 loopback), so the back-to-back figure rests on three runs.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r66"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
S=benchmarks/results/2026-11-25-h100-lean-call/scripts
for i in 1 2; do
  timeout -k 10 70 env RINGREDUCE_TIMEOUT=30 python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 \
    --gpus-per-machine 2 --mode loopback --script $S/caller_path.py -- --size 25M > "$X/path$i.log" 2>&1
  echo "path$i exit $?"; grep -E "^(way|nccl|rr) |^# exact" "$X/path$i.log" | cut -c1-100
done
tar -czf "$OUT/r66_logs.tar.gz" -C "$X" . && rm -rf "$X"
