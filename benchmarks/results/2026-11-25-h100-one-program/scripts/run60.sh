#!/usr/bin/env bash
# Session 29, device call 5: test_gpu.py at 4x2 under MPS with the slot-0 start (exact
# sweeps with many slices and tails, wire format, graphs, DDP hook and backend against
# plain DDP), within the session's remaining device time.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r60"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
t0=$SECONDS
timeout -k 10 330 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=4x2 RR_MPS=1 RINGREDUCE_TIMEOUT=60 \
  python3 -m pytest tests/test_gpu.py -p no:cacheprovider -v -rs -k "not fault" > "$X/gpu_4x2.log" 2>&1
echo "gpu_4x2 exit $? in $((SECONDS-t0)) s" | tee "$X/status.txt"
grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED|SKIPPED" "$X/gpu_4x2.log" | cut -c1-150 | tail -14
tar -czf "$OUT/r60_logs.tar.gz" -C "$X" . && rm -rf "$X"
