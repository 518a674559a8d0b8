#!/usr/bin/env bash
# The GPU session in one command (docs/gpu.md). Device time is scarce, so nothing here searches:
# `python -m benchmarks.gpu_prepare ...` has filled gpu-bundle/ on a CPU (answers, tuning graphs,
# KernelBench answers, sm_90a cubins), and the device tool carries it with .whl/ (wheels the GPU
# machine lacks: scipy, tqdm). From the repository root on the GPU machine:
#
#     bash benchmarks/gpu_session.sh all            # everything, about 8 minutes
#     bash benchmarks/gpu_session.sh again STEP...  # after fixes: bench | tests | kernelbench | tuning
#     EARLIER=path/tuning.jsonl bash benchmarks/gpu_session.sh second  # re-measure, pick the
#                                                   # fastest timed schedules, build variants, ncu
#     bash benchmarks/gpu_session.sh dry            # on a CPU: every measuring step, --dry-run
#
# Each step has its own time cap, so one slow step cannot eat the rest, and writes its results
# under $OUT (the device tool's folder that comes back; default benchmarks/results/gpu-session)
# as it goes: a cap or a timeout keeps what was measured.
set -uo pipefail
cd "$(dirname "$0")/.."
mode=${1:-all}
shift || true
export OUT=${OUT:-benchmarks/results/gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/.site${PYTHONPATH:+:$PYTHONPATH}"
export MIRAGE_PY_CACHE="$PWD/gpu-bundle/cache" MIRAGE_PY_DATABASE="$PWD/gpu-bundle/session.sqlite"
PY=${PYTHON:-python3}
T0=$(date +%s)
LOG="$OUT/log.txt"  # every step's output (the device tool brings back a few files only)
TMP=$(mktemp -d)
say() { echo "[$(( $(date +%s) - T0 )) s] $*" | tee -a "$LOG"; }

wheels() {  # install a carried wheel only where the machine lacks the module
  for w in .whl/*.whl; do
    [ -e "$w" ] || continue
    mod=$(basename "$w" | cut -d- -f1 | tr 'A-Z-' 'a-z_')
    $PY -c "import $mod" 2>/dev/null && continue
    $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target .site "$w" \
      && say "installed $(basename "$w")"
  done
}

facts() {
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit \
      --format=csv 2>&1; nvcc --version 2>&1 | tail -2; $PY -m benchmarks.gpu_measure facts
  } > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
}

tests() {  # the GPU tests in two processes (the extension build is the long one)
  local cap=$1
  timeout "$cap" $PY -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_codegen_gpu.py \
    -k "not extension" > "$TMP/pytest-gpu.txt" 2>&1 &
  timeout "$cap" $PY -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_tuner.py \
    tests/test_torch_compile.py "tests/test_codegen_gpu.py::test_exported_extension_builds_and_runs" \
    > "$TMP/pytest-gpu-2.txt" 2>&1 &
}

warm() {  # torch.compile's caches filled in parallel processes: the measuring steps load them
  local cap=$1 kinds=${2:-} n=12  # kinds: bench | kernelbench (default both)
  for i in $(seq 0 $((n - 1))); do
    TORCHINDUCTOR_COMPILE_THREADS=1 timeout "$cap" $PY -m benchmarks.gpu_measure warm \
      --shard "$i" --of "$n" ${kinds:+--only $kinds} >> "$TMP/warm.txt" 2>&1 &
  done
}

measure() {  # step, cap, options
  say "$1: start (cap $2 s)"
  timeout "$2" $PY -m benchmarks.gpu_measure "$1" ${DRY:-} "${@:3}" >> "$LOG" 2>&1
  say "$1: exit $?"
}

case "$mode" in
  all)
    wheels
    facts
    warm 150
    tests 150
    say "warmers and GPU tests started"
    wait
    cat "$TMP"/pytest-gpu*.txt >> "$LOG"
    say "warmers and tests done: $(tail -1 "$TMP/pytest-gpu.txt") | $(tail -1 "$TMP/pytest-gpu-2.txt")"
    measure bench 100
    measure tuning 100 --budget 0.5
    measure best 50 --budget 1
    measure kernelbench 110 --budget 0.4
    measure variants 30 --bs 1 --budget 0.3
    $PY -m benchmarks.gpu_measure report
    say "done"
    ;;
  again)
    wheels
    for s in "$@"; do
      case "$s" in
        tests) tests 150; wait; cat "$TMP"/pytest-gpu*.txt >> "$LOG"
               say "tests: $(tail -1 "$TMP/pytest-gpu.txt") | $(tail -1 "$TMP/pytest-gpu-2.txt")" ;;
        warm) warm 150; wait ;;
        bench) measure bench 150 ;;
        kernelbench) measure kernelbench 150 --budget 0.4 ;;
        tuning) measure tuning 100 --budget 0.5 ;;
        *) echo "unknown step $s" >&2 ;;
      esac
    done
    $PY -m benchmarks.gpu_measure report
    ;;
  second)  # the shorter call after fixes: re-measure, pick by measurement, diagnose
    wheels
    facts
    warm 80 bench
    timeout 80 $PY -m pytest -m gpu -q -rs -p no:cacheprovider tests/test_codegen_gpu.py \
      -k "captured or small or dlpack" > "$TMP/pytest-gpu.txt" 2>&1 &
    wait
    cat "$TMP/pytest-gpu.txt" >> "$LOG"
    say "warmers and tests done: $(tail -1 "$TMP/pytest-gpu.txt")"
    measure bench 90
    measure tuning 60 --bs 8 --budget 0.5
    measure best 55 --earlier ${EARLIER:-} --budget 1
    measure variants 45 --bs 1 --budget 0.5
    say "ncu: start"
    timeout 45 ncu --section SpeedOfLight --section Occupancy --section LaunchStats \
      --launch-count 12 $PY -m benchmarks.gpu_measure profile --bs 1 > "$OUT/ncu.txt" 2>&1
    say "ncu: exit $?"
    $PY -m benchmarks.gpu_measure report
    ;;
  dry)
    export DRY=--dry-run
    $PY -m benchmarks.gpu_measure facts
    measure bench 1200
    measure kernelbench 1200
    measure tuning 600
    $PY -m benchmarks.gpu_measure report
    ;;
  *)
    echo "usage: $0 all | again STEP... | dry" >&2
    exit 2
    ;;
esac
