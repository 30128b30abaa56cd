#!/usr/bin/env bash
# Session 31, device call 3: diffuse gathered (one in-place all-gather on the rail
# communicator) against diffuse by sends and receives, in the same processes
# (native_host.py ways native and native/p2p), the order alternating: at 4x2 loopback
# (four machines: 3 sends and 3 receives a slice against one all-gather) four times,
# at 2x2 twice; then the 146-bucket transformer in DDP, capped 2x2, hook on the default
# issuer, gathered and p2p, one after the other (each against NCCL in its own run).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r69"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 500 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
E="python3 benchmarks/emulate.py --physical-gpus 1"
H="--mode loopback --script benchmarks/native_host.py -- --size 25M --calls 32 --profile"
for i in 1 2; do
  run g4x2_a$i 70 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $H "" --ways native,native/p2p
  run g4x2_b$i 70 env RINGREDUCE_TIMEOUT=30 $E --machines 4 --gpus-per-machine 2 $H "" --ways native/p2p,native
done
run g2x2_a 40 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $H "" --ways native,native/p2p
run g2x2_b 40 env RINGREDUCE_TIMEOUT=30 $E --machines 2 --gpus-per-machine 2 $H "" --ways native/p2p,native
T="--script benchmarks/dlrm.py -- --modes nccl,hook --model transformer --layers 48 --bucket-mb 4 --steps 16 --warmup 4"
run tf_gather 80 env RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit $T
run tf_p2p 80 env RINGREDUCE_TIMEOUT=60 RINGREDUCE_DIFFUSE_GATHER=0 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit $T
cat "$X/status.txt"
for f in g4x2_a1 g4x2_b1 g4x2_a2 g4x2_b2 g2x2_a g2x2_b; do echo "== $f"
  grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async)|^# inside|^#   group_end|Error|wrong" "$X/$f.log" | cut -c1-130; done
for f in tf_gather tf_p2p; do echo "== $f"; grep -A3 -E "^mode " "$X/$f.log" | cut -c1-200; grep -hE "Error" "$X/$f.log" | head -3 | cut -c1-300; done
tar -czf "$OUT/r69_logs.tar.gz" -C "$X" . && rm -rf "$X"
