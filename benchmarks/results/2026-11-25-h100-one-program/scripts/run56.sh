#!/usr/bin/env bash
# Session 29, device call 1: every call starts at staging slot 0, so one kind of call has
# one native program. Capped 10 Gbit/s 2x2 bench (2-32 MiB; its host column is now
# replays, not traces), the 146-bucket transformer in DDP (gpu.sh dlrm, transformer step
# only), the caller's host time per 25 MiB call at 2x2 loopback, then the random soak
# (sync and async, back to back, every dtype and op, up to 16 MiB).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r56"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 500 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
B="-b 2M -e 32M -f 2 -n 3 -w 1 -r 3 -c 1"
run bench 60 env RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- $B
run dlrm 110 env SKIP='dlrm_2x2|dlrm_4x2' BUDGET_S=100 bash benchmarks/gpu.sh dlrm
run host 100 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback \
  --script benchmarks/native_host.py -- --size 25M --calls 32 --ways native,native-async --profile ""
run soak 200 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 --mode loopback \
  --script benchmarks/soak.py -- --calls 600 --max-bytes 16777216 --min-bytes 65536 --json "$X/soak.json"
cat "$X/status.txt"
echo "== bench"; grep -E "^ +[0-9]+ +float" "$X/bench.log" | awk '{print $1, "time", $5, "host", $6, "wrong", $9, "ratio", $20, "2lvl", $21, "eff", $22}'
echo "== dlrm"; tail -4 "$X/dlrm.log"; [ -d "$OUT/dlrm" ] && cp "$OUT/dlrm/summary.txt" "$X/dlrm_summary.txt" 2>/dev/null
echo "== host"; grep -E "^way |^(nccl|native|python)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/host.log" | cut -c1-220 | tail -8
echo "== soak"; grep -hE "^# soak|wrong|FAILED|Error" "$X/soak.log" | cut -c1-300 | tail -6
tar -czf "$OUT/r56_logs.tar.gz" -C "$X" . && rm -rf "$X"
