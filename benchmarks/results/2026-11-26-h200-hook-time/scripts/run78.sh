#!/usr/bin/env bash
# Session 32, device call 7 (library code as run 72): link efficiency at capped 2x2 on an
# H200, issue 18's "2x2 link efficiency >= 0.95 for single calls of 16-256 MiB and for
# 16 x 25 MiB buckets": gpu.sh perf's capped 2x2 step at 16M-256M plus the buckets, on
# the default issuer, then on native-async.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r78"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
export RINGREDUCE_TIMEOUT=90
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 2 --link-cap 10gbit"
A="-b 16M -e 256M -f 4 -n 3 -w 1 -r 3 -c 1 --extra-buckets 16"
timeout -k 10 150 $E -- $A --json "$X/capped_2x2_native.json" > "$X/capped_2x2_native.log" 2>&1; echo "native exit $?"
timeout -k 10 150 env RINGREDUCE_ISSUER=native-async $E -- $A --json "$X/capped_2x2_async.json" > "$X/capped_2x2_async.log" 2>&1; echo "native-async exit $?"
for f in native async; do echo "== $f"; grep -vE "^\[rank|Warning|warn" "$X/capped_2x2_$f.log" | grep -E "^#  |^ +[0-9]+ |bucket|efficien|Error" | cut -c1-220 | tail -12; done
tar -czf "$OUT/r78_logs.tar.gz" -C "$X" . && rm -rf "$X"
