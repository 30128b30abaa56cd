#!/usr/bin/env bash
# The native issuer (issue 18) on one GPU. Parts:
#   build   build ringreduce._native in place (g++), python -m ringreduce.info
#   tests   tests/test_native.py (CPU parts) and tests/test_native_cuda.py (2 x 1: both
#           issuers exact, futures, killed peer), then the existing GPU fault tests
#   sweep   the existing GPU sweep and DDP tests (now issued natively by default)
#   host21  benchmarks/native_host.py: host time and CPU per 25 MiB call, native vs
#           Python issuer vs NCCL, same run, 2 x 1 (no MPS); host22, host42: 2 x 2 and
#           4 x 2 under MPS
# Carry .whl. Full logs in $OUT.   bash benchmarks/gpu_native.sh build tests host22
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus 1 --mode loopback"
mps_on() {
  export CUDA_MPS_PIPE_DIRECTORY=/tmp/rr-mps-pipe CUDA_MPS_LOG_DIRECTORY=/tmp/rr-mps-log
  mkdir -p $CUDA_MPS_PIPE_DIRECTORY $CUDA_MPS_LOG_DIRECTORY
  PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control -d && echo "mps on"
}
mps_off() { echo quit | PATH=$PATH:/usr/local/nvidia/bin nvidia-cuda-mps-control; unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY; }
for part in "$@"; do
  case $part in
  build)
    python3 setup.py build_ext --inplace > "$OUT/build.log" 2>&1; echo "build exit $?"
    grep -iE "error|warning" "$OUT/build.log" | head -5
    python3 -m ringreduce.info | tee "$OUT/info.txt" ;;
  tests)
    timeout ${TESTS_S:-300} python3 -m pytest -p no:cacheprovider -v -rs -x tests/test_native.py \
      tests/test_native_cuda.py -k "${TESTS_K:-not nothing}" > "$OUT/native_tests.log" 2>&1
    echo "native tests exit $?"; grep -E "PASS|FAIL|SKIP|Error|passed|failed" "$OUT/native_tests.log" | tail -25 ;;
  faults)
    timeout 200 python3 -m pytest -p no:cacheprovider -v -rs tests/test_gpu_faults.py > "$OUT/faults.log" 2>&1
    echo "fault tests exit $?"; grep -E "PASS|FAIL|passed|failed" "$OUT/faults.log" | tail -8 ;;
  sweep)
    timeout 300 python3 -m pytest -p no:cacheprovider -v -rs tests/test_gpu.py \
      -k "every_size or wire or no_sync or ddp or captures or replay" > "$OUT/gpu_tests.log" 2>&1
    echo "gpu tests exit $?"; grep -E "PASS|FAIL|passed|failed" "$OUT/gpu_tests.log" | tail -20 ;;
  host21)
    logrun host_2x1 timeout 150 $E --machines 2 --gpus-per-machine 1 --script benchmarks/native_host.py -- --size 25M
    cat "$OUT/host_2x1.txt" | grep -vE "NCCL INFO|^$" | tail -12 ;;
  host22|host42)
    m=${part:4:1}; mps_on
    logrun host_${m}x2 timeout ${HOST_S:-150} $E --machines $m --gpus-per-machine 2 --script benchmarks/native_host.py -- --size 25M --calls 20
    grep -vE "NCCL INFO|^$" "$OUT/host_${m}x2.txt" | tail -12
    mps_off ;;
  esac
done
