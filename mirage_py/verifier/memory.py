"""Whether a field check fits the memory left, asked before it starts.

A check at full size (or at a shrunk size that is still large) holds the program's values as
float64 field residues: the reference evaluation keeps each value from its producer to its last
reader (``Program.lean_order``), the interpreter runs the candidate beside the reference's
outputs, and every field operator makes int64 temporaries of its operands' size. A check that
cannot fit used to end minutes later in an allocation deep in ``verifier/field.py``;
:func:`require_memory` refuses it up front with a :class:`~.errors.VerifierMemoryError` that names
the largest tensor and why the check was not shrunk (KernelBench's GroupNorm,
112 x 64 x 512 x 512: its reshape to (112, 8, 2097152) pins 64 and 512, see shrink.py).
"""

from __future__ import annotations

import os
import resource

from ..lax.program import Program
from .errors import VerifierMemoryError

#: the check's peak, as a multiple of the reference evaluation's largest set of live values (as
#: float64): the candidate's run beside it, and each field operator's int64 temporaries
FIELD_COPIES = 4


def live_peak_bytes(program: Program) -> int:
    """The most bytes of values (float64) alive at once in the evaluation order that keeps the
    fewest (``Program.lean_order``)."""
    live: dict[str, int] = {}
    peak = 0
    for t, dropped in program.lean_order():
        if t.op != "const":
            live[t.digest] = 8 * t.size
        peak = max(peak, sum(live.values()))
        for d in dropped:
            live.pop(d, None)
    return peak


def headroom_bytes() -> int | None:
    """The memory this process may still take: what its address-space limit leaves above its
    current address space; without a limit, the machine's memory (its total: what other
    processes hold now may be gone when the check runs, so only a check that could never fit is
    refused); None when neither is known."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    try:
        if soft != resource.RLIM_INFINITY:
            with open("/proc/self/statm") as f:
                return soft - int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def _need_bytes(program: Program) -> int | None:
    """What a check of ``program`` at its own sizes is estimated to take: ``FIELD_COPIES`` times
    :func:`live_peak_bytes`; None for a symbolic or padded program (sized when bound)."""
    if program.symbolic or program.params:
        return None
    return FIELD_COPIES * live_peak_bytes(program)


def fits(program: Program) -> bool:
    """Could a check of ``program`` at its own sizes fit (what :func:`require_memory` asks;
    True where the memory left or the program's sizes are not known)?"""
    left = headroom_bytes()
    need = None if left is None else _need_bytes(program)
    return need is None or need <= left


def require_memory(program: Program, why_full: str = "") -> None:
    """Raise :class:`~.errors.VerifierMemoryError` unless :func:`fits`: checking ``program``
    needs more than :func:`headroom_bytes`; ``why_full`` says why it is checked at these sizes
    (why shrink.py did not apply)."""
    if fits(program):
        return
    need, left = _need_bytes(program), headroom_bytes()
    big = max(program.nodes(), key=lambda t: t.size)
    raise VerifierMemoryError(
        f"verify: checking {program.name!r} needs about {need / 2 ** 30:.1f} GiB of field values "
        f"(its largest tensor, {big.op} of shape {tuple(big.shape)}, "
        f"{8 * big.size / 2 ** 30:.2f} GiB as float64), {max(left, 0) / 2 ** 30:.1f} GiB left"
        + (f"; not shrunk further: {why_full}" if why_full else ""))


__all__ = ["require_memory", "fits", "live_peak_bytes", "headroom_bytes", "FIELD_COPIES"]
