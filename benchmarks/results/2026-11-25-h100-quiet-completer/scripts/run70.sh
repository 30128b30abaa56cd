#!/usr/bin/env bash
# Session 31, device call 4: native-async's completer waits for the caller's quiet
# (Issuer.follow's quiet_s, 200 us; at most 5 ms after the issue) and completes in
# batches. Against the session's starting commit (c9f04c9, .whl/baseline-c9f04c9.tar.gz):
#   1. the native issuers' GPU tests at 2x2 (Futures, issue order, DDP) on the new tree;
#   2. caller_path.py at 2x2 loopback, base/new interleaved twice, and native_host.py
#      (native-async only) base/new once;
#   3. the 146-bucket transformer in DDP, capped 2x2, hook on native-async, base then new.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r70"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
NEW=$PWD; BASE=/tmp/base
mkdir -p $BASE && tar -xzf .whl/baseline-c9f04c9.tar.gz -C $BASE
(cd $BASE && python3 setup.py -q build_ext --inplace > "$X/base_build.log" 2>&1) || echo "base build failed"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 470 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run native_2x2 160 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k "ddp or futures or issue_order or one_order"
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2"
P="$E --mode loopback --script benchmarks/results/2026-11-25-h100-lean-call/scripts/caller_path.py -- --size 25M --rounds 5"
H="$E --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native-async --profile ''"
T="$E --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,hook --model transformer --layers 48 --bucket-mb 4 --steps 16 --warmup 4"
tree() { case $1 in new) echo $NEW;; *) echo $BASE;; esac; }
for i in 1 2; do for t in base new; do
  run path_$t$i 45 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=30 $P"
done; done
for t in base new; do
  run host_$t 40 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=30 $H"
done
for t in base new; do
  run tf_$t 80 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=60 RINGREDUCE_ISSUER=native-async $T"
done
cat "$X/status.txt"
echo "== native_2x2"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED|^E  " "$X/native_2x2.log" | cut -c1-150 | tail -12
for i in 1 2; do for t in base new; do echo "== path_$t$i"; grep -E "^(nccl|rr) |Error|wrong" "$X/path_$t$i.log" | cut -c1-80 | head -4; done; done
for t in base new; do echo "== host_$t"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/host_$t.log" | cut -c1-130; done
for t in base new; do echo "== tf_$t"; grep -A3 -E "^mode " "$X/tf_$t.log" | cut -c1-200; grep -hE "Error" "$X/tf_$t.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r70_logs.tar.gz" -C "$X" . && rm -rf "$X"
