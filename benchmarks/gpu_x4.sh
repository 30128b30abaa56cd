#!/usr/bin/env bash
# The 4-GPU measurements of issues 3, 4, 5 and 6, one device call per part (each fits
# the 10-minute limit): bash benchmarks/gpu_x4.sh perf|blocks|dlrm|soak
#   perf    T1 one machine 1x4 (4K-1G), T2/T5 capped 2x2 (4K-256M), T3 16 x 25M buckets
#           (and with CUDA-graph replay, plus its host time, T6),
#           T4 loopback 2x2 default and tuned sockets, T7 bf16 wire capped 2x2
#   blocks  reduce_scatter and all_gather, capped 2x2, against NCCL's own
#   dlrm    T9: DDP on NCCL vs hook vs backend, capped 2x2, loss curves
#   soak    10,000 random exact calls as 2x2, memory flat
# Tables last; full logs, JSON and plots in $OUT.
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus $NGPU --machines 2 --gpus-per-machine 2"
case "${1:-perf}" in
perf)
  logrun t1_one_machine torchrun --nproc-per-node "$NGPU" -m ringreduce.bench -b 4K -e 1G -f 4 $B \
    --json "$OUT/t1.json" --plot "$OUT/t1.png"
  logrun t2_capped $E -- -b 4K -e 256M -f 4 $B --host-profile 25M --json "$OUT/t2.json" --plot "$OUT/t2.png"
  logrun t3_buckets $E -- -b 25M -e 25M --buckets 16 $B --json "$OUT/t3.json"
  RINGREDUCE_GRAPHS=256 logrun t3_t6_graphs $E -- -b 25M -e 25M --buckets 16 $B --host-profile 25M \
    --json "$OUT/t3g.json"
  logrun t4_loopback $E --mode loopback -- -b 1M -e 256M -f 4 $B --json "$OUT/t4.json"
  logrun t4_loopback_tuned $E --mode loopback --nccl-tuned -- -b 1M -e 256M -f 4 $B --json "$OUT/t4t.json"
  RINGREDUCE_WIRE_DTYPE=bfloat16 logrun t7_wire_bf16 $E -- -b 16M -e 256M -f 4 $B --json "$OUT/t7.json"
  logshow t1_one_machine t2_capped t3_buckets t3_t6_graphs t4_loopback t4_loopback_tuned t7_wire_bf16 ;;
blocks)
  for c in reduce_scatter all_gather; do
    logrun "capped_$c" $E -- --collective "$c" -b 1M -e 256M -f 4 $B --json "$OUT/$c.json" --plot "$OUT/$c.png"
  done
  logshow capped_reduce_scatter capped_all_gather ;;
dlrm)
  logrun dlrm_capped $E --script benchmarks/dlrm.py -- --modes nccl,hook,backend \
    --json "$OUT/dlrm.json" --plot "$OUT/dlrm.png"
  logshow dlrm_capped ;;
soak)
  logrun soak $E --mode loopback --script benchmarks/soak.py -- --calls 10000 --min-bytes 65536 \
    --json "$OUT/soak.json"
  grep -E "^# soak|wrong_elements|FAILED" "$OUT/soak.txt" | cut -c1-300 | tail -8 ;;
*) echo "usage: $0 perf|blocks|dlrm|soak" >&2; exit 2 ;;
esac
