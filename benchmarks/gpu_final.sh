#!/usr/bin/env bash
# One device call: kernel + GPU tests, kernel bandwidth (T8), then capped and loopback
# 2 x 2 sweeps (virtual machines share the GPUs when fewer than 4), host time (T6).
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus $NGPU --machines 2 --gpus-per-machine 2"
LOG="$OUT/final.log"; : > "$LOG"
run() { local name=$1; shift; { echo "=== $name: $*"; "$@" 2>&1 | grep -vE "Warning|warn|return func|^W1|^\s*$|^\[rank"; } >> "$LOG"; }
python3 -m pytest -m gpu tests/test_kernels.py tests/test_gpu.py -p no:cacheprovider -v \
  -k "${TESTS_K:-kernels or 2x2 or syncs or ddp or graph}" > "$OUT/gpu_tests.log" 2>&1
grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | sed 's/ *\[.*%\]//' | awk '{print $NF, $1}' | sort | uniq -c | sort -rn | head -5
grep -E "FAILED|ERROR" "$OUT/gpu_tests.log" | head -5
run kernel_bench python3 benchmarks/kernel_bench.py
run capped_2x2 $E -- -b 1M -e 256M -f 4 $B --host-profile 25M
run capped_2x2_buckets $E -- -b 25M -e 25M --buckets 16 $B
run loopback_2x2 $E --mode loopback -- -b 1M -e 256M -f 4 $B
grep -vE "^# (NCCL env|ringreduce\.bench|emulate)|^ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +\{|^ +ncalls|Ordered by|List reduced|function calls" "$LOG" | cut -c1-190
