#!/usr/bin/env bash
# Session 28, device call 5: single calls with the slice size by call size against the
# old fixed 4 MiB slices, back to back in one call (capped 10 Gbit/s 2x2, 2-32 MiB, each
# run against NCCL and the two-level composition in its own processes, every element
# checked); then test_gpu.py at 2x2 under MPS with the new default (DDP hook and backend
# against plain DDP among them).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r52"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
E="python3 benchmarks/emulate.py --physical-gpus 1"
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 330 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
B="-b 2M -e 32M -f 2 -n 3 -w 1 -r 3 -c 1"
run bench_new 60 env RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- $B
run bench_old 60 env RINGREDUCE_TIMEOUT=60 RINGREDUCE_SLICE_BYTES=4194304 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- $B
run bench_new2 60 env RINGREDUCE_TIMEOUT=60 $E --machines 2 --gpus-per-machine 2 --link-cap 10gbit -- $B
run gpu_2x2 180 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_gpu.py -p no:cacheprovider -v -rs -k "not fault"
cat "$X/status.txt"
for f in bench_new bench_old bench_new2; do echo "== $f"; grep -E "^ +[0-9]+ +float" "$X/$f.log" | awk '{print $1, "time", $5, "host", $6, "wrong", $9, "ratio", $20, "2lvl", $21, "eff", $22}'; done
echo "== gpu_2x2"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED" "$X/gpu_2x2.log" | cut -c1-160 | tail -12
tar -czf "$OUT/r52_logs.tar.gz" -C "$X" . && rm -rf "$X"
