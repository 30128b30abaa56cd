#!/usr/bin/env bash
# Session 30, device call 6: test_gpu.py at 2x2 on the final code (every route: exact
# sweeps, wire format, graphs, DDP hook and backend, now also find_unused_parameters),
# then the caller's time at 4x2 loopback: caller_path.py and native_host.py.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r65"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
S=benchmarks/results/2026-11-25-h100-lean-call/scripts
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 420 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run gpu_2x2 200 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_gpu.py -p no:cacheprovider -v -rs -k "not fault"
run path_4x2 80 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 --mode loopback \
  --script $S/caller_path.py -- --size 25M --rounds 5
run host_4x2 80 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 --mode loopback \
  --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native-async --profile ""
cat "$X/status.txt"
echo "== gpu_2x2"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED|^E  " "$X/gpu_2x2.log" | cut -c1-150 | tail -12
echo "== path_4x2"; grep -E "^(way|nccl|rr) " "$X/path_4x2.log" | cut -c1-100
echo "== host_4x2"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/host_4x2.log" | cut -c1-130 | tail -6
tar -czf "$OUT/r65_logs.tar.gz" -C "$X" . && rm -rf "$X"
