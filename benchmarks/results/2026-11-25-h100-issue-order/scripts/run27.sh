#!/usr/bin/env bash
# Session 25, device call 3: native-async's hang, where on the device (the deadline error
# now names the streams still busy on each rank), with one job in flight, with NCCL's
# kernels held to 2 channels (blocks), and with 16 hardware queues; the new waves on the
# wire-format test and the native sweep at 2x2.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r27"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
M="python3 benchmarks/emulate.py --mps-only --"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 560 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
A="$E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_order.py -- --phase alone"
run async_default 50 env RINGREDUCE_TIMEOUT=10 $A
run async_inflight1 50 env RINGREDUCE_TIMEOUT=10 $A --in-flight 1
run async_2channels 50 env RINGREDUCE_TIMEOUT=10 NCCL_MAX_NCHANNELS=2 NCCL_MIN_NCHANNELS=1 $A
run async_conn16 50 env RINGREDUCE_TIMEOUT=10 CUDA_DEVICE_MAX_CONNECTIONS=16 $A
run wire_2x2 120 $M env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu.py -k "wire_format or never_syncs" -p no:cacheprovider -v -rs -x -s
run native_2x2 200 $M env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest tests/test_native_cuda.py -k "futures or sweep" -p no:cacheprovider -v -rs -x -s
cat "$X/status.txt"
echo "== async"; grep -hE "^\[async-order\].*phase|watchdog:" "$X"/async_*.log | sed -e 's/ringreduce stage.*deadline of [0-9.]* s (RINGREDUCE_TIMEOUT); a peer died, hangs, or never made this call//' | cut -c1-330 | head -24
echo "== tests"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/wire_2x2.log" "$X/native_2x2.log" | cut -c1-200 | head -16
tar -czf "$OUT/r27_logs.tar.gz" -C "$X" . && rm -rf "$X"
