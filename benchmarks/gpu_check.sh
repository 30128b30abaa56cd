#!/usr/bin/env bash
# One device call: every GPU test (kernels, exact sweeps, block collectives, backend,
# DDP, watchdog faults, sharded embedding), then the CUDA-graph test on its own with a
# short deadline (a known hang). Summary last; full logs in $OUT.
set -u
. "$(dirname "$0")/gpu_env.sh"
P="python3 -m pytest -m gpu -p no:cacheprovider -v -rs"
$P tests/test_kernels.py tests/test_gpu.py tests/test_gpu_faults.py tests/test_gpu_embedding.py \
  -k "${TESTS_K:-not graph}" > "$OUT/gpu_tests.log" 2>&1
RR_GPU_GRAPH=1 timeout 200 $P tests/test_gpu.py -k graph > "$OUT/gpu_graph.log" 2>&1
echo "graph test exit: $?" >> "$OUT/gpu_graph.log"
for f in "$OUT"/gpu_tests.log "$OUT"/gpu_graph.log; do
  echo "== $f"; grep -E "^(tests/|FAILED|ERROR)|passed|failed|graph test exit" "$f" | sed 's/ *\[ *[0-9]*%\]//' | tail -40
done
