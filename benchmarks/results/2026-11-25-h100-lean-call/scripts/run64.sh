#!/usr/bin/env bash
# Session 30, device call 5: DDP's hook with find_unused_parameters under both native
# issuers (native-async: the last bucket waits until the worker issued everything), the
# native issuers' Futures and issue-order tests at 2x2; host time per 25 MiB call at 2x2
# loopback against the session's starting commit (9ecbd87, carried as
# .whl/baseline-9ecbd87.tar.gz, built here), interleaved base/new/base/new; the
# 146-bucket transformer in DDP, capped 2x2, hook on native and on native-async.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r64"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
NEW=$PWD; BASE=/tmp/base
mkdir -p $BASE && tar -xzf .whl/baseline-9ecbd87.tar.gz -C $BASE
(cd $BASE && python3 setup.py -q build_ext --inplace > "$X/base_build.log" 2>&1) || echo "base build failed"
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 480 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run native_2x2 150 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k "ddp or futures or issue_order or one_order"
H="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native-async --profile ''"
for i in 1 2; do
  run host_base$i 50 bash -c "cd $BASE && PYTHONPATH=/tmp/site:$BASE RINGREDUCE_TIMEOUT=30 $H"
  run host_new$i 50 bash -c "cd $NEW && RINGREDUCE_TIMEOUT=30 $H"
done
T="--script benchmarks/dlrm.py -- --modes nccl,hook --model transformer --layers 48 --bucket-mb 4 --steps 24 --warmup 4"
run tf_cap_native 90 env RINGREDUCE_TIMEOUT=60 RINGREDUCE_ISSUER=native $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit $T
run tf_cap_async 90 env RINGREDUCE_TIMEOUT=60 RINGREDUCE_ISSUER=native-async $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit $T
cat "$X/status.txt"
echo "== native_2x2"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED|^E  " "$X/native_2x2.log" | cut -c1-150 | tail -12
for f in host_base1 host_new1 host_base2 host_new2; do echo "== $f"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/$f.log" | cut -c1-130 | tail -6; done
for f in tf_cap_native tf_cap_async; do echo "== $f"; grep -A3 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r64_logs.tar.gz" -C "$X" . && rm -rf "$X"
