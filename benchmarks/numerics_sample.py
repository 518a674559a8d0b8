"""What the numerics check on sampled rows (verifier/sample.py) saves on KernelBench problems.

For each problem file: the unbudgeted ``mp.superopt(program, target="h100_pcie", workers=1,
database=False)`` (seconds, whether the answer is the naive lowering), then the numerics check
of its answer against the naive lowering sampled and at full size (seconds, input elements
read, verdict, the sampled size of each input dim), then the call at each ``--budget`` (seconds,
whether the answer is the naive lowering). Each superopt call runs in a fresh process (its own
peak RSS, no caches of an earlier call). Prints a table and writes ``benchmarks/results/numerics_sample.{json,md}``::

    python -m benchmarks.numerics_sample                      # level2/76_Gemm_Add_ReLU
    python -m benchmarks.numerics_sample path/to/problem.py --budget 20 60
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import time
from pathlib import Path

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks._results import RESULTS, table, write_results  # noqa: E402

DEFAULT = Path("/tmp/kb/129232e/KernelBench/level2/76_Gemm_Add_ReLU.py")


def _sampled_dims(program, sampled: dict) -> dict[str, int]:
    """``input[dim]`` -> sampled extent for each input dim of a sampled label."""
    from mirage_py.generator.labels import infer_labels
    dims = infer_labels(program).node_dims
    return {f"{t.name}[{d}] {t.shape[d]}": sampled[lab] for t in program.inputs
            for d, lab in enumerate(dims[t.digest]) if lab in sampled}


def _superopt(path: Path, budget: float | None) -> tuple:
    """One superopt call in this (fresh) process: its answer graph and its numbers."""
    import mirage_py as mp
    from benchmarks.published_gpu import problem_program
    from mirage_py.ugraph import naive_lowering
    program = problem_program(path)[0]
    t0 = time.perf_counter()
    g = mp.superopt(program, target="h100_pcie", workers=1, database=False, progress=False,
                    time_budget_s=budget).graph
    return g, {"seconds": round(time.perf_counter() - t0, 2),
               "naive": g.structural_hash() == naive_lowering(program).structural_hash(),
               "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}


def _fresh(path: Path, budget: float | None) -> tuple:
    """:func:`_superopt` in a fresh process (no caches of an earlier call; its own peak RSS)."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as ex:
        return ex.submit(_superopt, path, budget).result()


def measure(path: Path, budgets: list[float]) -> dict:
    from benchmarks.published_gpu import problem_program
    from mirage_py.ugraph import naive_lowering
    from mirage_py.verifier import numerics_verdict
    program = problem_program(path)[0]
    naive = naive_lowering(program)
    out: dict = {"problem": path.stem,
                 "inputs": {t.name: list(t.shape) for t in program.inputs}}
    answer, out["unbudgeted"] = _fresh(path, None)
    for name, sample in (("sampled", True), ("full", False)):
        t0 = time.perf_counter()
        v = numerics_verdict(program, answer, naive, target="h100_pcie", sample=sample)
        out[name] = {"seconds": round(time.perf_counter() - t0, 2), "ok": v.ok,
                     "elements": v.elements, "dims": _sampled_dims(program, v.sampled)}
    out["budgets"] = {str(b): _fresh(path, b)[1] for b in budgets}
    return out


def markdown(doc: dict) -> str:
    lines = [f"Numerics checks on sampled rows ({doc['machine']}, load {doc['load']})", ""]
    rows = []
    for r in doc["problems"]:
        s, f, u = r["sampled"], r["full"], r["unbudgeted"]
        rows.append([r["problem"], f"{u['seconds']} s, {u['peak_rss_mib']} MiB", u["naive"],
                     f"{s['seconds']} s, {s['elements']:,} el, ok={s['ok']}",
                     f"{f['seconds']} s, {f['elements']:,} el, ok={f['ok']}",
                     ", ".join(f"{k}->{n}" for k, n in s["dims"].items()) or "-",
                     ", ".join(f"{b} s: {x['seconds']} s naive={x['naive']}"
                               for b, x in r["budgets"].items()) or "-"])
    lines += table(["problem", "superopt (peak RSS)", "naive", "answer's check sampled",
                    "at full size", "sampled dims", "budgeted"], rows)
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="*", type=Path, default=[DEFAULT])
    ap.add_argument("--budget", nargs="*", type=float, default=[20.0])
    ap.add_argument("--out", default=str(RESULTS / "numerics_sample"))
    a = ap.parse_args()
    doc = {"machine": f"{platform.node()} {os.cpu_count()} CPUs",
           "load": round(os.getloadavg()[0], 1),
           "problems": [measure(p, a.budget) for p in a.problems]}
    print(write_results(a.out, doc, markdown))


if __name__ == "__main__":
    main()
