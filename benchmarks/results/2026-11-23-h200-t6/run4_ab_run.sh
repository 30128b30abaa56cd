#!/usr/bin/env bash
# A/B (not committed): replayed 25 MiB call host time, this tree (new) against ab_old/ (HEAD~1)
set -u
. benchmarks/gpu_env.sh
E="benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1 --mode loopback"
for i in 1 2 3; do
  for side in new old; do
    dir=.; [ $side = old ] && dir=ab_old
    (cd $dir && RINGREDUCE_GRAPHS=256 PYTHONPATH=/tmp/site:$PWD timeout 90 python3 $E -- -b 25M -e 25M -n 5 -w 2 --host-profile 25M) > "$OUT/ab_${side}_$i.txt" 2>&1
    echo "$side $i: $(grep -E '^# host time.*same tensor' "$OUT/ab_${side}_$i.txt" | sed 's/.*same tensor: //') | nccl $(grep -E '^# host time.*nccl' "$OUT/ab_${side}_$i.txt" | sed 's/.*nccl: //') | cprofile $(grep -A1 '^# same tensor' "$OUT/ab_${side}_$i.txt" | grep -o '[0-9.]* us/call under')"
  done
done
