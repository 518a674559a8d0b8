"""Shared-memory swizzles for dense row-major tiles, with an exact chooser.

A tile lives in shared memory as a dense row-major array. Some warp-wide accesses to such an array
hit the same shared-memory bank with several distinct words (a *bank conflict*), and the hardware
then needs several wavefronts for one instruction. A swizzle permutes the tile's 16-byte chunks so
that those accesses spread over the banks, without changing which thread reads which element.

This module has three parts:

* :class:`Swizzle` -- the XOR swizzle ``Swizzle<B, M, S>`` on *element* offsets (the form of
  CuTe's ``cute::Swizzle``), its application to offsets and arrays, and a C expression for it.
* access-pattern builders -- the warp-wide shared-memory instructions that tile kernels issue
  (``ldmatrix`` for mma operands, 16-byte ``cp.async`` fills, element-wise loops, fp32 fragment
  reads), each an :class:`Instruction` made of :class:`Access` es.
* a bank-conflict cost model (:func:`wavefronts`, :func:`cost`) and :func:`choose_swizzle`, which
  enumerates every valid candidate for a tile and returns the cheapest (ties go to fewer bits,
  identity first).

The cost model is a model, documented in ``docs/swizzle.md``: 32 banks of 4 bytes; one warp-wide
instruction is split into phases (the whole warp for accesses of at most 4 bytes per lane, half
warps for 8 bytes, quarter warps for 16 bytes, which includes each 8x8 matrix of an ``ldmatrix``);
a phase costs the largest number of distinct 4-byte words that it addresses in any one bank (lanes
reading the same word share it). It is not a measurement of any particular GPU.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from ..errors import MirageError

__all__ = [
    "SwizzleError", "Swizzle", "Access", "Instruction", "BANKS", "BANK_BYTES", "CHUNK_BYTES",
    "group_base", "candidates", "ldmatrix_a", "ldmatrix_b_trans", "tile_matmul_ldmatrix",
    "cp_async_fill", "elementwise", "fragment_reads_a", "wavefronts", "ideal_wavefronts",
    "cost", "ideal_cost", "choose_swizzle",
]

BANKS = 32  # shared-memory banks
BANK_BYTES = 4  # each bank serves one 4-byte word per wavefront
CHUNK_BYTES = 16  # cp.async / ldmatrix row / vector access granularity, kept whole by swizzles
WARP = 32
_WIDTHS = (1, 2, 4, 8, 16)  # bytes per lane of a shared-memory access (and element sizes)


class SwizzleError(MirageError, ValueError):
    """An invalid swizzle, a swizzle that does not fit a tile, or an access pattern that does not
    fit its tile; the message names the tile shape or the swizzle."""


def _shape_str(shape: int | Sequence[int]) -> str:
    if isinstance(shape, int):
        return f"{shape} elements"
    return "x".join(str(d) for d in shape)


def _tile_elems(shape: int | Sequence[int]) -> int:
    dims = (shape,) if isinstance(shape, int) else tuple(shape)
    if not dims or any(not isinstance(d, (int, np.integer)) or isinstance(d, bool) or d <= 0
                       for d in dims):
        raise SwizzleError(f"tile shape {tuple(dims)!r} must be one or more positive integers")
    return math.prod(int(d) for d in dims)


def _check_elem_bytes(elem_bytes: int, shape: int | Sequence[int]) -> None:
    if elem_bytes not in _WIDTHS:
        raise SwizzleError(f"tile {_shape_str(shape)}: element size {elem_bytes!r} bytes is not "
                           f"one of {_WIDTHS}")


def group_base(elem_bytes: int) -> int:
    """``M`` such that a group of ``2**M`` elements is one 16-byte chunk (fp16: 3, fp32: 2)."""
    _check_elem_bytes(elem_bytes, "?")
    return (CHUNK_BYTES // elem_bytes).bit_length() - 1


# ---------------------------------------------------------------------------------------------
# The swizzle function
# ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Swizzle:
    """``Swizzle<B, M, S>`` on element offsets (B = ``bits``, M = ``base``, S = ``shift``)::

        apply(o) = o ^ ((o >> S) & (((1 << B) - 1) << M))

    i.e. bits ``[M, M+B)`` of the offset are XOR-ed with bits ``[M+S, M+S+B)``. This is CuTe's
    ``Swizzle<B,M,S>::apply`` (``o ^ ((o & yyy_msk) >> S)`` with ``yyy_msk = ((1<<B)-1) << (M+S)``)
    for non-negative ``S``; as CuTe does, we require ``S >= B`` when ``B > 0``, so that the bits
    read (``[M+S, M+S+B)``) and the bits changed (``[M, M+B)``) are disjoint.

    Properties (proved in ``docs/swizzle.md``, checked by the tests):

    * ``B == 0`` is the identity.
    * Bits below ``M`` are never changed: each aligned group of ``2**M`` consecutive elements
      moves as a whole and keeps its internal order.
    * It is an involution (``apply(apply(o)) == o``), hence a bijection of the non-negative
      integers; bits at and above ``M+B`` are never changed, so every aligned block of
      ``2**(M+B)`` elements is mapped onto itself, and the swizzle is a bijection of
      ``[0, n)`` whenever ``2**(M+B)`` divides ``n``.
    """

    bits: int
    base: int
    shift: int

    def __post_init__(self) -> None:
        for name in ("bits", "base", "shift"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise SwizzleError(f"Swizzle {name} must be a non-negative int, got {v!r}")
        if self.bits > 0 and self.shift < self.bits:
            raise SwizzleError(f"{self}: shift ({self.shift}) must be at least bits "
                               f"({self.bits}), or the bits read overlap the bits changed")

    @classmethod
    def identity(cls, base: int = 0) -> Swizzle:
        return cls(0, base, 0)

    @property
    def is_identity(self) -> bool:
        return self.bits == 0

    @property
    def target_mask(self) -> int:
        """The offset bits that are changed (CuTe's ``zzz_msk``)."""
        return ((1 << self.bits) - 1) << self.base

    @property
    def source_mask(self) -> int:
        """The offset bits that are read (CuTe's ``yyy_msk``)."""
        return self.target_mask << self.shift

    def apply(self, offset: int) -> int:
        """The swizzled (physical) element offset of logical element offset ``offset``."""
        if not isinstance(offset, (int, np.integer)) or isinstance(offset, bool) or offset < 0:
            raise SwizzleError(f"{self}: offset must be a non-negative int, got {offset!r}")
        o = int(offset)
        return o ^ ((o >> self.shift) & self.target_mask)

    def apply_array(self, offsets: np.ndarray) -> np.ndarray:
        """:meth:`apply` element-wise on an integer array (same shape, int64)."""
        a = np.asarray(offsets)
        if a.size and not np.issubdtype(a.dtype, np.integer):
            raise SwizzleError(f"{self}: offsets must be integers, got dtype {a.dtype}")
        a = a.astype(np.int64, copy=False)
        if a.size and int(a.min()) < 0:
            raise SwizzleError(f"{self}: offsets must be non-negative")
        if self.is_identity:
            return a.copy()
        return a ^ ((a >> self.shift) & self.target_mask)

    def c_expr(self, off: str) -> str:
        """A C expression for the swizzled offset, given a C expression ``off`` for the logical
        element offset (a non-negative ``int``; it appears twice, so it must have no side
        effects). The identity returns ``off`` unchanged."""
        if self.is_identity:
            return off
        o = off if re.fullmatch(r"[A-Za-z_][A-Za-z_0-9]*|[0-9]+", off.strip()) else f"({off})"
        return f"({o} ^ (({o} >> {self.shift}) & 0x{self.target_mask:x}))"

    def check_tile(self, shape: int | Sequence[int], elem_bytes: int) -> None:
        """Raise :class:`SwizzleError` unless this swizzle is a valid layout for a dense tile of
        ``shape`` with ``elem_bytes``-byte elements: groups of ``2**base`` elements must be whole
        16-byte chunks (so 16-byte copies and ldmatrix rows stay contiguous), and ``2**(bits +
        base)`` must divide the element count (so the swizzle is a bijection of the tile)."""
        n = _tile_elems(shape)
        _check_elem_bytes(elem_bytes, shape)
        if self.is_identity:
            return
        group = (1 << self.base) * elem_bytes
        if group < CHUNK_BYTES:
            raise SwizzleError(f"{self} on tile {_shape_str(shape)} of {elem_bytes}-byte "
                               f"elements: groups of 2**{self.base} elements are {group} bytes, "
                               f"less than a {CHUNK_BYTES}-byte chunk")
        block = 1 << (self.bits + self.base)
        if n % block:
            raise SwizzleError(f"{self} on tile {_shape_str(shape)}: {n} elements is not a "
                               f"multiple of 2**(bits+base) = {block}, so it is not a bijection "
                               f"of the tile")

    def __str__(self) -> str:
        if self.is_identity:
            return "identity"
        return f"Swizzle<{self.bits},{self.base},{self.shift}>"


# The hardware's swizzle modes (TMA's CU_TENSOR_MAP_SWIZZLE_32B / 64B / 128B, wgmma's matrix
# descriptors): rows of 32, 64 or 128 bytes, 16-byte chunks XORed with the row bits 7.. of the
# byte address -- Swizzle<B, 4, 3> on bytes, with 2^B chunks per row. Row bytes -> B.
CANONICAL_ROW_BYTES = {32: 1, 64: 2, 128: 3}


def canonical_swizzle(row_bytes: int, elem_bytes: int) -> Swizzle | None:
    """The hardware mode's swizzle of a tile with rows of ``row_bytes`` on offsets of
    ``elem_bytes``-byte elements (``Swizzle<B, group_base(elem_bytes), 3>``), or None for rows
    no mode covers."""
    bits = CANONICAL_ROW_BYTES.get(row_bytes)
    return None if bits is None else Swizzle(bits, group_base(elem_bytes), 3)


def candidates(shape: int | Sequence[int], elem_bytes: int, *, max_bits: int = 3,
               max_shift: int | None = None) -> list[Swizzle]:
    """Every candidate swizzle for a dense tile, in a fixed order: the identity first, then
    ``Swizzle<B, M, S>`` for ``B = 1..max_bits`` and ``S = B..max_shift``, with ``M`` fixed so
    that a group is one 16-byte chunk.

    Candidates that are not valid for the tile (:meth:`Swizzle.check_tile`) are left out, and so
    are those that read only offset bits above the tile (``M + S >= log2(tile)``): on this tile
    they are the identity. ``max_shift`` defaults to the largest shift that still reads a bit
    inside the tile. ``max_bits = 3`` is enough for 32 banks of 4 bytes: a bank line is 128 bytes
    = 8 chunks, and bit ``M+3`` and above of an offset does not change the bank.
    """
    n = _tile_elems(shape)
    _check_elem_bytes(elem_bytes, shape)
    if not isinstance(max_bits, int) or max_bits < 0:
        raise SwizzleError(f"max_bits must be a non-negative int, got {max_bits!r}")
    m = group_base(elem_bytes)
    top = (n - 1).bit_length()  # offsets of the tile have bits [0, top)
    if max_shift is None:
        max_shift = top - m - 1
    out = [Swizzle.identity(m)]
    for b in range(1, max_bits + 1):
        for s in range(b, max_shift + 1):
            if m + s >= top:
                continue
            sw = Swizzle(b, m, s)
            try:
                sw.check_tile(shape, elem_bytes)
            except SwizzleError:
                continue
            out.append(sw)
    return out


# ---------------------------------------------------------------------------------------------
# Access patterns
# ---------------------------------------------------------------------------------------------

class Access(NamedTuple):
    """One lane's part of a warp-wide shared-memory instruction: ``width`` bytes starting at the
    logical (unswizzled) byte offset ``byte`` within the dense row-major tile."""

    lane: int
    byte: int
    width: int


@dataclass(frozen=True)
class Instruction:
    """One warp-wide shared-memory instruction on a tile of ``elem_bytes``-byte elements.

    All accesses have the same width; lanes are distinct and in ``[0, 32)``; every access is
    naturally aligned (``byte % width == 0``). Lanes that take no part (inactive threads, or the
    lanes whose addresses an ``ldmatrix.x2`` ignores) are simply absent.
    """

    kind: str
    elem_bytes: int
    accesses: tuple[Access, ...]

    def __post_init__(self) -> None:
        acc = tuple(Access(*a) for a in self.accesses)
        object.__setattr__(self, "accesses", acc)
        if self.elem_bytes not in _WIDTHS:
            raise SwizzleError(f"{self.kind}: element size {self.elem_bytes!r} is not one of "
                               f"{_WIDTHS}")
        if not acc:
            raise SwizzleError(f"{self.kind}: an instruction needs at least one access")
        widths = {a.width for a in acc}
        if len(widths) != 1 or acc[0].width not in _WIDTHS:
            raise SwizzleError(f"{self.kind}: all accesses need one width out of {_WIDTHS}, "
                               f"got {sorted(widths)}")
        lanes = [a.lane for a in acc]
        if len(set(lanes)) != len(lanes) or min(lanes) < 0 or max(lanes) >= WARP:
            raise SwizzleError(f"{self.kind}: lanes must be distinct and in [0, {WARP})")
        for a in acc:
            if a.byte < 0 or a.byte % a.width:
                raise SwizzleError(f"{self.kind}: lane {a.lane} accesses {a.width} bytes at "
                                   f"byte {a.byte}, which is not naturally aligned")

    @property
    def width(self) -> int:
        return self.accesses[0].width

    @property
    def lanes_per_phase(self) -> int:
        """32 for accesses of at most 4 bytes, 16 for 8 bytes, 8 for 16 bytes."""
        return WARP // max(1, self.width // BANK_BYTES)

    @property
    def end(self) -> int:
        """One past the last byte this instruction touches."""
        return max(a.byte + a.width for a in self.accesses)


def _check_2d(rows: int, cols: int, what: str) -> None:
    for v in (rows, cols):
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise SwizzleError(f"{what}: tile {rows}x{cols} needs positive integer dimensions")


def _check_b16(rows: int, cols: int, elem_bytes: int, what: str) -> None:
    _check_2d(rows, cols, what)
    if elem_bytes != 2:
        raise SwizzleError(f"{what}: ldmatrix .b16 needs 2-byte elements, tile {rows}x{cols} has "
                           f"{elem_bytes}-byte elements")
    if (cols * elem_bytes) % CHUNK_BYTES:
        raise SwizzleError(f"{what}: rows of tile {rows}x{cols} are {cols * elem_bytes} bytes, "
                           f"not a multiple of {CHUNK_BYTES}, so ldmatrix row addresses are "
                           f"not 16-byte aligned")


def ldmatrix_a(rows: int, cols: int, elem_bytes: int = 2, m0: int = 0,
               k0: int = 0) -> list[Instruction]:
    """The ``ldmatrix.sync.aligned.m8n8.x4.shared.b16`` that loads the 16x16 A fragment at
    ``(m0, k0)`` of a row-major ``rows x cols`` (M x K) tile: lanes ``8j..8j+7`` give the row
    addresses of matrix ``j``, rows ``m0 + 8*(j % 2) + r`` at column ``k0 + 8*(j // 2)``."""
    what = "ldmatrix_a"
    _check_b16(rows, cols, elem_bytes, what)
    if m0 < 0 or k0 < 0 or m0 + 16 > rows or k0 + 16 > cols or k0 % 8:
        raise SwizzleError(f"{what}: a 16x16 fragment at ({m0}, {k0}) does not fit tile "
                           f"{rows}x{cols} (k0 must be a multiple of 8)")
    acc = []
    for lane in range(WARP):
        j, r = divmod(lane, 8)
        row, col = m0 + 8 * (j % 2) + r, k0 + 8 * (j // 2)
        acc.append(Access(lane, (row * cols + col) * elem_bytes, CHUNK_BYTES))
    return [Instruction("ldmatrix.x4", elem_bytes, tuple(acc))]


def ldmatrix_b_trans(rows: int, cols: int, elem_bytes: int = 2, k0: int = 0, n0: int = 0,
                     x4: bool = True) -> list[Instruction]:
    """The ``ldmatrix ... .x4.trans`` (or ``.x2.trans``) that loads the B fragment at ``(k0, n0)``
    of a row-major ``rows x cols`` (K x N) tile: lanes 0-7 give rows ``k0..k0+7`` at column
    ``n0``, lanes 8-15 rows ``k0+8..k0+15``; for x4, lanes 16-31 the same at column ``n0 + 8``.
    For x2 the addresses of lanes 16-31 are ignored, so they are absent."""
    what = "ldmatrix_b_trans"
    _check_b16(rows, cols, elem_bytes, what)
    width_n = 16 if x4 else 8
    if k0 < 0 or n0 < 0 or k0 + 16 > rows or n0 + width_n > cols or n0 % 8:
        raise SwizzleError(f"{what}: a 16x{width_n} fragment at ({k0}, {n0}) does not fit tile "
                           f"{rows}x{cols} (n0 must be a multiple of 8)")
    acc = []
    for lane in range(WARP if x4 else 16):
        j, r = divmod(lane, 8)
        row, col = k0 + 8 * (j % 2) + r, n0 + 8 * (j // 2)
        acc.append(Access(lane, (row * cols + col) * elem_bytes, CHUNK_BYTES))
    return [Instruction("ldmatrix.x4.trans" if x4 else "ldmatrix.x2.trans", elem_bytes,
                        tuple(acc))]


def tile_matmul_ldmatrix(m: int, k: int, n: int,
                         elem_bytes: int = 2) -> tuple[list[Instruction], list[Instruction]]:
    """Every ldmatrix that an mma (m16n8k16) tile matmul ``(m x k) @ (k x n)`` issues on its
    row-major operand tiles, each fragment once: ``(A instructions, B instructions)``.

    A: one x4 per ``(m0, k0)`` in steps of 16. B: one x4.trans per ``(k0, n0)`` in steps of 16,
    and an x2.trans for a last 8 columns when ``n % 16 == 8``. When several warps load the same
    fragment, every instruction repeats equally often, which scales the cost and not the choice.
    """
    _check_2d(m, k, "tile_matmul_ldmatrix (A)")
    _check_2d(k, n, "tile_matmul_ldmatrix (B)")
    if m % 16 or k % 16 or n % 8:
        raise SwizzleError(f"tile_matmul_ldmatrix: ({m}x{k}) @ ({k}x{n}) needs m and k multiples "
                           f"of 16 and n a multiple of 8")
    a = [ins for m0 in range(0, m, 16) for k0 in range(0, k, 16)
         for ins in ldmatrix_a(m, k, elem_bytes, m0, k0)]
    b = []
    for k0 in range(0, k, 16):
        for n0 in range(0, n - n % 16, 16):
            b += ldmatrix_b_trans(k, n, elem_bytes, k0, n0, x4=True)
        if n % 16:
            b += ldmatrix_b_trans(k, n, elem_bytes, k0, n - 8, x4=False)
    return a, b


def _check_threads(threads: int, what: str) -> None:
    if not isinstance(threads, int) or threads <= 0 or threads % WARP:
        raise SwizzleError(f"{what}: threads ({threads!r}) must be a positive multiple of {WARP}")


def _strided(n_items: int, threads: int, kind: str, elem_bytes: int,
             width: int) -> list[Instruction]:
    """Item ``i`` on thread ``i % threads``, at byte ``i * width``: one instruction per warp and
    iteration that has an active lane."""
    out = []
    for start in range(0, n_items, threads):
        for w0 in range(start, min(start + threads, n_items), WARP):
            acc = tuple(Access(i - w0, i * width, width)
                        for i in range(w0, min(w0 + WARP, n_items)))
            out.append(Instruction(kind, elem_bytes, acc))
    return out


def cp_async_fill(tile_elems: int, elem_bytes: int, threads: int) -> list[Instruction]:
    """The shared-memory side of filling a dense tile with 16-byte ``cp.async`` copies: thread
    ``t`` copies chunks ``t, t + threads, ...``, so consecutive lanes write consecutive chunks."""
    what = "cp_async_fill"
    n = _tile_elems(tile_elems)
    _check_elem_bytes(elem_bytes, tile_elems)
    _check_threads(threads, what)
    if (n * elem_bytes) % CHUNK_BYTES:
        raise SwizzleError(f"{what}: tile of {n} elements is {n * elem_bytes} bytes, not a "
                           f"multiple of {CHUNK_BYTES}")
    return _strided(n * elem_bytes // CHUNK_BYTES, threads, "cp.async.16", elem_bytes,
                    CHUNK_BYTES)


def elementwise(tile_elems: int, elem_bytes: int, threads: int) -> list[Instruction]:
    """An element-wise loop over a dense tile: element ``i`` on thread ``i % threads``, one
    ``elem_bytes``-byte access each."""
    n = _tile_elems(tile_elems)
    _check_elem_bytes(elem_bytes, tile_elems)
    _check_threads(threads, "elementwise")
    return _strided(n, threads, f"ld.shared.b{8 * elem_bytes}", elem_bytes, elem_bytes)


def fragment_reads_a(rows: int, cols: int, elem_bytes: int = 4, m0: int = 0,
                     k0: int = 0) -> list[Instruction]:
    """Element-wise reads of the 16x16 A fragment at ``(m0, k0)`` of a row-major ``rows x cols``
    tile (fp32 operands that are converted in registers): lane ``l`` with ``g = l // 4``,
    ``t = l % 4`` reads rows ``g`` and ``g + 8``, columns ``2t, 2t+1, 2t+8, 2t+9`` relative to
    ``(m0, k0)``. One instruction per (row offset, column offset): 8 instructions."""
    what = "fragment_reads_a"
    _check_2d(rows, cols, what)
    _check_elem_bytes(elem_bytes, (rows, cols))
    if m0 < 0 or k0 < 0 or m0 + 16 > rows or k0 + 16 > cols:
        raise SwizzleError(f"{what}: a 16x16 fragment at ({m0}, {k0}) does not fit tile "
                           f"{rows}x{cols}")
    out = []
    for dc in (0, 1, 8, 9):
        for dr in (0, 8):
            acc = tuple(Access(lane, ((m0 + lane // 4 + dr) * cols + k0 + 2 * (lane % 4) + dc)
                               * elem_bytes, elem_bytes) for lane in range(WARP))
            out.append(Instruction(f"ld.shared.b{8 * elem_bytes}", elem_bytes, acc))
    return out


# ---------------------------------------------------------------------------------------------
# Cost model
# ---------------------------------------------------------------------------------------------

_PHASES = 4  # at most 4 phases per instruction (16-byte accesses)


class _Flat:
    """A list of instructions as flat arrays, so that many swizzles can be costed quickly."""

    def __init__(self, instrs: Sequence[Instruction]):
        lanes, byte, width, eb, idx = [], [], [], [], []
        for k, ins in enumerate(instrs):
            if not isinstance(ins, Instruction):
                raise SwizzleError(f"expected Instruction, got {type(ins).__name__}")
            for a in ins.accesses:
                lanes.append(a.lane)
                byte.append(a.byte)
                width.append(a.width)
                eb.append(ins.elem_bytes)
                idx.append(k)
        self.n = len(instrs)
        self.byte = np.asarray(byte, dtype=np.int64)
        self.width = np.asarray(width, dtype=np.int64)
        self.eb = np.asarray(eb, dtype=np.int64)
        lane = np.asarray(lanes, dtype=np.int64)
        idx_a = np.asarray(idx, dtype=np.int64)
        per_phase = WARP // np.maximum(1, self.width // BANK_BYTES)
        self.phase = idx_a * _PHASES + lane // per_phase  # global phase id
        nw = np.maximum(1, self.width // BANK_BYTES)  # 4-byte words per access
        self.rep = nw
        starts = np.cumsum(nw) - nw
        self.word_off = np.arange(int(nw.sum()), dtype=np.int64) - np.repeat(starts, nw)
        self.word_phase = np.repeat(self.phase, nw)

    def swizzled_bytes(self, swizzle: Swizzle) -> np.ndarray:
        if swizzle.is_identity or not self.byte.size:
            return self.byte
        group = self.eb << swizzle.base
        if np.any(self.width > group):
            bad = int(self.width[np.argmax(self.width > group)])
            raise SwizzleError(f"{swizzle}: a {bad}-byte access would be split, its groups are "
                               f"{int(group.min())} bytes")
        elem, rem = np.divmod(self.byte, self.eb)
        return swizzle.apply_array(elem) * self.eb + rem

    def _unique_words(self, swizzle: Swizzle) -> tuple[np.ndarray, np.ndarray]:
        words = np.repeat(self.swizzled_bytes(swizzle) // BANK_BYTES, self.rep) + self.word_off
        key = np.unique((self.word_phase << 32) | words)
        return key >> 32, key & 0xFFFFFFFF

    def wavefronts(self, swizzle: Swizzle) -> np.ndarray:
        """Wavefronts per instruction."""
        if not self.n:
            return np.zeros(0, dtype=np.int64)
        phase, words = self._unique_words(swizzle)
        counts = np.bincount(phase * BANKS + words % BANKS, minlength=self.n * _PHASES * BANKS)
        return counts.reshape(self.n, _PHASES, BANKS).max(axis=2).sum(axis=1)

    def ideal(self) -> np.ndarray:
        """Least wavefronts per instruction: each phase with accesses needs at least one, and at
        least its distinct words / 32."""
        if not self.n:
            return np.zeros(0, dtype=np.int64)
        phase, _ = self._unique_words(Swizzle.identity())
        per_phase = np.bincount(phase, minlength=self.n * _PHASES)
        return (-(-per_phase // BANKS)).reshape(self.n, _PHASES).sum(axis=1)


def wavefronts(instr: Instruction, swizzle: Swizzle | None = None) -> int:
    """Wavefronts the model charges for one instruction when the tile is stored with
    ``swizzle`` (default: identity)."""
    return int(_Flat([instr]).wavefronts(swizzle or Swizzle.identity())[0])


def ideal_wavefronts(instr: Instruction) -> int:
    """The model's lower bound for one instruction, under any swizzle: per phase with accesses,
    ``max(1, ceil(distinct words / 32))``. Swizzles move whole 16-byte chunks, so they do not
    change the number of distinct words."""
    return int(_Flat([instr]).ideal()[0])


Weighted = Iterable[tuple[Sequence[Instruction], float]]


def _weighted(accesses: Weighted) -> list[tuple[_Flat, float]]:
    out = []
    for item in accesses:
        try:
            instrs, weight = item
        except (TypeError, ValueError):
            raise SwizzleError("accesses must be (instructions, weight) pairs") from None
        if isinstance(instrs, Instruction):
            raise SwizzleError("accesses must be (list of instructions, weight) pairs, got a "
                               "single Instruction")
        if not isinstance(weight, (int, float)) or isinstance(weight, bool) \
                or not math.isfinite(weight) or weight < 0:
            raise SwizzleError(f"access weight must be a finite number >= 0, got {weight!r}")
        out.append((_Flat(list(instrs)), weight))
    return out


def cost(accesses: Weighted, swizzle: Swizzle | None = None) -> float:
    """Weighted total wavefronts: ``sum(weight * sum(wavefronts(i, swizzle) for i in instrs))``
    over ``(instrs, weight)`` pairs (int when the weights are ints)."""
    sw = swizzle or Swizzle.identity()
    return sum(w * int(f.wavefronts(sw).sum()) for f, w in _weighted(accesses))


def ideal_cost(accesses: Weighted) -> float:
    """Weighted total of :func:`ideal_wavefronts`: no swizzle can cost less."""
    return sum(w * int(f.ideal().sum()) for f, w in _weighted(accesses))


def choose_swizzle(shape: int | Sequence[int], elem_bytes: int, accesses: Weighted, *,
                   max_bits: int = 3,
                   max_shift: int | None = None) -> tuple[Swizzle, dict[Swizzle, float]]:
    """The cheapest swizzle for a dense row-major tile of ``shape`` under the weighted accesses
    (``(instructions, weight)`` pairs, byte offsets logical), by exact enumeration of
    :func:`candidates`. Ties go to fewer bits, then to the smaller shift, so the identity wins
    when nothing is gained. Returns ``(best, {candidate: cost})`` in enumeration order."""
    n = _tile_elems(shape)
    _check_elem_bytes(elem_bytes, shape)
    flats = _weighted(accesses)
    for f, _ in flats:
        if f.eb.size and np.any(f.eb != elem_bytes):
            raise SwizzleError(f"tile {_shape_str(shape)} has {elem_bytes}-byte elements but an "
                               f"access pattern was built for {int(f.eb.max())}-byte elements")
        if f.byte.size and int((f.byte + f.width).max()) > n * elem_bytes:
            raise SwizzleError(f"tile {_shape_str(shape)} is {n * elem_bytes} bytes, an access "
                               f"reaches byte {int((f.byte + f.width).max())}")
    table: dict[Swizzle, float] = {}
    for sw in candidates(shape, elem_bytes, max_bits=max_bits, max_shift=max_shift):
        table[sw] = sum(w * int(f.wavefronts(sw).sum()) for f, w in flats)
    best = min(table, key=lambda s: (table[s], s.bits, s.shift))
    return best, table
