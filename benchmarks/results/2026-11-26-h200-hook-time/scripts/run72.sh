#!/usr/bin/env bash
# Session 32, device call 1, on the session's first commit:
#   1. native_host.py, 2x2 loopback, native-async only: host time, CPU per call and, new,
#      where the CPU goes by thread kind (NCCL_SET_THREAD_NAME=1 names NCCL's threads);
#   2. caller_path.py at 4x2 loopback (native-async async back to back; never finished
#      inside run 71's 40 s);
#   3. the DLRM-style model in DDP, capped 2x2, 25 MiB buckets: nccl, nccl-hook (torch's
#      allreduce_hook) and the hook on native-async, each hook call timed on the host;
#   4. the native GPU tests at 2x2 (Futures, DDP) on the completer changed after run 71;
#   5. the killed peer under native-async (2x1, no MPS).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r72"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 480 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
export NCCL_SET_THREAD_NAME=1 RINGREDUCE_TIMEOUT=30
E="python3 benchmarks/emulate.py --physical-gpus 1"
run host_2x2 50 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native-async --profile ''
run path_4x2 100 $E --machines 4 --gpus-per-machine 2 --mode loopback --script benchmarks/results/2026-11-25-h100-lean-call/scripts/caller_path.py -- --size 25M --rounds 5
run dlrm_async 100 env RINGREDUCE_ISSUER=native-async RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,nccl-hook,hook --steps 20 --warmup 5
run tests_2x2 130 python3 benchmarks/emulate.py --mps-only -- env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k "futures or ddp"
run killed_2x1 90 python3 -m pytest tests/test_native_cuda.py -k "killed and native-async" -p no:cacheprovider -v -rs -s
cat "$X/status.txt"
echo "== host_2x2"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async) |^#   |Error|wrong" "$X/host_2x2.log" | cut -c1-200
echo "== path_4x2"; grep -E "^(nccl|rr) |Error|wrong" "$X/path_4x2.log" | cut -c1-90 | head -5
echo "== dlrm_async"; grep -A4 -E "^mode " "$X/dlrm_async.log" | cut -c1-200; grep -hE "Error" "$X/dlrm_async.log" | head -3 | cut -c1-300
for f in tests_2x2 killed_2x1; do echo "== $f"; grep -hE "PASSED|FAILED|ERROR|passed|failed|RingReduceError [0-9.]+ s" "$X/$f.log" | cut -c1-160 | tail -8; done
tar -czf "$OUT/r72_logs.tar.gz" -C "$X" . && rm -rf "$X"
