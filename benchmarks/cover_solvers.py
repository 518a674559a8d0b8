"""The region layer's cover problem, solved by two solvers on the problems real runs pose:
HiGHS (``scipy.optimize.milp``, the default) and z3's optimiser.

Every ``solve_cover`` call of ``mp.superopt`` on the composition programs (a decoder block, the
composition bank) is recorded, then each recorded problem is solved again by both solvers,
best of ``--repeat`` runs. Both must reach the same optimum (the script checks it); the table
gives candidates, constraint rows, and milliseconds per solve.

``python -m benchmarks.cover_solvers`` writes ``benchmarks/results/cover_solvers.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import mirage_py as mp
from mirage_py.regions import cover as cover_mod
from mirage_py.superopt import part as part_mod

from .compositions import bank, decoder_block

RESULTS = Path(__file__).parent / "results"


def record_problems(programs: list) -> list[tuple[str, tuple, dict]]:
    """(program name, args, kwargs) of every cover solved while superoptimising ``programs``."""
    seen: list = []
    real = part_mod.solve_cover

    def spy(*args, **kw):
        seen.append((current[0], args, kw))
        return real(*args, **kw)
    current = [""]
    part_mod.solve_cover = spy
    try:
        for p in programs:
            current[0] = p.name
            mp.superopt(p, workers=1, progress=False, database=False, time_budget_s=60)
    finally:
        part_mod.solve_cover = real
    return seen


def time_solver(args: tuple, kw: dict, solver: str, repeat: int) -> tuple[float, float, int]:
    """(best milliseconds, cost, chosen candidates)."""
    best, got = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        # both solvers exact (the lazy loop's own calls ask HiGHS for quick covers)
        got = cover_mod.solve_cover(*args, **{**kw, "solver": solver, "exact": True})
        best = min(best, (time.perf_counter() - t0) * 1e3)
    return best, got.cost, len(got.chosen)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args(argv)
    programs = [decoder_block(b=1, kv=256, d=256, heads=4, f=512).program] + \
        [c.program for c in bank(0)]
    problems = record_problems(programs)
    rows = []
    for name, a, kw in problems:
        cands = a[0]
        h = time_solver(a, kw, "highs", args.repeat)
        z = time_solver(a, kw, "z3", args.repeat)
        if abs(h[1] - z[1]) > 1e-6 * max(1.0, abs(h[1])):
            raise SystemExit(f"{name}: HiGHS cost {h[1]} != z3 cost {z[1]}")
        rows.append({"program": name, "candidates": len(cands), "cost_us": round(h[1], 3),
                     "chosen": h[2], "highs_ms": round(h[0], 2), "z3_ms": round(z[0], 2)})
        print(rows[-1], flush=True)
    hs = [r["highs_ms"] for r in rows]
    zs = [r["z3_ms"] for r in rows]
    lines = ["| program | candidates | cover cost (us) | chosen | HiGHS ms | z3 ms |",
             "| --- | --- | --- | --- | --- | --- |"]
    lines += [f"| {r['program']} | {r['candidates']} | {r['cost_us']} | {r['chosen']} | "
              f"{r['highs_ms']} | {r['z3_ms']} |" for r in rows]
    summary = (f"{len(rows)} cover problems from {len(programs)} programs; both solvers reach "
               f"the same optimum on every one. Median ms per solve: HiGHS "
               f"{statistics.median(hs):.2f}, z3 {statistics.median(zs):.2f}; largest: HiGHS "
               f"{max(hs):.1f}, z3 {max(zs):.1f}.")
    text = summary + "\n\n" + "\n".join(lines)
    print(text)
    if args.no_save:
        return
    RESULTS.mkdir(exist_ok=True)
    meta = {"device": f"cpu ({platform.machine()}, {os.cpu_count()} cores)",
            "date": time.strftime("%Y-%m-%dT%H:%M:%S"), "repeat": args.repeat}
    (RESULTS / "cover_solvers.json").write_text(json.dumps({**meta, "rows": rows}, indent=1))
    (RESULTS / "cover_solvers.md").write_text(
        f"# Cover solvers\n\n{meta['device']}, {meta['date']}, best of {args.repeat}.\n\n"
        + text + "\n")


if __name__ == "__main__":
    main()
