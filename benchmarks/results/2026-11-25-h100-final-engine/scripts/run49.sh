#!/usr/bin/env bash
# Session 28, device call 2: DDP training of the transformer workload (issue 18's second
# workload: >= 100 buckets a step), capped 10 Gbit/s 2x2 under MPS, NCCL and the hook in
# the same processes, the hook's Communicator on the default native issuer, on
# native-async, and with CUDA-graph replay of every bucket (graphs=256).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r49"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 530 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
T=${TRANSFORMER:---model transformer --layers 48 --width 512 --bucket-mb 4 --steps 24 --warmup 4}
D="--machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,hook $T"
run tf_native 170 env RINGREDUCE_ISSUER=native RINGREDUCE_TIMEOUT=60 $E $D --json "$X/tf_native.json"
run tf_native_async 170 env RINGREDUCE_ISSUER=native-async RINGREDUCE_TIMEOUT=60 $E $D --json "$X/tf_native_async.json"
run tf_graphs 170 env RINGREDUCE_GRAPHS=256 RINGREDUCE_TIMEOUT=60 $E $D --json "$X/tf_graphs.json"
cat "$X/status.txt"
for f in tf_native tf_native_async tf_graphs; do echo "== $f"; grep -E "^# dlrm|^# transformer" "$X/$f.log" | cut -c1-300 | head -2; grep -A3 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r49_logs.tar.gz" -C "$X" . && rm -rf "$X"
