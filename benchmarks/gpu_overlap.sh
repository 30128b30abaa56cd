#!/usr/bin/env bash
# Overlapping replays (pipeline.CudaStreams: external event nodes, alternating replay
# streams) on a one-GPU machine as 2 virtual machines x 1 GPU. Parts:
#   tests    the replay, graph, DDP and backend GPU tests, then 16 x 25 MiB buckets
#            capped at 20 Gbit/s with replay on and off, and host time with replay
#   dlrm     DLRM-style DDP capped, replay on (NCCL, hook and backend in one run)
# Carry .whl and .iproute. Summary last; full logs in $OUT.
#   bash benchmarks/gpu_overlap.sh tests|dlrm
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1"
case "${1:-tests}" in
tests)
  timeout 420 python3 -m pytest -m gpu -p no:cacheprovider -v -rs -x tests/test_gpu.py \
    -k "replay or graph or captures or ddp or sync" > "$OUT/gpu_tests.log" 2>&1
  echo "tests exit $?"
  grep -E "^tests/|passed|failed" "$OUT/gpu_tests.log" | sed 's/ *\[ *[0-9]*%\]//' | tail -14
  for g in 256 0; do
    RINGREDUCE_GRAPHS=$g logrun "buckets_graphs$g" timeout 100 $E -- -b 25M -e 25M --buckets 16 $B \
      --json "$OUT/buckets_graphs$g.json"
  done
  RINGREDUCE_GRAPHS=256 logrun host_graphs256 timeout 90 $E --mode loopback -- -b 25M -e 25M \
    -n 5 -w 2 --host-profile 25M
  logshow buckets_graphs256 buckets_graphs0
  grep -E "^# host time" "$OUT/host_graphs256.txt" ;;
dlrm)
  RINGREDUCE_GRAPHS=256 logrun dlrm_graphs256 timeout 150 $E --script benchmarks/dlrm.py -- \
    --modes nccl,hook,backend --steps 20 --warmup 5 --json "$OUT/dlrm_graphs256.json"
  logshow dlrm_graphs256 ;;
esac
