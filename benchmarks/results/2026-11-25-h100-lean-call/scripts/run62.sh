#!/usr/bin/env bash
# Session 30, device call 3: the lean completer and call path against the session's
# starting commit (9ecbd87, carried as .whl/baseline-9ecbd87.tar.gz, built here), host
# time per 25 MiB call at 2x2 loopback, interleaved base/new/base/new; caller_path.py on
# the new tree; then the native issuers' GPU tests at 2x2 (Futures, issue order, two
# communicators, the exact sweep; not the Python issuer's) and the killed peer (2x1).
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r62"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
NEW=$PWD; BASE=/tmp/base
mkdir -p $BASE && tar -xzf .whl/baseline-9ecbd87.tar.gz -C $BASE
(cd $BASE && python3 setup.py -q build_ext --inplace > "$X/base_build.log" 2>&1) || echo "base build failed"
S=benchmarks/results/2026-11-25-h100-lean-call/scripts
START=$SECONDS
run() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  if [ $((SECONDS - START + limit)) -gt 470 ]; then echo "$name skipped (budget)" | tee -a "$X/status.txt"; return; fi
  timeout -k 10 "$limit" "$@" > "$X/$name.log" 2>&1; echo "$name exit $? in $((SECONDS-t0)) s" | tee -a "$X/status.txt"; }
host() { # $1: tree
  (cd $1 && PYTHONPATH=/tmp/site:$1 RINGREDUCE_TIMEOUT=30 python3 benchmarks/emulate.py --physical-gpus 1 \
    --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/native_host.py -- \
    --size 25M --calls 32 --ways native,native-async --profile "") ; }
for i in 1 2; do run host_base$i 60 host $BASE; run host_new$i 60 host $NEW; done
run path 60 env RINGREDUCE_TIMEOUT=30 python3 benchmarks/emulate.py --physical-gpus 1 --machines 2 \
  --gpus-per-machine 2 --mode loopback --script $S/caller_path.py -- --size 25M
run native_2x2 170 python3 benchmarks/emulate.py --mps-only -- \
  env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30 \
  python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k "not killed and not python"
run killed 90 env RINGREDUCE_TIMEOUT=30 python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k killed
cat "$X/status.txt"
for f in host_base1 host_new1 host_base2 host_new2; do echo "== $f"; grep -E "^(nccl|native)[/0-9A-Za-z-]* (sync|async)|Error|wrong" "$X/$f.log" | cut -c1-130 | tail -6; done
echo "== path"; grep -E "^(way|nccl|rr) |^#   " "$X/path.log" | cut -c1-100 | head -22
for f in native_2x2 killed; do echo "== $f"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|PASSED|FAILED" "$X/$f.log" | cut -c1-150 | tail -12; done
tar -czf "$OUT/r62_logs.tar.gz" -C "$X" . && rm -rf "$X"
