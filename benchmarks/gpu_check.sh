#!/usr/bin/env bash
# One device call: every GPU test (kernels, exact sweeps, CUDA graphs, block
# collectives, backend, DDP, watchdog faults, sharded embedding). Summary last; full
# logs in $OUT.
set -u
. "$(dirname "$0")/gpu_env.sh"
P="python3 -m pytest -m gpu -p no:cacheprovider -v -rs"
$P tests/test_kernels.py tests/test_gpu.py tests/test_gpu_faults.py tests/test_gpu_embedding.py \
  -k "${TESTS_K:-}" > "$OUT/gpu_tests.log" 2>&1
grep -E "^(tests/|FAILED|ERROR)|passed|failed" "$OUT/gpu_tests.log" | sed 's/ *\[ *[0-9]*%\]//' | tail -50
