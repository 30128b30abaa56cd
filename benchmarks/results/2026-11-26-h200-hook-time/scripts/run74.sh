#!/usr/bin/env bash
# Session 32, device call 3: the worker woken as the call returns (submit_held + kick),
# against run 72's code (a096432, woken at submit; .whl/baseline-a096432.tar.gz):
#   1. the native GPU tests at 2x2 (Futures, DDP, issue order), new tree;
#   2. idle_call.py at 2x2 (both ways in one process, interleaved) and at 4x2;
#   3. DDP hook time, capped 2x2, native-async: the 146-bucket transformer and the
#      DLRM-style model, base then new.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r74"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
NEW=$PWD; BASE=/tmp/base
mkdir -p $BASE && tar -xzf .whl/baseline-a096432.tar.gz -C $BASE && ln -s $NEW/.iproute $BASE/.iproute
(cd $BASE && python3 setup.py -q build_ext --inplace > "$X/base_build.log" 2>&1) || echo "base build failed"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 500 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
export NCCL_SET_THREAD_NAME=1 RINGREDUCE_TIMEOUT=30
run tests_2x2 120 python3 benchmarks/emulate.py --mps-only -- env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k "futures or ddp or issue_order"
E="python3 benchmarks/emulate.py --physical-gpus 1"
I="--mode loopback --script benchmarks/results/2026-11-26-h200-hook-time/scripts/idle_call.py -- --size 25M"
run idle_2x2 70 $E --machines 2 --gpus-per-machine 2 $I
T="$E --machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,nccl-hook,hook"
tree() { case $1 in new) echo $NEW;; *) echo $BASE;; esac; }
for t in base new; do
  run tf_$t 75 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=60 RINGREDUCE_ISSUER=native-async $T --model transformer --layers 48 --bucket-mb 4 --steps 16 --warmup 4"
done
for t in base new; do
  run dlrm_$t 45 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=60 RINGREDUCE_ISSUER=native-async $T --steps 20 --warmup 5"
done
run idle_4x2 100 $E --machines 4 --gpus-per-machine 2 $I
cat "$X/status.txt"
echo "== tests_2x2"; grep -hE "PASSED|FAILED|ERROR|passed|failed" "$X/tests_2x2.log" | cut -c1-150 | tail -8
for f in idle_2x2 idle_4x2; do echo "== $f"; grep -E "^(way|event|kernel|nccl|rr)|Error|wrong" "$X/$f.log" | cut -c1-80; done
for f in tf_base tf_new dlrm_base dlrm_new; do echo "== $f"; grep -A4 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r74_logs.tar.gz" -C "$X" . && rm -rf "$X"
