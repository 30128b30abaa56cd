#!/usr/bin/env bash
# Session 23, device call 7: host time with paired stage communicators (native_host, 2x2
# and 4x2 loopback), capped and loopback 2x2 bench at the default 4 MiB and at 8 MiB slices.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r7"; mkdir -p "$X"
{ git log --oneline -1; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
B="-b 16M -e 256M -f 4 -n 3 -w 1 -r 3 -c 1 --extra-buckets 16"
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run host_2x2 170 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --slices 8M
run capped_2x2_4M 110 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- $B --json "$X/capped_2x2_4M.json"
run capped_2x2_8M 110 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- $B --slice-bytes 8M --json "$X/capped_2x2_8M.json"
run loop_2x2_4M 70 $E --machines 2 --gpus-per-machine 2 --mode loopback -- $B --json "$X/loop_2x2_4M.json"
run loop_2x2_8M 70 $E --machines 2 --gpus-per-machine 2 --mode loopback -- $B --slice-bytes 8M --json "$X/loop_2x2_8M.json"
cat "$X/status.txt"
for f in host_2x2; do echo "== $f"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z]* (sync|async)|Error|error" "$X/$f.log" | head -30; done
for f in capped_2x2_4M capped_2x2_8M loop_2x2_4M loop_2x2_8M; do echo "== $f"; grep -E "^ *[0-9]+ |ratio|size|wrong|Error" "$X/$f.log" | grep -v "^\[" | head -14; done
tar -czf "$X/logs.tar.gz" -C "$X" --exclude logs.tar.gz . 2>/dev/null
