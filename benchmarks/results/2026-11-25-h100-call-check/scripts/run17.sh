#!/usr/bin/env bash
# Session 24, device call 17: the end-of-call check over the stage communicators (the new
# default): mismatch faults at 2x1, the same-width swap at 2x1, 2x2 and 4x2, GPU tests at
# 2x2, host cost (stages against world against no check) and wire cost (capped 2x2).
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r17"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
M="python3 benchmarks/emulate.py --mps-only --"
E="python3 benchmarks/emulate.py --physical-gpus 1"
B="-b 16M -e 256M -f 4 -n 3 -w 1 -r 3 -c 1 --extra-buckets 16"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 540 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run host_2x2 80 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native/world,native/nocheck
run faults 230 $M env RINGREDUCE_GPU_TOPOLOGIES=2x1,2x2,4x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu_faults.py -k "mismatch or same_width or store_gone" -p no:cacheprovider -v -rs -s -x
run gpu_2x2 120 $M env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu.py -k "collectives or capture_and_replay or ddp_backend" -p no:cacheprovider -v -rs -x -s
run capped_2x2_check 90 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- $B --json "$X/capped_2x2_check.json"
run capped_2x2_nocheck 90 env RINGREDUCE_CHECK_CALL_END=0 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- $B --json "$X/capped_2x2_nocheck.json"
cat "$X/status.txt"
echo "== host"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z]* (sync|async)|Error" "$X/host_2x2.log" | cut -c1-200 | head -12
echo "== faults"; grep -hE "^\[fault|PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/faults.log" | cut -c1-200 | head -40
echo "== gpu_2x2"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/gpu_2x2.log" | cut -c1-200 | head -12
for f in capped_2x2_check capped_2x2_nocheck; do echo "== $f"; grep -E "^ +[0-9]+ " "$X/$f.log" | head -6; done
tar -czf "$OUT/r17_logs.tar.gz" -C "$X" . && rm -rf "$X"
