#!/usr/bin/env bash
# Target T6 on a one-GPU machine, as 2 virtual machines x 1 GPU (loopback). Parts:
#   tests   the GPU backend, graph and replay tests
#   slices  host time of a 25 MiB call by slice count (RINGREDUCE_SLICE_BYTES 4 MiB =
#           7 slices, the default; 13 MiB = 2; 25 MiB = 1), slow path and replay
#           (RINGREDUCE_GRAPHS=256), and the floor of CUDAGraph.replay() by graph shape
#   host    host time of a 25 MiB call at the default slices, slow path and replay
#   nccl    replay() of NCCL's own captured all-reduce against ringreduce's captured
#           call, with NCCL_GRAPH_MIXING_SUPPORT at its default and at 0, and the
#           whole replayed call's host time with it at 0
# Carry .whl. Summary last; full logs in $OUT.   bash benchmarks/gpu_t6.sh [PART...]
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1 --mode loopback"
for part in "${@:-slices nccl}"; do
  for p in $part; do
    case $p in
    tests)
      timeout 300 python3 -m pytest -m gpu -p no:cacheprovider -v -rs tests/test_gpu.py \
        -k "backend or graph or replay" > "$OUT/gpu_tests.log" 2>&1
      echo "gpu tests exit $?" ;;
    slices)
      logrun graph_launch timeout 120 python3 benchmarks/graph_launch.py
      for sb in 4194304 13631488 26214400; do
        for g in 0 256; do
          RINGREDUCE_SLICE_BYTES=$sb RINGREDUCE_GRAPHS=$g logrun "host_slice${sb}_graphs$g" \
            timeout 90 $E -- -b 25M -e 25M -n 5 -w 2 --host-profile 25M
        done
      done ;;
    host)
      for g in 0 256; do
        RINGREDUCE_GRAPHS=$g logrun "host_graphs$g" timeout 90 \
          $E -- -b 25M -e 25M -n 5 -w 2 --host-profile 25M
      done ;;
    nccl)
      logrun nccl_graph_mixing1 timeout 120 $E --script benchmarks/graph_launch.py -- --nccl
      NCCL_GRAPH_MIXING_SUPPORT=0 logrun nccl_graph_mixing0 timeout 120 \
        $E --script benchmarks/graph_launch.py -- --nccl
      NCCL_GRAPH_MIXING_SUPPORT=0 RINGREDUCE_GRAPHS=256 logrun host_graphs256_mixing0 \
        timeout 90 $E -- -b 25M -e 25M -n 5 -w 2 --host-profile 25M ;;
    esac
  done
done
[ -f "$OUT/gpu_tests.log" ] && grep -E "^tests/|passed|failed" "$OUT/gpu_tests.log" \
  | sed 's/ *\[ *[0-9]*%\]//' | tail -20
[ -f "$OUT/graph_launch.txt" ] && cat "$OUT/graph_launch.txt"
for f in "$OUT"/nccl_graph*.txt; do [ -f "$f" ] && grep -vE "NCCL env|socket.cpp|^###" "$f" | tail -6; done
for f in "$OUT"/host_*.txt; do
  [ -f "$f" ] && { echo "== $(basename "$f" .txt)"; grep -E "^# host time" "$f"; }
done
exit 0
