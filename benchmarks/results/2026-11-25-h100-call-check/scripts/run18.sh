#!/usr/bin/env bash
# Session 24, device call 18: with the end-of-call check over the stage communicators:
# the exact collectives (stage-call counts) at 2x2 and 4x2, torch's distributed suite on
# CUDA (2x2 under MPS, against NCCL), the native issuer's sweep at 4x2.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r18"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
M="python3 benchmarks/emulate.py --mps-only --"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 540 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run collectives 170 $M env RINGREDUCE_GPU_TOPOLOGIES=2x2,4x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu.py -k "collectives_are_exact" -p no:cacheprovider -v -rs -x -s
run torch_suite 160 $M python3 -m tests.torch_suite --device cuda --jobs 4 --logs "$X/torch_suite" --time-limit 130
run native_sweep_4x2 200 $M env RINGREDUCE_GPU_TOPOLOGIES=4x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_native_cuda.py -k "sweep and native" -p no:cacheprovider -v -rs -x -s
cat "$X/status.txt"
echo "== collectives"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/collectives.log" | cut -c1-200 | head -12
echo "== torch suite"; tail -15 "$X/torch_suite.log"
echo "== native sweep 4x2"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/native_sweep_4x2.log" | cut -c1-200 | head -8
tar -czf "$OUT/r18_logs.tar.gz" -C "$X" . && rm -rf "$X"
