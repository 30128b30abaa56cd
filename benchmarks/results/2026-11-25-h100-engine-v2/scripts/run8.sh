#!/usr/bin/env bash
# Session 23, device call 8: the new-call check and the store on the GPU (mismatch and
# store-gone faults, 2x1 under MPS), paired communicators at 4x2 (exact sweep, graphs),
# and whether native-async hangs only when the caller's thread issues NCCL beside it.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r8"; mkdir -p "$X"
{ git log --oneline -1; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
M="python3 benchmarks/emulate.py --mps-only --"
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 540 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run host_dbg 110 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 16
run pairs_4x2 140 $M env RINGREDUCE_GPU_TOPOLOGIES=4x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu.py -k "collectives_are_exact" -p no:cacheprovider -v -rs -x
run faults_check 220 $M env RINGREDUCE_GPU_TOPOLOGIES=2x1 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu_faults.py -k "mismatch or store_gone" -p no:cacheprovider -v -rs -s -x
run async_alone 50 env RINGREDUCE_TIMEOUT=15 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_order.py -- --phase alone
run async_mixed 50 env RINGREDUCE_TIMEOUT=15 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_order.py -- --phase mixed
cat "$X/status.txt"
echo "== host"; grep -E "^# (built|exact|warm|measured)|^way |^(nccl|native|python)[/0-9A-Za-z]* (sync|async)|Error" "$X/host_dbg.log" | cut -c1-250 | tail -30
echo "== faults"; grep -hE "^\[fault|PASSED|FAILED|XFAIL|XPASS|ERROR|[0-9]+ (passed|failed)" "$X/faults_check.log" | cut -c1-260 | head -40
echo "== pairs"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/pairs_4x2.log" | cut -c1-200 | head -12
echo "== async"; grep -hE "^\[async-order\]|Error" "$X"/async_*.log | cut -c1-300 | head -16
tar -czf "$OUT/r8_logs.tar.gz" -C "$X" . && rm -rf "$X"
