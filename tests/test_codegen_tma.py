"""TMA copies of pipelined tiles (layout/tma.py, the prelude's tma_load / mbarrier helpers):
which tiles qualify, their tensor maps, and the emitted code run in the CPU emulator -- which
copies a box only when a wait needs its phase, swizzles absolute addresses as the hardware
does, and fails a launch whose waits nothing would complete -- against the interpreter, with
the cp.async fallback (MIRAGE_NO_TMA) as the control. Mutants of the protocol must fail."""

import shutil
from dataclasses import replace

import numpy as np
import pytest

import codegen_cases as cc
import fake_cupy
from benchmarks.fixtures import hand_built
from benchmarks.programs import NAMES
from mirage_py.codegen_cuda import emit_cuda, runtime, tensor_map
from mirage_py.codegen_cuda.emulator import EmulatedGraph, build_emulator, to_storage
from mirage_py.layout import plan_graph
from mirage_py.layout.swizzle import Swizzle
from mirage_py.layout.tma import tma_geometry, tma_swizzle
from mirage_py.ugraph.graph import InputIter
from test_codegen_mma import block_matmul

needs_gxx = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


def _rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def _inputs(g, seed):
    rng = np.random.default_rng(seed)
    return {t.name: rng.standard_normal(t.shape).astype(np.float32) for t in g.inputs}


# ---- planning ---------------------------------------------------------------------------------

def test_tiles_of_the_fixtures_arrive_by_tma_on_hopper_only():
    """On h100 the pipelined tiles of the attention fixtures (K and V, 128-byte rows with the
    128B swizzle) and their loop-invariant Q tiles are TMA copies, placed on the swizzle's 1 KB
    repeat, with one mbarrier for the tiles loaded once and one per pipeline stage after the
    tiles; on a100 there is no TMA and the plan is unchanged otherwise."""
    seen = 0
    for name in NAMES:
        g = hand_built(name, 1)
        hop, amp = plan_graph(g, "h100"), plan_graph(g, "a100")
        for k, kp in hop.kernels.items():
            assert amp.kernels[k].tma == {} and amp.kernels[k].barriers == -1
            once = {st.writes for st in kp.schedule.steps if st.kind == "load" and
                    st.writes not in kp.pipelined and st.vector > 1 and not st.into}
            assert set(kp.tma) <= set(kp.pipelined) | once
            assert kp.smem.conflicts() == []
            for t, c in kp.tma.items():
                seen += 1
                assert kp.smem.offsets[t] % (1024 if c.swizzle == 3 else 128) == 0
                assert c.nbytes == int(np.prod(kp.info.shapes[t])) * (2 if c.dtype != "float32"
                                                                      else 4)
                copies = kp.pipeline if t in kp.pipelined else 1
                assert kp.barriers >= kp.smem.offsets[t] + c.nbytes * copies
            if kp.tma:
                piped = any(t in kp.pipelined for t in kp.tma)
                n = (kp.pipeline if piped else 0) + any(t not in kp.pipelined for t in kp.tma)
                assert kp.barriers % 8 == 0 and kp.smem.total_bytes == kp.barriers + 8 * n
    assert seen >= 20
    gqa = plan_graph(hand_built("gqa", 1), "h100").kernels[0]
    assert set(gqa.tma) == {"q", "k", "v"} and {c.swizzle for c in gqa.tma.values()} == {3}
    v = gqa.tma["v"]  # V (2, 4096, 64): map dims innermost first, byte strides of dims 1..
    assert v.dims == (64, 4096, 2) and v.strides == (128, 4096 * 128) and v.box == (64, 64, 1)


def test_tma_geometry_rules():
    """What a tensor map can express: the innermost dim contiguous, strides multiples of 16
    bytes, boxes of at most 256, and a swizzle only where the row is one 32/64/128-byte span."""
    g = hand_built("gqa", 1)
    plan = plan_graph(g, "h100")
    kp, op = plan.kernels[0], g.ops[0]
    it = next(n for n in op.block.ops if isinstance(n, InputIter) and n.out == "v")
    assert tma_geometry(it, kp.info, plan.device, "V", Swizzle(3, 3, 3)).swizzle == 3
    assert tma_geometry(it, kp.info, plan.device, "V", None).swizzle == 0
    assert tma_geometry(it, kp.info, plan.device, "V", Swizzle(3, 3, 4)) is None
    assert tma_geometry(it, kp.info, plan.device, "V", Swizzle(2, 3, 3)) is None  # 64B on 128B rows
    lay = plan.device.layouts["V"]
    odd = replace(plan.device, layouts={**plan.device.layouts,
                                        "V": replace(lay, strides=(lay.strides[0], 68, 1))})
    assert tma_geometry(it, kp.info, odd, "V", None) is None  # 136-byte rows
    inner = replace(plan.device, layouts={**plan.device.layouts,
                                          "V": replace(lay, strides=(lay.strides[0], 1, 4096))})
    assert tma_geometry(it, kp.info, inner, "V", None) is None  # innermost dim not contiguous
    assert tma_swizzle((64, 64), "float16", Swizzle(3, 3, 3)) == 3
    assert tma_swizzle((64, 32), "float16", Swizzle(2, 3, 3)) == 2
    assert tma_swizzle((64, 16), "float16", Swizzle(1, 3, 3)) == 1
    assert tma_swizzle((64, 32), "float32", Swizzle(3, 2, 3)) == 3
    assert tma_swizzle((64, 128), "float16", Swizzle(3, 3, 3)) is None


