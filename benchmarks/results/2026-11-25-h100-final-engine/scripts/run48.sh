#!/usr/bin/env bash
# Session 28, device call 1: the final engine (process-wide issue order) re-verified where
# session 27 did not: the killed peer at 2x1 without MPS (native, native-async), the sweep
# at 2x1 for every issuer and python's at 2x2; then host time of a synchronous 25 MiB call
# with ringreduce's CUDA-graph replay (graphs=8) against NCCL and the native issuers, same
# processes, 2x2 loopback (and 4x2 if the budget allows).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r48"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 530 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run killed_2x1 100 python3 -m pytest tests/test_native_cuda.py -k killed -p no:cacheprovider -v -rs
H="--mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32"
run host_2x2 120 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $H \
  --ways native,native-async,native/graphs --profile ""
run sweep 200 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x1,2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs \
  -k "sweep and (2x1 or python)"
run host_4x2 130 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $H \
  --ways native,native/graphs --profile ""
cat "$X/status.txt"
for f in killed_2x1 sweep; do echo "== $f"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED" "$X/$f.log" | cut -c1-160 | tail -8; done
for f in host_2x2 host_4x2; do echo "== $f"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/$f.log" | cut -c1-220 | tail -10; done
tar -czf "$OUT/r48_logs.tar.gz" -C "$X" . && rm -rf "$X"
