#!/usr/bin/env bash
# Session 25, device call 8: the GPU tests run 31 did not reach, and the caller's capture
# at 4x2 that failed there (the watchdog's query refused during a global-mode capture),
# now with the watchdog's thread in relaxed capture mode.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r32"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
M="python3 benchmarks/emulate.py --mps-only --"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 570 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
T="python3 -m pytest -m gpu -p no:cacheprovider -v -rs -s"
run graphs_4x2 150 $M env RINGREDUCE_GPU_TOPOLOGIES=4x2 RR_MPS=1 $T tests/test_gpu.py -k "cuda_graphs_capture"
run rest_4x2 260 $M env RINGREDUCE_GPU_TOPOLOGIES=4x2 RR_MPS=1 $T tests/test_gpu.py tests/test_native_cuda.py -k "ddp_backend or back_to_back or futures or issue_order"
run ddp_2x2 140 $M env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 $T tests/test_gpu.py -k "ddp_backend"
cat "$X/status.txt"
echo "== tests"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X"/*_*.log | sed 's/ \[run_test_ranks\].*//' | cut -c1-200 | head -24
tar -czf "$OUT/r32_logs.tar.gz" -C "$X" . && rm -rf "$X"
