#!/usr/bin/env bash
# Session 27, device call 6: what run 44 (`bash benchmarks/gpu.sh tests`, 330 s step) did
# not reach: test_gpu.py at 2x2 under MPS (DDP hook and backend against plain DDP among
# them), then PyTorch's own distributed suite on CUDA (tests/torch_suite).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r45"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 420 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run gpu_2x2 220 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu.py \
  -k "not fault" -p no:cacheprovider -v -rs --durations=10
run torch_suite 170 python3 benchmarks/emulate.py --mps-only -- \
  python3 -m tests.torch_suite --device cuda --jobs 4 --logs "$X/torch_suite" --time-limit 140
cat "$X/status.txt"
echo "== gpu_2x2"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$X/gpu_2x2.log" | tail -6
echo "== torch_suite"; tail -12 "$X/torch_suite.log"
tar -czf "$OUT/r45_logs.tar.gz" -C "$X" . && rm -rf "$X"
