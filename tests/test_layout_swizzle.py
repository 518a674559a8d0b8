"""Shared-memory swizzles: the XOR swizzle is a chunk-preserving bijection, the bank-conflict model
counts what it says it counts, and the chooser finds conflict-free layouts for mma operand tiles
(and leaves conflict-free tiles alone). docs/swizzle.md's worked table is checked here too."""

import os
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mirage_py.errors import MirageError
from mirage_py.layout.swizzle import (Access, Instruction, Swizzle, SwizzleError, candidates,
                                      choose_swizzle, cost, cp_async_fill, elementwise,
                                      fragment_reads_a, group_base, ideal_cost, ideal_wavefronts,
                                      ldmatrix_a, ldmatrix_b_trans, tile_matmul_ldmatrix,
                                      wavefronts)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (shape, elem_bytes): includes tiles whose size is a multiple of 2**(B+M) but not of
# 2**(B+M+S) (3x64, 24x32, 128x24), where bijectivity rests on the block argument of the docs.
TILES = [((64, 64), 2), ((16, 16), 2), ((8, 8), 2), ((3, 64), 2), ((128, 24), 2),
         ((24, 32), 2), ((64, 32), 4), ((5, 16), 4), ((1, 4096), 1), ((32, 8), 8)]


def _ref_swizzle(o, b, m, s):
    """Independent bit-by-bit statement of Swizzle<B,M,S>: bit M+i ^= bit M+S+i."""
    out = o
    for i in range(b):
        out ^= ((o >> (m + s + i)) & 1) << (m + i)
    return out


# -- the swizzle function --------------------------------------------------------------------

