#!/usr/bin/env bash
# One device call: the remaining GPU tests, then the benchmark sweep, tables last.
# Usage on the GPU machine (carry .whl and .iproute): bash benchmarks/gpu_bench.sh
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus $NGPU"
run() { local name=$1; shift; echo "### $name: $*" >> "$OUT/bench.log"; "$@" > "$OUT/$name.txt" 2>&1; echo "$name rc=$?"; }
[ "${SKIP_TESTS:-0}" = 1 ] || python3 -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} \
  > "$OUT/gpu_tests.log" 2>&1; grep -E "PASSED|FAILED|ERROR|passed|failed" "$OUT/gpu_tests.log" | tail -12
run one_machine torchrun --nproc-per-node "$NGPU" -m ringreduce.bench -b 4K -e 1G -f 4 $B --json "$OUT/one_machine.json"
run capped_2x1 $E --machines 2 --gpus-per-machine 1 -- -b 1M -e 256M -f 4 $B --json "$OUT/capped_2x1.json"
run capped_2x1_buckets $E --machines 2 --gpus-per-machine 1 -- -b 25M -e 25M --buckets 16 $B --json "$OUT/capped_buckets.json"
run loopback_2x1 $E --machines 2 --gpus-per-machine 1 --mode loopback -- -b 1M -e 256M -f 4 $B --json "$OUT/loopback.json"
run loopback_2x1_tuned $E --machines 2 --gpus-per-machine 1 --mode loopback --nccl-tuned -- -b 1M -e 256M -f 4 $B --json "$OUT/loopback_tuned.json"
for f in one_machine capped_2x1 capped_2x1_buckets loopback_2x1 loopback_2x1_tuned; do
  echo "== $f"; grep -vE "Warning|warn|return func|^W1|^\s*$" "$OUT/$f.txt" | grep -E "^#|^ *[0-9]|Error|error" | tail -14
done
