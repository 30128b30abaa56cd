#!/usr/bin/env bash
# One entry point for GPU runs, one suite per device call:
#
#   bash benchmarks/gpu.sh tests|perf|faithful|faults|soak|dlrm|train|fsdp|kernels|native|compressed|host|four|four_host|jobs|wire|textlm
#
#   tests    the GPU tests but the fault tests (pytest -m gpu -k "not fault"; TESTS_K) under
#            a private CUDA MPS daemon with
#            RINGREDUCE_GPU_TOPOLOGIES=2x1,2x2,4x2 RR_MPS=1 for them to read, then the torch
#            suite driver (python -m tests.torch_suite --device cuda; SUITE_K: a case regex)
#   perf     on >= 2 GPUs first the faithful capped 2x2 (1M-256M by 4x, 16 x 25M buckets) and
#            its bf16 wire (16M-256M), then NCCL alone under NCCL_ALGO=allreduce:tree and
#            allreduce:ring (bench --only-references --wire bfloat16: fp32 and bf16, one process
#            each, since NCCL reads NCCL_ALGO once); then the one-GPU setting (every rank on
#            GPU 0: intra-machine traffic as slow as the network): capped 10 Gbit/s 2x2, 4x1,
#            4x2, loopback 2x2, bf16 wire capped 2x2 (and 4x2, 4x1: on >= 2 GPUs only with
#            PERF_ONE_GPU_WIRE="2x2 4x2 4x1"); on one GPU the tree/ring runs go with the
#            capped 2x2. Every table against flat NCCL, two-level and, with the bf16 wire,
#            NCCL in bf16 (torch's bf16_compress_hook); the summary adds per row NCCL best
#            (the fastest algorithm, named) and the best reference.
#   faithful on >= 2 GPUs only, the faithful setting: per link (FAITHFUL_LINKS, default 10gbit
#            25gbit loopback) and topology (FAITHFUL_TOPOS, default 2x2 4x2) the fp32 sweep
#            16M-256M and 16 x 25M against NCCL default and two-level, NCCL alone under its
#            tree, on capped links NCCL with FAITHFUL_SOCKETS (4x4) socket threads x sockets
#            (default and tree), and one call per wire format (benchmarks/compressed.py);
#            the summary's NCCL best takes the fastest of them, named
#   faults   pytest -m gpu -k fault under MPS, then the capped link cut: 2x2 soak, machine
#            1's link set down after CUT_S seconds; every rank must end with
#            RingReduceError within RINGREDUCE_TIMEOUT
#   soak     SOAK_CALLS random exact calls at 2x2 (loopback), memory flat
#   dlrm     DDP on NCCL vs the hook vs the backend, capped 2x2; the transformer (146
#            buckets a step) NCCL vs hook at 2x2; DLRM at 4x2 if time is left
#   train    DDP for TRAIN_STEPS (1000) steps, DLRM-style (--rows TRAIN_ROWS, 31250), on the
#            faithful 2x2 capped under NCCL's tree (its best at two machines), against
#            one loss target (TRAIN_TARGET; default: dlrm.py's): one process set per
#            TRAIN_SETS entry, "name:wire:modes[:seed:seeds[:topology[:rows[:steps]]]]"
#            (the wire reaches the hook as RINGREDUCE_WIRE, empty: none, the hook-<wire>
#            modes carry their own; the topology MxD, default 2x2);
#            15 s before a set's limit every rank prints its threads' stacks (kill -USR1),
#            so a set that does not end says where it stood; TRAIN_ALGO replaces the
#            tree (empty: NCCL's own choice), TRAIN_EXTRA adds dlrm.py arguments
#   fsdp     FSDP2 training of the transformer (issue 38, benchmarks/fsdp.py) on the faithful
#            capped 2x2: plain FSDP2 and native HSDP on NCCL against ringreduce's
#            reduce-scatter and custom-HSDP replicate all-reduce, fp32 and int8, fsdp-nccl at
#            FSDP_SEEDS (3) seeds; then the NCCL modes alone under NCCL_ALGO=allreduce:tree
#            (one process set each: NCCL reads it once); the same at 4x2 (one seed) if the
#            budget is left; the summary per topology each NCCL mode at its faster algorithm
#            (fsdp.py --merge) and every mode's ratio to those
#   kernels  the kernel tests, benchmarks/kernel_bench.py, benchmarks/kernel_occupancy.py
#   compressed  the quantized rail wires (issue 37) on the faithful 2x2 (>= 2 GPUs): their
#            GPU tests with the construction and integration tests at 2x2, then one
#            all-reduce per wire format (benchmarks/compressed.py) capped at 10 Gbit/s
#            against NCCL fp32 under its default and its tree algorithm and torch's bf16
#            hook, then over loopback
#   host     what a call costs the host (issue 36), on the faithful 2x2 capped (>= 2 GPUs):
#            the GPU tests at 2x2 (test_gpu.py, test_native_cuda.py, test_gpu_compressed.py,
#            HOST_TEST_FILES);
#            benchmarks/native_host.py at 25 MiB and 4 MiB: the probe-chosen plan (native
#            issuer: replayed) against one slice (native and Python issuers), the pipeline,
#            the compressed route (int8, native and Python) and NCCL's own call, with a
#            cProfile (HOST_PROFILE) and HOST_EXTRA's arguments (e.g. --pieces); DDP with
#            torch's NCCL allreduce_hook against ringreduce's hook (HOST_DDP_FLAGS; hook
#            times per call): DLRM (25 MiB buckets) and the transformer (4 MiB buckets,
#            HOST_TRANSFORMER_MODES), NCCL's tree; DLRM with the int8 hook against torch's
#            bf16 hook
#   jobs     training jobs as people run them (issue 49), tests/test_gpu_jobs.py at 2x2 (2x1 on
#            one GPU) under MPS over NCCL: two DDP models on one int8 Communicator against
#            one each (bit for bit), int8 DDP (across a bucket rebuild) and FSDP2 runs
#            checkpointed and resumed in new processes against the uninterrupted ones (bit
#            for bit), and the "ringreduce" backend exact under RINGREDUCE_WIRE=int8
#   wire     the rotated 4-bit wire (issue 50), one GPU: the quantize/dequantize kernel tests
#            (bit for bit against quant.py's torch ops), benchmarks/quant_bench.py (each
#            kernel's bandwidth / a device copy's) and benchmarks/wire_study.py on the GPU
#            (one call's error on real gradients at the training runs' model sizes; torch ops,
#            which the kernel tests hold bit-identical to the kernels: no compile per variant)
#   textlm   the byte-level language model (benchmarks/text_lm.py, 6 x 512: 19.2 M parameters)
#            on the faithful capped 2x2 under NCCL's tree (TEXTLM_ALGO; empty: NCCL's choice),
#            TEXTLM_STEPS (1000) steps a run: DDP fp32 at TEXTLM_SEEDS (0,1,2), then TEXTLM_WIRES
#            (int4,int8,bf16-hook) at the first seed, one process set (textlm_ddp;
#            TEXTLM_REF= leaves fp32 out: a second set of wires beside a run that has it);
#            then FSDP2/HSDP, TEXTLM_FSDP_MODES (hsdp-nccl,hsdp-int4,hsdp-int8,fsdp-nccl,
#            fsdp-int4,fsdp-int8) at the first seed (textlm_fsdp, its own limit, cut by the
#            budget: each run's numbers are kept as it ends); last, text_lm.py --merge's table
#            of both and of TEXTLM_MERGE (JSON files of earlier runs, e.g. the DDP fp32 seeds
#            for an FSDP-only call: SKIP=textlm_ddp)
#   native   the native issuer (issue 18): benchmarks/native_host.py (host time, CPU and wall
#            per 25 MiB call, native at several slice sizes vs Python issuer vs NCCL, same
#            run) at 2x2 loopback and capped and 4x2 loopback under MPS;
#            tests/test_native*.py at 2x1 and 2x2 under MPS, the killed peer without MPS
#   four     the four-GPU kind (nvidia-h200-x4; refuses fewer than 4 GPUs), the rows that matter
#            most, in order until BUDGET_S: the faithful 2x2 with one rank per GPU (no MPS),
#            2x4 and 4x2 (two ranks a GPU, MPS), capped at 10 Gbit/s, fp32 FOUR_SIZES (4M-256M
#            by 4x) and 16 x 25M against NCCL default and two-level, then NCCL alone under
#            FOUR_ALGOS (tree ring, one process set each); one call per wire format
#            (benchmarks/compressed.py: int8, fp8, int4, bf16 against NCCL fp32 and torch's
#            bf16 hook) at 2x2 and 2x4; then 2x2 at 25 Gbit/s and over loopback. The summary
#            merges every run's rows: ratio per row against the best reference (NCCL best
#            of default/tree/ring, two-level)
#   four_host  the four-GPU kind's second call: the probe's GPU tests at 2x2
#            (tests/test_gpu_probe.py, test_gpu.py's exact sweep); DDP's hook against torch's
#            allreduce_hook, median host time at 25 MiB and 4 MiB, fp32 and int8, in turns
#            (native_host.py --hooks) on the faithful 2x2 capped; 4x4 (four ranks a GPU) capped
#            with its references; the wires at 4x2; then 2x4 and 4x2 at 25 Gbit/s and loopback
#
# Each suite fits one 9-minute call on one H200 (16 cores): steps run in order, each
# under its own timeout, and a step that would start past BUDGET_S (default 500 s) is
# skipped and listed as such (SKIP='name|name' skips named steps). Each writes $OUT/<suite>/ with at most 4 files:
# summary.txt (also printed last), <suite>.json and <suite>.png where the suite has
# tables, and logs.tar.gz (every full log, JSON and plot). Carry .whl/ (the nccl4py
# wheel) and .iproute/ (benchmarks/fetch_iproute.sh). No GPU setting is changed.
set -u
cd "$(dirname "$0")/.."
. benchmarks/gpu_env.sh
suite=${1:-}
case "$suite" in tests|perf|faithful|faults|soak|dlrm|train|fsdp|kernels|native|compressed|host|four|four_host|jobs|wire|textlm) ;;
  *) echo "usage: bash benchmarks/gpu.sh tests|perf|faithful|faults|soak|dlrm|train|fsdp|kernels|native|compressed|host|four|four_host|jobs|wire|textlm" >&2
     exit 2 ;;
