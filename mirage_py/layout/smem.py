"""Shared-memory plan of a graph-defined kernel: a byte offset for every tile.

Every tile lives in shared memory, dense row-major, at a 16-byte aligned offset (a tile whose
size is not a multiple of 16 bytes, such as a column of row sums, at its natural alignment). Live ranges are
measured in barrier stages (see :mod:`.schedule`): a tile is live from the stage that writes it to
the last stage that reads it; a tile written before the loop and read inside it (loop-invariant
tiles, accumulators) stays live until the loop's last stage. Two tiles may share bytes only when
their live ranges do not meet, so a barrier always separates the last read of one from the first
write of the other. Fused thread graphs keep their intermediates in registers and need no space.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lax.ops import DTYPES
from ..ugraph.phase import Phase
from ..ugraph.validate import BlockInfo, accum_copies
from .intervals import Buffer, conflicts, first_fit, peak_live_bytes
from .schedule import BlockSchedule

SMEM_ALIGN = 16


@dataclass(frozen=True)
class SmemPlan:
    offsets: dict[str, int]  # tile -> byte offset
    buffers: tuple[Buffer, ...]  # tile sizes and live ranges (stages)
    total_bytes: int

    def conflicts(self) -> list[tuple[str, str]]:
        return conflicts(list(self.buffers), self.offsets)

    @property
    def peak_live_bytes(self) -> int:
        return peak_live_bytes(list(self.buffers))


def tile_bytes(shape: tuple[int, ...], dtype: str) -> int:
    n = 1
    for d in shape:
        n *= d
    return n * DTYPES[dtype]


def live_ranges(sched: BlockSchedule, info: BlockInfo,
                copies: dict[str, int] | None = None) -> list[Buffer]:
    """Buffers of every tile; ``copies`` (tile -> n, the software pipeline's tiles) gives a tile
    n copies live for the whole loop (prefetched before it, refilled during it)."""
    copies = copies or {}
    start: dict[str, int] = {}
    end: dict[str, int] = {}
    body = sched.stages[Phase.BODY]
    for st in sched.steps:
        if st.writes is not None:
            start.setdefault(st.writes, st.stage)
            end[st.writes] = max(end.get(st.writes, st.stage), st.stage)
        for t in st.reads + ((st.writes,) if st.writes is not None else ()):
            end[t] = max(end[t], st.stage)
            if st.segment is Phase.BODY and start[t] not in body:
                end[t] = max(end[t], body[-1])  # read or updated by every iteration
    last = max(body, default=0)
    in_registers = set(sched.registers) - set(sched.spilled)  # never stored in shared memory
    for t in in_registers:
        start.pop(t, None)
    # a register accumulator spilled after the loop is stored there (frags_to_smem) and read
    # after it: its buffer is live from the loop's last stage on -- overlapping body tiles only
    # if a barrier closes every iteration, since the spill follows the loop without one
    for t in sched.spilled:
        if sched.registers[t].carried and t in start and body:
            start[t] = body[-1] + (1 if sched.loop_barrier else 0)
            end[t] = max(end[t], start[t])
    # a running accumulator keeps its rescale factor after its value
    factor = {st.writes: accum_copies(st.node) for st in sched.steps if st.writes is not None}
    return [Buffer(t, tile_bytes(info.shapes[t], info.dtypes[t]) * copies[t], 0,
                   max(end[t], last)) if t in copies else
            Buffer(t, tile_bytes(info.shapes[t], info.dtypes[t]) * factor.get(t, 1), start[t],
                   end[t])
            for t in start]


def plan_shared_memory(sched: BlockSchedule, info: BlockInfo,
                       copies: dict[str, int] | None = None,
                       aligns: dict[str, int] | None = None) -> SmemPlan:
    """``aligns``: tile -> byte alignment beyond the default (warpgroup-MMA operands: one
    swizzle atom, since the hardware swizzles absolute shared-memory addresses)."""
    bufs = live_ranges(sched, info, copies)
    offsets, total = first_fit(bufs, SMEM_ALIGN, pad=False, aligns=aligns)
    return SmemPlan(offsets, tuple(bufs), total)
