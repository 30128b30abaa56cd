#!/usr/bin/env bash
# Session 24, device call 21: issue 15 item 6's fix. The race on purpose (a second thread
# polling ncclCommGetAsyncError on every communicator while 2x2 non-blocking calls run):
# unlocked, as before the fix, then locked, twice; then the crash's own command, with a
# group per stage, three times.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r21"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 520 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
RACE="$E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_error_race.py -- --seconds 25"
run race_unlocked 70 env PYTHONFAULTHANDLER=1 RINGREDUCE_TIMEOUT=30 $RACE --unlocked
run race_locked1 70 env PYTHONFAULTHANDLER=1 RINGREDUCE_TIMEOUT=30 $RACE
run race_locked2 70 env PYTHONFAULTHANDLER=1 RINGREDUCE_TIMEOUT=30 $RACE
ITEM6="$E --machines 4 --gpus-per-machine 2 --link-cap 10gbit -- -b 64M -e 256M -f 4 -n 3 -w 1 -r 3 -c 1"
for i in 1 2 3; do
  run stage_groups_try$i 90 env RINGREDUCE_NCCL_BLOCKING=0 RINGREDUCE_WAVE_GROUPS=0 PYTHONFAULTHANDLER=1 NCCL_DEBUG=WARN $ITEM6
done
cat "$X/status.txt"
for f in race_unlocked race_locked1 race_locked2; do echo "== $f"; grep -hE "^\[async-error-race\]|Fatal|Segmentation|exited|ended" "$X/$f.log" | cut -c1-200 | head -8; done
for i in 1 2 3; do echo "== stage_groups_try$i"; grep -E "^ +[0-9]+ |Fatal|Segmentation" "$X/stage_groups_try$i.log" | cut -c1-200 | head -4; done
tar -czf "$OUT/r21_logs.tar.gz" -C "$X" . && rm -rf "$X"