@pytest.mark.parametrize("shape,eb", TILES, ids=lambda v: str(v))
def test_every_candidate_is_a_chunk_preserving_bijection(shape, eb):
    n = int(np.prod(shape))
    m = group_base(eb)
    assert (1 << m) * eb == 16
    cands = candidates(shape, eb)
    assert cands[0].is_identity
    offs = np.arange(n)
    for sw in cands:
        img = sw.apply_array(offs)
        assert sorted(img.tolist()) == list(range(n)), (shape, str(sw))  # bijection of [0, n)
        assert np.array_equal(sw.apply_array(img), offs)  # involution
        groups = img.reshape(-1, 1 << m)  # 16-byte chunks stay whole and in order
        assert np.all(groups % (1 << m) == np.arange(1 << m)), (shape, str(sw))
        assert np.all(groups[:, 1:] - groups[:, :-1] == 1)
        assert all(sw.apply(o) == _ref_swizzle(o, sw.bits, sw.base, sw.shift)
                   for o in range(0, n, max(1, n // 257)))


def test_bijective_whenever_block_divides_size():
    """The claim behind check_tile, exhaustively on small sizes: 2**(B+M) | n suffices."""
    for b in range(1, 4):
        for m in range(0, 3):
            for s in range(b, 6):
                sw = Swizzle(b, m, s)
                blk = 1 << (b + m)
                for n in range(blk, 8 * blk + 1, blk):
                    assert sorted(sw.apply_array(np.arange(n)).tolist()) == list(range(n))


def test_check_tile_rejects_a_non_bijection():
    sw = Swizzle(2, 3, 2)  # bits 3,4 ^= bits 5,6
    img = sw.apply_array(np.arange(80))
    assert img.max() >= 80  # really not a bijection of [0, 80)
    with pytest.raises(SwizzleError, match="5x16"):
        sw.check_tile((5, 16), 2)
    assert sw not in candidates((5, 16), 2)
    with pytest.raises(SwizzleError, match="8 bytes"):
        Swizzle(1, 2, 2).check_tile((64,), 2)  # groups of 4 fp16 = 8 bytes split 16-byte chunks


def test_swizzle_validation_and_identity():
    with pytest.raises(SwizzleError, match="shift"):
        Swizzle(3, 3, 2)
    with pytest.raises(SwizzleError):
        Swizzle(-1, 3, 3)
    with pytest.raises(SwizzleError):
        Swizzle(1, 3, 3).apply(-1)
    assert issubclass(SwizzleError, MirageError) and issubclass(SwizzleError, ValueError)
    ident = Swizzle.identity(3)
    assert ident.is_identity and str(ident) == "identity"
    assert all(ident.apply(o) == o for o in range(300))
    assert str(Swizzle(3, 3, 3)) == "Swizzle<3,3,3>"
    assert Swizzle(3, 3, 3).apply(0b111_000_101) == 0b111_111_101


def _c_expr_cases():
    return [sw for sw in candidates((64, 64), 2)] + [Swizzle(2, 2, 3), Swizzle(1, 4, 1)]


def test_c_expr_agrees_with_apply_in_python():
    for sw in _c_expr_cases():
        e_plain = sw.c_expr("i")
        e_compound = sw.c_expr("r * 64 + c")  # must be parenthesised inside the expression
        assert (e_plain == "i") == sw.is_identity
        # ^, >> and & mean the same in Python and C for non-negative ints, also on int arrays
        o = np.arange(4096)
        want = sw.apply_array(o)
        assert np.array_equal(eval(e_plain, {"i": o}), want)
        assert np.array_equal(eval(e_compound, {"r": o // 64, "c": o % 64}), want)
        assert all(eval(e_compound, {"r": x // 64, "c": x % 64}) == sw.apply(x)
                   for x in (0, 7, 8, 63, 64, 511, 512, 4095))


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
def test_c_expr_agrees_with_apply_in_c(tmp_path):
    sws = _c_expr_cases()
    body = "\n".join(f'  for (int i = 0; i < 4096; ++i) {{ int r = i / 64, c = i % 64; '
                     f'printf("%d %d\\n", {sw.c_expr("i")}, {sw.c_expr("r * 64 + c")}); }}'
                     for sw in sws)
    src = tmp_path / "sw.cpp"
    src.write_text(f"#include <cstdio>\nint main() {{\n{body}\n  return 0;\n}}\n")
    exe = tmp_path / "sw"
    subprocess.run(["g++", "-O0", "-o", str(exe), str(src)], check=True, capture_output=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split()
    got = np.array(out, dtype=np.int64).reshape(len(sws), 4096, 2)
    for k, sw in enumerate(sws):
        want = sw.apply_array(np.arange(4096))
        assert np.array_equal(got[k, :, 0], want) and np.array_equal(got[k, :, 1], want), str(sw)


# -- the cost model --------------------------------------------------------------------------

def _ref_wavefronts(instr, b, m, s):
    """Straightforward count: split lanes into phases by width, swizzle each access's element
    offset bit by bit, walk its bytes, collect distinct words per bank, take the max per phase."""
    per_phase = {1: 32, 2: 32, 4: 32, 8: 16, 16: 8}[instr.width]
    total = 0
    for p in range(32 // per_phase):
        banks = {}
        for lane, byte, width in instr.accesses:
            if p * per_phase <= lane < (p + 1) * per_phase:
                e, r = divmod(byte, instr.elem_bytes)
                phys = _ref_swizzle(e, b, m, s) * instr.elem_bytes + r
                for x in range(phys, phys + width):
                    banks.setdefault((x // 4) % 32, set()).add(x // 4)
        total += max((len(w) for w in banks.values()), default=0)
    return total


@st.composite
def _instructions(draw):
    eb = draw(st.sampled_from([1, 2, 4]))
    width = draw(st.sampled_from([w for w in (1, 2, 4, 8, 16) if w >= eb]))
    lanes = draw(st.lists(st.integers(0, 31), min_size=1, max_size=32, unique=True))
    span = draw(st.sampled_from([64, 512, 4096]))  # small spans force broadcasts and conflicts
    addrs = draw(st.lists(st.integers(0, span // width - 1), min_size=len(lanes),
                          max_size=len(lanes)))
    return Instruction("random", eb, tuple(Access(l, a * width, width)
                                           for l, a in zip(lanes, addrs)))


@settings(max_examples=300, deadline=None)
@given(_instructions(), st.sampled_from([(0, 0), (1, 0), (3, 0), (2, 1), (3, 3)]))
def test_wavefronts_match_an_independent_count(instr, bs):
    b, s = bs
    m = group_base(instr.elem_bytes)
    sw = Swizzle(b, m, s + (b if b > s else 0))  # keep shift >= bits
    got = wavefronts(instr, sw)
    assert got == _ref_wavefronts(instr, sw.bits, sw.base, sw.shift)
    assert ideal_wavefronts(instr) <= got
    assert cost([([instr, instr], 3)], sw) == 6 * got


def test_wavefront_basics():
    # 32 lanes reading one word: broadcast, 1 wavefront; 32 distinct words in one bank: 32
    bcast = Instruction("b", 4, tuple(Access(l, 0, 4) for l in range(32)))
    column = Instruction("c", 4, tuple(Access(l, 128 * l, 4) for l in range(32)))
    assert wavefronts(bcast) == 1 and wavefronts(column) == 32 and ideal_wavefronts(column) == 1
    # 16-byte accesses: 4 quarter-warp phases, each 8 lanes x 16 B = one 128-byte line
    vec = Instruction("v", 4, tuple(Access(l, 16 * l, 16) for l in range(32)))
    assert wavefronts(vec) == 4 == ideal_wavefronts(vec)
    # 8-byte accesses: 2 half-warp phases
    dbl = Instruction("d", 4, tuple(Access(l, 8 * l, 8) for l in range(32)))
    assert wavefronts(dbl) == 2
    with pytest.raises(SwizzleError):
        Instruction("bad", 2, (Access(0, 4, 8),))  # misaligned
    with pytest.raises(SwizzleError):
        Instruction("bad", 2, (Access(0, 0, 4), Access(0, 4, 4)))  # lane twice


# -- access patterns and the chooser ---------------------------------------------------------

def test_swizzle_333_makes_64x64_fp16_ldmatrix_conflict_free():
    sw = Swizzle(3, 3, 3)
    ident = Swizzle.identity(3)
    a, b = tile_matmul_ldmatrix(64, 64, 64)
    assert len(a) == 16 and len(b) == 16
    for ins in a + b:
        assert len(ins.accesses) == 32 and ins.lanes_per_phase == 8
        assert wavefronts(ins, sw) == 4  # 4 matrices, 1 wavefront each
        assert wavefronts(ins, ident) == 32  # 8-way conflict in each matrix
        assert ideal_wavefronts(ins) == 4
    # single fragments built directly agree with the tile-matmul helper
    assert ldmatrix_a(64, 64, 2, 16, 32)[0] == a[1 * 4 + 2]
    assert ldmatrix_b_trans(64, 64, 2, 16, 32)[0] == b[1 * 4 + 2]


def _a_tile(m, k, threads=128):
    a, _ = tile_matmul_ldmatrix(m, k, 16)
    return a, cp_async_fill(m * k, 2, threads)


def _b_tile(k, n, threads=128):
    _, b = tile_matmul_ldmatrix(16, k, n)
    return b, cp_async_fill(k * n, 2, threads)


# Row bytes of a row-major fp16 tile -> the chosen swizzle: B chunk bits XOR-ed with the row's
# low bits, S = log2(row bytes / 16) so that the bits read are exactly the row index bits.
@pytest.mark.parametrize("cols,expect", [(16, (1, 3, 3)), (32, (2, 3, 3)), (64, (3, 3, 3)),
                                         (128, (3, 3, 4)), (256, (3, 3, 5))])
@pytest.mark.parametrize("operand", ["A", "B"])
def test_chooser_makes_fp16_operand_tiles_conflict_free(cols, expect, operand):
    rows = 64 if cols <= 128 else 16
    reads, fill = (_a_tile if operand == "A" else _b_tile)(rows, cols)
    acc = [(reads, 1), (fill, 1)]
    best, table = choose_swizzle((rows, cols), 2, acc)
    assert best == Swizzle(*expect)
    assert table[best] == ideal_cost(acc)  # conflict-free: every phase 1 wavefront
    assert cost([(reads, 1)], best) == 4 * len(reads)  # x4: 4 phases of 1 wavefront
    ident = table[Swizzle.identity(3)]
    way = min(8, cols * 2 // 16)  # rows of R bytes: R/16 rows share a 128-byte bank line slot
    assert cost([(reads, 1)], Swizzle.identity(3)) == 4 * way * len(reads)
    assert ident > table[best]
    # the fill is conflict-free under every candidate, not just the chosen one
    assert all(cost([(fill, 1)], sw) == ideal_cost([(fill, 1)]) for sw in table)


@pytest.mark.parametrize("shape,reads", [
    ((16, 8), "B"),    # rows of 16 bytes: 16 consecutive chunks, nothing to remove
    ((32, 24), "B"),   # rows of 48 bytes (padded): 3r mod 8 is distinct for 8 rows
    ((64, 64), "elementwise"),
])
def test_chooser_keeps_identity_when_nothing_conflicts(shape, reads):
    k, n = shape
    instrs = _b_tile(k, n)[0] if reads == "B" else elementwise(k * n, 2, 128)
    acc = [(instrs, 1), (cp_async_fill(k * n, 2, 128), 1)]
    best, table = choose_swizzle(shape, 2, acc)
    assert best.is_identity
    assert table[best] == ideal_cost(acc)
    assert len(table) > 1  # there were other candidates, and none was strictly better


def test_elementwise_and_fills_are_conflict_free_under_every_candidate():
    for eb in (2, 4):
        for threads in (32, 128, 96):
            for p in (elementwise(64 * 64, eb, threads), cp_async_fill(64 * 64, eb, threads)):
                _, table = choose_swizzle((64, 64), eb, [(p, 1)])
                assert list(table) == candidates((64, 64), eb)
                assert set(table.values()) == {ideal_cost([(p, 1)])}, (eb, threads)


def test_fp32_fragment_reads_halve_but_cannot_reach_ideal():
    """Each lane reads single fp32 words at columns 2t (+dc): per phase, 8 rows x 2 chunks = 16
    chunk reads land on 8 chunk slots of a bank line, so any chunk permutation leaves 2 words per
    bank. The identity on 128-byte rows has all 8 rows in the same banks (8 wavefronts)."""
    frags = [i for m0 in range(0, 64, 16) for k0 in range(0, 32, 16)
             for i in fragment_reads_a(64, 32, 4, m0, k0)]
    assert len(frags) == 64
    acc = [(frags, 1)]
    best, table = choose_swizzle((64, 32), 4, acc)
    assert best == Swizzle(3, 2, 3)
    assert table[Swizzle.identity(2)] == 8 * len(frags)
    assert table[best] == 2 * len(frags) == 2 * ideal_cost(acc)


def test_chooser_is_deterministic_and_ties_go_to_fewer_bits():
    acc = [(_a_tile(64, 64)[0], 1)]
    b1, t1 = choose_swizzle((64, 64), 2, acc)
    b2, t2 = choose_swizzle((64, 64), 2, acc)
    assert b1 == b2 and list(t1.items()) == list(t2.items())
    assert next(iter(t1)).is_identity
    best_cost = t1[b1]
    ties = [s for s, c in t1.items() if c == best_cost]
    assert b1 == min(ties, key=lambda s: (s.bits, s.shift))
    # weights scale the table
    _, t3 = choose_swizzle((64, 64), 2, [(acc[0][0], 3)])
    assert all(t3[s] == 3 * t1[s] for s in t1)


def test_pattern_and_chooser_errors_name_the_shape():
    with pytest.raises(SwizzleError, match="64x64"):
        ldmatrix_a(64, 64, 2, 56, 0)
    with pytest.raises(SwizzleError, match="32x20"):
        ldmatrix_a(32, 20, 2)  # rows of 40 bytes: row addresses not 16-byte aligned
    with pytest.raises(SwizzleError, match="2-byte"):
        ldmatrix_b_trans(32, 32, 4)
    with pytest.raises(SwizzleError, match="threads"):
        cp_async_fill(1024, 2, 100)
    a, _ = tile_matmul_ldmatrix(64, 64, 16)
    with pytest.raises(SwizzleError, match="32x64"):
        choose_swizzle((32, 64), 2, [(a, 1)])  # accesses reach past the tile
    with pytest.raises(SwizzleError, match="64x32"):
        choose_swizzle((64, 32), 4, [(a[:1], 1)])  # patterns built for fp16
    with pytest.raises(SwizzleError):
        choose_swizzle((64, 64), 2, [(a, -1)])
    with pytest.raises(SwizzleError):
        choose_swizzle((0, 64), 2, [])


# -- docs/swizzle.md's worked table ----------------------------------------------------------

def doc_rows():
    """The worked table of docs/swizzle.md, recomputed. Chooser input: operand reads + cp.async
    fill (128 threads), weight 1 each; the columns split the cost by pattern."""
    cases = [("A", 64, 16, 2), ("A", 64, 32, 2), ("A", 64, 64, 2), ("A", 64, 128, 2),
             ("B", 16, 8, 2), ("B", 32, 24, 2), ("B", 32, 32, 2), ("B", 64, 64, 2),
             ("B", 64, 128, 2), ("F", 64, 16, 4), ("F", 64, 32, 4)]
    rows = []
    for op, r, c, eb in cases:
        if op == "A":
            reads, what = _a_tile(r, c)[0], "ldmatrix.x4 (A)"
        elif op == "B":
            reads, what = _b_tile(r, c)[0], "ldmatrix.trans (B)"
        else:
            reads = [i for m0 in range(0, r, 16) for k0 in range(0, c, 16)
                     for i in fragment_reads_a(r, c, eb, m0, k0)]
            what = "fp32 fragment reads (A)"
        fill = cp_async_fill(r * c, eb, 128)
        best, _ = choose_swizzle((r, c), eb, [(reads, 1), (fill, 1)])
        ident = Swizzle.identity(group_base(eb))
        rows.append(f"| {r}x{c} | {'fp16' if eb == 2 else 'fp32'} | {c * eb} | {what} | "
                    f"{len(reads)} | {cost([(reads, 1)], ident)} | `{best}` | "
                    f"{cost([(reads, 1)], best)} | {ideal_cost([(reads, 1)])} | "
                    f"{cost([(fill, 1)], best)} / {ideal_cost([(fill, 1)])} |")
    return rows


def test_docs_table_is_current():
    with open(os.path.join(ROOT, "docs", "swizzle.md")) as f:
        text = f.read()
    missing = [row for row in doc_rows() if row not in text]
    assert not missing, "docs/swizzle.md table is stale; expected rows:\n" + "\n".join(missing)


def test_docs_example_runs(capsys):
    import re
    with open(os.path.join(ROOT, "docs", "swizzle.md")) as f:
        blocks = re.findall(r"```python\n(.*?)```", f.read(), flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/swizzle.md", "exec"), {"__name__": "__doc_example__"})
    assert capsys.readouterr().out.strip() == "Swizzle<3,3,3> 128"
