#!/usr/bin/env bash
# Session 24, device call 20: issue 15 item 6 under the conditions of its one crash (run 1,
# commit 091fbf8: a group per stage, before waves; -b 64M -e 256M), four times, and twice
# with waves (the default since), all non-blocking, stacks on.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r20"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 520 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
ITEM6="$E --machines 4 --gpus-per-machine 2 --link-cap 10gbit -- -b 64M -e 256M -f 4 -n 3 -w 1 -r 3 -c 1"
for i in 1 2 3 4; do
  run stage_groups_try$i 100 env RINGREDUCE_NCCL_BLOCKING=0 RINGREDUCE_WAVE_GROUPS=0 PYTHONFAULTHANDLER=1 NCCL_DEBUG=WARN $ITEM6
done
for i in 1 2; do
  run waves_try$i 80 env RINGREDUCE_NCCL_BLOCKING=0 PYTHONFAULTHANDLER=1 NCCL_DEBUG=WARN $ITEM6
done
cat "$X/status.txt"
for f in "$X"/*_try*.log; do echo "== $(basename "$f")"; grep -E "^ +[0-9]+ |Fatal|Segmentation|illegal|Connection closed|exited with|Thread 0x" "$f" | cut -c1-200 | head -8; done
tar -czf "$OUT/r20_logs.tar.gz" -C "$X" . && rm -rf "$X"
