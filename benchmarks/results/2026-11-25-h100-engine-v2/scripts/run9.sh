#!/usr/bin/env bash
# Session 23, device call 9: host time with paired communicators at 2x2 (with 8 MiB
# slices beside) and 4x2, the async_order control (inline native issuer), native tests at 4x2.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r9"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
M="python3 benchmarks/emulate.py --mps-only --"
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 545 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run host_2x2 130 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --slices 8M
run async_native 50 env RINGREDUCE_TIMEOUT=15 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_order.py -- --phase alone --issuer native
run host_4x2 160 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 16
run native_4x2 150 $M env RINGREDUCE_GPU_TOPOLOGIES=4x2 RR_MPS=1 python3 -m pytest tests/test_native_cuda.py -k "not killed" -p no:cacheprovider -v -rs
cat "$X/status.txt"
for f in host_2x2 host_4x2; do echo "== $f"; grep -E "ranks, [0-9]+ bytes|^way |^(nccl|native|python)[/0-9A-Za-z]* (sync|async)|Error" "$X/$f.log" | cut -c1-250 | tail -20; grep "^# " "$X/$f.log" | tail -1 | cut -c1-120; done
echo "== async"; grep -hE "^\[async-order\]|watchdog" "$X/async_native.log" | cut -c1-300 | head -10
echo "== native 4x2"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/native_4x2.log" | cut -c1-200 | head -12
tar -czf "$OUT/r9_logs.tar.gz" -C "$X" . && rm -rf "$X"
