cd kb4 && . benchmarks/gpu_env.sh
timeout 150 python3 -m pytest -m gpu tests/test_gpu_quant_kernels.py -p no:cacheprovider -q -x > $OUT/kernel-tests.txt 2>&1; rc=$?; tail -25 $OUT/kernel-tests.txt | grep -E "passed|failed|Error|assert" | head -8
[ $rc = 0 ] || exit 1
for r in 1 2; do
  echo "==== kb4 64 MiB all" >> $OUT/benches.txt; python3 benchmarks/quant_bench.py >> $OUT/benches.txt 2>&1
  echo "==== kq 64 MiB" >> $OUT/benches.txt; (cd ../kq && PYTHONPATH=/tmp/site:$PWD python3 benchmarks/quant_bench.py int4 >> $OUT/benches.txt 2>&1)
done
echo "==== kb4 4 MiB" >> $OUT/benches.txt; python3 benchmarks/quant_bench.py --mib 4 int4 >> $OUT/benches.txt 2>&1
grep -E "====|quantize  int4|dequantize  int4|quantize  int8" $OUT/benches.txt
timeout 200 python3 benchmarks/emulate.py --mps-only -- env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu_compressed.py -p no:cacheprovider -q > $OUT/compressed-tests.txt 2>&1; tail -1 $OUT/compressed-tests.txt
CAP=loopback SKIP=textlm_fsdp TEXTLM_REF= TEXTLM_SEEDS=0 TEXTLM_WIRES=int4 bash benchmarks/gpu.sh textlm > $OUT/textlm.txt 2>&1; grep -E "seed 0:|exit" $OUT/textlm.txt | tail -2
