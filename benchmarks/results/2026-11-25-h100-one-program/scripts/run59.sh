#!/usr/bin/env bash
# Session 29, device call 4: run 58's capped 4x2 step again (it printed nothing in its 150 s:
# not even the bench's header, so before the first call), alone, with a 60 s ringreduce
# deadline so that a hang becomes an error that says where, and NCCL's warnings on.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r59"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
t0=$SECONDS
timeout -k 10 230 env RINGREDUCE_TIMEOUT=60 NCCL_DEBUG=WARN python3 benchmarks/emulate.py --physical-gpus 1 \
  --machines 4 --gpus-per-machine 2 --link-cap 10gbit -- -b 1M -e 256M -f 4 -n 3 -w 1 -r 3 -c 1 \
  --extra-buckets 16 --json "$X/capped_4x2.json" > "$X/capped_4x2.log" 2>&1
echo "capped_4x2 exit $? in $((SECONDS-t0)) s" | tee "$X/status.txt"
grep -E "^ +[0-9]+ +float" "$X/capped_4x2.log" | awk '{print $1, "time", $5, "wrong", $9, "ratio", $20, "2lvl", $21, "eff", $22, $23}'
grep -hE "RingReduceError|NCCL WARN|Error" "$X/capped_4x2.log" | cut -c1-300 | sort | uniq -c | sort -rn | head -8
tar -czf "$OUT/r59_logs.tar.gz" -C "$X" . && rm -rf "$X"
