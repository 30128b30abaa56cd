#!/usr/bin/env bash
# Session 23, device call 12: where the native issuer's host time goes (op_times) at 2x2 and 4x2.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r12"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run host_2x2 80 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,python
run host_4x2 100 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native
for f in host_2x2 host_4x2; do echo "== $f"; grep -E "^# inside|^#   |^way |^(nccl|native|python)[/0-9A-Za-z]* (sync|async)|watchdog" "$X/$f.log" | cut -c1-200 | head -24; done
tar -czf "$OUT/r12_logs.tar.gz" -C "$X" . && rm -rf "$X"
