#!/usr/bin/env bash
# Session 32, device call 5 (code as run 72, a096432; run 75 again with the warm-up fixed, without the transformer): ringreduce's helper threads as
# SCHED_BATCH against SCHED_OTHER (batch_threads.py) at 4x2 and 2x2 loopback; the
# 146-bucket transformer in DDP at 4x2 capped, native-async, with hook times.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r76"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; uname -r; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 500 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
export NCCL_SET_THREAD_NAME=1 RINGREDUCE_TIMEOUT=30
E="python3 benchmarks/emulate.py --physical-gpus 1"
B="--mode loopback --script benchmarks/results/2026-11-26-h200-hook-time/scripts/batch_threads.py -- --size 25M"
run batch_4x2 120 $E --machines 4 --gpus-per-machine 2 $B
run batch_2x2 80 $E --machines 2 --gpus-per-machine 2 $B

cat "$X/status.txt"
for f in batch_4x2 batch_2x2; do echo "== $f"; grep -E "^(way|nccl|rr)|Error|wrong|helper" "$X/$f.log" | cut -c1-90; done
echo "== tf_4x2"; grep -A4 -E "^mode " "$X/tf_4x2.log" | cut -c1-200; grep -hE "Error" "$X/tf_4x2.log" | head -3 | cut -c1-300
tar -czf "$OUT/r76_logs.tar.gz" -C "$X" . && rm -rf "$X"
