#!/usr/bin/env bash
# One device call for a one-GPU machine: the GPU tests, then CUDA-graph replay
# (RINGREDUCE_GRAPHS, graphs.py) against the slow path as 2 virtual machines x 1 GPU
# sharing the GPU, capped at 20 Gbit/s: host time per 25 MiB call (T6), a sweep, and
# 16 back-to-back 25 MiB buckets, each with replay on (default) and off.
# Summary last; full logs and JSON in $OUT.
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1"
run() { local name=$1; shift; echo "### $name: $*" > "$OUT/$name.txt"; "$@" >> "$OUT/$name.txt" 2>&1;
        echo "$name rc=$?"; }
timeout "${TESTS_S:-260}" python3 -m pytest -m gpu -p no:cacheprovider -v -rs --durations=0 \
  tests/test_gpu.py > "$OUT/gpu_tests.log" 2>&1; echo "pytest exit $?" >> "$OUT/gpu_tests.log"
for g in 256 0; do
  RINGREDUCE_GRAPHS=$g run "capped_graphs$g" timeout 100 $E -- -b 4M -e 256M -f 4 $B \
    --host-profile 25M --json "$OUT/capped_graphs$g.json"
  RINGREDUCE_GRAPHS=$g run "buckets_graphs$g" timeout 60 $E -- -b 25M -e 25M --buckets 16 $B \
    --json "$OUT/buckets_graphs$g.json"
done
grep -E "^(tests/|FAILED)|passed|failed|pytest exit" "$OUT/gpu_tests.log" | sed 's/ *\[ *[0-9]*%\]//' | tail -12
for f in capped_graphs256 capped_graphs0 buckets_graphs256 buckets_graphs0; do
  echo "== $f"; grep -E "^#|^ *[0-9]|Error|error" "$OUT/$f.txt" | grep -vE "NCCL env|socket.cpp|ncalls|^# +[a-z]" | tail -12
done
