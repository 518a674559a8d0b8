"""How long the finite-field verifier takes on every benchmark at its real shapes.

For each benchmark this runs ``mp.verify(program, graph)`` with the default bound (1e-9) on the
hand-built fused μGraph (``benchmarks/fixtures.py``) and on the naive lowering, and reports the
number of tests the bound needs, the per-test bound, the degree and the wall time. ``cold`` is a
fresh ``verify`` call (random inputs drawn, program evaluated, candidate evaluated, for every
test); ``warm`` checks the candidate again with a :class:`~mirage_py.verifier.Verifier` that has
the program side cached (inputs and program outputs; memoised kernels dropped), as a search
checking many candidates of one program does. It also times the exact modular matmul two ways --
float64 BLAS on balanced residues (what the verifier does) and ``galois.GF(p)`` -- at the
shapes that matter. Prints a table and writes JSON to ``benchmarks/results/verify_time-cpu.json``::

    python -m benchmarks.verify_time                  # all benchmarks, bs 1
    python -m benchmarks.verify_time gqa lora --bs 1 8 --repeat 3
    python -m benchmarks.verify_time --no-matmul      # skip the matmul comparison
    python -m benchmarks.verify_time --blas-threads 1 # pin BLAS (a busy 2-core box: faster)
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

# NumPy (and everything that imports it) is imported only after --blas-threads has set the
# environment, so those imports live inside the functions
from benchmarks import _blas  # noqa: E402  (NumPy-free)
from benchmarks._blas import BLAS_ENV  # noqa: E402
RESULTS = os.path.join(ROOT, "benchmarks", "results", "verify_time-cpu.json")


def _hand_built():
    try:
        from benchmarks.fixtures import hand_built
    except ImportError:
        return None
    return hand_built


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def time_verify(name: str, bs: int, repeat: int) -> list[dict]:
    import numpy as np

    from benchmarks.programs import get_program
    from mirage_py.ugraph import naive_lowering
    from mirage_py.verifier import Verifier, verify

    program = get_program(name, bs)
    graphs = []
    hb = _hand_built()
    if hb is not None:
        graphs.append(("fixture", hb(name, bs)))
    graphs.append(("naive", naive_lowering(program)))
    rows = []
    for kind, graph in graphs:
        colds = []
        for _ in range(repeat):
            gc.collect()
            r = verify(program, graph)
            assert r.equivalent, f"{name} {kind}: {r}"
            colds.append(r.seconds)
        v = Verifier(program, cache_bytes=4 << 30)
        v.check(graph)
        v.forget_kernels()
        t = time.perf_counter()
        w = v.check(graph)
        warm = time.perf_counter() - t
        del v
        rows.append({"benchmark": name, "bs": bs, "graph": kind, "tests": r.tests_run,
                     "per_test_bound": r.per_test_bound, "bound": r.bound, "degree": r.degree,
                     "exp_degree": r.exp_degree, "seconds": min(colds), "seconds_all": colds,
                     "warm_seconds": warm, "warm_equivalent": w.equivalent,
                     "inputs_elements": int(sum(np.prod(t.shape) for t in program.inputs))})
        print(f"{name:15s} bs={bs:<3d} {kind:8s} tests {r.tests_run}  bound {r.bound:8.2e}  "
              f"(per test {r.per_test_bound:8.2e}, degree {r.degree}, exp-arg "
              f"{r.exp_degree})  cold {min(colds):7.3f}s  warm {warm:7.3f}s", flush=True)
    return rows


def time_matmul(repeat: int) -> list[dict]:
    """Exact matmul mod p: float64 BLAS on balanced residues vs galois."""
    import numpy as np

    from mirage_py.verifier import SAFE_PRIMES
    from mirage_py.verifier.field import Modulus

    p = SAFE_PRIMES[0]
    M = Modulus(p)
    rng = np.random.default_rng(0)
    rows = []
    try:
        import galois
        t = time.perf_counter()
        GF = galois.GF(p)
        gf_setup = time.perf_counter() - t
    except ImportError:  # pragma: no cover - galois is a dependency
        GF, gf_setup = None, None
    for (b, m, k, n) in [(1, 64, 512, 512), (1, 8, 4096, 4096), (1, 64, 4096, 4096),
                         (8, 8, 4096, 4096)]:
        a = rng.integers(0, p, (b, m, k))
        w = rng.integers(0, p, (b, k, n))
        fa, fw = M.balanced(a.astype(np.float64)), M.balanced(w.astype(np.float64))

        def blas():
            x, _ = M.matmul(fa, M.bound, fw, M.bound)
            return M.canon(x)

        best = min(_timed(blas) for _ in range(repeat))
        row = {"shape": f"{b}x({m}x{k} @ {k}x{n})", "blas_float64_s": best}
        if GF is not None:
            ga, gw = GF(a), GF(w)
            gbest = min(_timed(lambda: ga @ gw) for _ in range(repeat))
            same = np.array_equal(np.asarray(ga @ gw), blas().astype(np.int64))
            row.update({"galois_s": gbest, "galois_field_setup_s": gf_setup, "equal": bool(same)})
        rows.append(row)
        print(f"matmul mod p {row['shape']:24s} float64 BLAS {best:8.4f}s" +
              (f"   galois {row['galois_s']:8.4f}s  equal {row['equal']}" if GF else ""),
              flush=True)
    return rows


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.verify_time", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("names", nargs="*", metavar="NAME", help="benchmarks (default: all nine)")
    ap.add_argument("--bs", type=int, nargs="+", default=[1])
    ap.add_argument("--repeat", type=int, default=1, help="best of N cold runs")
    ap.add_argument("--no-matmul", action="store_true", help="skip the matmul comparison")
    ap.add_argument("--out", default=RESULTS)
    ap.add_argument("--blas-threads", type=int, default=None, help=_blas.HELP)
    args = ap.parse_args(argv)
    _blas.pin_blas_threads(ap, args.blas_threads)
    import numpy as np

    from benchmarks.programs import NAMES
    from mirage_py.verifier import SAFE_PRIMES

    names = args.names or list(NAMES)
    info = {"machine": platform.machine(), "processor": platform.processor(),
            "cpus": os.cpu_count(), "python": platform.python_version(),
            "numpy": np.__version__, "load_before": _load(), "primes": list(SAFE_PRIMES),
            "blas_threads": {k: os.environ.get(k) for k in BLAS_ENV},
            "date": time.strftime("%Y-%m-%d %H:%M:%S")}
    rows = []
    for name in names:
        for bs in args.bs:
            rows += time_verify(name, bs, args.repeat)
    mm = [] if args.no_matmul else time_matmul(max(args.repeat, 2))
    info["load_after"] = _load()
    if max((info["load_before"] or [0])[0], (info["load_after"] or [0])[0]) > (os.cpu_count() or 1):
        print(f"warning: load average {info['load_before']} / {info['load_after']} on "
              f"{os.cpu_count()} CPUs: the machine was busy, times are inflated")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump({"info": info, "verify": rows, "matmul": mm}, f, indent=1)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
