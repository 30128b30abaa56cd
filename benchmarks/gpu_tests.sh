#!/usr/bin/env bash
# Run the GPU test suite on the lent GPU machine; full log under $OUT (or ./gpu-out).
# nccl4py travels as a wheel in .whl/ (see README, "GPU runs").
set -u
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
{
  echo "date: $(date -u +%FT%TZ)  commit: $(git rev-parse --short HEAD 2>/dev/null)"
  nvidia-smi -L
  python3 -c 'import torch, nccl.core as n; print("torch", torch.__version__, "nccl", n.get_version())'
} | tee "$OUT/env.txt"
python3 -m pytest -m gpu tests/test_gpu.py -v -p no:cacheprovider "$@" 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "PASSED|FAILED|ERROR|SKIPPED|passed|failed|Error" | tail -40
