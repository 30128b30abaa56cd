#!/usr/bin/env bash
# One device call for tuning: GPU tests (2x2), then one-machine, loopback (default and
# tuned sockets, several rail channel counts) and capped sweeps. Tables last.
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus $NGPU --machines 2 --gpus-per-machine 1"
LOG="$OUT/perf.log"; : > "$LOG"
run() { local name=$1; shift; { echo "=== $name: ${RINGREDUCE_RAIL_CHANNELS:+RINGREDUCE_RAIL_CHANNELS=$RINGREDUCE_RAIL_CHANNELS} $*"; "$@" 2>&1 | grep -E "^#|^ *[0-9]|Error"; } >> "$LOG"; }
python3 -m pytest -m gpu tests/test_gpu.py -p no:cacheprovider -k "${TESTS_K:-2x2 or no_sync}" > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"
run one_machine torchrun --nproc-per-node "$NGPU" -m ringreduce.bench -b 4K -e 64M -f 4 $B
run loopback $E --mode loopback -- -b 1M -e 256M -f 4 $B
for ch in "" 4 16; do
  RINGREDUCE_RAIL_CHANNELS=$ch run loopback_tuned $E --mode loopback --nccl-tuned -- -b 4M -e 256M -f 4 $B
done
run capped $E -- -b 1M -e 64M -f 4 $B
run capped_buckets $E -- -b 25M -e 25M --buckets 16 $B
grep -vE "^# (NCCL env|ringreduce\.bench|emulate)" "$LOG"
