#!/usr/bin/env bash
# Target T6 on a one-GPU machine, as 2 virtual machines x 1 GPU (loopback): where the
# host time of a 25 MiB call comes from, by slice count (RINGREDUCE_SLICE_BYTES 4 MiB = 7
# slices, the default; 13 MiB = 2; 25 MiB = 1), slow path and graph replay
# (RINGREDUCE_GRAPHS=256); and the floor of CUDAGraph.replay() by graph shape
# (benchmarks/graph_launch.py). Carry .whl. Summary last; full logs in $OUT.
#   bash benchmarks/gpu_t6.sh [tests]   ("tests": first the GPU backend and graph tests)
set -u
. "$(dirname "$0")/gpu_env.sh"
if [ "${1:-}" = tests ]; then
  timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -v -rs tests/test_gpu.py \
    -k "backend or graph or replay" > "$OUT/gpu_tests.log" 2>&1
  echo "gpu tests exit $?"
fi
logrun graph_launch timeout 120 python3 benchmarks/graph_launch.py
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1 --mode loopback"
for sb in 4194304 13631488 26214400; do
  for g in 0 256; do
    RINGREDUCE_SLICE_BYTES=$sb RINGREDUCE_GRAPHS=$g logrun "host_slice${sb}_graphs$g" timeout 90 \
      $E -- -b 25M -e 25M -n 5 -w 2 --host-profile 25M
  done
done
[ -f "$OUT/gpu_tests.log" ] && grep -E "^tests/|passed|failed" "$OUT/gpu_tests.log" \
  | sed 's/ *\[ *[0-9]*%\]//' | tail -20
cat "$OUT/graph_launch.txt"
for f in "$OUT"/host_slice*.txt; do
  echo "== $(basename "$f" .txt)"; grep -E "^# host time" "$f"
done
