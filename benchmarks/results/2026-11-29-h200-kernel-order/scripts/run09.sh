. benchmarks/gpu_env.sh
for r in 1 2; do for t in kq kb4; do
  for m in 64 4; do
    echo "==== $t $m MiB" >> $OUT/benches.txt
    (cd $t && PYTHONPATH=/tmp/site:$PWD python3 benchmarks/quant_bench.py --mib $m int4 >> $OUT/benches.txt 2>&1)
  done
done; done
grep -E "====|quantize  int4      off" $OUT/benches.txt
