#!/usr/bin/env bash
# Session 23, device call 13: the native issuer's exact sweep at 4x2 (cut by step limits before).
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r13"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
t0=$SECONDS
timeout -k 10 290 python3 benchmarks/emulate.py --mps-only -- env RINGREDUCE_GPU_TOPOLOGIES=4x2 RR_MPS=1 \
  python3 -m pytest tests/test_native_cuda.py -k "sweep" -p no:cacheprovider -v -rs --durations=5 > "$X/native_sweep_4x2.log" 2>&1
echo "native_sweep_4x2 exit $? in $((SECONDS-t0)) s" | tee "$X/status.txt"
grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)|s call" "$X/native_sweep_4x2.log" | cut -c1-200 | head -12
tar -czf "$OUT/r13_logs.tar.gz" -C "$X" . && rm -rf "$X"
