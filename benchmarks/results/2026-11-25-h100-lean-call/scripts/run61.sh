#!/usr/bin/env bash
# Session 30, device call 1: where native-async's asynchronous call spends the caller's
# time back to back at 2x2 loopback (caller_path.py: NCCL async, ringreduce async, and
# ringreduce async with Future completion deferred, interleaved; hot loops of the pieces;
# a wall-clock cProfile), then native_host.py's table for the same ways as run 56.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r61"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
S=benchmarks/results/2026-11-25-h100-lean-call/scripts
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 400 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run path 150 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback \
  --script $S/caller_path.py -- --size 25M
run host 150 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback \
  --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native-async --profile ""
cat "$X/status.txt"
echo "== path"; grep -vE "^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ .*(threading|queue|<built-in method _thread)" "$X/path.log" | grep -E "^(way|nccl|rr|#)" | cut -c1-160 | head -40
echo "== host"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/host.log" | cut -c1-220 | tail -8
tar -czf "$OUT/r61_logs.tar.gz" -C "$X" . && rm -rf "$X"
