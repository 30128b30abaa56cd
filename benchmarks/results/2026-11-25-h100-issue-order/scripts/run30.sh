#!/usr/bin/env bash
# Session 25, device call 6: native-async now that calls on one tensor run in order: on one
# tensor (no overlap on the device any more), round 8 tensors with 8 in flight (overlap, as
# DDP's buckets), the inline control; then host time with native-async beside native.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r30"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 570 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
A="$E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_order.py -- --phase alone"
run async_one_tensor 50 env RINGREDUCE_TIMEOUT=10 $A
run async_8_tensors 50 env RINGREDUCE_TIMEOUT=10 $A --tensors 8
run async_8_tensors_b 50 env RINGREDUCE_TIMEOUT=10 $A --tensors 8
run inline_8_tensors 50 env RINGREDUCE_TIMEOUT=10 $A --tensors 8 --issuer native
run host_2x2 110 env RINGREDUCE_TIMEOUT=20 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native-async,python
run host_2x2_inline 90 env RINGREDUCE_TIMEOUT=20 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native/nocheck
cat "$X/status.txt"
echo "== async"; grep -hE "^\[async-order\].*phase|watchdog:" "$X"/async_*.log "$X"/inline_*.log | sed -e 's/no progress within the deadline of [0-9.]* s (RINGREDUCE_TIMEOUT); a peer died, hangs, or never made this call//' | cut -c1-300 | head -24
for f in host_2x2 host_2x2_inline; do echo "== $f"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* |Error|group_end" "$X/$f.log" | cut -c1-200 | tail -12; done
tar -czf "$OUT/r30_logs.tar.gz" -C "$X" . && rm -rf "$X"
