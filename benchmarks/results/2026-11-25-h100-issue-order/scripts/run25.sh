#!/usr/bin/env bash
# Session 25, device call 1: bisect native-async's hang (run 8 of 2026-11-25-h100-engine-v2)
# over three suspects, one variable each: NCCL's implicit launch order (the per-communicator
# config field is NCCL >= 2.31; this NCCL is 2.28, so only the environment variable turns it
# on), CUDA's lazy kernel loading, NCCL's runtime connection; then host time with and
# without implicit launch order.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r25"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
A="$E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_order.py -- --phase alone"
run async_default 60 env RINGREDUCE_TIMEOUT=15 $A
run async_implicit 60 env RINGREDUCE_TIMEOUT=15 NCCL_LAUNCH_ORDER_IMPLICIT=1 $A
run async_eager 60 env RINGREDUCE_TIMEOUT=15 CUDA_MODULE_LOADING=EAGER $A
run async_noruntimeconnect 60 env RINGREDUCE_TIMEOUT=15 NCCL_RUNTIME_CONNECT=0 $A
H="$E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native/nocheck,python"
run host_default 120 env RINGREDUCE_TIMEOUT=30 $H
run host_implicit 120 env RINGREDUCE_TIMEOUT=30 NCCL_LAUNCH_ORDER_IMPLICIT=1 $H
cat "$X/status.txt"
echo "== async"; grep -hE "^\[async-order\]|Error" "$X"/async_*.log | cut -c1-260 | head -24
for f in host_default host_implicit; do echo "== $f"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* |Error" "$X/$f.log" | cut -c1-200 | tail -12; done
tar -czf "$OUT/r25_logs.tar.gz" -C "$X" . && rm -rf "$X"