esac
if [[ "$suite" == four* && "$NGPU" -lt 4 ]]; then
  echo "gpu.sh $suite: needs 4 GPUs (nvidia-h200-x4), found $NGPU; the faithful suite runs on 2" >&2
  exit 2
fi
R="$OUT/$suite"; W="$R/work"; rm -rf "$R"; mkdir -p "$W"
# four*: 460 s, the native build (gpu_env.sh, before the clock starts) and the tar after
# it inside one 9-minute call on a fresh machine
BUDGET_S=${BUDGET_S:-$([[ "$suite" == four* ]] && echo 460 || echo 500)}; START=$SECONDS
# The one-GPU setting everywhere (every rank on GPU 0 under MPS), so results compare
# across machines; the faithful 2x2 spreads a machine's ranks over the GPUs there are.
E="python3 benchmarks/emulate.py --physical-gpus 1"
E_ALL="python3 benchmarks/emulate.py --physical-gpus $NGPU"
# CAP: a rate for --link-cap (default 10gbit), or loopback (no cap: runs judged by loss)
if [ "${CAP:-}" = loopback ]; then CAP="--mode loopback"; else CAP="--link-cap ${CAP:-10gbit}"; fi
# -n 3 timed iterations, 1 warm-up, 3 rounds, 1 exact check per round and implementation:
# at 4x2, 256 MiB costs ~0.8 s per ringreduce call capped at 10 Gbit/s, and each size runs
# 13 calls of each of 3 implementations; this keeps perf's runs inside 9 minutes (one GPU:
# seven runs, 268 s on an H100 in run 19, plus two NCCL-only runs of ~30 s; two GPUs: four
# faithful runs, ~130 s estimated, then five one-GPU runs, ~210 s).
B=${BENCH_FLAGS:--n 3 -w 1 -r 3 -c 1}
SIZES=${PERF_SIZES:--b 1M -e 256M -f 4}; WIRE_SIZES=${WIRE_SIZES:--b 16M -e 256M -f 4}
BUCKETS=${PERF_BUCKETS:---extra-buckets 16}  # 16 x 25 MiB, DDP's bucket size
PLOT=(); python3 -c "import matplotlib" 2>/dev/null && PLOT=(--plot)
GPU_TESTS_ENV="RINGREDUCE_GPU_TOPOLOGIES=${RINGREDUCE_GPU_TOPOLOGIES:-2x1,2x2,4x2} RR_MPS=1"
STATUS="$W/status.txt"; : > "$STATUS"

