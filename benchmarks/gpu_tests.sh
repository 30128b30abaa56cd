#!/usr/bin/env bash
# Run the GPU test suite on the lent GPU machine; full log under $OUT (or ./gpu-out).
# nccl4py travels as a wheel in .whl/ (see README, "GPU runs").
set -u
. "$(dirname "$0")/gpu_env.sh"
{
  echo "date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi -L
  python3 -c 'import torch, nccl.core as n; print("torch", torch.__version__, "nccl", n.get_version())'
} | tee "$OUT/env.txt"
python3 -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Error" | tail -40
