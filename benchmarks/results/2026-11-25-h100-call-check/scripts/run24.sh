#!/usr/bin/env bash
# Session 24, device call 24: the race, the fixed poller pausing 100 us between polls (run 23: a tight loop starved the issuing thread) (run 22: with the poll lock alone; run
# 21's time-bounded loop let ranks end on different calls): unlocked once, locked twice.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r24"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
RACE="$E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/async_error_race.py -- --calls 300"
run race_unlocked 70 env PYTHONFAULTHANDLER=1 RINGREDUCE_TIMEOUT=30 $RACE --unlocked
run race_locked1 90 env PYTHONFAULTHANDLER=1 RINGREDUCE_TIMEOUT=30 $RACE
run race_locked2 90 env PYTHONFAULTHANDLER=1 RINGREDUCE_TIMEOUT=30 $RACE
cat "$X/status.txt"
for f in race_unlocked race_locked1 race_locked2; do echo "== $f"; grep -hE "^\[async-error-race\]|Fatal|Segmentation|Error" "$X/$f.log" | cut -c1-200 | head -6; done
tar -czf "$OUT/r24_logs.tar.gz" -C "$X" . && rm -rf "$X"
