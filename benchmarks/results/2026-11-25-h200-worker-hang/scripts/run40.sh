#!/usr/bin/env bash
# Session 26, device call 6: native-async with the flag wait (no host wait for the worker,
# no completer thread): host time at 2x2 (and 4x2 if time is left), async_order at 2x2,
# the native GPU tests at 2x2 under MPS for both native issuers, the killed peer at 2x1
# without MPS for native-async.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r40"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 470 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
H="--mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native-async"
run host_2x2 90 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $H
run async_2x2 50 env RINGREDUCE_TIMEOUT=15 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_order.py -- --phase alone --tensors 8
run tests_2x2 190 $E --mps-only -- env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest tests/test_native_cuda.py -k "not killed and not python" -p no:cacheprovider -v -rs
run killed_2x1 90 python3 -m pytest tests/test_native_cuda.py -k "killed and native-async" -p no:cacheprovider -v -rs -s
run host_4x2 90 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $H
cat "$X/status.txt"
grep -hE "^\[async-order\].*phase|watchdog:" "$X/async_2x2.log" | cut -c1-300
grep -hE "PASSED|FAILED|ERROR|SKIPPED|passed|failed" "$X/tests_2x2.log" "$X/killed_2x1.log" | cut -c1-200 | tail -30
for f in host_2x2 host_4x2; do echo "== $f"; grep -E "^way |^(nccl|native)[/0-9A-Za-z-]* |Error" "$X/$f.log" | cut -c1-200 | tail -8; done
tar -czf "$OUT/r40_logs.tar.gz" -C "$X" . && rm -rf "$X"
