#!/usr/bin/env bash
# Session 29, device call 2: the slot-0 start through every path that issues or replays a
# call at 2x2 under MPS: test_gpu.py (exact sweeps, wire format, CUDA-graph capture and
# replay, DDP hook and backend against plain DDP), test_native_cuda.py (Futures, issue
# order, both issuers' exact sweep), then DLRM in DDP (capped 10 Gbit/s 2x2, nccl vs hook).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r57"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 530 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run gpu_2x2 180 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_gpu.py -p no:cacheprovider -v -rs -k "not fault"
run native_2x2 170 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k "not killed"
run dlrm 160 env RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit \
  --script benchmarks/dlrm.py -- --modes nccl,hook --json "$X/dlrm.json"
cat "$X/status.txt"
for f in gpu_2x2 native_2x2; do echo "== $f"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED" "$X/$f.log" | cut -c1-150 | tail -14; done
echo "== dlrm"; grep -A3 -E "^mode " "$X/dlrm.log" | cut -c1-200; grep -hE "Error" "$X/dlrm.log" | head -3 | cut -c1-300
tar -czf "$OUT/r57_logs.tar.gz" -C "$X" . && rm -rf "$X"
