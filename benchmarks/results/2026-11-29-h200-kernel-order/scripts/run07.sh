cd kq && . benchmarks/gpu_env.sh
SKIP=wire_study bash benchmarks/gpu.sh wire > $OUT/wire.txt 2>&1; tail -32 $OUT/wire.txt
CAP=loopback SKIP=textlm_fsdp TEXTLM_REF= TEXTLM_SEEDS=0 TEXTLM_WIRES=int4 bash benchmarks/gpu.sh textlm > $OUT/textlm.txt 2>&1; grep -E "seed 0:|exit" $OUT/textlm.txt
