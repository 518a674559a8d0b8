"""First-fit placement of buffers with live ranges: one allocator for shared-memory tiles (live
ranges in barrier stages) and for workspace tensors (live ranges in kernel launches)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Buffer:
    """A buffer of ``size`` bytes live from ``start`` to ``end`` (both inclusive)."""

    name: str
    size: int
    start: int
    end: int

    def overlaps(self, other: "Buffer") -> bool:
        return self.start <= other.end and other.start <= self.end


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def natural_alignment(size: int, align: int) -> int:
    """``align`` for buffers whose size is a multiple of it, else the largest power of two that
    divides the size (a 4-byte tile needs no 16-byte slot)."""
    a = align
    while a > 1 and size % a:
        a //= 2
    return a


def first_fit(buffers: list[Buffer], align: int, pad: bool = True,
              aligns: dict[str, int] | None = None) -> tuple[dict[str, int], int]:
    """Byte offsets such that buffers live at the same time never share a byte; returns
    ``(offsets, total)``. Larger buffers are placed first, each at the lowest offset free over
    its whole live range. With ``pad`` every buffer starts at a multiple of ``align`` and its
    size is rounded up to it; without, a buffer whose size is not a multiple of ``align`` gets
    its :func:`natural_alignment` and no padding. ``aligns``: a larger alignment for some
    buffers by name (operands the hardware reads by swizzled absolute address)."""
    aligns = aligns or {}

    def slot(b: Buffer) -> tuple[int, int]:
        size = max(b.size, 1)
        if pad:
            return max(align, aligns.get(b.name, 1)), align_up(size, align)
        return max(natural_alignment(size, align), aligns.get(b.name, 1)), size

    order = sorted(buffers, key=lambda b: (-slot(b)[1], b.start, b.name))
    offsets: dict[str, int] = {}
    placed: list[Buffer] = []
    total = 0
    for b in order:
        al, size = slot(b)
        busy = sorted((offsets[p.name], offsets[p.name] + slot(p)[1])
                      for p in placed if p.overlaps(b))
        at = 0
        for lo, hi in busy:
            if align_up(at, al) + size <= lo:
                break
            at = max(at, hi)
        at = align_up(at, al)
        offsets[b.name] = at
        placed.append(b)
        total = max(total, at + size)
    return offsets, total


def conflicts(buffers: list[Buffer], offsets: dict[str, int]) -> list[tuple[str, str]]:
    """Pairs of buffers that are live at the same time and share bytes (empty for a good plan)."""
    bad = []
    for i, a in enumerate(buffers):
        for b in buffers[i + 1:]:
            if a.overlaps(b) and offsets[a.name] < offsets[b.name] + b.size and \
                    offsets[b.name] < offsets[a.name] + a.size:
                bad.append((a.name, b.name))
    return bad


def peak_live_bytes(buffers: list[Buffer]) -> int:
    """A lower bound for any plan: the most bytes live at one time."""
    points = {b.start for b in buffers}
    return max((sum(b.size for b in buffers if b.start <= p <= b.end) for p in points), default=0)
