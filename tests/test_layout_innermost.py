"""The innermost-dim chooser for intermediates (layout/innermost.py): its sector model, its
choice on the flash-decoding partial sums, and that row-major stays when nothing is gained.
The emulator tests run every fixture through the chosen (permuted) layouts."""

import itertools

import pytest

from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES
from mirage_py.layout import padded_layout, plan_graph
from mirage_py.layout.innermost import (TileAccess, candidate_orders, choose_order,
                                        contiguous_run, moved_bytes)


def _brute_run(layout, tile):
    """Consecutive addresses at the start of the tile's elements in logical order."""
    addrs = [sum(c * s for c, s in zip(idx, layout.strides))
             for idx in itertools.product(*(range(t) for t in tile))]
    run = 1
    while run < len(addrs) and addrs[run] == addrs[run - 1] + 1:
        run += 1
    return run


@pytest.mark.parametrize("shape,order,tile", [
    ((2, 16, 8), (0, 1, 2), (1, 4, 8)), ((2, 16, 8), (0, 2, 1), (1, 16, 1)),
    ((2, 16, 8), (0, 2, 1), (1, 8, 2)), ((3, 5, 7), (2, 0, 1), (3, 5, 1)),
    ((4, 6), (1, 0), (4, 1)), ((4, 6), (0, 1), (2, 6)), ((8, 1, 12), (0, 1, 2), (2, 1, 12)),
])
def test_contiguous_run_matches_enumeration(shape, order, tile):
    for dtype in ("float32", "float16"):
        lay = padded_layout("t", shape, dtype, order)
        assert contiguous_run(lay, tile) == _brute_run(lay, tile), (shape, order, tile, dtype)


def test_padded_layout_with_an_order_keeps_rows_aligned():
    lay = padded_layout("t", (2, 256, 32), "float32", (0, 2, 1))
    assert lay.strides == (8192, 1, 256)
    lay = padded_layout("t", (3, 10, 5), "float16", (0, 2, 1))
    assert lay.strides[1] == 1 and lay.strides[2] % 8 == 0 and lay.strides[0] >= 5 * 16
    with pytest.raises(ValueError, match="not an order"):
        padded_layout("t", (2, 3), "float32", (0, 0))


def test_partial_sums_of_flash_decoding_get_rows_innermost():
    """gqa's kernel 0 saves one float per row, (1, 64, 1) tiles of L_part (2, 256, 32); the
    combine kernel reads (1, 16, 1) tiles. Rows innermost moves 8x fewer sector bytes, and both
    sides become 16-byte vector accesses."""
    plan = plan_graph(hand_built("gqa", 1))
    lay = plan.device.layouts["L_part"]
    assert lay.strides[1] == 1
    acc = [TileAccess((1, 64, 1), 256), TileAccess((1, 16, 1), 1024)]
    _, table = choose_order("L_part", (2, 256, 32), "float32", acc)
    assert table[(0, 1, 2)] == 8 * table[(0, 2, 1)]
    saves = [s for s in plan.kernels[0].schedule.steps if s.kind == "save"]
    loads = [s for s in plan.kernels[1].schedule.steps if s.kind == "load"]
    assert all(s.vector > 1 for s in saves + loads)


@pytest.mark.parametrize("name", NAMES)
def test_row_major_unless_it_moves_more(name):
    plan = plan_graph(hand_built(name, 1))
    for t, lay in plan.device.layouts.items():
        if not plan.device.is_intermediate(t):
            assert lay.dense
        elif lay.strides[-1] != 1:  # permuted: only where it moves fewer bytes
            assert t == "L_part"


def test_candidates_and_ties():
    c = candidate_orders((2, 3, 4))
    assert c[:3] == [(0, 1, 2), (1, 2, 0), (0, 2, 1)] and len(c) == 6 == len(set(c))
    assert candidate_orders((1, 5, 1)) == [(0, 1, 2)]
    assert candidate_orders((2, 1, 3)) == [(0, 1, 2), (1, 2, 0)]  # size-1 dims do not count
    # tiles walking dim 1 then dim 0 whole: one contiguous run needs two dims moved, (2, 0, 1)
    order, table = choose_order("t", (2, 4, 4), "float32", [TileAccess((2, 4, 1), 4)])
    assert order == (2, 0, 1) and table[order] < min(table[o] for o in c[:3])
    # a whole-tensor row traversal (pre-defined kernels) keeps row-major
    order, table = choose_order("t", (64, 32), "float16", [TileAccess((1, 32), 64)])
    assert order == (0, 1) and table[(0, 1)] < table[(1, 0)]
    lay = padded_layout("t", (64, 32), "float16")
    assert moved_bytes(lay, [TileAccess((1, 32), 64)]) == 64 * 64