# ---- emitted code in the emulator -------------------------------------------------------------

def _pipeline_case(depth):
    g = block_matmul(f"tma{depth}", 1, 16, 128, 32, loop=8, threads=64)
    return g, emit_cuda(g, prefix=f"tma{depth}", stages=[depth])


@needs_gxx
@pytest.mark.parametrize("depth", [2, 3, 4])
def test_tma_pipeline_matches_the_interpreter_and_the_cp_async_path(depth):
    """K over an 8-iteration loop with 2..4 stages: A (16 x 16, 32-byte rows) and B (16 x 32,
    64-byte rows) arrive by TMA into swizzled buffers, each stage's mbarrier reused every
    `depth` iterations with alternating parity; the same source without TMA takes cp.async."""
    g, src = _pipeline_case(depth)
    kp = src.plan.kernels[0]
    assert kp.pipeline == depth and set(kp.tma) == {"a", "b"}
    assert {c.swizzle for c in kp.tma.values()} == {1, 2}  # 32B and 64B modes
    code = src.kernels[0]
    assert code.count("tma_load<2>(") == 2 * depth and "mbar_wait(" in code  # prologue + loop
    x = _inputs(g, depth)
    ref = g.run(x, precision="gpu")["Y"]
    for defines in ((), ("MIRAGE_NO_TMA",)):
        lib = build_emulator(src, defines)
        for order in ("forward", "reverse", 5):
            out = EmulatedGraph(src, order=order, lib=lib)(x)["Y"]
            assert _rel(out, ref) <= 2e-3, (defines, order)


def _mutant(src, old, new, tag):
    assert old in src.kernels[0], old
    return replace(src, kernels=(src.kernels[0].replace(old, new), *src.kernels[1:]),
                   prefix=src.prefix + tag)


@needs_gxx
def test_tma_protocol_mutants_are_caught():
    """A missing wait or a wrong parity reads stale (NaN-poisoned) buffers or re-arms a phase
    still in flight; a copy nobody armed the mbarrier for makes the emulated launch fail (the
    GPU would hang); a map with the wrong swizzle mode lands the tile in the wrong chunks."""
    g, src = _pipeline_case(3)
    x = _inputs(g, 11)
    ref = g.run(x, precision="gpu")["Y"]

    def wrong(s):  # stale or misplaced data, or a launch the emulator refuses
        try:
            out = EmulatedGraph(s)(x)["Y"]
        except RuntimeError as e:
            return "TMA or mbarrier" in str(e)
        return not np.all(np.isfinite(out)) or _rel(out, ref) > 0.1

    assert wrong(_mutant(src, "mbar_wait(tma_bar + it % 3, (it / 3) & 1);", "", "_nowait"))
    assert wrong(_mutant(src, "(it / 3) & 1)", "((it / 3) + 1) & 1)", "_parity"))
    assert wrong(_mutant(src, "tma_bar + it % 3,", "tma_bar + (it + 1) % 3,", "_stage"))
    unarmed = _mutant(src, "mbar_expect_tx(", "if (0) mbar_expect_tx(", "_unarmed")
    with pytest.raises(RuntimeError, match="TMA or mbarrier"):
        EmulatedGraph(unarmed)(x)
    # no barrier closing the iteration: thread 0's prefetch overwrites a buffer others still
    # read (shown where copies land at issue: the emulator's shuffled orders; on FMA matmuls,
    # since the emulator runs tensor-core fragments' exchanges in lockstep)
    fma = emit_cuda(g, prefix="tma_fma", stages=[3], tensor_cores=False)
    assert fma.plan.kernels[0].tma
    race = _mutant(fma, "__syncthreads();  // end of iteration", "// end of iteration", "_war")
    out = EmulatedGraph(race, order=7)(x)["Y"]
    assert not np.all(np.isfinite(out)) or _rel(out, ref) > 0.1
    assert _rel(EmulatedGraph(fma, order=7)(x)["Y"], ref) <= 2e-3  # the original is race-free
    (spec,) = src.launches
    maps = tuple(replace(m, copy=replace(m.copy, swizzle=3 - m.copy.swizzle))
                 for m in spec.tensor_maps)  # 32B <-> 64B... and 64B -> 1
    bad = replace(src, launches=(replace(spec, tensor_maps=maps),), prefix="tma_swz")
    assert wrong(bad)


