#!/usr/bin/env bash
# Session 26, device call 4: after the GIL/lock fix (issuer.cpp wait_for). native-async at
# 2x1 and 2x2 (8 tensors, 8 in flight: hung every time before), then host time, CPU and
# exactness per 25 MiB call, native vs native-async vs NCCL, same processes: 2x2, 4x2.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r38"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 480 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
P="env RINGREDUCE_TIMEOUT=15"
A="--mode loopback --script benchmarks/async_order.py -- --phase alone --tensors 8"
run async_2x1 60 $P $E --machines 2 --gpus-per-machine 1 $A
run async_2x2 70 $P $E --machines 2 --gpus-per-machine 2 $A
run async_2x2_mixed 70 $P $E --machines 2 --gpus-per-machine 2 ${A/alone/mixed}
H="--mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native-async"
run host_2x2 110 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $H
run host_4x2 150 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $H
cat "$X/status.txt"
for f in "$X"/async_*.log; do echo "== $(basename $f)"; grep -hE "^\[async-order\].*phase|watchdog:" "$f" | cut -c1-400; done
for f in host_2x2 host_4x2; do echo "== $f"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* |Error|exact" "$X/$f.log" | cut -c1-220 | tail -14; done
tar -czf "$OUT/r38_logs.tar.gz" -C "$X" . && rm -rf "$X"
