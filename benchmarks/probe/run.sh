
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
nvidia-smi -L; python3 -c 'import torch, cupy; print(torch.__version__, torch.cuda.device_count(), cupy.__version__)'
python3 -m pip list 2>/dev/null | grep -iE "cuda|nccl|cupy|mpi4py"
which mpirun ip tc
echo "=== 2 procs on 2 GPUs"
timeout 120 torchrun --nproc-per-node 2 benchmarks/probe/probe.py > $OUT/p2.log 2>&1; grep -E "^[0-9] |Error|error" $OUT/p2.log | head -40
echo "=== 4 procs on 2 GPUs, NCCL_HOSTID per virtual machine (rank%2 -> gpu)"
cat > /tmp/wrap.sh <<'W'
export NCCL_HOSTID=vm$(( LOCAL_RANK / 2 ))
exec python3 benchmarks/probe/probe.py
W
timeout 120 torchrun --nproc-per-node 4 --no-python bash /tmp/wrap.sh > $OUT/p4.log 2>&1; grep -E "^[0-9] |Error|error" $OUT/p4.log | head -60
