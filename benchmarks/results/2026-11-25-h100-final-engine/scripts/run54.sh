#!/usr/bin/env bash
# Session 28, device call 7: how many channels (CTAs, one SM each) the stages' NCCL
# kernels use against NCCL's own all-reduce: native_host.py at 2x2 loopback, 25 MiB, a few
# calls, with NCCL's INIT and TUNING logs (NCCL_DEBUG=INFO); the log is summarised here.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r54"; mkdir -p "$X"
timeout -k 10 120 env RINGREDUCE_TIMEOUT=30 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,TUNING \
  python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 \
  --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 2 --ways native \
  --profile "" > "$X/channels.log" 2>&1
echo "exit $?"
grep -E "^way |^(nccl|native)[/0-9A-Za-z-]* (sync|async)" "$X/channels.log" | cut -c1-200
grep -hoE "[0-9]+ coll channels, [0-9]+ collnet channels, [0-9]+ nvls channels, [0-9]+ p2p channels, [0-9]+ p2p channels per peer" "$X/channels.log" | sort | uniq -c
grep -hoE "(AllReduce|ReduceScatter|AllGather|Send|Recv|SendRecv)[^:]*: [0-9]+ Bytes -> Algo [0-9A-Za-z_]+ proto [A-Z0-9_]+ channel\{Lo\.\.Hi\}=\{[0-9]+\.\.[0-9]+\}" "$X/channels.log" | sed -E 's/: [0-9]+ Bytes//' | sort | uniq -c | sort -rn | head -20
gzip -9 "$X/channels.log"
tar -czf "$OUT/r54_logs.tar.gz" -C "$X" . && rm -rf "$X"
