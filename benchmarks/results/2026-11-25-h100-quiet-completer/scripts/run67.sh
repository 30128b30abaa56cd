#!/usr/bin/env bash
# Session 31, device call 1: native-async's completer completes the Futures queued
# together as one batch (Issuer.follow(..., last)), and diffuse is one in-place
# all-gather on the rail communicator (Config.diffuse_gather). Against the session's
# starting commit (c9f04c9, carried as .whl/baseline-c9f04c9.tar.gz, built here):
#   1. the native issuers' GPU tests at 2x2 (Futures, issue order, DDP) on the new tree;
#   2. caller_path.py at 2x2 loopback, base/new interleaved twice;
#   3. native_host.py at 2x2 loopback on the new tree: native, native/p2p (diffuse by
#      sends and receives), native-async; exact against NCCL, and the per-op breakdown.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r67"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
NEW=$PWD; BASE=/tmp/base
mkdir -p $BASE && tar -xzf .whl/baseline-c9f04c9.tar.gz -C $BASE
(cd $BASE && python3 setup.py -q build_ext --inplace > "$X/base_build.log" 2>&1) || echo "base build failed"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 480 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run native_2x2 160 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k "ddp or futures or issue_order or one_order"
P="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/results/2026-11-25-h100-lean-call/scripts/caller_path.py -- --size 25M --rounds 5"
for i in 1 2; do
  run path_base$i 60 bash -c "cd $BASE && PYTHONPATH=/tmp/site:$BASE RINGREDUCE_TIMEOUT=30 $P"
  run path_new$i 60 bash -c "cd $NEW && RINGREDUCE_TIMEOUT=30 $P"
done
run host_new 90 env RINGREDUCE_TIMEOUT=30 python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 \
  --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 \
  --ways native,native/p2p,native-async --profile ""
cat "$X/status.txt"
echo "== native_2x2"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED|^E  " "$X/native_2x2.log" | cut -c1-150 | tail -12
for f in path_base1 path_new1 path_base2 path_new2; do echo "== $f"; grep -E "^(way|nccl|rr) |Error" "$X/$f.log" | cut -c1-100 | head -6; done
echo "== host_new"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async)|^# inside|^#   (group_end|send|recv|all_gather|reduce_scatter)|Error|wrong" "$X/host_new.log" | cut -c1-130
tar -czf "$OUT/r67_logs.tar.gz" -C "$X" . && rm -rf "$X"
