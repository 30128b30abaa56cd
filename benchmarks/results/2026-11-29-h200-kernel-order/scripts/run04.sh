. benchmarks/gpu_env.sh
for t in main kq; do d=.; [ $t = kq ] && d=kq; echo "== $t regs"; (cd $d && cp ../regs.py . 2>/dev/null; PYTHONPATH=/tmp/site:$PWD python3 regs.py 2>&1 | tail -4); done
(cd kq && PYTHONPATH=/tmp/site:$PWD timeout 200 python3 -m pytest -m gpu tests/test_gpu_quant_kernels.py -p no:cacheprovider -q > $OUT/kq-kernel-tests.txt 2>&1; tail -1 $OUT/kq-kernel-tests.txt)
for r in 1 2; do for t in main kq; do
  d=.; [ $t = kq ] && d=kq
  for m in 64 4; do
    echo "==== $t $m MiB" >> $OUT/benches.txt
    (cd $d && PYTHONPATH=/tmp/site:$PWD python3 benchmarks/quant_bench.py --mib $m int4 >> $OUT/benches.txt 2>&1)
  done
done; done
grep -E "====|quantize  int4      off|dequantize" $OUT/benches.txt
