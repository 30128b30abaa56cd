#!/usr/bin/env bash
# Session 32, device call 2 (same code as run 72 plus idle_call.py):
#   1. idle_call.py at 2x2 and 4x2 loopback: an idle pipeline's call, split;
#   2. native_host.py at 4x2, native-async: CPU by thread kind;
#   3. DDP hook time, capped 2x2: the DLRM-style model (25 MiB buckets) with the default
#      issuer (native), and the 146-bucket transformer on native-async; both against
#      nccl and nccl-hook in the same processes.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r73"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 480 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
export NCCL_SET_THREAD_NAME=1 RINGREDUCE_TIMEOUT=30
E="python3 benchmarks/emulate.py --physical-gpus 1"
I="--mode loopback --script benchmarks/results/2026-11-26-h200-hook-time/scripts/idle_call.py -- --size 25M"
run idle_2x2 70 $E --machines 2 --gpus-per-machine 2 $I
run idle_4x2 110 $E --machines 4 --gpus-per-machine 2 $I
run host_4x2 100 $E --machines 4 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native-async --profile ''
run dlrm_native 80 env RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,nccl-hook,hook --steps 20 --warmup 5
run tf_async 100 env RINGREDUCE_ISSUER=native-async RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,nccl-hook,hook --model transformer --layers 48 --bucket-mb 4 --steps 16 --warmup 4
cat "$X/status.txt"
for f in idle_2x2 idle_4x2; do echo "== $f"; grep -E "^(way|event|kernel|nccl|rr)|Error|wrong" "$X/$f.log" | cut -c1-80; done
echo "== host_4x2"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async) |^#   |Error|wrong" "$X/host_4x2.log" | cut -c1-200
for f in dlrm_native tf_async; do echo "== $f"; grep -A4 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r73_logs.tar.gz" -C "$X" . && rm -rf "$X"
