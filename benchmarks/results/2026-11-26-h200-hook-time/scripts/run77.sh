#!/usr/bin/env bash
# Session 32, device call 6 (code as run 72): where an idle pipeline's asynchronous call
# spends the caller's time: native_host.py's cProfile of 32 idle native-async async calls
# and of 32 idle NCCL async calls, 2x2 loopback (cProfile's own cost inflates every
# Python call; the C calls' share is the point).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r77"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
export NCCL_SET_THREAD_NAME=1 RINGREDUCE_TIMEOUT=30
timeout -k 10 90 python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native-async --profile 'native-async async,nccl async' > "$X/profile_2x2.log" 2>&1; echo "exit $?"
grep -v "^\[rank" "$X/profile_2x2.log" | grep -A40 "cProfile" | cut -c1-160
grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async) " "$X/profile_2x2.log"
tar -czf "$OUT/r77_logs.tar.gz" -C "$X" . && rm -rf "$X"
