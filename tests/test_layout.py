"""Layout and memory planning: device layouts, workspace reuse, barrier stages, shared memory."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import codegen_cases as cc
from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES, get_program
from mirage_py.layout import (Buffer, first_fit, padded_layout, plan_device_memory, plan_graph,
                              schedule_block)
from mirage_py.layout.intervals import conflicts, peak_live_bytes
from mirage_py.layout.plan import LayoutError
from mirage_py.layout.schedule import ACCUMULATE, SAVE, LOAD
from mirage_py.ugraph import Phase, naive_lowering, validate

FIXTURES = [(n, bs) for bs in (1, 8) for n in NAMES]
SMALL = [cc.small_rmsnorm_matmul(), cc.small_attention(), cc.mixed_block_ops()]


@pytest.mark.parametrize("name,bs", FIXTURES)
def test_fixture_smem_plan_is_sound_and_within_validate(name, bs):
    g = hand_built(name, bs)
    plan = plan_graph(g, "h100")
    assert plan.kernels, name
    for k, kp in plan.kernels.items():
        sm = kp.smem
        assert sm.conflicts() == [], (name, k)
        # validate()'s bound plus the buffers of the cp.async pipeline (live through the
        # whole loop, so they also give up the reuse a single buffer had), within the target
        extra = sum(b.size for b in sm.buffers if b.name in kp.pipelined)
        assert sm.total_bytes <= kp.info.smem_bytes + extra, (name, k, sm.total_bytes)
        assert sm.total_bytes <= plan.target.smem_per_block
        assert sm.total_bytes >= sm.peak_live_bytes
        for b in sm.buffers:  # 16-byte aligned unless the tile is smaller than that
            assert sm.offsets[b.name] % (16 if b.size % 16 == 0 else 4) == 0
        tiles = set(kp.info.shapes)
        assert {b.name for b in sm.buffers} <= tiles


@pytest.mark.parametrize("g", SMALL, ids=lambda g: g.name)
def test_small_graph_plans(g):
    plan = plan_graph(g, stages=[1, 1])
    for kp in plan.kernels.values():
        assert kp.smem.conflicts() == []
        assert kp.smem.total_bytes <= kp.info.smem_bytes


def test_tiles_share_space_only_when_a_barrier_separates_them():
    # single-buffered, scores in shared memory (FMA path): k and v die before the loop ends
    plan = plan_graph(hand_built("gqa", 1), stages=[1], tensor_cores=False)
    kp = plan.kernels[0]
    sm, sched = kp.smem, kp.schedule
    shared = [(a, b) for a in sm.buffers for b in sm.buffers
              if a.name < b.name and sm.offsets[a.name] == sm.offsets[b.name]]
    assert shared, "expected reuse of dead tiles' space in the attention kernel"
    for a, b in shared:
        assert not a.overlaps(b)
        first, second = (a, b) if a.end < b.start else (b, a)
        assert first.end < second.start  # different stages: a __syncthreads() lies between


def test_folded_accumulators_store_no_tile():
    plan = plan_graph(hand_built("gqa", 1))
    kp = plan.kernels[0]
    names = {b.name for b in kp.smem.buffers}
    assert "o" not in names and "l" not in names  # matmul / sum add straight into O / L
    assert not any(s.kind == ACCUMULATE for s in kp.schedule.steps)
    combine = plan.kernels[1]
    loads = [s for s in combine.schedule.steps if s.kind == LOAD]
    assert all(s.into for s in loads)  # partial sums are added straight from global memory
    # one stage inside the loop: no barrier per iteration; two around the loop and one before
    # the 16-byte stores of the output (a thread stores elements other threads computed)
    saves = [s for s in combine.schedule.steps if s.kind == SAVE]
    assert [s.vector for s in saves] == [8]
    assert combine.schedule.barriers(hand_built("gqa", 1).ops[1].block.forloop) == 3


def test_barrier_counts_of_fixtures():
    # lora: its output saver stores 16 bytes at a time, one barrier after the epilogue's add
    # gqa: the scores stay in registers, so exp needs no barrier after q @ k (9 without
    # tensor cores), and so do the probabilities: the row sum and e @ v read them there, one
    # stage and one barrier fewer per iteration (7 with the probabilities in shared memory)
    expect = {"gqa": 5, "ntrans": 6, "lora": 11}
    for name, n in expect.items():
        g = hand_built(name, 1)
        kp = plan_graph(g).kernels[0]
        assert kp.schedule.barriers(g.ops[0].block.forloop) == n, name


def test_aligned_elementwise_steps_share_a_stage():
    g = cc.small_attention()
    kp = plan_graph(g).kernels[1]
    body = [s for s in kp.schedule.steps if s.segment is Phase.BODY]
    assert len({s.stage for s in body}) == 1


def test_lean_schedule_fits_the_validate_bound():
    for g in [hand_built(n, 1) for n in NAMES] + SMALL:
        infos = validate(g)
        dev = plan_device_memory(g)
        for k, info in infos.items():
            op = g.ops[k]
            lean = schedule_block(op.block, info, [dev.layouts[n] for n in op.inputs], lean=True)
            stages = [s.stage for s in lean.steps]
            assert len(set(stages)) == len(stages)  # one step per stage
            from mirage_py.layout.smem import plan_shared_memory
            sm = plan_shared_memory(lean, info)
            assert sm.conflicts() == [] and sm.total_bytes <= info.smem_bytes


def test_padded_layout_rows_are_16_byte_aligned():
    lay = padded_layout("t", (2, 3, 5), "float16")
    assert lay.strides == (24, 8, 1)
    assert lay.nbytes == (1 + 1 * 24 + 2 * 8 + 4) * 2
    assert padded_layout("t", (2, 256, 1), "float16").strides == (256, 1, 1)  # rows of 256
    assert padded_layout("t", (8, 1), "float32").dense  # a single row needs no padding
    assert padded_layout("t", (3, 6), "float32").strides == (8, 1)


@pytest.mark.parametrize("name", NAMES)
def test_workspace_plan(name):
    g = naive_lowering(get_program(name, 1))
    dev = plan_device_memory(g)
    inputs, outputs = {t.name for t in g.inputs}, set(g.outputs)
    assert set(dev.workspace) == set(g.tensors()) - inputs - outputs
    assert all(off % 256 == 0 for off in dev.workspace.values())
    for n in inputs | outputs:
        assert dev.layouts[n].dense
    # intermediates live at the same time never overlap
    live = {}
    for k, op in enumerate(g.ops):
        for t in op.outputs:
            live.setdefault(t.name, [k, k])
        for n in op.inputs:
            if n in live:
                live[n][1] = k
    items = [Buffer(n, dev.layouts[n].nbytes, *live[n]) for n in dev.workspace]
    assert conflicts(items, dev.workspace) == []
    assert dev.workspace_bytes >= peak_live_bytes(items)


def test_workspace_reuses_dead_intermediates():
    g = naive_lowering(get_program("ntrans", 1))
    dev = plan_device_memory(g)
    total = sum(dev.layouts[n].nbytes for n in dev.workspace)
    assert dev.workspace_bytes < total


def test_plan_rejects_what_does_not_fit():
    from dataclasses import replace
    from mirage_py.targets import get_target
    tiny = replace(get_target("h100"), smem_per_block=1 << 20)
    plan = plan_graph(hand_built("gqa", 1), tiny)
    with pytest.raises(LayoutError, match="shared-memory plan needs"):
        from mirage_py.layout.plan import check_fits
        check_fits(plan, replace(tiny, smem_per_block=1024))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 300), st.integers(0, 9), st.integers(0, 5)),
                min_size=1, max_size=14))
def test_first_fit_never_overlaps_live_buffers(raw):
    bufs = [Buffer(f"b{i}", size, s, s + d) for i, (size, s, d) in enumerate(raw)]
    for pad in (True, False):
        offsets, total = first_fit(bufs, 16, pad=pad)
        assert conflicts(bufs, offsets) == []
        assert total >= peak_live_bytes(bufs)
        for b in bufs:
            assert offsets[b.name] + b.size <= total
            if pad or b.size % 16 == 0:
                assert offsets[b.name] % 16 == 0


def test_swizzles_make_ldmatrix_conflict_free_on_fixtures():
    """Every tile the planner swizzles is read by ldmatrix without bank conflicts (model of
    layout/swizzle.py), where the identity layout had them; every fixture with 16-bit operand
    tiles of 32-byte rows or more gets at least one swizzle."""
    from mirage_py.layout.swizzle import Swizzle, ideal_wavefronts, wavefronts
    from mirage_py.layout.mma import tile_matmul
    from mirage_py.layout.tile_swizzle import _matmul_reads
    from mirage_py.ugraph.graph import BlockOp
    swizzled = 0
    for name in NAMES:
        plan = plan_graph(hand_built(name, 1))
        for k, kp in plan.kernels.items():
            bg = plan.graph.ops[k].block
            for op in bg.ops:
                if not (isinstance(op, BlockOp) and op.op == "matmul"):
                    continue
                tm = tile_matmul(op, kp.info, bg.threads)
                for tile, reads in _matmul_reads(tm, kp.info).items():
                    sw = kp.swizzles.get(tile, Swizzle.identity())
                    for ins, _ in reads:
                        for i in ins:
                            assert wavefronts(i, sw) == ideal_wavefronts(i), (name, tile, str(sw))
                    if tile in kp.swizzles:
                        swizzled += 1
                        assert any(wavefronts(i) > ideal_wavefronts(i)
                                   for ins, _ in reads for i in ins), (name, tile)
    assert swizzled >= 9


def test_pipeline_depth_follows_annotation_loop_and_smem():
    g = hand_built("rmsnorm_linear", 1)  # a loop of 64 iterations over x and w tiles
    k0 = plan_graph(g).kernels[0]
    assert k0.pipeline == 2 and set(k0.pipelined) == {"x", "w"}
    deep = plan_graph(g, stages=[4]).kernels[0]
    assert deep.pipeline == 4 and deep.smem.total_bytes > k0.smem.total_bytes
    assert plan_graph(g, stages=[1]).kernels[0].pipelined == ()
    # no deeper than the loop is long, and no more than shared memory holds
    assert plan_graph(hand_built("gqa", 1), stages=[4]).kernels[0].pipeline == 2  # 2 iterations
    huge = plan_graph(g, stages=[64]).kernels[0]
    assert 4 < huge.pipeline < 64 and huge.smem.total_bytes <= plan_graph(g).target.smem_per_block


def test_epilogues_computed_from_register_fragments():
    """rms-norm division, silu(a) * b and exp of an accumulator run on the mma fragments in
    registers: those accumulators never get shared memory (the emulator tests run this code)."""
    expect = {"rmsnorm_linear": ("acc", "y"), "gated_mlp": ("sa", "y"), "exp_matmul": ("acc", "e")}
    for name, (acc, epi) in expect.items():
        kp = plan_graph(hand_built(name, 1)).kernels[0]
        assert acc in kp.schedule.registers and acc not in kp.schedule.spilled, name
        assert [s.node.out for s in kp.schedule.steps if s.frag] == [epi], name
        assert acc not in kp.smem.offsets, name
    # without tensor cores nothing stays in registers
    kp = plan_graph(hand_built("rmsnorm_linear", 1), tensor_cores=False).kernels[0]
    assert kp.schedule.registers == {} and "acc" in kp.smem.offsets


def test_attention_scores_stay_in_registers():
    """The score tile s = q @ k is consumed only by exp: it stays in mma fragments (no shared
    memory, no barrier between the two), and exp writes e in fragment order."""
    kp = plan_graph(hand_built("gqa", 1)).kernels[0]
    reg = kp.schedule.registers
    assert "s" in reg and not reg["s"].carried and "s" not in kp.smem.offsets
    (exp_step,) = [st for st in kp.schedule.steps if st.frag == "s"]
    mm = next(st for st in kp.schedule.steps if st.writes == "s")
    assert exp_step.stage == mm.stage and not exp_step.flat
    fma = plan_graph(hand_built("gqa", 1), tensor_cores=False).kernels[0]
    assert "s" in fma.smem.offsets


def test_computed_fp32_operands_are_swizzled_for_fragment_reads():
    """The attention probabilities e (fp32, written by exp in fragment order, read as the A
    operand of e @ v element by element) get a swizzle that cuts the model's wavefronts of
    those reads at least fourfold; the emulator tests run the swizzled kernels. (mha's blocks
    have 16 query rows for 4 warps, too few for the probabilities to stay in registers.)"""
    from mirage_py.layout.swizzle import Swizzle, cost
    from mirage_py.layout.mma import tile_matmul
    from mirage_py.layout.tile_swizzle import _fragment_a_reads
    from mirage_py.ugraph.graph import BlockOp
    g = hand_built("mha", 1)
    kp = plan_graph(g).kernels[0]
    assert "e" in kp.swizzles
    (pv,) = [op for op in g.ops[0].block.ops if isinstance(op, BlockOp) and op.op == "matmul"
             and op.operands[0] == "e"]
    tile, reads = _fragment_a_reads(tile_matmul(pv, kp.info, g.ops[0].block.threads), kp.info)
    assert tile == "e"
    assert cost(reads, Swizzle.identity()) >= 4 * cost(reads, kp.swizzles["e"])


def test_sum_of_a_fragment_value_accumulates_in_registers():
    """accum.sum(e) where e = exp(scores) is computed on the score fragments: the running sum
    stays in registers (added where e is computed, no accumulate step), goes to shared memory
    once after the loop for the row reduction, and its buffer is live only from then on."""
    g = cc.attention_row_sums_after_loop()
    kp = plan_graph(g).kernels[0]
    sched = kp.schedule
    assert sched.registers["esum"].carried and "esum" in sched.spilled
    (step,) = [s for s in sched.steps if s.writes == "e"]
    assert step.frag == "s" and step.also == "esum"
    assert not [s for s in sched.steps if s.kind == ACCUMULATE]
    buf = next(b for b in kp.smem.buffers if b.name == "esum")
    assert buf.start > max(sched.stages["body"])
    # without tensor cores nothing is in registers: an accumulate step adds e into esum
    plain = plan_graph(g, tensor_cores=False).kernels[0].schedule
    assert [s.writes for s in plain.steps if s.kind == ACCUMULATE] == ["esum"]


def test_probabilities_stay_in_registers_where_every_warp_gets_rows():
    """FlashAttention-2's probabilities in registers: where the row tilings (units of 16 rows
    by all columns) of q @ k and e @ v give every warp a unit, e = exp(s) is written to
    registers, e @ v takes its A fragments from them and the row sums reduce them by quad
    shuffles -- e gets no shared memory. gqa's blocks (64 query rows, 4 warps) qualify, mha's
    (16 rows) do not, nor does anything without tensor cores."""
    from mirage_py.layout.mma import register_operand_pairs, tile_matmul
    g = hand_built("gqa", 1)
    bg = g.ops[0].block
    kp = plan_graph(g).kernels[0]
    (pair,) = register_operand_pairs(bg, kp.info)
    assert (pair.producer, pair.value, pair.consumer, pair.sums) == ("s", "e", "o", ("l",))
    sched = kp.schedule
    assert "e" in sched.registers and "e" not in kp.smem.offsets and "e" not in sched.spilled
    by_out = {st.node.out: st for st in sched.steps if hasattr(st.node, "out")}
    assert by_out["o"].frag == "e" and by_out["l"].frag == "e" and by_out["e"].frag == "s"
    assert "e" not in by_out["o"].reads and by_out["l"].reads == ()
    mm = {op.out: op for op in bg.ops if getattr(op, "op", None) == "matmul"}
    for name in ("s", "o"):  # row tilings: one unit of 16 x N per warp
        t = tile_matmul(mm[name], kp.info, bg.threads, bg)
        assert t.cfg.ng * 8 == t.n and t.cfg.units(t.batch, t.m, t.n) == 4
    assert register_operand_pairs(hand_built("mha", 1).ops[0].block,
                                  plan_graph(hand_built("mha", 1)).kernels[0].info) == ()
    assert "e" in plan_graph(g, tensor_cores=False).kernels[0].smem.offsets