# step NAME TIMEOUT_S CMD...: CMD's output into $W/NAME.log (headed by the command);
# its exit status (124: timed out) into status.txt; skipped when the budget is spent.
step() {
  local name=$1 limit=$2; shift 2
  local left=$((BUDGET_S - (SECONDS - START)))
  if [[ -n "${SKIP:-}" && "$name" =~ ^(${SKIP})$ ]]; then echo "$name: skipped (SKIP)" | tee -a "$STATUS"; return; fi
  if [ "$left" -lt 30 ]; then echo "$name: skipped (budget spent)" | tee -a "$STATUS"; return; fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo "### $name ($(date -u +%T), limit ${limit}s): $*" > "$W/$name.log"
  local t0=$SECONDS
  timeout -k 20 "$limit" "$@" >> "$W/$name.log" 2>&1
  local rc=$?
  echo "$name: exit $rc in $((SECONDS - t0)) s" | tee -a "$STATUS"
}

bench() {  # bench NAME TIMEOUT_S EMULATE_ARGS... -- BENCH_ARGS...: with JSON and plot
  local name=$1 limit=$2; shift 2
  step "$name" "$limit" ${EMU:-$E} "$@" --json "$W/$name.json" ${PLOT[@]+"${PLOT[@]}" "$W/$name.png"}
}

pytest_summary() {  # the result lines of a pytest log
  grep -hE "^(FAILED|ERROR)|[0-9]+ (passed|failed|skipped|errors?)" "$@" | tail -20
}

# four_rows LINK TOPO...: per topology (MxD) the faithful fp32 sweep on every GPU there
# is (E_ALL: one rank per GPU where M*D <= NGPU, else MPS), ringreduce against NCCL
# default and two-level, then NCCL alone under each FOUR_ALGOS algorithm (NCCL reads
# NCCL_ALGO once per process); LINK: a rate for --link-cap, or loopback.
four_rows() {
  local link=$1; shift
  local L=(--link-cap "$link"); [ "$link" = loopback ] && L=(--mode loopback)
  local FS=${FOUR_SIZES:--b 4M -e 256M -f 4} FB=${FOUR_FLAGS:--n 3 -w 1 -r 2 -c 1}
  for topo in "$@"; do
    local T=(--machines "${topo%x*}" --gpus-per-machine "${topo#*x}") n="f4_${topo}_$link"
    EMU=$E_ALL bench "$n" 150 "${T[@]}" "${L[@]}" -- $FS $FB $BUCKETS
    for algo in ${FOUR_ALGOS:-tree ring}; do
      step "${n}_$algo" 100 env NCCL_ALGO="allreduce:$algo" $E_ALL "${T[@]}" "${L[@]}" -- \
        $FS $FB $BUCKETS --only-references --json "$W/${n}_$algo.json"
    done
  done
}

# four_wires LINK TOPO: one AVG call per wire format against NCCL fp32 and torch's bf16 hook
four_wires() {
  local L=(--link-cap "$1"); [ "$1" = loopback ] && L=(--mode loopback)
  step "f4_$2_$1_wires" 120 $E_ALL --machines "${2%x*}" --gpus-per-machine "${2#*x}" \
    "${L[@]}" --script benchmarks/compressed.py -- --sizes "${COMPRESSED_SIZES:-16M,64M}" \
    --rounds 3 --json "$W/f4_$2_$1_wires.json"
}

# four_summary: each wire run's table, the probe's choice per run, then (last) the merged
# table of every f4_ run: ratio per row against the best reference
four_summary() {
  for f in "$W"/f4_*_wires.log; do [ -f "$f" ] || continue; echo "== $(basename "$f" .log)"
    grep -E "^#|^ +[0-9]+ " "$f" | tail -14; done
  echo "== the construction probe's choice per run (describe())"
  python3 - "$W" <<'PY'
import pathlib, re, sys
for log in sorted(pathlib.Path(sys.argv[1]).glob("f4_*.log")):
    if re.search(r"_(tree|ring|wires)$", log.stem):
        continue
    for line in log.read_text(errors="replace").splitlines():
        m = re.search(r"^# ringreduce: .*?((?:below \S+ MiB: )?plan=.*?), slice_bytes=", line)
        if m:
            print(f"{log.stem}: {m.group(1)}")
            break
PY
  python3 -m ringreduce.benchmark.summary $(ls "$W"/f4_*.json | grep -v _wires) \
    --json "$R/$suite.json" ${PLOT[@]+"${PLOT[@]}" "$R/$suite.png"} 2>&1
}