@needs_gxx
def test_attention_with_tma_in_the_emulator():
    """The small flash-decoding attention (K and V pipelined by TMA, Q by TMA once before the
    loop, on its own mbarrier) equals the interpreter with and without TMA; a missing wait
    for Q is caught."""
    g = cc.small_attention()
    src = emit_cuda(g, "h100", prefix="tma_attn")
    assert [m.copy.tile for m in src.launches[0].tensor_maps] == ["q", "k", "v"]
    assert "mbar_wait(tma_bar, 0);" in src.kernels[0]
    x = cc.random_inputs(g, seed=3)
    ref = g.run(x, precision="gpu")["O"]
    for defines in ((), ("MIRAGE_NO_TMA",)):
        out = EmulatedGraph(src, lib=build_emulator(src, defines))(x)["O"]
        assert _rel(out, ref) <= 2e-3, defines
    nowait = _mutant(src, "mbar_wait(tma_bar, 0);", "", "_noqwait")
    out = EmulatedGraph(nowait)(x)["O"]
    assert not np.all(np.isfinite(out)) or _rel(out, ref) > 0.1


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="needs nvcc")
def test_one_source_tma_on_sm90_cp_async_on_sm80():
    """The same translation unit (kernels and host launcher) compiles to UTMALDG and mbarrier
    waits for sm_90 and to cp.async only for sm_80."""
    from mirage_py.codegen_cuda.emit import translation_unit
    from mirage_py.codegen_cuda.sass import find_cuobjdump, sass_stats
    if find_cuobjdump() is None:
        pytest.skip("needs cuobjdump")
    src = emit_cuda(cc.small_attention(), "h100", prefix="tma_arch")
    tu = translation_unit([src])
    k = src.launches[0].kernel
    hop, amp = sass_stats(tu, "sm_90")[k], sass_stats(tu, "sm_80")[k]
    # K and V in the prologue and the loop, Q once
    assert hop.tma == 5 and hop.opcodes["SYNCS"] > 0 and not hop.local_memory
    assert sum(hop.ldgsts.values()) == 0
    assert amp.tma == 0 and amp.ldgsts.get(128, 0) > hop.ldgsts.get(128, 0)


@needs_gxx
def test_a_serialised_schedule_keeps_tma_to_one_stage(monkeypatch):
    """When the barrier-minimal schedule needs too much shared memory the planner serialises
    (one step per stage) and the pipelined tiles load in different stages; each stage's
    mbarrier is armed once per iteration, so only the tiles of one load stage take TMA and the
    others keep cp.async -- and the result still equals the interpreter."""
    from mirage_py.layout import plan as plan_mod
    real = plan_mod.schedule_block
    monkeypatch.setattr(plan_mod, "schedule_block", lambda *a, **k: real(*a, **{**k, "lean": True}))
    g = cc.small_attention()
    kp = plan_graph(g, "h100").kernels[0]
    loads = {st.writes: st.stage for st in kp.schedule.steps if st.writes in kp.pipelined}
    assert len(set(loads.values())) > 1  # serialised: the tiles load in different stages
    piped = [t for t in kp.tma if t in kp.pipelined]
    assert len(piped) == 1 and len({loads[t] for t in piped}) == 1
    src = emit_cuda(g, "h100", prefix="tma_lean")
    # Q once, then K or V in the prologue and the loop, one stage
    assert src.kernels[0].count("mbar_expect_tx(") == 3
    x = cc.random_inputs(g, seed=6)
    ref = g.run(x, precision="gpu")["O"]
    for order in ("reverse", 3):
        assert _rel(EmulatedGraph(src, order=order)(x)["O"], ref) <= 2e-3


# ---- launchers --------------------------------------------------------------------------------

