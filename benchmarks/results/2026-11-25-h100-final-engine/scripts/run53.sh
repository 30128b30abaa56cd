#!/usr/bin/env bash
# Session 28, device call 6: gpu.sh's dlrm suite with its new transformer step alone
# (SKIP the DLRM steps), then the caller's host time of one 4 MiB call at 2x2 loopback:
# slice size by call size (four 1 MiB slices) against fixed 4 MiB (native/4M), both
# issuers, same processes.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r53"; mkdir -p "$X"
START=$SECONDS
SKIP='dlrm_2x2|dlrm_4x2' BUDGET_S=150 bash benchmarks/gpu.sh dlrm > "$X/gpu_sh_dlrm.log" 2>&1
echo "gpu.sh dlrm exit $? in $((SECONDS-START)) s" | tee -a "$X/status.txt"
t0=$SECONDS
timeout -k 10 100 env RINGREDUCE_TIMEOUT=30 python3 benchmarks/emulate.py --physical-gpus 1 \
  --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- \
  --size 4M --calls 32 --ways native,native/4M,native-async,native-async/4M --profile "" \
  > "$X/host_4M.log" 2>&1
echo "host_4M exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"
cat "$X/status.txt"; tail -8 "$X/gpu_sh_dlrm.log"
grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/host_4M.log" | cut -c1-220 | tail -12
[ -d "$OUT/dlrm" ] && cp "$OUT/dlrm/summary.txt" "$X/dlrm_summary.txt" 2>/dev/null
tar -czf "$OUT/r53_logs.tar.gz" -C "$X" . && rm -rf "$X"
