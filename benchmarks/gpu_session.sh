#!/usr/bin/env bash
# One GPU job in steps that each fit the device machine's 10-minute limit per command
# (see ../shared/device/README.md). From the repository root on the GPU machine, with the wheels
# of ../shared/device/wheels.sh (z3-solver, galois) carried in .whl/:
#
#     bash benchmarks/gpu_session.sh tests      # machine facts + every GPU test (pytest -m gpu)
#     bash benchmarks/gpu_session.sh bench 1    # benchmark suite at bs 1: ours vs PyTorch eager,
#     bash benchmarks/gpu_session.sh bench 8    #   torch.compile, sdpa; copy bandwidth
#     bash benchmarks/gpu_session.sh tuning     # predicted vs measured ranking (tuning table)
#
# Everything lands under $OUT (the device tool's folder that comes back), else
# benchmarks/results/gpu-session/. Each step installs the wheels first (cheap when done), so the
# steps run in any order on a fresh machine. Commit what comes back with the device and versions.
set -uo pipefail
cd "$(dirname "$0")/.."
step=${1:-tests}
OUT=${OUT:-benchmarks/results/gpu-session}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD:$PWD/.site${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}

if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f .site/.installed ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target .site .whl/*.whl && touch .site/.installed
fi

facts() {
  { date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm \
      --format=csv 2>&1; nvcc --version 2>&1 | tail -2
    $PY - <<'EOF'
import importlib
for m in ("numpy", "cupy", "torch", "z3", "galois", "mirage_py"):
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:  # noqa: BLE001 -- report, do not stop
        print(m, "missing:", type(e).__name__, e)
EOF
  } > "$OUT/machine.txt" 2>&1
  cat "$OUT/machine.txt"
}

case "$step" in
  tests)
    facts
    timeout 560 $PY -m pytest -m gpu -q -rs tests/ 2>&1 | tee "$OUT/pytest-gpu.txt"
    ;;
  bench)
    bs=${2:-1}
    timeout 570 $PY -m benchmarks.run --bs "$bs" --out "$OUT" 2>&1 | tee "$OUT/run-bs$bs.txt"
    ;;
  tuning)
    timeout 570 $PY -m benchmarks.tuning_table --out "$OUT" 2>&1 | tee "$OUT/tuning.txt"
    ;;
  *)
    echo "usage: $0 tests | bench BS | tuning" >&2
    exit 2
    ;;
esac
