#!/usr/bin/env bash
# Session 32, device call 8, on the final code: test_gpu.py at 2x2 (every route exact,
# wire format, graphs, DDP hook and backend) and all of test_native_cuda.py at 2x2 but
# the killed peer (run 72 ran it), both under MPS.
set -u
cd "$(dirname "$0")/../../../.."
. benchmarks/gpu_env.sh
X="$OUT/r79"; mkdir -p "$X"
{ echo "commit ${RR_COMMIT:-?}"; nvidia-smi -L; date -u; python3 -m ringreduce.info; } > "$X/info.txt" 2>&1
M="python3 benchmarks/emulate.py --mps-only -- env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 RINGREDUCE_TIMEOUT=30"
timeout -k 10 200 $M python3 -m pytest tests/test_gpu.py -p no:cacheprovider -v -rs -k "not fault" > "$X/gpu_2x2.log" 2>&1; echo "test_gpu exit $?"
timeout -k 10 200 $M python3 -m pytest tests/test_native_cuda.py -p no:cacheprovider -v -rs -k "not killed" > "$X/native_2x2.log" 2>&1; echo "test_native_cuda exit $?"
for f in gpu_2x2 native_2x2; do echo "== $f"; grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed)|^E  " "$X/$f.log" | cut -c1-160 | tail -8; done
tar -czf "$OUT/r79_logs.tar.gz" -C "$X" . && rm -rf "$X"
