#!/usr/bin/env bash
# Session 26, device call 3: 2x1, where it hangs in the synchronous phase too: stacks and
# worker counters of every rank from the start; the caller on a created stream beside.
# a deadline error names, per stream, the first instruction the device has not passed.
# 2x2 loopback under MPS (8 tensors, 8 in flight: hangs every time so far), the same
# time-sliced (--mps off: is it MPS's?), 2x1 under MPS (one communicator pair fewer).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r37"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 540 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
P="env RINGREDUCE_TIMEOUT=12 RINGREDUCE_ISSUE_PROBES=512"
A="--mode loopback --script benchmarks/async_order.py -- --phase alone --tensors 8"
run async_2x1_mps 70 $P $E --machines 2 --gpus-per-machine 1 $A
run async_2x1_mps_side 70 $P $E --machines 2 --gpus-per-machine 1 $A --side-stream
cat "$X/status.txt"
for f in "$X"/async_*.log; do echo "== $(basename $f)"; grep -hE "^\[async-order\]|^\[hang\]|watchdog:" "$f" | sed -e 's/no progress within the deadline of [0-9.]* s (RINGREDUCE_TIMEOUT); a peer died, hangs, or never made this call//' | cut -c1-1500; done
tar -czf "$OUT/r37_logs.tar.gz" -C "$X" . && rm -rf "$X"
