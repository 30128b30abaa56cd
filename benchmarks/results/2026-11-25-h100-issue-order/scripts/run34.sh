#!/usr/bin/env bash
# Session 25, device call 10: the fault tests at 2x1 with the watchdog's thread in relaxed
# capture mode (cuda_setup.relaxed_capture_mode): under MPS, then the killed peer without.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r34"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 400 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
run faults_2x1 200 python3 benchmarks/emulate.py --mps-only -- env RINGREDUCE_GPU_TOPOLOGIES=2x1 RR_MPS=1 python3 -m pytest -m gpu tests -k fault -p no:cacheprovider -v -rs -s
run killed_2x1 150 python3 -m pytest -m gpu tests -k "killed or failed_work" -p no:cacheprovider -v -rs -s
cat "$X/status.txt"
echo "== tests"; grep -hE "^\[fault|PASSED|FAILED|ERROR|SKIPPED|XFAIL|[0-9]+ (passed|failed)" "$X"/*_2x1.log | sed 's/ \[run_test_ranks\].*//' | cut -c1-220 | head -40
tar -czf "$OUT/r34_logs.tar.gz" -C "$X" . && rm -rf "$X"
