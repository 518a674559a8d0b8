"""Grids and loop trip counts computed at launch for a shape family's bucket
(codegen_cuda/extents.py, docs/codegen.md "Sizes at run time"): a bucket's graph compiled once
runs at a valid size inside the bucket without the bucket's whole grid / loop, equal to the
interpreter and to float64 at sizes 1, a partial tile, a tile boundary and the full bucket, with
NaN-poisoned outputs and workspace (a block left out that was needed shows as NaN); counts that
leave out one block or one iteration too many are caught; the source compiles with nvcc for
sm_90. Every emulated source (mutants included) is built into one library, one g++ run."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emit import CudaSource, translation_unit
from mirage_py.codegen_cuda.emulator import EmulatedGraph, build_emulator
from mirage_py.codegen_cuda.extents import PaddedExtents, RunCount, kernel_counts
from mirage_py.codegen_cuda.nvcc import compile_with_nvcc, find_nvcc
from mirage_py.lax.family import cut_outputs, pad_inputs
from mirage_py.lax.shapes import Affine


def _rel(y, r):
    return float(np.linalg.norm(np.asarray(y, np.float64) - r) / np.linalg.norm(r))


def _rmsnorm_matmul():
    """RMSNorm and a projection over a symbolic token count: one block per token row."""
    T = mp.dim("T", 1, 128)
    p = mp.Program("rms_t")
    x = p.input("X", (T, 64))
    g = p.input("G", (64,))
    w = p.input("W", (64, 64))
    p.output(mp.rms_norm(x, g) @ w, name="Y")
    return p


def _contraction():
    """A contraction over a symbolic length (exp(X) @ W, X zero-filled past S: the padded
    contraction relies on W's zero padding) followed by a softmax over its columns."""
    S = mp.dim("S", 1, 1024)
    p = mp.Program("kred_s")
    x = p.input("X", (32, S))
    w = p.input("W", (S, 64))
    p.output(mp.softmax(mp.exp(x) @ w, -1), name="Y")
    return p


def _split_k(prefix: str):
    """``ugraph_cases.split_k`` with K as a padded dim: grid.y splits K in 2 parts of 128, each
    looped in 4 iterations of 32 on a 4-stage pipeline, so the trip count depends on the block
    (``start_axis``) and the prologue would run past the last iteration at small sizes."""
    from ugraph_cases import split_k
    g, _ = split_k(M=16, K=256, N=32, splits=2, forloop=4)
    K = mp.dim("K", 1, 256)
    ext = PaddedExtents({"A": (16, K), "B": (K, 32), "C": (16, 32)})
    return g, ext, emit_cuda(g, prefix=prefix, extents=ext, stages=(4, 2))


def _masked_online_attention():
    """FlashAttention's loop over a padded key length, written as superopt writes it for a
    family's bucket: a valid mask hides padded keys from the running max (fill -65504) and the
    row sums (fill 0); ``exp(s - m) @ v`` is left unmasked, relying on V's zero padding. 32 query
    rows on 2 blocks, keys padded to 64 in 4 iterations of 16."""
    from mirage_py.ugraph import (Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel,
                                  InputIter, KernelGraph, MaskIter, OutputSaver, ThreadGraph,
                                  ThreadOp)
    S = mp.dim("S", 1, 64)
    rows, d, n = 32, 16, 64
    where_max = ThreadGraph(2, (ThreadOp("a", "where", ("in0", "in1", -65504.0)),))
    exp_sub = ThreadGraph(2, (ThreadOp("a", "sub", ("in0", "in1")), ThreadOp("b", "exp", ("a",))))
    where_exp = ThreadGraph(3, (ThreadOp("a", "sub", ("in1", "in2")), ThreadOp("b", "exp", ("a",)),
                                ThreadOp("c", "where", ("in0", "b", 0.0))))
    keep = (("axes", (1,)), ("keepdims", True))
    ops = (InputIter("q", 0, (0, -1, -1)), InputIter("k", 1, (-1, -1, -1), 1),
           InputIter("v", 2, (-1, -1, -1), 0),
           MaskIter("mk", (rows, n), n, 0, (0, -1, -1), 1, (rows, Affine.of(S))),
           BlockOp("s", "matmul", ("q", "k")),
           Fused("sm", ("mk", "s"), where_max),
           BlockOp("cm", "max", ("sm",), keep),
           Accum("m", "cm", "max", running=True),
           Fused("e", ("s", "m"), exp_sub),
           Fused("em", ("mk", "s", "m"), where_exp),
           BlockOp("l1", "sum", ("em",), keep),
           Accum("l", "l1", "sum", rescale="m"),
           BlockOp("o1", "matmul", ("e", "v")),
           Accum("o", "o1", "sum", rescale="m"),
           BlockOp("y", "div", ("o", "l")),
           OutputSaver("y", 0, (0, -1, -1)))
    ins = (DTensor("Q", (rows, d)), DTensor("K", (d, n)), DTensor("V", (n, d)))
    gk = GraphKernel(("Q", "K", "V"), (DTensor("Y", (rows, d)),),
                     BlockGraph((2, 1, 1), 128, 4, ops))
    g = KernelGraph("online_s", ins, (gk,), ("Y",))
    return g, PaddedExtents({"Q": (rows, d), "K": (d, S), "V": (S, d), "Y": (rows, d)})


def _mutant(src: CudaSource, old: str, new: str) -> CudaSource:
    """``src`` with ``old`` replaced by ``new`` in the kernel that holds it."""
    i = next(k for k, t in enumerate(src.kernels) if old in t)
    return replace(src, kernels=src.kernels[:i] + (src.kernels[i].replace(old, new),)
                   + src.kernels[i + 1:])


@pytest.fixture(scope="module")
def families():
    rms, kred = _rmsnorm_matmul(), _contraction()
    return {"rms": (rms, mp.superopt(rms, workers=1, database=False,
                                     representative={"T": 64}), {"T": 64}),
            "kred": (kred, mp.superopt(kred, workers=1, database=False,
                                       representative={"S": 512}), {"S": 512})}


@pytest.fixture(scope="module")
def emulated(families):
    """The sources (name -> CudaSource) and their one emulator library."""
    src = {}
    for name, (p, fam, bucket) in families.items():
        ext = PaddedExtents.of_program(p)
        src[name] = emit_cuda(fam.instance(bucket).annotated, prefix=name, extents=ext)
    kred_m = emit_cuda(families["kred"][1].instance({"S": 512}).annotated, prefix="kred_m",
                       extents=PaddedExtents.of_program(families["kred"][0]))
    src["kred_short"] = _mutant(kred_m, "it < mp_trips;", "it < mp_trips - 1;")
    src["splitk"] = _split_k("splitk")[2]
    g, ext = _masked_online_attention()
    src["online"] = emit_cuda(g, prefix="online", extents=ext)
    src["splitk_late"] = _mutant(_split_k("splitk_m")[2], "blockIdx.y) * 128)",
                                 "blockIdx.y) * 256)")
    return src, build_emulator(list(src.values()))


def _emulator(emulated, name, source=None):
    src, lib = emulated
    return EmulatedGraph(source or src[name], lib=lib)


def _run_family(families, em, name, s, seed):
    p, _, bucket = families[name]
    (dim,) = bucket
    x = p.random_inputs(seed, sizes={dim: s})
    padded_x = pad_inputs(p, p.check_inputs(x), bucket)
    got = cut_outputs(p, em(padded_x, sizes={dim: s}), {dim: s})["Y"]
    return x, padded_x, got


def test_a_token_count_inside_the_bucket_launches_only_the_blocks_it_needs(families, emulated):
    p, fam, bucket = families["rms"]
    graph = fam.instance(bucket).annotated.graph
    counts = kernel_counts(graph, PaddedExtents.of_program(p))
    assert counts, "the kernel over the token rows should size its grid at launch"
    src = emulated[0]["rms"]
    static = emit_cuda(fam.instance(bucket).annotated, prefix="rms")
    (kc,) = counts.values()
    axis = next(a for a in range(3) if kc.grid[a] is not None)
    part = kc.grid[axis].part
    spec = src.launches[0]
    assert src.dims == ("T",) and static.dims == ()
    assert "int mp_dim_T;" in src.header and "tensors->mp_dim_T" in src.launcher
    assert src.kernels == static.kernels  # the kernel itself is unchanged: only its launch
    em = _emulator(emulated, "rms")
    for s in sorted({1, part + 1 if part > 1 else 3, 2 * part, 40, 64}):
        grid = spec.grid_at({"T": s})
        assert grid[axis] == -(-s // part) and (grid[axis] < spec.grid[axis] or s == 64)
        x, padded_x, got = _run_family(families, em, "rms", s, s)
        assert not np.isnan(got).any(), s
        assert _rel(got, p.evaluate(x)["Y"]) <= 2e-3, s
        interp = cut_outputs(p, graph.run(padded_x, precision="gpu"), {"T": s})["Y"]
        assert _rel(got, interp) <= 2e-3, s


def test_a_grid_that_leaves_out_one_block_too_many_is_caught(families, emulated):
    src = emulated[0]["rms"]
    spec = src.launches[0]
    axis = next(a for a in range(3) if spec.grid_counts[a] is not None)
    c = spec.grid_counts[axis]
    short = RunCount(c.valid - c.part, c.part, c.whole)  # one block fewer
    counts = tuple(short if a == axis else spec.grid_counts[a] for a in range(3))
    mutant = replace(src, launches=(replace(spec, grid_counts=counts),) + src.launches[1:])
    _, _, got = _run_family(families, _emulator(emulated, "rms", mutant), "rms",
                            2 * c.part + 1, 1)
    assert np.isnan(got).any()  # the last valid rows were never written


def test_a_loop_over_the_padded_length_runs_only_the_iterations_it_needs(families, emulated):
    p, fam, bucket = families["kred"]
    graph = fam.instance(bucket).annotated.graph
    counts = kernel_counts(graph, PaddedExtents.of_program(p))
    loops = [c.loop for c in counts.values() if c.loop is not None]
    assert len(loops) == 1
    tile, whole = loops[0].part, loops[0].whole
    assert whole >= 2
    src = emulated[0]["kred"]
    assert "for (int it = 0; it < mp_trips; ++it)" in "".join(src.kernels)
    assert next(s for s in src.launches if s.dims).dims == ("S",)
    em = _emulator(emulated, "kred")
    for s in sorted({1, tile // 2 + 1, tile, tile + 1, 512}):
        assert loops[0].at({"S": s}) == min(whole, -(-s // tile))
        x, padded_x, got = _run_family(families, em, "kred", s, s)
        assert not np.isnan(got).any(), s
        assert _rel(got, p.evaluate(x)["Y"]) <= 2e-2, s
        interp = cut_outputs(p, graph.run(padded_x, precision="gpu", sizes={"S": s}),
                             {"S": s})["Y"]
        assert _rel(got, interp) <= 2e-2, s


def test_a_trip_count_one_iteration_short_is_caught(families, emulated):
    """The trip count is part of the kernel's code: a mutant that stops one iteration early
    (``mp_trips - 1``) is wrong at a size that needs the last iteration."""
    p = families["kred"][0]
    x, _, got = _run_family(families, _emulator(emulated, "kred_short"), "kred", 512 - 7, 3)
    assert _rel(got, p.evaluate(x)["Y"]) > 0.05


def _split_k_inputs(valid: int, seed: int):
    rng = np.random.default_rng(seed)
    a, b = np.zeros((16, 256)), np.zeros((256, 32))  # zero-filled past the valid size
    a[:, :valid] = rng.standard_normal((16, valid))
    b[:valid] = rng.standard_normal((valid, 32))
    return {"A": a, "B": b}, a[:, :valid] @ b[:valid] / 3.0


def test_a_loop_split_over_the_grid_counts_its_trips_per_block(emulated):
    """Each block's trips start at its part of K (``blockIdx.y * 128``): sizes 1, a partial
    tile, a tile, a part boundary, a block wholly past the valid size (it runs one iteration,
    of zeros), the full bucket; the pipeline prologue's copies past the last iteration are
    guarded by the trip count."""
    g, ext, _ = _split_k("splitk")
    loop = kernel_counts(g, ext)[0].loop
    assert (loop.part, loop.whole, loop.start_axis, loop.start_part) == (32, 4, 1, 128)
    assert [loop.at({"K": 100}, b) for b in (0, 1)] == [4, 1]
    assert [loop.at({"K": 200}, b) for b in (0, 1)] == [4, 3]
    em = _emulator(emulated, "splitk")
    for v in (1, 20, 32, 128, 129, 200, 256):
        x, ref = _split_k_inputs(v, v)
        got = em(x, sizes={"K": v})["C"]
        assert not np.isnan(got).any(), v
        assert _rel(got, ref) <= 2e-2, v
    assert "if (1 < mp_trips) {" in emulated[0]["splitk"].kernels[0]


def test_a_per_block_trip_count_that_starts_a_part_late_is_caught(emulated):
    """The second block's part of K starting at 256 instead of 128: it runs one iteration
    where it needs three, and the product is wrong."""
    x, ref = _split_k_inputs(200, 5)
    assert _rel(_emulator(emulated, "splitk_late")(x, sizes={"K": 200})["C"], ref) > 0.05


def test_an_online_softmax_skips_padded_iterations_through_its_running_max(emulated):
    """A skipped iteration would add the fill -65504 to the running max (its identity: the
    rescale factor is 1) and zeros to the masked row sums and to ``exp(s - m) @ v`` (V
    zero-filled): trips = ceil(S / 16); equal to float64 at 1, a partial tile, a tile, the
    next one and the full bucket, and to the interpreter."""
    g, ext = _masked_online_attention()
    loop = kernel_counts(g, ext)[0].loop
    assert (loop.part, loop.whole) == (16, 4)
    assert "for (int it = 0; it < mp_trips; ++it)" in emulated[0]["online"].kernels[0]
    em = _emulator(emulated, "online")
    rng = np.random.default_rng(0)
    for v in (1, 7, 16, 17, 64):
        q = rng.standard_normal((32, 16))
        k, vv = np.zeros((16, 64)), np.zeros((64, 16))
        k[:, :v] = rng.standard_normal((16, v))
        vv[:v] = rng.standard_normal((v, 16))
        sc = q @ k[:, :v]
        pr = np.exp(sc - sc.max(-1, keepdims=True))
        ref = pr / pr.sum(-1, keepdims=True) @ vv[:v]
        got = em({"Q": q, "K": k, "V": vv}, sizes={"S": v})["Y"]
        assert not np.isnan(got).any(), v
        assert _rel(got, ref) <= 2e-2, v
        interp = g.run({"Q": q, "K": k, "V": vv}, precision="gpu", sizes={"S": v})["Y"]
        assert _rel(got, interp) <= 2e-2, v


def test_the_rule_keeps_work_whose_padding_is_read():
    """Where a skipped iteration would not add the identity, or a kernel's output is read by
    another, the bucket's counts stay: an online softmax whose row sums are not masked (a padded
    key adds exp(0 - m) to them) keeps its loop; split-K's first kernel, which writes partial
    sums another kernel reads, keeps its grid."""
    from test_online_softmax import online
    S = mp.dim("S", 1, 64)
    g = online(forloop=4)
    assert kernel_counts(g, PaddedExtents({"Q": (32, 16), "K": (16, S), "V": (S, 16),
                                           "Y": (32, 16)})) == {}
    g, ext, _ = _split_k("splitk_r")
    counts = kernel_counts(g, ext)
    assert counts[0].grid == (None, None, None) and 1 not in counts


def test_static_graphs_and_graphs_without_extents_emit_what_they_did(families):
    """Without extents (or with extents that name no padded dim of the graph) the kernels run
    the bucket's whole grid and loop: the same text as before."""
    _, fam, bucket = families["kred"]
    inst = fam.instance(bucket)
    plain = emit_cuda(inst.annotated, prefix="kred_p")
    assert "mp_trips" not in plain.cu() and plain.dims == ()
    assert all(s.grid_counts == (None, None, None) for s in plain.launches)
    fixed = emit_cuda(inst.annotated, prefix="kred_p", extents=PaddedExtents({}))
    assert fixed.cu() == plain.cu()


@pytest.mark.skipif(find_nvcc() is None, reason="nvcc not installed")
def test_sources_with_counts_at_launch_compile_with_nvcc_for_sm90(emulated):
    """The families' buckets and the split-K graph, kernels and host launchers (grids computed
    from the tensors struct's sizes), in one translation unit: nvcc for sm_90, no warning."""
    src = emulated[0]
    res = compile_with_nvcc(translation_unit([src["rms"], src["kred"], src["splitk"]]),
                            ("sm_90",), name="rtgrid")
    assert res.warnings == [], res.warnings


@pytest.mark.slow
def test_a_searched_decode_attention_runs_only_the_kv_tiles_it_needs():
    """superopt's answer for attention over a symbolic KV length (64 query rows, searched at
    2048: FlashAttention's loop with a running max, 16 iterations of 128 keys) sizes its loop
    at launch; in the emulator at 1, a partial tile, a tile, the next, 1000 and the full bucket
    it equals float64 and the interpreter (search about 20 s: slow)."""
    S = mp.dim("S", 1, 4096)
    p = mp.Program("gq")
    q = p.input("Q", (2, 64, 32))
    k = p.input("K", (2, 32, S))
    v = p.input("V", (2, S, 32))
    p.output(mp.softmax((q @ k) * 32 ** -0.5, -1) @ v, name="O")
    fam = mp.superopt(p, workers=1, database=False, progress=False,
                      representative={"S": 2048})
    inst = fam.instance({"S": 2048})
    ext = PaddedExtents.of_program(p)
    loops = [c.loop for c in kernel_counts(inst.annotated.graph, ext).values() if c.loop]
    assert loops and loops[0].whole > 1
    em = EmulatedGraph(emit_cuda(inst.annotated, prefix="gq_s", extents=ext))
    tile = loops[0].part
    for s in (1, tile // 2 + 3, tile, tile + 1, 1000, 2048):
        x = p.random_inputs(s, sizes={"S": s})
        padded_x = pad_inputs(p, p.check_inputs(x), {"S": 2048})
        got = cut_outputs(p, em(padded_x, sizes={"S": s}), {"S": s})["O"]
        assert not np.isnan(got).any(), s
        assert _rel(got, p.evaluate(x)["O"]) <= 2e-3, s
        interp = cut_outputs(p, inst.annotated.graph.run(padded_x, precision="gpu",
                                                         sizes={"S": s}), {"S": s})["O"]
        assert _rel(got, interp) <= 2e-3, s


# ---- the cost model at a valid size inside the bucket (cost_model "work at launch") ----------

def test_the_cost_model_prices_the_iterations_a_padded_loop_runs():
    """The masked online attention (2 blocks, 4 iterations of 16 keys) priced at each valid
    key length: the bytes it loads are the tiles its blocks really load -- each block's Q tile
    and output tile once, one K and one V tile of 16 x 16 per iteration run -- counted here from
    the tile arithmetic alone; at the bucket's length the price is the whole-bucket price, and
    it never falls as the length grows."""
    from mirage_py.codegen_cuda.extents import launch_work
    from mirage_py.cost_model import kernel_costs
    g, ext = _masked_online_attention()
    whole = kernel_costs(g)[0]
    tile = 16 * 16 * 2  # float16
    last = 0.0
    for s in range(1, 65):
        work = launch_work(g, ext, {"S": s})
        (c,) = kernel_costs(g, work=work)
        iterations = 2 * -(-s // 16)
        assert (work[0].blocks, work[0].iterations) == (2, iterations), s
        assert c.load_bytes == 2 * tile + iterations * 2 * tile + 2 * tile, s
        assert c.us >= last - 1e-12, s
        last = c.us
    assert (c.us, c.load_bytes, c.dram_bytes) == (whole.us, whole.load_bytes, whole.dram_bytes)
    assert kernel_costs(g, work=launch_work(g, ext, None))[0] == whole


def test_launch_work_outside_the_kernel_is_a_typed_error():
    from mirage_py.cost_model import LaunchWork, kernel_costs
    from mirage_py.errors import MirageError
    g, _ = _masked_online_attention()
    for bad in (LaunchWork(0, 0), LaunchWork(3, 3), LaunchWork(2, 9), LaunchWork(2, 1)):
        with pytest.raises(MirageError, match="blocks running"):
            kernel_costs(g, work={0: bad})


def test_a_family_prices_a_call_by_what_it_launches_there(families):
    """``FamilyProgram.estimated_time_at``: the bucket's own size is the bucket's price; a
    token count inside the bucket is priced with the blocks its grid launches there (one per
    row per column part) and the DRAM bytes they move, fewer for fewer tokens; a size outside
    the range or a missing dim is a ShapeError. (The time itself need not fall with the count:
    fewer blocks per SM hide less latency in the model.)"""
    from mirage_py.codegen_cuda.extents import launch_work
    from mirage_py.errors import ShapeError
    p, fam, bucket = families["rms"]
    inst = fam.instance(bucket)
    assert fam.estimated_time_at(bucket) == pytest.approx(inst.estimated_time_us, rel=1e-12)
    (k, gk), = [(k, op) for k, op in enumerate(inst.graph.ops) if hasattr(op, "block")]
    per_row = gk.block.num_blocks // bucket["T"]
    dram = []
    for t in (1, 2, 33, 40, 63, 64):
        work = launch_work(inst.graph, PaddedExtents.of_program(p), {"T": t})
        (c,) = inst.model.kernel_costs(inst.annotated, inst.target, work)
        assert c.blocks == work[k].blocks == t * per_row, t
        assert fam.estimated_time_at({"T": t}) == pytest.approx(c.us, rel=1e-12)
        dram.append(c.dram_bytes)
    assert dram == sorted(set(dram))
    with pytest.raises(ShapeError, match="outside its range"):
        fam.estimated_time_at({"T": 129})
    with pytest.raises(ShapeError, match="needs a size for dim"):
        fam.estimated_time_at({})
