# Sourced by the GPU run scripts: the environment every process there needs, nccl4py
# from the carried wheels in .whl/, and $OUT for full logs.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
fi
NGPU=$(nvidia-smi -L | wc -l)
B="-n 10 -w 3 -r 3 -c 1"
