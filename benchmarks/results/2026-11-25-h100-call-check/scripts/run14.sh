#!/usr/bin/env bash
# Session 24, device call 14: issue 15 item 6 (4x2 capped, non-blocking communicators,
# 256 MiB) three times with stacks on, then the native issuer's exact sweep at 4x2.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
X="$OUT/r14"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + 30)) -gt 530 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
for i in 1 2 3; do
  run item6_try$i 60 env RINGREDUCE_NCCL_BLOCKING=0 PYTHONFAULTHANDLER=1 NCCL_DEBUG=WARN \
    $E --machines 4 --gpus-per-machine 2 --link-cap 10gbit -- -b 256M -e 256M -f 4 -n 3 -w 1 -r 3 -c 1
done
run native_sweep_4x2 360 python3 benchmarks/emulate.py --mps-only -- env RINGREDUCE_GPU_TOPOLOGIES=4x2 RR_MPS=1 \
  python3 -m pytest tests/test_native_cuda.py -k "sweep and 4x2" -x -s -p no:cacheprovider -v -rs --durations=5
cat "$X/status.txt"
for i in 1 2 3; do echo "== item6_try$i"; grep -E "^ +[0-9]+ |Fatal|Segmentation|illegal|Connection closed|exit|Thread 0x|File " "$X/item6_try$i.log" | cut -c1-180 | head -14; done
echo "== native_sweep_4x2"; grep -hE "PASSED|FAILED|ERROR|^E  |[0-9]+ (passed|failed)|s call|still running" "$X/native_sweep_4x2.log" | cut -c1-200 | head -16
tar -czf "$OUT/r14_logs.tar.gz" -C "$X" . && rm -rf "$X"
