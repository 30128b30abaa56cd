#!/usr/bin/env bash
# Session 31, device call 2: three trees, interleaved twice, at 2x2 loopback, each with
# diffuse by sends and receives (what c9f04c9 does):
#   base  c9f04c9 (the session's start, .whl/baseline-c9f04c9.tar.gz)
#   b1    98f3e78 (+ the completer's batches, .whl/b1-98f3e78.tar.gz)
#   new   this commit (+ a stage pair shares one stream, schedule.PAIRS)
# caller_path.py (native-async, back to back) and native_host.py (native and
# native-async; the "/p2p" ways are plain native on base). Then on the new tree:
# native_host.py native/p2p against native (diffuse gathered), p2p measured first this
# time; and test_gpu.py at 2x2 (every route exact, graphs, DDP), as the streams changed.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r68"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
NEW=$PWD
for t in base:baseline-c9f04c9 b1:b1-98f3e78; do
  d=/tmp/${t%%:*}; mkdir -p $d && tar -xzf .whl/${t#*:}.tar.gz -C $d
  (cd $d && python3 setup.py -q build_ext --inplace > "$X/${t%%:*}_build.log" 2>&1) || echo "${t%%:*} build failed"
done
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 500 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 --mode loopback --script"
P="$E benchmarks/results/2026-11-25-h100-lean-call/scripts/caller_path.py -- --size 25M --rounds 5"
H="$E benchmarks/native_host.py -- --size 25M --calls 32 --ways native/p2p,native-async/p2p --profile ''"
tree() { case $1 in new) echo $NEW;; *) echo /tmp/$1;; esac; }
for i in 1 2; do
  for t in base b1 new; do
    run path_$t$i 45 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=30 RINGREDUCE_DIFFUSE_GATHER=0 $P"
    run host_$t$i 50 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=30 $H"
  done
done
run gather 60 env RINGREDUCE_TIMEOUT=30 $E benchmarks/native_host.py -- --size 25M --calls 32 --ways native/p2p,native --profile ""
run gpu_2x2 200 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_gpu.py -p no:cacheprovider -v -rs -k "not fault"
cat "$X/status.txt"
for i in 1 2; do for t in base b1 new; do
  echo "== path_$t$i"; grep -E "^(nccl|rr) |Error" "$X/path_$t$i.log" | cut -c1-80 | head -4
  echo "== host_$t$i"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/host_$t$i.log" | cut -c1-130
done; done
echo "== gather"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async)|^# inside|^#   (group_end|send|recv|all_gather)|Error|wrong" "$X/gather.log" | cut -c1-130
echo "== gpu_2x2"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|^E  " "$X/gpu_2x2.log" | cut -c1-150 | tail -12
tar -czf "$OUT/r68_logs.tar.gz" -C "$X" . && rm -rf "$X"
