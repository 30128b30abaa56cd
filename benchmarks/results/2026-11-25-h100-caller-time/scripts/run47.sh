#!/usr/bin/env bash
# Session 27, device call 9: native-async's caller with no CUDA call after its job is
# queued (the Future and record_stream first; _watch asks CUDA nothing for native calls).
# Host time, own CPU, CPU and wall per 25 MiB call against NCCL, same processes: 2x2 and
# 4x2 loopback.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r47"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 250 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
H="--mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native-async"
run host_2x2 90 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $H --profile "native-async async"
run host_4x2 120 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $H --profile ""
cat "$X/status.txt"
for f in host_2x2 host_4x2; do echo "== $f"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/$f.log" | cut -c1-220 | tail -8; done
tar -czf "$OUT/r47_logs.tar.gz" -C "$X" . && rm -rf "$X"
