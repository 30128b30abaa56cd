#!/usr/bin/env bash
# Session 23, device call 11: CUDA graphs with paired communicators (capture/replay tests
# at 2x2 and 4x2, DDP hook with graphs), replay host time at 2x2 beside eager native and NCCL.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r11"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
M="python3 benchmarks/emulate.py --mps-only --"
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 330 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run graphs_tests 150 $M env RINGREDUCE_GPU_TOPOLOGIES=2x2,4x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu.py -k "graphs_capture or hook_with_graphs" -p no:cacheprovider -v -rs
run host_graphs 110 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native/graphs,native/sep
cat "$X/status.txt"
echo "== graphs tests"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/graphs_tests.log" | cut -c1-200 | head -12
echo "== host"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z]* (sync|async)|watchdog" "$X/host_graphs.log" | cut -c1-200 | head -12
tar -czf "$OUT/r11_logs.tar.gz" -C "$X" . && rm -rf "$X"