case "$suite" in
tests)
  # Correctness at every topology; the fault tests at 2x1 only (each waits out a
  # deadline): the faults suite runs them at every topology, with the capped link cut.
  step info 30 python3 -m ringreduce.info
  step gpu_tests ${TESTS_S:-330} python3 benchmarks/emulate.py --mps-only -- env $GPU_TESTS_ENV \
    python3 -m pytest -m gpu tests -k "${TESTS_K-not fault}" -p no:cacheprovider -v -rs -s --durations=15
  step gpu_faults_2x1 ${FAULTS_S:-150} python3 benchmarks/emulate.py --mps-only -- \
    env RINGREDUCE_GPU_TOPOLOGIES=2x1 RR_MPS=1 python3 -m pytest -m gpu tests -k fault \
    -p no:cacheprovider -v -rs -s
  # The driver's own --time-limit ends a little before the step's, so it still prints
  # (and keeps) the cases that finished; the step's timeout would kill it silently.
  suite_s=${SUITE_S:-150}; left=$((BUDGET_S - (SECONDS - START) - 20))
  [ "$left" -lt "$suite_s" ] && suite_s=$left
  step torch_suite "$suite_s" python3 benchmarks/emulate.py --mps-only -- \
    python3 -m tests.torch_suite --device cuda --jobs ${SUITE_JOBS:-4} --logs "$W/torch_suite" \
    ${SUITE_K:+-k "$SUITE_K"} --time-limit $((suite_s > 70 ? suite_s - 30 : 40))
  { pytest_summary "$W/gpu_tests.log" "$W/gpu_faults_2x1.log"
    grep -h "^\[fault" "$W/gpu_faults_2x1.log"
    [ -f "$W/torch_suite.log" ] && tail -15 "$W/torch_suite.log"; } > "$W/summary_body.txt" ;;
