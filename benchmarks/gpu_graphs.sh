#!/usr/bin/env bash
# CUDA-graph replay (RINGREDUCE_GRAPHS, graphs.py) against the slow path, on a
# one-GPU machine as 2 virtual machines x 1 GPU sharing the GPU, capped at 20 Gbit/s;
# one device call per part: bash benchmarks/gpu_graphs.sh tests|apps
#   tests  the GPU tests; host time per 25 MiB call (T6), a 4M-256M sweep and 16
#          back-to-back 25 MiB buckets, with replay on (RINGREDUCE_GRAPHS=256) and off (0)
#   apps   host time (replay on); buckets on/off; DLRM-style DDP on/off; a soak with replay on
# Summary last; full logs and JSON in $OUT.
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1"
case "${1:-tests}" in
tests)
  timeout "${TESTS_S:-260}" python3 -m pytest -m gpu -p no:cacheprovider -v -rs --durations=0 \
    tests/test_gpu.py > "$OUT/gpu_tests.log" 2>&1; echo "pytest exit $?" >> "$OUT/gpu_tests.log"
  for g in 256 0; do
    RINGREDUCE_GRAPHS=$g logrun "capped_graphs$g" timeout 100 $E -- -b 4M -e 256M -f 4 $B \
      --host-profile 25M --json "$OUT/capped_graphs$g.json"
    RINGREDUCE_GRAPHS=$g logrun "buckets_graphs$g" timeout 60 $E -- -b 25M -e 25M --buckets 16 $B \
      --json "$OUT/buckets_graphs$g.json"
  done
  grep -E "^(tests/|FAILED)|passed|failed|pytest exit" "$OUT/gpu_tests.log" | sed 's/ *\[ *[0-9]*%\]//' | tail -12
  logshow capped_graphs256 capped_graphs0 buckets_graphs256 buckets_graphs0 ;;
apps)
  RINGREDUCE_GRAPHS=256 logrun host_25m timeout 60 $E -- -b 25M -e 25M $B --host-profile 25M
  for g in 256 0; do
    RINGREDUCE_GRAPHS=$g logrun "buckets_graphs$g" timeout 60 $E -- -b 25M -e 25M --buckets 16 $B \
      --json "$OUT/buckets_graphs$g.json"
    RINGREDUCE_GRAPHS=$g logrun "dlrm_graphs$g" timeout 130 $E --script benchmarks/dlrm.py -- \
      --modes nccl,hook,backend --steps 20 --warmup 5 --json "$OUT/dlrm_graphs$g.json"
  done
  RINGREDUCE_GRAPHS=256 logrun soak timeout 100 $E --mode loopback --script benchmarks/soak.py -- --calls "${SOAK_CALLS:-1500}" \
    --min-bytes 65536 --json "$OUT/soak.json"
  grep -h "host time" "$OUT/host_25m.txt"
  logshow buckets_graphs256 buckets_graphs0 dlrm_graphs256 dlrm_graphs0 soak ;;
esac
