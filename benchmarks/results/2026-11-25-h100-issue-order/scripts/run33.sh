#!/usr/bin/env bash
# Session 25, device call 9: the issue-order fix with its marks as events recorded right
# after each asynchronous call (native: the job's flag first): calls on one tensor at 2x2,
# both issuers, and the replay and DDP paths that record those marks.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r33"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
M="python3 benchmarks/emulate.py --mps-only --"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 570 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
T="python3 -m pytest -m gpu -p no:cacheprovider -v -rs -s"
run order_2x2 200 $M env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 $T tests/test_gpu.py tests/test_native_cuda.py -k "issue_order or back_to_back or ddp_hook_with_graphs or futures"
cat "$X/status.txt"
echo "== tests"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)" "$X"/*_*.log | sed 's/ \[run_test_ranks\].*//' | cut -c1-200 | head -24
tar -czf "$OUT/r33_logs.tar.gz" -C "$X" . && rm -rf "$X"
