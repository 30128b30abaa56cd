#!/usr/bin/env bash
# Session 23, device call 10: paired against separate stage communicators at 4x2 (capped
# bench each way, and native_host's two ways in one process again).
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r10"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
B="-b 16M -e 256M -f 4 -n 3 -w 1 -r 3 -c 1 --extra-buckets 16"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 550 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run capped_4x2_pairs 170 $E --machines 4 --gpus-per-machine 2 --link-cap 10gbit -- $B --json "$X/capped_4x2_pairs.json"
run capped_4x2_sep 170 env RINGREDUCE_PAIR_COMMS=0 $E --machines 4 --gpus-per-machine 2 --link-cap 10gbit -- $B --json "$X/capped_4x2_sep.json"
run host_4x2 170 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32
cat "$X/status.txt"
for f in capped_4x2_pairs capped_4x2_sep; do echo "== $f"; grep -E "^ +[0-9]+ " "$X/$f.log" | head -6; done
echo "== host_4x2"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z]* (sync|async)|watchdog" "$X/host_4x2.log" | cut -c1-200 | head -20
tar -czf "$OUT/r10_logs.tar.gz" -C "$X" . && rm -rf "$X"
