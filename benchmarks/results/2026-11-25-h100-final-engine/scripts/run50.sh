#!/usr/bin/env bash
# Session 28, device call 3: why the hook ran at 0.93-1.00x NCCL on run 49's transformer
# (48 x 512, 146 buckets of 4 MiB a step, capped 10 Gbit/s 2x2): the same model with
# DDP's default 25 MiB buckets (bucket size, same model), and with 4 MiB buckets cut
# into 1 MiB slices (a bucket of one 4 MiB slice has no pipeline inside the call), on
# native and native-async. NCCL and the hook in the same processes each time.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r50"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 500 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
M="--model transformer --layers 48 --width 512 --steps 24 --warmup 4"
D="--machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,hook $M"
run tf25_native 150 env RINGREDUCE_ISSUER=native RINGREDUCE_TIMEOUT=60 $E $D --bucket-mb 25 --json "$X/tf25_native.json"
run tf4_1M_native 150 env RINGREDUCE_ISSUER=native RINGREDUCE_SLICE_BYTES=1048576 RINGREDUCE_TIMEOUT=60 $E $D --bucket-mb 4 --json "$X/tf4_1M_native.json"
run tf4_1M_native_async 150 env RINGREDUCE_ISSUER=native-async RINGREDUCE_SLICE_BYTES=1048576 RINGREDUCE_TIMEOUT=60 $E $D --bucket-mb 4 --json "$X/tf4_1M_native_async.json"
cat "$X/status.txt"
for f in tf25_native tf4_1M_native tf4_1M_native_async; do echo "== $f"; grep -A3 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r50_logs.tar.gz" -C "$X" . && rm -rf "$X"
