#!/usr/bin/env bash
# Session 27, device call 4: the native GPU tests run 42's step did not reach (issue
# order at 2x2 for native-async and python, two native-async Communicators at 2x1 and
# 2x2), then DDP training (benchmarks/dlrm.py, capped 10 Gbit/s 2x2 under MPS, modes nccl
# and hook in one run) with the hook on native-async, and again on the default native.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r43"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 540 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run tests 130 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x1,2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs \
  -k "two_native_async or (issue_order and 2x2 and (native-async or python))"
D="--machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,hook"
run dlrm_native_async 200 env RINGREDUCE_ISSUER=native-async RINGREDUCE_TIMEOUT=60 $E $D --json "$X/dlrm_native_async.json"
run dlrm_native 200 env RINGREDUCE_ISSUER=native RINGREDUCE_TIMEOUT=60 $E $D --json "$X/dlrm_native.json"
cat "$X/status.txt"
echo "== tests"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED" "$X/tests.log" | cut -c1-200 | tail -10
for f in dlrm_native_async dlrm_native; do echo "== $f"; grep -A4 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r43_logs.tar.gz" -C "$X" . && rm -rf "$X"
