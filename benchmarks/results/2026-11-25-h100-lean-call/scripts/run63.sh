#!/usr/bin/env bash
# Session 30, device call 4: DDP's hook queues its calls for the native worker thread
# (Config.hook_worker, default on) and drains at the backward's last bucket. The DDP
# hook and backend test at 2x2 (now also with find_unused_parameters), the killed peer
# under both issuers (errors raised by a call now name its operation), then the
# 146-bucket transformer in DDP at 2x2 loopback (where host time shows), hook_worker 1
# and 0, each against NCCL in its own run.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r63"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 500 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run ddp_2x2 150 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_gpu.py -p no:cacheprovider -v -rs -k "ddp_backend_and_hook"
run killed 80 env RINGREDUCE_TIMEOUT=30 python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k killed
T="--script benchmarks/dlrm.py -- --modes nccl,hook --model transformer --layers 48 --bucket-mb 4 --steps 24 --warmup 4"
run tf_loop_worker 90 env RINGREDUCE_TIMEOUT=60 RINGREDUCE_HOOK_WORKER=1 $E --machines 2 --gpus-per-machine 2 --mode loopback $T
run tf_loop_inline 90 env RINGREDUCE_TIMEOUT=60 RINGREDUCE_HOOK_WORKER=0 $E --machines 2 --gpus-per-machine 2 --mode loopback $T
cat "$X/status.txt"
for f in ddp_2x2 killed; do echo "== $f"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED|^E  " "$X/$f.log" | cut -c1-200 | tail -10; done
for f in tf_loop_worker tf_loop_inline; do echo "== $f"; grep -A3 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r63_logs.tar.gz" -C "$X" . && rm -rf "$X"