perf)
  # Shorter than a step's limit: a stall (run 58's capped 4x2 stood before its first call
  # for 150 s, results 2026-11-25-h100-one-program) ends as an error naming its place.
  export RINGREDUCE_TIMEOUT=${RINGREDUCE_TIMEOUT:-90}
  # nccl_algos NAME EMULATE...: NCCL alone under each PERF_ALGOS algorithm, fp32 and bf16 at
  # every size of the sweep and the buckets row, for the summary's NCCL best (~30 s each).
  nccl_algos() {
    local name=$1; shift
    for algo in ${PERF_ALGOS:-tree ring}; do
      step "${name}_nccl_$algo" 90 env NCCL_ALGO="allreduce:$algo" "$@" $CAP -- $SIZES $B \
        $BUCKETS --wire bfloat16 --only-references --json "$W/${name}_nccl_$algo.json"
    done
  }
  one_gpu_wire=${PERF_ONE_GPU_WIRE:-2x2 4x2 4x1}
  if [ "$NGPU" -ge 2 ]; then  # a machine's two ranks on two GPUs: NVLink inside, NCCL sees 2 hosts
    EMU=$E_ALL bench faithful_2x2 120 --machines 2 --gpus-per-machine 2 $CAP -- $SIZES $B $BUCKETS
    EMU=$E_ALL bench faithful_wire_bf16_2x2 90 --machines 2 --gpus-per-machine 2 $CAP -- \
      $WIRE_SIZES $B --wire bfloat16
    nccl_algos faithful_2x2 $E_ALL --machines 2 --gpus-per-machine 2
    one_gpu_wire=${PERF_ONE_GPU_WIRE:-2x2}  # the budget's share for the faithful runs
  fi
  bench capped_2x2 120 --machines 2 --gpus-per-machine 2 $CAP -- $SIZES $B $BUCKETS
  [ "$NGPU" -ge 2 ] || nccl_algos capped_2x2 $E --machines 2 --gpus-per-machine 2
  bench capped_4x1 120 --machines 4 --gpus-per-machine 1 $CAP -- $SIZES $B $BUCKETS
  bench capped_4x2 150 --machines 4 --gpus-per-machine 2 $CAP -- $SIZES $B $BUCKETS
  bench loopback_2x2 90 --machines 2 --gpus-per-machine 2 --mode loopback -- $SIZES $B $BUCKETS
  for topo in $one_gpu_wire; do
    bench "wire_bf16_$topo" 90 --machines "${topo%x*}" --gpus-per-machine "${topo#*x}" $CAP -- \
      $WIRE_SIZES $B --wire bfloat16
  done
  python3 -m ringreduce.benchmark.summary "$W"/*.json --json "$R/perf.json" \
    ${PLOT[@]+"${PLOT[@]}" "$R/perf.png"} > "$W/summary_body.txt" 2>&1 ;;
faithful)
  # The faithful setting only (>= 2 GPUs: a virtual machine's ranks on the GPUs there are,
  # NVLink inside, MPS where virtual machines share GPUs), per link of FAITHFUL_LINKS and
  # topology of FAITHFUL_TOPOS: the fp32 sweep (ringreduce, NCCL default, two-level), NCCL
  # alone under its tree, on capped links NCCL alone with its socket transport tuned as a
  # TCP user would (NCCL_SOCKET_NTHREADS x NCCL_NSOCKS_PERTHREAD = FAITHFUL_SOCKETS), and
  # one AVG call per wire format (benchmarks/compressed.py: NCCL fp32, torch's bf16 hook).
  export RINGREDUCE_TIMEOUT=${RINGREDUCE_TIMEOUT:-90}
  FS=${FAITHFUL_SIZES:--b 16M -e 256M -f 4}; FB=${FAITHFUL_FLAGS:--n 3 -w 1 -r 2 -c 1}
  socks=${FAITHFUL_SOCKETS:-4x4}
  for link in ${FAITHFUL_LINKS:-10gbit 25gbit loopback}; do
    L=(--link-cap "$link"); [ "$link" = loopback ] && L=(--mode loopback)
    for topo in ${FAITHFUL_TOPOS:-2x2 4x2}; do
      T=(--machines "${topo%x*}" --gpus-per-machine "${topo#*x}"); n="${topo}_$link"
      EMU=$E_ALL bench "f_$n" 150 "${T[@]}" "${L[@]}" -- $FS $FB $BUCKETS
      step "f_${n}_tree" 100 env NCCL_ALGO=allreduce:tree $E_ALL "${T[@]}" "${L[@]}" -- \
        $FS $FB $BUCKETS --only-references --json "$W/f_${n}_tree.json"
      if [ "$link" != loopback ] && [ -n "$socks" ]; then
        for algo in default tree; do
          A=(); [ "$algo" = tree ] && A=(NCCL_ALGO=allreduce:tree)
          step "f_${n}_sockets_$algo" 100 env ${A[@]+"${A[@]}"} NCCL_SOCKET_NTHREADS="${socks%x*}" \
            NCCL_NSOCKS_PERTHREAD="${socks#*x}" $E_ALL "${T[@]}" "${L[@]}" -- $FS $FB $BUCKETS \
            --only-references --json "$W/f_${n}_sockets_$algo.json"
        done
      fi
      [ -n "${FAITHFUL_WIRES-1}" ] && step "f_${n}_wires" 120 $E_ALL "${T[@]}" "${L[@]}" \
        --script benchmarks/compressed.py -- --sizes "${COMPRESSED_SIZES:-16M,64M}" \
        --rounds 3 --json "$W/f_${n}_wires.json"
    done
  done
  { python3 -m ringreduce.benchmark.summary $(ls "$W"/f_*.json | grep -v _wires) \
      --json "$R/faithful.json" \
      ${PLOT[@]+"${PLOT[@]}" "$R/faithful.png"} 2>&1
    for f in "$W"/f_*_wires.log; do [ -f "$f" ] || continue; echo "== $(basename "$f" .log)"
      grep -E "^#|^ +[0-9]+ " "$f" | tail -14; done; } > "$W/summary_body.txt" ;;
faults)
  step gpu_faults 240 python3 benchmarks/emulate.py --mps-only -- env $GPU_TESTS_ENV \
    python3 -m pytest -m gpu tests -k fault -p no:cacheprovider -v -rs
  # A client killed under MPS takes the MPS server down for every client of the GPU, so
  # the tests that kill a peer (killed, or stopped and then killed; skipped above) run at
  # 2x1 without MPS: two ranks time-slice.
  step gpu_killed_2x1 150 python3 -m pytest -m gpu tests -k "killed or failed_work or stopped" \
    -p no:cacheprovider -v -rs -s
  # exit 1 is the expected outcome here: every rank must raise, none may hang
  step link_cut 200 env RINGREDUCE_TIMEOUT=${CUT_TIMEOUT_S:-20} $E --machines 2 --gpus-per-machine 2 \
    $CAP --cut-link "1:${CUT_S:-60}" --cut-grace 90 --script benchmarks/soak.py -- \
    --calls 10000000 --min-bytes 65536
  { pytest_summary "$W/gpu_faults.log" "$W/gpu_killed_2x1.log"
    echo "== link cut (expect every rank to end with RingReduceError within RINGREDUCE_TIMEOUT):"
    grep -hE "^# emulate: (cut|rank|ranks)" "$W/link_cut.log"
    grep -hoE "RingReduceError: .{0,220}" "$W/link_cut.log" | sort -u | head -4
    ended=$(grep -cE "^# emulate: rank [0-9]+ ended" "$W/link_cut.log")
    raised=$(grep -cE "^\[rank[0-9]+\]: ringreduce.errors.RingReduceError" "$W/link_cut.log")
    slowest=$(grep -oE "ended [0-9.]+ s after" "$W/link_cut.log" | awk '{print $2}' | sort -n | tail -1)
    verdict=FAIL; [ "$ended" = 4 ] && [ "$raised" = 4 ] && verdict=PASS
    echo "link cut: $verdict ($ended/4 ranks ended, $raised raised RingReduceError, slowest ${slowest:-?} s after the cut; deadline ${CUT_TIMEOUT_S:-20} s)"
  } > "$W/summary_body.txt" ;;
soak)
  step soak_2x2 420 $E --machines 2 --gpus-per-machine 2 --mode loopback --script benchmarks/soak.py -- \
    --calls "${SOAK_CALLS:-6000}" --min-bytes 65536 --json "$W/soak_2x2.json"
  grep -hE "^# soak|wrong|FAILED|Error" "$W/soak_2x2.log" | cut -c1-400 | tail -12 > "$W/summary_body.txt" ;;
dlrm)
  # The DLRM-style model (a few 25 MiB buckets a step) at 2x2, the transformer with 146
  # buckets of 4 MiB a step at 2x2 (the host's share of a step), then DLRM at 4x2.
  step dlrm_2x2 200 $E --machines 2 --gpus-per-machine 2 $CAP \
    --script benchmarks/dlrm.py -- --modes nccl,hook,backend \
    --json "$W/dlrm_2x2.json" ${PLOT[@]+"${PLOT[@]}" "$W/dlrm_2x2.png"}
  step transformer_2x2 150 $E --machines 2 --gpus-per-machine 2 $CAP \
    --script benchmarks/dlrm.py -- --modes nccl,hook --model transformer --layers 48 \
    --bucket-mb 4 --steps 24 --warmup 4 --json "$W/transformer_2x2.json"
  step dlrm_4x2 240 $E --machines 4 --gpus-per-machine 2 $CAP \
    --script benchmarks/dlrm.py -- --modes nccl,hook,backend \
    --json "$W/dlrm_4x2.json" ${PLOT[@]+"${PLOT[@]}" "$W/dlrm_4x2.png"}
  grep -hvE "Warning|warn|^W1|^\[rank|^\s*$|socket.cpp|^###" "$W"/dlrm_*.log "$W"/transformer_*.log | tail -40 > "$W/summary_body.txt" ;;
train)
  for spec in ${TRAIN_SETS:-int8:int8:nccl,hook bf16:int8:bf16-hook,powersgd seeds:int8:nccl:1:2}; do
    IFS=: read -r name wire modes seed seeds topo rows steps <<< "$spec"
    topo=${topo:-2x2}; limit=${TRAIN_S:-150}
    A=(--rows "${rows:-${TRAIN_ROWS:-31250}}" --steps "${steps:-${TRAIN_STEPS:-1000}}" --warmup 20)
    [ -n "${TRAIN_TARGET:-}" ] && A+=(--target-loss "$TRAIN_TARGET")
    ( sleep $((limit - 15)); pkill -USR1 -f "python[0-9.]* /\S*benchmarks/dlrm.py" ) &
    dumper=$!
    algo=${TRAIN_ALGO-allreduce:tree}
    step "train_$name" "$limit" env RINGREDUCE_WIRE="$wire" ${algo:+NCCL_ALGO=$algo} $E_ALL \
      --machines "${topo%x*}" --gpus-per-machine "${topo#*x}" $CAP --script benchmarks/dlrm.py \
      -- --modes "$modes" ${TRAIN_EXTRA:-} \
      "${A[@]}" --seed "${seed:-0}" --seeds "${seeds:-1}" --json "$W/train_$name.json" \
      ${PLOT[@]+"${PLOT[@]}" "$W/train_$name.png"}
    kill "$dumper" 2>/dev/null; wait "$dumper" 2>/dev/null
  done
  { for f in "$W"/train_*.log; do echo "== $(basename "$f" .log)"
      grep -E "^# (seed|outputs|loss floor)|^mode |^[a-z0-9-]+ +[0-9]+ |spread|: last 100 |Thread|File" "$f" \
        | head -50; done; } > "$W/summary_body.txt" ;;
fsdp)
  # Estimated on the faithful capped 2x2: fsdp-nccl ~0.2 s a step (fsdp_modes.DEFAULT_SPEC
  # says why), so 60 steps of six modes plus two more seeds ~100 s and start-up; the tree
  # run two modes. At 4x2 eight ranks share the GPUs, hence one seed and its own limit.
  export RINGREDUCE_TIMEOUT=${RINGREDUCE_TIMEOUT:-90}
  for topo in 2x2 4x2; do
    T=(--machines "${topo%x*}" --gpus-per-machine "${topo#*x}")
    seeds=${FSDP_SEEDS:-3}; limit=${FSDP_S:-240}
    [ "$topo" = 4x2 ] && { seeds=1; limit=${FSDP_4X2_S:-200}; }
    step "fsdp_$topo" "$limit" $E_ALL "${T[@]}" $CAP --script benchmarks/fsdp.py -- \
      --seeds "$seeds" ${FSDP_FLAGS:-} --json "$W/fsdp_$topo.json"
    # NCCL reads NCCL_ALGO once per process: its tree (HSDP's all-reduce) runs apart
    step "fsdp_${topo}_tree" ${FSDP_TREE_S:-120} env NCCL_ALGO=allreduce:tree $E_ALL "${T[@]}" \
      $CAP --script benchmarks/fsdp.py -- --modes fsdp-nccl,hsdp-nccl ${FSDP_FLAGS:-} \
      --json "$W/fsdp_${topo}_tree.json"
  done
  { for topo in 2x2 4x2; do
      [ -f "$W/fsdp_$topo.json" ] || continue
      tree=(); [ -f "$W/fsdp_${topo}_tree.json" ] && tree=("$W/fsdp_${topo}_tree.json")
      echo "== fsdp_$topo"; grep -h "^# FSDP2" "$W/fsdp_$topo.log"
      python3 benchmarks/fsdp.py --merge "$W/fsdp_$topo.json" ${tree[@]+"${tree[@]}"} \
        --json "$W/fsdp_${topo}_best.json" 2>&1
    done; } > "$W/summary_body.txt" ;;
compressed)
  step compressed_tests ${TESTS_S:-240} python3 benchmarks/emulate.py --mps-only -- \
    env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest -m gpu \
    tests/test_gpu_compressed.py tests/test_gpu_construction.py tests/test_gpu_integrations.py \
    tests/test_gpu.py -k "${TESTS_K-compressed or construction or integrations or ddp}" \
    -p no:cacheprovider -v -rs
  C=(--machines 2 --gpus-per-machine 2)
  CSIZES=${COMPRESSED_SIZES:-16M,64M}
  step compressed_capped_2x2 ${BENCH_S:-110} $E_ALL "${C[@]}" $CAP --script benchmarks/compressed.py \
    -- --sizes "$CSIZES" --json "$W/compressed_capped_2x2.json"
  # NCCL reads NCCL_ALGO once per process: its tree (the best NCCL at two machines) runs apart
  step compressed_capped_2x2_tree ${BENCH_S:-110} env NCCL_ALGO=allreduce:tree $E_ALL "${C[@]}" \
    $CAP --script benchmarks/compressed.py -- --sizes "$CSIZES" --json "$W/compressed_tree.json"
  step compressed_loopback_2x2 ${BENCH_S:-110} $E_ALL "${C[@]}" --mode loopback \
    --script benchmarks/compressed.py -- --sizes "$CSIZES" --json "$W/compressed_loopback.json"
  { pytest_summary "$W/compressed_tests.log"
    for f in capped_2x2 capped_2x2_tree loopback_2x2; do echo "== compressed_$f"
      grep -E "^#|^ +[0-9]+ " "$W/compressed_$f.log" | tail -16; done; } > "$W/summary_body.txt" ;;
jobs)
  step jobs_tests ${TESTS_S:-220} python3 benchmarks/emulate.py --mps-only -- \
    env RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu_jobs.py -p no:cacheprovider -v -rs \
    --durations=10
  pytest_summary "$W/jobs_tests.log" > "$W/summary_body.txt" ;;
kernels)
  step kernel_tests 200 python3 -m pytest -m gpu tests/test_kernels.py -p no:cacheprovider -v -rs
  step kernel_bench 120 python3 benchmarks/kernel_bench.py
  step kernel_occupancy 120 python3 benchmarks/kernel_occupancy.py
  { pytest_summary "$W/kernel_tests.log"; tail -25 "$W/kernel_bench.log" "$W/kernel_occupancy.log"; } \
    > "$W/summary_body.txt" ;;
host)
  step info 30 python3 -m ringreduce.info
  F=(--machines 2 --gpus-per-machine 2 $CAP)
  step host_tests ${TESTS_S:-150} python3 benchmarks/emulate.py --mps-only -- \
    env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu.py \
    tests/test_native_cuda.py tests/test_gpu_compressed.py ${HOST_TEST_FILES:-} \
    -k "${TESTS_K-not fault and not killed}" -p no:cacheprovider -v -rs
  for size in 25M 4M; do
    NCCL_SET_THREAD_NAME=1 step "host_call_$size" ${HOST_S:-80} $E_ALL "${F[@]}" \
      --script benchmarks/native_host.py -- --size $size --calls ${HOST_CALLS:-32} \
      --ways ${HOST_WAYS:-native/auto,python/one,native/piped,native/auto+int8,python/auto+int8} \
      --profile "${HOST_PROFILE:-native/auto async,native/auto+int8 async}" ${HOST_EXTRA:-}
  done
  # over loopback (no cap): where the rail is fast and the host's time shows; NCCL's
  # INFO lines say which transport carries the intra-machine stages here
  NCCL_SET_THREAD_NAME=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT step host_call_loopback_25M \
    ${HOST_S:-80} $E_ALL --machines 2 --gpus-per-machine 2 --mode loopback \
    --script benchmarks/native_host.py -- --size 25M --calls ${HOST_CALLS:-32} \
    --ways ${HOST_WAYS:-native/auto,native/one,python/one,native/piped}
  step host_ddp_dlrm ${DDP_S:-110} env NCCL_ALGO=allreduce:tree $E_ALL "${F[@]}" \
    --script benchmarks/dlrm.py -- --modes nccl,nccl-hook,hook ${HOST_DDP_FLAGS:-} \
    --json "$W/host_ddp_dlrm.json"
  step host_ddp_transformer ${DDP_S:-110} env NCCL_ALGO=allreduce:tree $E_ALL "${F[@]}" \
    --script benchmarks/dlrm.py -- --modes ${HOST_TRANSFORMER_MODES:-nccl,nccl-hook,hook} \
    ${HOST_DDP_FLAGS:-} --model transformer \
    --layers 48 --bucket-mb 4 --steps 24 --warmup 4 --json "$W/host_ddp_transformer.json"
  # the compressed route (int8, the hook's default: no error feedback) against torch's
  # bf16 hook and its fp32 NCCL hook, each hook call timed on the autograd thread
  step host_ddp_dlrm_int8 ${DDP_S:-110} env RINGREDUCE_WIRE=int8 NCCL_ALGO=allreduce:tree \
    $E_ALL "${F[@]}" --script benchmarks/dlrm.py -- --modes nccl-hook,bf16-hook,hook \
    --json "$W/host_ddp_dlrm_int8.json"
  { pytest_summary "$W/host_tests.log"; grep -h "plan" "$W/info.log"
    for f in "$W"/host_call_*.log; do echo "== $(basename "$f" .log)"
      grep -hoE "plan=[a-z-]+ \([^)]*\)" "$f" | sort -u
      grep -E "ranks, [0-9]+ bytes|^way |^(nccl|native|python)[/0-9A-Za-z+]* (sync|async)" "$f"; done
    grep -hoE "Channel 00/0 : [0-9]+\[[0-9]+\] -> [0-9]+\[[0-9]+\] via [A-Za-z/]+" \
      "$W/host_call_loopback_25M.log" | sort -u | head -8
    for f in "$W"/host_ddp_*.log; do echo "== $(basename "$f" .log)"
      grep -iE "hook|samples/s|mode " "$f" | grep -vE "Warning|warn" | tail -12; done
  } > "$W/summary_body.txt" ;;
four)
  # Estimated from the faithful runs on two GPUs (results 2026-11-27-h100x2-one-path,
  # 2026-11-26-h100x2-faithful: 16-40 s a sweep, 16-25 s a references-only run, a wire
  # run ~30 s): 10 Gbit/s 2x2 ~80 s, 2x4 ~90 s, 4x2 ~100 s with their references, the wires
  # ~70 s, so ~350 s; then 2x2 at 25 Gbit/s (~50 s) and loopback (~60 s) within BUDGET_S.
  export RINGREDUCE_TIMEOUT=${RINGREDUCE_TIMEOUT:-90}
  step info 30 python3 -m ringreduce.info
  four_rows 10gbit ${FOUR_TOPOS:-2x2 2x4 4x2}
  for topo in ${FOUR_WIRE_TOPOS:-2x2 2x4}; do four_wires 10gbit "$topo"; done
  for link in ${FOUR_MORE_LINKS:-25gbit loopback}; do four_rows "$link" 2x2; done
  four_summary > "$W/summary_body.txt" ;;
four_host)
  # ~90 s of tests, ~60 + 25 s of hook times, 4x4 ~110 s with its references, the 4x2
  # wires ~45 s; then 2x4 and 4x2 at 25 Gbit/s and loopback while BUDGET_S lasts.
  export RINGREDUCE_TIMEOUT=${RINGREDUCE_TIMEOUT:-90}
  step info 30 python3 -m ringreduce.info
  step probe_tests ${TESTS_S:-150} python3 benchmarks/emulate.py --mps-only -- \
    env RINGREDUCE_GPU_TOPOLOGIES=2x2 RR_MPS=1 python3 -m pytest -m gpu tests/test_gpu_probe.py \
    tests/test_gpu.py -k "${TESTS_K-probe or collectives_are_exact}" -p no:cacheprovider -v -rs -s
  for size in 25M 4M; do
    step "hooks_$size" ${HOST_S:-100} $E_ALL --machines 2 --gpus-per-machine 2 $CAP \
      --script benchmarks/native_host.py -- --size $size --calls ${HOST_CALLS:-32} \
      --ways ${HOOK_WAYS:-native/auto,native/auto+int8} --hooks --profile "${HOOK_PROFILE:-}"
  done
  four_rows 10gbit ${FOUR_HOST_TOPOS:-4x4}
  four_wires 10gbit 4x2
  for link in ${FOUR_MORE_LINKS:-25gbit loopback}; do four_rows "$link" 2x4 4x2; done
  { pytest_summary "$W/probe_tests.log"
    grep -hE "^ *[0-9]+ machines x" "$W/probe_tests.log" | sort -u | head -4
    for f in "$W"/hooks_*.log; do echo "== $(basename "$f" .log) (vs_nccl of hook: rows = over torch's allreduce_hook)"
      grep -hoE "plan=[a-z-]+[^,]*: probe at [^;]*" "$f" | sort -u | head -3
      grep -E "ranks, [0-9]+ bytes|^way |^(nccl|native|hook:)[/0-9A-Za-z+:]* (sync|async)" "$f"; done
    four_summary; } > "$W/summary_body.txt" ;;
native)
  step info 30 python3 -m ringreduce.info
  host() {  # host TOPOLOGY MODE: native_host.py there, under MPS (emulate.py's auto)
    local link=(--mode loopback); [ "$2" = capped ] && link=($CAP)
    # NCCL_SET_THREAD_NAME: native_host.py's CPU-by-thread table names NCCL's threads
    NCCL_SET_THREAD_NAME=1 step "host_$1_$2" ${HOST_S:-150} $E --machines "${1%x*}" --gpus-per-machine "${1#*x}" \
      "${link[@]}" --script benchmarks/native_host.py -- --size 25M --calls ${HOST_CALLS:-32} \
      --slices "${HOST_SLICES-8M,16M,32M}"
  }
  host 2x2 loopback
  host 2x2 capped
  step native_tests ${TESTS_S:-200} python3 benchmarks/emulate.py --mps-only -- \
    env RINGREDUCE_GPU_TOPOLOGIES=${RINGREDUCE_GPU_TOPOLOGIES:-2x1,2x2} RR_MPS=1 \
    python3 -m pytest tests/test_native.py tests/test_native_cuda.py -k "${TESTS_K-not nothing}" \
    -p no:cacheprovider -v -rs
  host 4x2 loopback
  step native_killed_2x1 120 python3 -m pytest tests/test_native_cuda.py -k killed \
    -p no:cacheprovider -v -rs -s
  { pytest_summary "$W/native_tests.log" "$W/native_killed_2x1.log"; grep -h "issuer" "$W/info.log"
    for f in "$W"/host_*.log; do echo "== $(basename "$f" .log)"
      grep -E "ranks, [0-9]+ bytes|^way |^(nccl|native|python)[/0-9A-Za-z+]* (sync|async)" "$f"; done
  } > "$W/summary_body.txt" ;;
wire)
  step quant_kernel_tests ${TESTS_S:-120} python3 -m pytest -m gpu tests/test_gpu_quant_kernels.py \
    -p no:cacheprovider -q -rs
  step quant_bench ${BENCH_S:-100} python3 benchmarks/quant_bench.py
  step wire_study ${STUDY_S:-120} python3 benchmarks/wire_study.py --device cuda --big --no-kernels \
    --warm ${STUDY_WARM:-50}
  { pytest_summary "$W/quant_kernel_tests.log"; tail -28 "$W/quant_bench.log"
    tail -20 "$W/wire_study.log"; } > "$W/summary_body.txt" ;;
textlm)
  # Estimated at 2x2 capped (two ranks a GPU on 2 GPUs): fp32 moves ~77 MB across each
  # machine's link a step under NCCL's tree, >= 62 ms at 1.25 GB/s, so ~70-80 s a seed;
  # int8 / int4 ~25 s, bf16-hook ~45 s; ~20 s of start-up and ~4 s a run: ~350 s for
  # textlm_ddp. FSDP2 gathers the fp32 weights twice a step (~0.15 s): fsdp-*
  # runs take 110-190 s, hsdp-* 25-80 s, so the FSDP step finishes what the budget allows.
  # The default corpus (stdlib, ~3.2 MB) takes ~2 s to build in every rank at start-up and
  # has ~12x the topics' held-out bytes: ~110 validation batches a run, under a second.
  # TEXTLM_FLAGS="--corpus topics" reruns the earlier results' corpus.
  export RINGREDUCE_TIMEOUT=${RINGREDUCE_TIMEOUT:-90}
  algo=${TEXTLM_ALGO-allreduce:tree}; seeds=${TEXTLM_SEEDS:-0,1,2}
  L=(env ${algo:+NCCL_ALGO=$algo} $E_ALL --machines 2 --gpus-per-machine 2 $CAP
     --script benchmarks/text_lm.py -- --steps "${TEXTLM_STEPS:-1000}" ${TEXTLM_FLAGS:-})
  step textlm_ddp ${TEXTLM_S:-450} "${L[@]}" --json "$W/textlm_ddp.json" \
    --wire "${TEXTLM_REF-fp32,}${TEXTLM_WIRES:-int4,int8,bf16-hook}" --seed "$seeds"
  step textlm_fsdp ${TEXTLM_FSDP_S:-480} "${L[@]}" --json "$W/textlm_fsdp.json" \
    --wire "${TEXTLM_FSDP_MODES:-hsdp-nccl,hsdp-int4,hsdp-int8,fsdp-nccl,fsdp-int4,fsdp-int8}" \
    --seed "${seeds%%,*}" --spread ""
  { for f in "$W"/textlm_*.log; do echo "== $(basename "$f" .log)"
      grep -E "^# (pydoc|stdlib|emulate: emulated)|seed [0-9]+: train|seed [0-9]+ engine:|Error" "$f" | cut -c1-900; done
    echo "== text_lm.py --merge (the table)"
    python3 benchmarks/text_lm.py --merge "$W"/textlm_*.json ${TEXTLM_MERGE:-} 2>&1
  } > "$W/summary_body.txt" ;;
esac

{
  echo "# gpu.sh $suite  $(date -u +%FT%TZ)  commit ${RR_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null)}  $(nvidia-smi -L 2>/dev/null | head -1)"
  python3 -c 'import torch; print("# torch", torch.__version__, "NCCL", torch.cuda.nccl.version())' 2>/dev/null
  cat "$STATUS"
  cat "$W/summary_body.txt"
} > "$R/summary.txt"
tar -czf "$R/logs.tar.gz" -C "$W" . && rm -rf "$W"
cat "$R/summary.txt"
