#!/usr/bin/env bash
# Session 28, device call 4: the default slice size now follows the call size
# (layout.call_slice_bytes: a call smaller than 4 default slices is cut into 4, down to
# 256 KiB shards). Run 49's transformer (48 x 512, 146 buckets of 4 MiB a step, capped
# 10 Gbit/s 2x2) with the new default, interleaved with the old fixed 4 MiB slices
# (RINGREDUCE_SLICE_BYTES=4194304), NCCL and the hook in the same processes each time;
# then the bandwidth benchmark capped at 2x2 from 2 MiB to 32 MiB (every element checked)
# under the new default.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r51"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 420 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
M="--model transformer --layers 48 --width 512 --bucket-mb 4 --steps 24 --warmup 4"
D="--machines 2 --gpus-per-machine 2 --link-cap 10gbit --script benchmarks/dlrm.py -- --modes nccl,hook $M"
run tf4_new_async 120 env RINGREDUCE_ISSUER=native-async RINGREDUCE_TIMEOUT=60 $E $D --json "$X/tf4_new_async.json"
run tf4_old_async 120 env RINGREDUCE_ISSUER=native-async RINGREDUCE_SLICE_BYTES=4194304 RINGREDUCE_TIMEOUT=60 $E $D --json "$X/tf4_old_async.json"
run tf4_new_native 120 env RINGREDUCE_TIMEOUT=60 $E $D --json "$X/tf4_new_native.json"
run tf4_old_native 120 env RINGREDUCE_SLICE_BYTES=4194304 RINGREDUCE_TIMEOUT=60 $E $D --json "$X/tf4_old_native.json"
run bench_capped 100 env RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- \
  -b 2M -e 32M -f 2 -n 3 -w 1 -r 2 -c 1 --json "$X/bench_capped.json"
cat "$X/status.txt"
for f in tf4_new_async tf4_old_async tf4_new_native tf4_old_native; do echo "== $f"; grep -A2 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
echo "== bench_capped"; grep -vE "^\[|^#|^$|frame|TCPStore|Exception|heartbeat" "$X/bench_capped.log" | cut -c1-200 | tail -14
tar -czf "$OUT/r51_logs.tar.gz" -C "$X" . && rm -rf "$X"
