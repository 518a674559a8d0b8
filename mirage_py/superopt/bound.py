"""The verification bound a part's answer states, and how it is kept within the promised one.

A part's answer is verified piece by piece: each chosen region's graph against the region's
program, and each max-shifted exp's cluster against its shifted form. The part's bound is the
union bound, the sum of the pieces' (docs/verifier.md). Each piece is verified to
``DEFAULT_BOUND`` (1e-9) on its own, so a cover of several pieces could state more than that
(a scaled attention: 1.03e-9); then the pieces above their share of the bound are verified again
with more tests -- the same tests and more, so the answer does not change, only its bound -- until
the sum is within it. A run that fixed the number of tests (``verify_tests``) keeps its bound,
and so does one whose time budget has ended (a little above 1e-9 on 32 stacked layers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..lax.program import Program
from ..ugraph.graph import KernelGraph
from .result import summed_verification


@dataclass
class Checked:
    """One term of a union bound: a program, the graph checked against it, the verification
    (a chosen region's answer, a :class:`~.result.RegionResult`, is another)."""

    program: Program
    graph: KernelGraph
    verification: Any


def settled_verification(pieces: list, shift_checks: list[Checked], run: Any) -> Any:
    """The union bound of ``pieces`` (the chosen regions' answers) and ``shift_checks``,
    within ``DEFAULT_BOUND`` unless ``run`` fixed the number of tests or its budget has ended
    (``OptimizedProgram.timed_out`` says so; each piece is within the bound alone): pieces above their share
    are verified again, with more tests, in place (a region's answer keeps the stronger
    verification for every place that uses it and for the database)."""
    from ..verifier.equivalence import DEFAULT_BOUND
    v = _union(pieces, shift_checks)
    if run.settings.verify_tests is not None or v.bound <= DEFAULT_BOUND or run.out_of_time():
        # past the budget's end the union is stated as it is (above 1e-9 by a little: each
        # piece is within 1e-9 alone) -- verifying the pieces again took 22 s on 32 8B layers
        return v
    terms = list(pieces) + list(shift_checks)
    share = DEFAULT_BOUND / len(terms)
    from ..verifier.errors import VerifierMemoryError
    for t in terms:
        if t.verification.equivalent and t.verification.bound > share:
            try:
                t.verification = run.new_verifier(t.program, bound_target=share).check(t.graph)
            except VerifierMemoryError:  # the first check stands, its bound stated as it is
                pass
    return _union(pieces, shift_checks)


@dataclass
class _Term:
    verification: Any


def _union(pieces: list, shift_checks: list[Checked]) -> Any:
    """The regions' bounds and the shift checks' sum, in that order (floats add up the same way
    in every run)."""
    shift = [_Term(summed_verification(shift_checks))] if shift_checks else []
    return summed_verification(list(pieces) + shift)


__all__ = ["Checked", "settled_verification"]
