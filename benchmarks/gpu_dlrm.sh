#!/usr/bin/env bash
# One device call: the DLRM benchmark (benchmarks/dlrm.py), all three modes in one
# process lifetime per run: capped 2 x 2 (virtual machines share the GPUs when fewer
# than 4), then one machine under torchrun (there ringreduce routes to NCCL's own
# all-reduce: hook and backend should match nccl). Tables, JSON and PNGs in $OUT.
set -u
. "$(dirname "$0")/gpu_env.sh"
E="python3 benchmarks/emulate.py --physical-gpus $NGPU --machines 2 --gpus-per-machine 2"
D="--modes nccl,hook,backend ${DLRM_ARGS:-}"
run() { local name=$1; shift; echo "=== $name: $*"; "$@" 2>&1 | grep -vE "Warning|warn|^W1|^\s*$"; }
{
  run dlrm_capped_2x2 $E --script benchmarks/dlrm.py -- $D \
    --json "$OUT/dlrm_capped_2x2.json" --plot "$OUT/dlrm_capped_2x2.png"
  run dlrm_one_machine python3 -m torch.distributed.run --standalone --nproc-per-node "$NGPU" \
    benchmarks/dlrm.py $D --json "$OUT/dlrm_one_machine.json" --plot "$OUT/dlrm_one_machine.png"
} 2>&1 | tee "$OUT/dlrm.log"
