#!/usr/bin/env bash
# Session 25, device call 4: calls on one tensor with several in flight, before the fix
# (the three files as they were, from .runs/unfixed) and after it; the GPU tests at 2x2
# with the fix and the new waves; host time and CPU per call at 2x2 against NCCL.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r28"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
M="python3 benchmarks/emulate.py --mps-only --"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 570 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
put() { cp ".runs/$1/issue.py" ringreduce/execution/issue.py; cp ".runs/$1/engine.py" ringreduce/engine.py; cp ".runs/$1/native.py" ringreduce/execution/native.py; }
T="$M env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest -p no:cacheprovider -v -rs -s"
put unfixed
run order_unfixed 110 $T tests/test_native_cuda.py -k issue_order
put fixed
run order_fixed 110 $T tests/test_native_cuda.py -k issue_order
run gpu_2x2 210 $T -x tests/test_gpu.py tests/test_native_cuda.py -k "collectives_are_exact or never_syncs or ddp_backend or cuda_graphs_capture or back_to_back or futures"
run host_2x2 100 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native/nocheck,python
cat "$X/status.txt"
echo "== order"; grep -hE "check_equal|wrong elements|PASSED|FAILED|[0-9]+ (passed|failed)" "$X/order_unfixed.log" "$X/order_fixed.log" | cut -c1-220 | head -16
echo "== gpu"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X/gpu_2x2.log" | cut -c1-200 | head -20
echo "== host"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* |Error|group_end" "$X/host_2x2.log" | cut -c1-200 | tail -12
tar -czf "$OUT/r28_logs.tar.gz" -C "$X" . && rm -rf "$X"
