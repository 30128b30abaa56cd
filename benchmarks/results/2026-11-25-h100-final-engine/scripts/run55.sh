#!/usr/bin/env bash
# Session 28, device call 8: the slice size by call size (with 617e4ac's rounding) on
# random sizes: benchmarks/soak.py at 2x2 loopback under MPS, 1000 random exact calls of
# the three collectives up to 16 MiB (the sizes the rule cuts into four), every dtype and
# op, sync and async, from 64 KiB on the hierarchy; memory must stay flat.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r55"; mkdir -p "$X"
timeout -k 10 110 env RINGREDUCE_TIMEOUT=30 python3 benchmarks/emulate.py --physical-gpus 1 \
  --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/soak.py -- \
  --calls 1000 --max-bytes 16777216 --min-bytes 65536 --json "$X/soak.json" > "$X/soak.log" 2>&1
echo "soak exit $?"
grep -hE "^# soak|wrong|FAILED|Error|slice_bytes" "$X/soak.log" | cut -c1-300 | tail -8
tar -czf "$OUT/r55_logs.tar.gz" -C "$X" . && rm -rf "$X"
