set -u
. benchmarks/gpu_env.sh
timeout 420 python3 -m pytest -m gpu -p no:cacheprovider -v -rs -x tests/test_gpu.py -k "replay or graph or captures or ddp or sync" > "$OUT/gpu_tests.log" 2>&1
echo "tests exit $?"; grep -E "^tests/|passed|failed" "$OUT/gpu_tests.log" | sed 's/ *\[ *[0-9]*%\]//' | tail -14
grep -E "Error|error|assert" "$OUT/gpu_tests.log" | head -10
E="python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 --gpus-per-machine 1"
for g in 256 0; do
  RINGREDUCE_GRAPHS=$g logrun buckets_graphs$g timeout 100 $E -- -b 25M -e 25M --buckets 16 $B --json "$OUT/buckets_graphs$g.json"
done
RINGREDUCE_GRAPHS=256 logrun host_graphs256 timeout 90 $E --mode loopback -- -b 25M -e 25M -n 5 -w 2 --host-profile 25M
logshow buckets_graphs256 buckets_graphs0
grep -E "^# host time" "$OUT/host_graphs256.txt"
