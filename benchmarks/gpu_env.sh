# Sourced by benchmarks/gpu.sh (and by any script of a GPU run): the environment every
# process there needs, nccl4py from the carried wheel in .whl/, $OUT and $NGPU.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  # Into a private folder, never the machine's site-packages (it is not ours to change).
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
# The native issuer (ringreduce._native) built in place with the machine's g++, so the
# GPU tests and the benchmark run the tree as an install would; `python -m ringreduce.info`
# in each suite's log says whether it was built and which issuer a CUDA call uses.
if command -v g++ >/dev/null 2>&1 && ! ls ringreduce/_native*.so >/dev/null 2>&1; then
  python3 setup.py -q build_ext --inplace > "$OUT/native_build.log" 2>&1 \
    || echo "native build failed: $OUT/native_build.log"
fi
