"""When a block graph computes a tile, relative to its for-loop: one vocabulary for validation,
the interpreter, the search, the layout planner and code generation, and the one rule that says
what phase a value computed from others has.

A graph-defined kernel runs in three segments -- before the loop, the loop body, after the loop
-- and a tile belongs to one of them, or is a running accumulator readable in two:

* ``PRE``: loop-invariant (an iterator whose for-loop dim is none, or computed only from such
  tiles): loaded or computed once per block, before the loop;
* ``BODY``: one iteration's value (an iterator that walks the loop, and what is computed from
  it): recomputed every iteration;
* ``POST``: after the loop (an accumulator's final value, and what is computed from it: the
  epilogue, the output savers);
* ``RUN``: a running accumulator (FlashAttention's running max): inside the loop its value after
  this iteration's update, after the loop its final value.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    PRE = "pre"
    BODY = "body"
    POST = "post"
    RUN = "run"


# module-level names: the search asks for phases millions of times, and an enum member read
# through its class costs several times a global's
PRE, BODY, POST, RUN = Phase.PRE, Phase.BODY, Phase.POST, Phase.RUN

#: the segments of a kernel, in the order they run (every phase but ``RUN``)
SEGMENTS = (PRE, BODY, POST)


def combine(*phases: Phase) -> Phase | None:
    """The phase of a value computed from values of ``phases``, or None when they do not mix (a
    loop-body tile with an accumulated one). Loop-invariant values go with anything; a running
    value goes with the body (its current value) and with the epilogue (its final value), and
    alone it makes a body value."""
    s = set(phases)
    s.discard(PRE)
    running = RUN in s
    s.discard(RUN)
    if len(s) > 1:
        return None
    return s.pop() if s else BODY if running else PRE


__all__ = ["Phase", "PRE", "BODY", "POST", "RUN", "SEGMENTS", "combine"]
