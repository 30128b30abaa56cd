#!/usr/bin/env bash
# Session 27, device call 1: native-async after the worker-side ordering of calls on one
# tensor (issuer.cpp `after`) and the watchdog no longer woken by watch(). The native GPU
# tests (both issuers, 2x1 and 2x2 under MPS; the killed peer at 2x1 without MPS), then
# host time (with the caller's own CPU time), CPU and wall per 25 MiB call against NCCL,
# same processes: 2x2 and 4x2 loopback.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r41"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 530 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
H="--mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32"
run host_2x2 110 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $H \
  --ways native,native-async,native-async/8M --profile "native-async async"
run tests 230 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x1,2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_native_cuda.py -k "not killed" -p no:cacheprovider -v -rs
run killed_2x1 90 python3 -m pytest tests/test_native_cuda.py -k killed -p no:cacheprovider -v -rs
run host_4x2 140 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $H \
  --ways native,native-async
cat "$X/status.txt"
for f in tests killed_2x1; do echo "== $f"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)" "$X/$f.log" | tail -8; done
for f in host_2x2 host_4x2; do echo "== $f"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/$f.log" | cut -c1-220 | tail -14; done
tar -czf "$OUT/r41_logs.tar.gz" -C "$X" . && rm -rf "$X"