def test_host_launcher_encodes_one_map_per_copy():
    src = emit_cuda(hand_built("gqa", 1), "h100")
    spec = src.launches[0]
    assert [m.copy.tile for m in spec.tensor_maps] == ["q", "k", "v"]
    launcher = src.launcher
    assert launcher.count("mp_encode_tensor_map(") == 3
    assert "const cuuint64_t dims[] = {64, 4096, 2};" in launcher  # V
    i = spec.op_index
    assert f"d_Q, d_K, d_V, d_O_part, d_L_part, tm_q_{i}, tm_k_{i}, tm_v_{i}" in launcher
    assert "mp_tensor_map" not in emit_cuda(hand_built("gqa", 1), "a100").launcher


def test_emulated_map_layout():
    """The emulator's map: base, rank, element size, swizzle, then five dims, five byte
    strides (the first the element size) and five box sizes -- 128 bytes."""
    c = plan_graph(hand_built("gqa", 1), "h100").kernels[0].tma["v"]
    raw = tensor_map.emulated(c, 0x1000)
    assert len(raw) == 128
    words = np.frombuffer(raw[:24], np.uint32)
    assert int.from_bytes(raw[:8], "little") == 0x1000 and list(words[2:5]) == [3, 2, 3]
    assert list(np.frombuffer(raw[24:64], np.uint64)) == [64, 4096, 2, 0, 0]
    assert list(np.frombuffer(raw[64:104], np.uint64)) == [2, 128, 524288, 0, 0]
    assert list(np.frombuffer(raw[104:124], np.uint32)) == [64, 64, 1, 0, 0]


def test_driver_encoding_call(monkeypatch):
    """What the runtime hands cuTensorMapEncodeTiled (the driver itself needs a GPU machine):
    a 128-byte aligned map, the dtype's enum, rank, address, dims, byte strides, box, unit
    element strides, no interleave, the swizzle mode, 256-byte L2 promotion, zero fill."""
    import ctypes
    c = plan_graph(hand_built("gqa", 1), "h100").kernels[0].tma["k"]
    seen = {}

    def fake(out, dtype, rank, address, dims, strides, box, ones, interleave, swizzle, l2, oob):
        seen.update(aligned=out % 128 == 0, dtype=dtype, rank=rank, address=address.value,
                    dims=list(dims), strides=list(strides)[:rank - 1], box=list(box),
                    ones=list(ones), rest=(interleave, swizzle, l2, oob))
        ctypes.memmove(out, bytes(range(128)), 128)
        return 0
    monkeypatch.setattr(tensor_map, "_ENCODE", fake)
    raw = tensor_map.encode(c, 0x7F0000001000)
    assert raw == bytes(range(128))
    assert seen == dict(aligned=True, dtype=6, rank=3, address=0x7F0000001000,
                        dims=[4096, 64, 2], strides=[8192, 524288], box=[64, 64, 1],
                        ones=[1, 1, 1], rest=(0, 3, 3, 0))
    monkeypatch.setattr(tensor_map, "_ENCODE", lambda *a: 1)  # CUDA_ERROR_INVALID_VALUE
    with pytest.raises(RuntimeError, match="cuTensorMapEncodeTiled failed"):
        tensor_map.encode(c, 0x1000)


@needs_gxx
@pytest.mark.parametrize("tma", [True, False])
def test_runtime_passes_maps_or_compiles_tma_out(tma, monkeypatch):
    """The CuPy runtime (CuPy replaced by the emulator-backed double): with TMA it encodes one
    map per copy and address (once: cached) and passes them after the pointers; without
    (pre-Hopper device, no driver encoder, MIRAGE_PY_NO_TMA) it compiles with MIRAGE_NO_TMA
    and passes zeros."""
    monkeypatch.setattr(runtime, "_MODULES", {})
    cp = fake_cupy.install(monkeypatch)
    monkeypatch.setattr(runtime, "tma_enabled", lambda _cp: tma)
    encoded = []
    monkeypatch.setattr(runtime, "_encode_map",
                        lambda c, a: encoded.append((c.tile, a)) or tensor_map.emulated(c, a))
    g = cc.small_attention()
    cg = runtime.CompiledGraph(g)
    assert cg.tma == tma
    x = cc.random_inputs(g, seed=5)
    arrays = {t.name: cp.asarray(to_storage(x[t.name], t.dtype)) for t in g.inputs}
    ref = g.run(x, precision="gpu")["O"]
    for _ in range(2):
        out = np.asarray(cg(arrays)["O"], dtype=np.float32)
        assert _rel(out, ref) <= 2e-3
    assert sorted(t for t, _ in encoded) == (["k", "q", "v"] if tma else [])
    assert ("-DMIRAGE_NO_TMA" in cg.module.options) == (not tma)
