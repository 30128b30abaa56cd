#!/usr/bin/env bash
# Session 25, device call 2: (1) native-async's hang against the number of hardware work
# queues a process's streams share (CUDA_DEVICE_MAX_CONNECTIONS, 8 by default; streams
# that share a queue can wait behind each other's event waits), with the inline control
# in the same run; (2) the new waves (the add after its collect's group) exact on the GPU
# at 2x2 and 4x2 and their host time at 2x2 and 4x2.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r26"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
M="python3 benchmarks/emulate.py --mps-only --"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 560 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
A="$E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_order.py -- --phase alone"
run async_inline 60 env RINGREDUCE_TIMEOUT=15 $A --issuer native
run async_conn32_a 60 env RINGREDUCE_TIMEOUT=15 CUDA_DEVICE_MAX_CONNECTIONS=32 $A
run async_conn32_b 60 env RINGREDUCE_TIMEOUT=15 CUDA_DEVICE_MAX_CONNECTIONS=32 $A
run exact_2x2_4x2 170 $M env RINGREDUCE_GPU_TOPOLOGIES=2x2,4x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu.py tests/test_native_cuda.py -k "collectives_are_exact or native_futures or wire_format" -p no:cacheprovider -v -rs -x -s
H="--mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native/nocheck,python"
run host_2x2 100 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $H
run host_4x2 120 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $H
cat "$X/status.txt"
echo "== async"; grep -hE "^\[async-order\].*phase|watchdog:" "$X"/async_*.log | cut -c1-330 | head -16
echo "== exact"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/exact_2x2_4x2.log" | cut -c1-200 | head -16
for f in host_2x2 host_4x2; do echo "== $f"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* |Error|groups" "$X/$f.log" | cut -c1-200 | tail -12; done
tar -czf "$OUT/r26_logs.tar.gz" -C "$X" . && rm -rf "$X"
