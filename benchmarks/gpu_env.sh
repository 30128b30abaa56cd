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
# logrun NAME CMD...: CMD's output into $OUT/NAME.txt (headed by the command), "NAME rc=N".
logrun() { local name=$1; shift; echo "### $name: $*" > "$OUT/$name.txt"; "$@" >> "$OUT/$name.txt" 2>&1;
           echo "$name rc=$?"; }
# logshow NAME...: the table lines of each $OUT/NAME.txt (rows, headers, errors, summaries).
logshow() { for f in "$@"; do echo "== $f"; grep -E "^#|^ *[0-9]|Error|error|^mode|^nccl|^hook|^backend|wrong|^soak" \
            "$OUT/$f.txt" | grep -vE "NCCL env|socket.cpp|ncalls|^# +[a-z]" | cut -c1-300 | tail -16; done; }
