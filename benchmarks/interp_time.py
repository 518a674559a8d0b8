"""How long the CPU μGraph interpreter takes on every benchmark at its real shapes.

For each benchmark, batch size and precision ("float64", "gpu") this times ``ugraph.run`` on the
naive lowering (one pre-defined kernel per operator) and, when ``benchmarks/fixtures.py`` provides
``hand_built``, on the hand-built fused μGraph, and reports the error against the program's
float64 reference (norm-wise relative). Prints a table and writes JSON to
``benchmarks/results/interp_time.json``::

    python -m benchmarks.interp_time                 # all benchmarks, bs 1 and 8
    python -m benchmarks.interp_time gqa lora --bs 1 --repeat 3 --blas-threads 1

Wall times on a shared machine are only as good as its load: the JSON records the load average
before and after, and ``--blas-threads`` pins the BLAS thread count (an oversubscribed OpenBLAS
can be ten times slower on small batched matmuls).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# numpy (imported by mirage_py and benchmarks.programs) is imported only after --blas-threads
# has set the environment, so those imports live inside the functions
PRECISIONS = ("float64", "gpu")
from benchmarks import _blas  # noqa: E402  (NumPy-free)
from benchmarks._blas import BLAS_ENV  # noqa: E402
RESULTS = os.path.join(ROOT, "benchmarks", "results", "interp_time.json")


def _hand_built():
    try:
        from benchmarks.fixtures import hand_built
    except ImportError:
        return None
    return hand_built


def _time(graph, inputs, precision: str, repeat: int) -> tuple[float, dict]:
    """Best wall time of ``repeat`` runs (one run when the first takes over a second)."""
    from mirage_py.ugraph import run
    best, out = float("inf"), None
    for i in range(repeat):
        gc.collect()
        t = time.perf_counter()
        out = run(graph, inputs, precision=precision)
        best = min(best, time.perf_counter() - t)
        if best > 1.0:
            break
    return best, out


def _err(out: dict, ref: dict) -> float:
    import numpy as np
    return max(float(np.linalg.norm(out[k] - ref[k]) / np.linalg.norm(ref[k])) for k in ref)


def measure(names, batch_sizes, precisions, repeat: int) -> list[dict]:
    from benchmarks.programs import get_inputs, get_program
    from mirage_py.ugraph import naive_lowering, validate
    hand_built = _hand_built()
    rows = []
    for name in names:
        for bs in batch_sizes:
            p = get_program(name, bs)
            x = get_inputs(name, bs)
            t = time.perf_counter()
            ref = p.evaluate(x)
            t_ref = time.perf_counter() - t
            graphs = {"naive": naive_lowering(p)}
            if hand_built is not None:
                graphs["fixture"] = hand_built(name, bs)
            for kind, g in graphs.items():
                validate(g, "h100")
                for precision in precisions:
                    secs, out = _time(g, x, precision, repeat)
                    row = {"benchmark": name, "bs": bs, "graph": kind, "precision": precision,
                           "kernels": g.num_kernels, "seconds": round(secs, 4),
                           "reference_seconds": round(t_ref, 4),
                           "rel_error": float(f"{_err(out, ref):.3e}")}
                    rows.append(row)
                    print(f"{name:15s} bs={bs:<2d} {kind:8s} {precision:8s} "
                          f"kernels={g.num_kernels:<3d} {secs * 1e3:10.1f} ms   "
                          f"(Program.evaluate {t_ref * 1e3:8.1f} ms)  "
                          f"rel err {row['rel_error']:.2e}",
                          flush=True)
                    del out
            del x, ref
            gc.collect()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.interp_time", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME", help="benchmarks (default: all nine)")
    ap.add_argument("--bs", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--precision", nargs="+", default=list(PRECISIONS), choices=PRECISIONS)
    ap.add_argument("--repeat", type=int, default=3, help="best of N runs (default 3)")
    ap.add_argument("--out", default=RESULTS, help="JSON file to write")
    ap.add_argument("--blas-threads", type=int, default=None, help=_blas.HELP)
    args = ap.parse_args(argv)
    _blas.pin_blas_threads(ap, args.blas_threads)
    import numpy as np

    from benchmarks.programs import NAMES

    names = args.names or list(NAMES)
    unknown = [n for n in names if n not in NAMES]
    if unknown:
        ap.error(f"unknown benchmark(s) {', '.join(unknown)}; choose from {', '.join(NAMES)}")
    load_before = os.getloadavg()
    rows = measure(names, args.bs, args.precision, args.repeat)
    load_after = os.getloadavg()
    if max(load_before[0], load_after[0]) > (os.cpu_count() or 1):
        print(f"warning: load average {load_before[0]:.1f} / {load_after[0]:.1f} on "
              f"{os.cpu_count()} CPUs: the machine was busy, times are inflated")
    doc = {"what": "CPU μGraph interpreter wall time per benchmark (best of --repeat runs)",
           "machine": {"python": platform.python_version(), "numpy": np.__version__,
                       "platform": platform.platform(), "cpus": os.cpu_count(),
                       "processor": platform.processor(),
                       "blas_threads": {k: os.environ.get(k) for k in BLAS_ENV}},
           "load_average_before": load_before, "load_average_after": load_after,
           "date": time.strftime("%Y-%m-%d %H:%M:%S"), "results": rows}
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
