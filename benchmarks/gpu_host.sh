#!/usr/bin/env bash
# Blocking against non-blocking NCCL communicators for traffic (Config.nccl_blocking,
# RINGREDUCE_NCCL_BLOCKING) on a one-GPU machine, as 2 virtual machines x 1 GPU: the
# GPU fault tests, host time per 25 MiB call (T6) with a profile of where it goes, and
# 16 back-to-back 25 MiB buckets capped at 20 Gbit/s, in both modes. Carry .whl and
# .iproute. Summary last; full logs in $OUT.   bash benchmarks/gpu_host.sh
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1"
for b in ${MODES:-1 0}; do
  RINGREDUCE_NCCL_BLOCKING=$b timeout 200 python3 -m pytest -m gpu -p no:cacheprovider -v -rs \
    tests/test_gpu_faults.py > "$OUT/faults_blocking$b.log" 2>&1
  echo "faults blocking=$b exit $?"
  RINGREDUCE_NCCL_BLOCKING=$b logrun "host_blocking$b" timeout 90 $E --mode loopback -- \
    -b 25M -e 25M -n 5 -w 2 --host-profile 25M
  RINGREDUCE_NCCL_BLOCKING=$b logrun "buckets_blocking$b" timeout 60 $E -- -b 25M -e 25M \
    --buckets 16 $B --json "$OUT/buckets_blocking$b.json"
done
for b in ${MODES:-1 0}; do
  grep -hE "^tests/|passed|failed" "$OUT/faults_blocking$b.log" | sed 's/ *\[ *[0-9]*%\]//' | tail -4
  echo "== host_blocking$b"; grep -E "^# (host time|profile|  )" "$OUT/host_blocking$b.txt" | head -18
done
logshow buckets_blocking1 buckets_blocking0
