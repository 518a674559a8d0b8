"""The verifier on the nine benchmarks at their real shapes (bs = 1).

* the hand-built fused μGraph and the naive lowering of every benchmark are accepted with the
  default bound (<= 1e-9);
* mutation testing: structural mutants of the hand-built μGraph (:mod:`mirage_py.verifier.mutate`)
  are run by the float64 interpreter on realistic inputs (``get_inputs``); every mutant whose
  output differs numerically from the program must be rejected by the finite-field verifier.

Each mutant gets one field test (``tests=1``: per-test false-acceptance bound about 1e-5), with
the program's inputs and outputs cached across mutants by one
:class:`~mirage_py.verifier.Verifier`; kernels shared with earlier mutants are memoised. The
counts are printed (``pytest -s``) and recorded in docs/verifier.md.
"""

from __future__ import annotations

import collections
import gc

import numpy as np
import pytest

from benchmarks.programs import NAMES, get_inputs, get_program
from mirage_py.ugraph import naive_lowering, run
from mirage_py.verifier import Verifier
from mirage_py.verifier.mutate import mutants
from marks import sample

fixtures = pytest.importorskip("benchmarks.fixtures",
                               reason="benchmarks/fixtures.py (hand-built μGraphs) is not there")

MIN_MUTANTS = 50
LIMIT = 52  # mutants checked per benchmark (interleaved by kind, so every kind is in)
# relative difference (norm-wise) above which a mutant "differs numerically": far above float64
# rounding of a correct reordering (~1e-13), far below any real change (the tiny-constant
# mutants scale by 1 + 2^-20 ~ 1e-6)
DIFFERS = 1e-9


class Bench:
    def __init__(self, name: str):
        self.name = name
        self.program = get_program(name, 1)
        self.fixture = fixtures.hand_built(name, 1)
        self.verifier = Verifier(self.program, cache_bytes=4 << 30)


@pytest.fixture(scope="module", params=sample(NAMES))
def bench(request):
    # module scope + params: pytest runs every test of one benchmark before the next, so the
    # cached field inputs (up to 3 GB for exp_matmul) are dropped between benchmarks
    b = Bench(request.param)
    yield b
    del b
    gc.collect()


def test_fixture_and_naive_lowering_accepted(bench):
    for graph in (bench.fixture, naive_lowering(bench.program)):
        r = bench.verifier.check(graph)
        assert r.equivalent, f"{bench.name}: {r}"
        assert r.bound <= 1e-9 and r.tests_run == r.tests_needed
        print(f"\n{bench.name} {graph.name}: {r}")


def _rel_diff(y: dict, ref: dict) -> float:
    worst = 0.0
    for n, r in ref.items():
        a = np.asarray(y[n], dtype=np.float64)
        if not np.isfinite(a).all():
            return float("inf")
        den = np.linalg.norm(r.ravel())
        worst = max(worst, float(np.linalg.norm((a - r).ravel()) / (den if den > 0 else 1.0)))
    return worst


def test_mutants_rejected(bench):
    ms = mutants(bench.fixture, limit=LIMIT)
    assert len(ms) >= MIN_MUTANTS, f"{bench.name}: only {len(ms)} valid mutants"
    x = get_inputs(bench.name, 1)
    ref = bench.program.evaluate(x)
    counts = collections.Counter()
    by_kind = collections.defaultdict(lambda: [0, 0])
    escaped = []
    memo: dict = {}  # kernels shared with earlier mutants are not run again
    for m in ms:
        with np.errstate(all="ignore"):
            y = run(m.graph, x, memo=memo)
        differs = _rel_diff(y, ref) > DIFFERS
        r = bench.verifier.check(m.graph, tests=1)
        counts["mutants"] += 1
        counts["differ"] += differs
        counts["rejected"] += not r.equivalent
        counts["differ_and_rejected"] += differs and not r.equivalent
        counts["same_and_accepted"] += (not differs) and r.equivalent
        by_kind[m.kind][0] += 1
        by_kind[m.kind][1] += not r.equivalent
        if differs and r.equivalent:
            escaped.append(str(m))
        if not differs and not r.equivalent:
            counts["same_but_rejected"] += 1  # a real change below float64 visibility
    del x, ref, memo
    gc.collect()
    kinds = ", ".join(f"{k} {n[1]}/{n[0]}" for k, n in sorted(by_kind.items()))
    print(f"\n{bench.name}: {counts['mutants']} mutants, {counts['differ']} differ numerically, "
          f"{counts['differ_and_rejected']} of those rejected; "
          f"{counts['same_and_accepted']} numerically equal and accepted, "
          f"{counts['same_but_rejected']} numerically equal but rejected. "
          f"Rejected by kind: {kinds}")
    assert not escaped, f"{bench.name}: numerically different mutants accepted: {escaped}"
    assert counts["differ"] >= 1
