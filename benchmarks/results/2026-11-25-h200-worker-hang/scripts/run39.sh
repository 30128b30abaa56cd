#!/usr/bin/env bash
# Session 26, device call 5: where native-async's caller time goes (cProfile of its sync
# and async calls on an idle pipeline, 2x2 loopback), and the host cost of a Future's
# pieces in one process (scripts/micro_future.py).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r39"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
python3 benchmarks/results/2026-11-25-h200-worker-hang/scripts/micro_future.py > "$X/micro_future.log" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
timeout -k 10 120 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native-async --profile "native-async async,native-async sync" > "$X/host_2x2_profile.log" 2>&1; echo "host exit $?"
cat "$X/micro_future.log"
grep -E "^#|^way |^(nccl|native)" "$X/host_2x2_profile.log" | cut -c1-200 | tail -62
tar -czf "$OUT/r39_logs.tar.gz" -C "$X" . && rm -rf "$X"
