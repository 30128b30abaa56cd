#!/usr/bin/env bash
# Session 31, device call 5, on the final code: test_gpu.py at 2x2 (every route exact,
# wire format, graphs, DDP hook and backend; diffuse now gathered); the transformer in
# DDP, capped 2x2, hook on native-async, base (c9f04c9) then new (run 70's base could not
# cap: its tree had no .iproute); caller_path.py at 4x2 and 2x2 loopback, base/new.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r71"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
NEW=$PWD; BASE=/tmp/base
mkdir -p $BASE && tar -xzf .whl/baseline-c9f04c9.tar.gz -C $BASE && ln -s $NEW/.iproute $BASE/.iproute
(cd $BASE && python3 setup.py -q build_ext --inplace > "$X/base_build.log" 2>&1) || echo "base build failed"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 340 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run gpu_2x2 170 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_gpu.py -p no:cacheprovider -v -rs -k "not fault"
E="python3 benchmarks/emulate.py --physical-gpus 1"
T="--machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,hook --model transformer --layers 48 --bucket-mb 4 --steps 16 --warmup 4"
P="--mode loopback --script benchmarks/results/2026-11-25-h100-lean-call/scripts/caller_path.py -- --size 25M --rounds 5"
tree() { case $1 in new) echo $NEW;; *) echo $BASE;; esac; }
for t in base new; do
  run tf_$t 60 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=60 RINGREDUCE_ISSUER=native-async $E $T"
done
for t in base new; do
  run path4_$t 40 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $P"
done
for t in base new; do
  run path2_$t 25 bash -c "cd $(tree $t) && PYTHONPATH=/tmp/site:$(tree $t) RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $P"
done
cat "$X/status.txt"
echo "== gpu_2x2"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|^E  " "$X/gpu_2x2.log" | cut -c1-150 | tail -12
for t in base new; do echo "== tf_$t"; grep -A3 -E "^mode " "$X/tf_$t.log" | cut -c1-200; grep -hE "Error" "$X/tf_$t.log" | head -3 | cut -c1-300; done
for f in path4_base path4_new path2_base path2_new; do echo "== $f"; grep -E "^(nccl|rr) |Error|wrong" "$X/$f.log" | cut -c1-80 | head -4; done
tar -czf "$OUT/r71_logs.tar.gz" -C "$X" . && rm -rf "$X"
