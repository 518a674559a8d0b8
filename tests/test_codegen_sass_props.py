"""What the machine code of the emitted kernels does, read from SASS for sm_90 on the CPU
(cuobjdump), for the nine benchmarks at batch size 1 -- both the hand-built fusions and the
kernels superopt finds -- and the tensor-core cases of small graphs:

* every kernel that has a tile matmul runs it on tensor cores (HMMA) with ldmatrix (LDSM)
  wherever its operand tiles are whole fragments stored in the operand type;
* no kernel touches local memory (no LDL/STL: no spills, no run-time indexed arrays);
* tiles with 16-byte aligned rows are loaded with 128-bit asynchronous copies (LDGSTS.128) or,
  where the plan fetches a pipelined tile by TMA, with UTMALDG, and no narrower global loads;
  outputs with aligned rows are stored with 128-bit stores.

Static instruction counts: they show what the code can do, not how fast it runs (benchmarks
measure that on a GPU)."""

import pytest

from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emit import translation_unit
from mirage_py.codegen_cuda.nvcc import find_nvcc
from mirage_py.codegen_cuda.sass import find_cuobjdump, sass_stats
from mirage_py.layout.mma import ldmatrix_operands, tile_matmul
from mirage_py.layout.schedule import LOAD, SAVE
from mirage_py.ugraph.graph import BlockOp, GraphKernel, KernelOp

pytestmark = pytest.mark.skipif(find_nvcc() is None or find_cuobjdump() is None,
                                reason="needs nvcc and cuobjdump")


_BUILT: dict = {}


@pytest.fixture(params=["fixtures", "superopt"])
def fixtures_sm90(request, superopt_bs1):
    """The nine benchmarks' kernels at bs 1 -- the hand-built fusions, or what superopt ships
    (emitted from its annotated graph, with the tuner's pipeline depths) -- compiled for sm_90
    in one translation unit, and their SASS statistics."""
    kind = request.param
    if kind not in _BUILT:
        if kind == "fixtures":
            sources = [emit_cuda(hand_built(n, 1), "h100", prefix=f"{n}_bs1") for n in NAMES]
        else:
            sources = [emit_cuda(superopt_bs1(n).annotated, "h100", prefix=f"{n}_opt_bs1")
                       for n in NAMES]
        _BUILT[kind] = sources, sass_stats(translation_unit(sources), "sm_90")
    return _BUILT[kind]


def _kernels(sources):
    for src in sources:
        for spec in src.launches:
            yield src, spec, src.graph.ops[spec.op_index]


def _matmuls(op, plan):
    if isinstance(op, KernelOp):
        return ["predefined"] if op.op == "matmul" else []
    info = plan.info
    out = []
    for n in op.block.ops:
        if isinstance(n, BlockOp) and n.op == "matmul":
            t = tile_matmul(n, info, op.block.threads)
            out.append(any(ldmatrix_operands(t.m, t.k, t.n, info.dtypes[t.a], info.dtypes[t.b],
                                             t.cfg)))
    return out


def test_every_tile_matmul_runs_on_tensor_cores(fixtures_sm90):
    sources, stats = fixtures_sm90
    with_matmul = 0
    for src, spec, op in _kernels(sources):
        plan = src.plan.kernels.get(spec.op_index)
        mms = _matmuls(op, plan)
        st = stats[spec.kernel]
        if mms:
            with_matmul += 1
            assert st.hmma >= len(mms), (spec.kernel, st.hmma)
            if any(mms):
                assert st.ldsm > 0, spec.kernel
        else:
            assert st.tensor_core == 0, spec.kernel
    assert with_matmul >= 8


def test_no_local_memory(fixtures_sm90):
    _, stats = fixtures_sm90
    bad = {k: (s.ldl, s.stl) for k, s in stats.items() if s.local_memory}
    assert bad == {}


def test_aligned_tiles_move_in_128_bit_accesses(fixtures_sm90):
    sources, stats = fixtures_sm90
    vector_loads = vector_stores = tma_kernels = 0
    for src, spec, op in _kernels(sources):
        if not isinstance(op, GraphKernel):
            continue
        kp = src.plan.kernels[spec.op_index]
        st = stats[spec.kernel]
        loads = [s for s in kp.schedule.steps if s.kind == LOAD]
        assert st.tma >= len(kp.tma), spec.kernel  # TMA tiles: UTMALDG (sm_90)
        tma_kernels += bool(kp.tma)
        if loads and all(s.vector > 1 for s in loads):
            vector_loads += 1
            assert st.global_loads_narrow == 0, (spec.kernel, st.ldg, st.ldgsts)
            assert st.global_loads_128 > 0 or st.tma > 0, spec.kernel
            if any(not s.into and s.writes not in kp.tma for s in loads):  # cp.async tiles
                assert st.ldgsts.get(128, 0) > 0, (spec.kernel, st.ldgsts)
            if any(s.into for s in loads):  # added straight into an accumulator: LDG.128
                assert st.ldg.get(128, 0) > 0, (spec.kernel, st.ldg)
        saves = [s for s in kp.schedule.steps if s.kind == SAVE]
        if saves and all(s.vector > 1 for s in saves):
            vector_stores += 1
            assert st.global_stores_128 > 0 and sum(st.stg.values()) == st.global_stores_128, \
                (spec.kernel, st.stg)
    assert vector_loads >= 10 and vector_stores >= 5 and tma_kernels >= 5


def test_warpgroup_mma_on_sm90a_and_mma_sync_elsewhere():
    """Tile matmuls that qualify for the warpgroup MMA (see layout/mma.py) compile to HGMMA for
    sm_90a -- with no local memory, and with the k-steps of a block issued back to back (ptxas
    does not serialise them) -- and to HMMA for sm_90, from the same source."""
    import sys
    from pathlib import Path
    from mirage_py.codegen_cuda.sass import compile_cubin, count_sass, disassemble
    sys.path.insert(0, str(Path(__file__).parent))
    from test_codegen_mma import WGMMA_CASES, block_matmul
    sources = [emit_cuda(block_matmul(c, *a), "h100", prefix=f"wg_{c}")
               for c, a in WGMMA_CASES.items()]
    tu = translation_unit(sources)
    hopper, plain = sass_stats(tu, "sm_90a"), sass_stats(tu, "sm_90")
    for src in sources:
        (spec,) = src.launches
        a, p = hopper[spec.kernel], plain[spec.kernel]
        assert a.hgmma > 0 and a.hmma == 0 and not a.local_memory, (spec.kernel, a.opcodes)
        assert p.hmma > 0 and p.hgmma == 0 and not p.local_memory, spec.kernel
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        build = compile_cubin(tu, "sm_90a", out_dir=tmp)
        # no serialised MMAs, no waits or arrives injected by ptxas (in any case)
        assert build.nvcc.performance_notes == []
        funcs = disassemble(build.path)
    ops = funcs[sources[0].launches[0].kernel]  # 128-byte rows, 4 k-steps per iteration
    # per iteration (ptxas may unroll the two): one ARRIVE, four HGMMA.64x64x16 back to back,
    # one DEPBAR
    blocks = " ".join(o.split(".")[0] if not o.startswith("WARPGROUP.") else o.split(".")[1]
                      for o in ops if o.startswith(("WARPGROUP.", "HGMMA."))).split("DEPBAR")
    assert blocks[-1] == "" and len(blocks) >= 2
    assert all(b.split() == ["ARRIVE"] + ["HGMMA"] * 4 for b in blocks[:-1]), blocks
