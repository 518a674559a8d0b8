"""Shapes that vary: symbolic dims in programs (lax/shapes.py), padded programs (lax/family.py)
and one search serving every size of a range (superopt/family.py). Every answer is compared
with the program's float64 evaluation at the same sizes."""

from __future__ import annotations

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.errors import ShapeError
from mirage_py.lax.family import bucket_of, buckets, cut_outputs, pad_inputs, padded
from mirage_py.superopt.family import family_bindings
from mirage_py.ugraph.graph import GraphKernel, MaskIter
from mirage_py.verifier import verify


def _rel(y, r):
    return float(np.linalg.norm(y - r) / np.linalg.norm(r))


def _decode(S=None, heads=4, hd=32):
    S = S or mp.dim("S", 1, 256)
    p = mp.Program("decode")
    q = p.input("Q", (heads, 1, hd))
    k = p.input("K", (heads, hd, S))
    v = p.input("V", (heads, S, hd))
    p.output(mp.softmax((q @ k) * hd ** -0.5, -1) @ v, name="O")
    return p


def _chunked_prefill():
    """T new tokens attending causally over a cache of S positions (the last T are theirs)."""
    S, T = mp.dim("S", 1, 128), mp.dim("T", 1, 32)
    p = mp.Program("prefill")
    q = p.input("Q", (2, T, 16))
    k = p.input("K", (2, 16, S))
    v = p.input("V", (2, S, 16))
    s = mp.where(mp.causal_mask(T, S, offset=S - T), (q @ k) * 0.25, -1e4)
    p.output(mp.softmax(s, -1) @ v, name="O")
    return p


def _inputs(p, sizes, seed=0):
    return p.random_inputs(seed, sizes=sizes)


# ---- symbolic programs ---------------------------------------------------------------------

def test_shape_inference_and_typed_errors_with_dims():
    S, T = mp.dim("S", 1, 64), mp.dim("T", 1, 64)
    p = mp.Program("p")
    x = p.input("X", (T, 32))
    k = p.input("K", (32, S))
    assert (x @ k).shape == (T, S) and str(T) == "T"
    assert mp.sum(x @ k, axis=-1, keepdims=True).shape == (T, 1)
    assert mp.reshape(x, (T, 4, 8)).shape == (T, 4, 8)
    with pytest.raises(ShapeError, match=r"\(T, 32\) @ \(T, 32\)"):
        x @ p.input("Y", (T, 32))
    with pytest.raises(ShapeError, match="do not broadcast"):
        (x @ k) + p.input("Z", (S, S))
    with pytest.raises(ShapeError, match="symbolic dim T"):
        x[:3]
    with pytest.raises(ShapeError, match="reappear whole"):
        mp.reshape(x, (-1,))
    with pytest.raises(ShapeError, match="count is not a constant"):
        mp.mean(x @ k, axis=-1)
    with pytest.raises(ShapeError, match="along a symbolic dim"):
        mp.concat([x, x], axis=0)
    with pytest.raises(mp.ProgramError, match="range 1 .. 8"):
        p.input("W", (mp.dim("S", 1, 8), 2))


def test_evaluate_binds_sizes_from_the_inputs():
    p = _chunked_prefill()
    assert set(p.dims) == {"S", "T"} and p.symbolic
    for t, s in ((1, 1), (3, 40), (32, 128)):
        x = _inputs(p, {"S": s, "T": t})
        y = p.evaluate(x)["O"]
        assert y.shape == (2, t, 16)
        static = p.at({"S": s, "T": t})
        assert not static.symbolic and static.inputs[1].shape == (2, 16, s)
        np.testing.assert_array_equal(y, static.evaluate(x)["O"])
    x = _inputs(p, {"S": 40, "T": 3})
    with pytest.raises(ShapeError, match="dim S is 39 here and 40"):
        p.evaluate({**x, "V": x["V"][:, :39]})
    with pytest.raises(ShapeError, match="outside its range 1 .. 32"):
        p.evaluate(_inputs(p, {"S": 40, "T": 33}))


def test_symbolic_programs_round_trip_through_json():
    p = _chunked_prefill()
    q = mp.Program.loads(p.dumps())
    assert q.structural_hash() == p.structural_hash() and q.dims == p.dims
    x = _inputs(p, {"S": 20, "T": 5})
    np.testing.assert_array_equal(q.evaluate(x)["O"], p.evaluate(x)["O"])


# ---- padded programs -----------------------------------------------------------------------

def test_buckets():
    S = mp.dim("S", 3, 100)
    assert buckets(S) == (4, 8, 16, 32, 64, 128)
    assert buckets(S, [16, 128]) == (16, 128) and bucket_of(17, (16, 128)) == 128
    with pytest.raises(ShapeError):
        buckets(S, [16, 64])  # does not reach 100


@pytest.mark.parametrize("make", [_decode, _chunked_prefill], ids=["decode", "prefill"])
def test_padded_program_equals_the_symbolic_one_at_every_size_up_to_its_bucket(make):
    """Zero-filled inputs, masks hiding the padding: the padded program cut back equals the
    symbolic program (float64) wherever the valid part ends, also inside a tile."""
    p = make()
    bucket = {n: 64 if n == "S" else 16 for n in p.dims}
    pp = padded(p, bucket)
    assert not pp.symbolic and set(pp.params) == set(p.dims)
    rng = np.random.default_rng(1)
    for _ in range(6):
        sizes = {n: int(rng.integers(1, bucket[n] + 1)) for n in p.dims}
        x = _inputs(p, sizes, seed=int(rng.integers(100)))
        want = p.evaluate(x)
        got = cut_outputs(p, pp.evaluate(pad_inputs(p, x, bucket), sizes=sizes), sizes)
        for n in want:
            np.testing.assert_allclose(got[n], want[n], rtol=1e-12, atol=1e-12)
    with pytest.raises(ShapeError, match="need the size"):
        pp.evaluate(pad_inputs(p, _inputs(p, {n: 2 for n in p.dims}), bucket))


def test_padding_masks_only_where_padding_could_leak():
    """A sum over a zero-filled input needs no mask; a max always does; a contraction with a
    zero-filled operand does not."""
    S = mp.dim("S", 1, 64)
    p = mp.Program("r")
    x = p.input("X", (8, S))
    w = p.input("W", (S, 4))
    p.output(mp.sum(x, -1), name="A")
    p.output(mp.max(x, -1), name="B")
    p.output(mp.exp(x) @ w, name="C")  # W zero-filled: no mask on exp(X)
    p.output(mp.sum(mp.exp(x), -1), name="D")  # exp(0) = 1: masked
    pp = padded(p, {"S": 16})
    wheres = [t for t in pp.nodes() if t.op == "where"]
    assert len(wheres) == 2
    x_ = _inputs(p, {"S": 11})
    got = cut_outputs(p, pp.evaluate(pad_inputs(p, x_, {"S": 16}), sizes={"S": 11}), {"S": 11})
    for n, want in p.evaluate(x_).items():
        np.testing.assert_allclose(got[n], want, rtol=1e-12)


# ---- one search for a range ----------------------------------------------------------------

@pytest.fixture(scope="module")
def decode_family():
    p = _decode()
    return p, mp.superopt(p, workers=1, database=False, representative={"S": 64})


def test_one_search_serves_every_size(decode_family):
    """Searched once at S = 64; every other size runs on a replay of that answer (no search),
    equal to float64 within float16 precision."""
    p, fam = decode_family
    assert isinstance(fam, mp.FamilyProgram) and fam.num_kernels == 1
    searched = fam.searches
    for s in (64, 33, 17, 100, 256, 200, 5, 2):
        x = _inputs(p, {"S": s}, seed=s)
        assert _rel(fam.run_numpy(x)["O"], p.evaluate(x)["O"]) <= 2e-3, s
    built = [k for k in fam.instances if k != (("S", 64),)]
    assert sorted(k[0][1] for k in built) == [2, 8, 32, 128, 256]
    assert fam.searches == searched  # replays, no new search
    for key, inst in fam.instances.items():
        if key != (("S", 64),):
            assert all(p_.searched == 0 for p_ in inst.parts), key
            assert {pc.result.source for p_ in inst.parts for pc in p_.pieces
                    if pc.kind == "region"} == {"replay"}
    assert "bucket S=256" in fam.summary()


def test_family_check_covers_the_edge_cases_of_a_bucket(decode_family):
    p, fam = decode_family
    bindings = family_bindings(p.dims, {"S": 64})
    assert bindings == [{"S": 63}, {"S": 33}, {"S": 1}]
    assert len(fam.family_checks) == 3 * sum(
        pc.kind == "region" for part in fam.answer.parts for pc in part.pieces)
    assert all(v.equivalent for _, v in fam.family_checks)


def test_a_mask_wrong_only_inside_the_last_tile_is_rejected(decode_family):
    """A mutant whose valid mask lets one padded key through is right when the bucket is full
    (the only binding a one-size check would try) and wrong at every partial binding."""
    from dataclasses import replace
    p, fam = decode_family
    piece = next(pc for part in fam.answer.parts for pc in part.pieces if pc.kind == "region")
    region, graph = piece.result.program, piece.result.graph

    def loosen(n):
        if isinstance(n, MaskIter) and n.valid is not None:
            return replace(n, valid=(n.valid[0], n.valid[1] + 1))
        return n
    ops = tuple(replace(op, block=replace(op.block, ops=tuple(map(loosen, op.block.ops))))
                if isinstance(op, GraphKernel) else op for op in graph.ops)
    mutant = replace(graph, ops=ops)
    assert mutant.structural_hash() != graph.structural_hash()
    assert verify(region, mutant, sizes={"S": 64}).equivalent  # a full bucket cannot tell
    for sizes in family_bindings(p.dims, {"S": 64})[:2]:
        assert not verify(region, mutant, sizes=sizes).equivalent, sizes


def test_two_dims_and_a_causal_offset_that_depends_on_both():
    """Chunked prefill: the diagonal of the causal mask moves with S - T; one search at
    (S, T) = (64, 16) serves (S, T) in 1..128 x 1..32."""
    p = _chunked_prefill()
    fam = mp.superopt(p, workers=1, database=False, representative={"S": 64, "T": 16})
    for s, t in ((64, 16), (50, 9), (128, 32), (7, 7), (100, 3)):
        x = _inputs(p, {"S": s, "T": t}, seed=s + t)
        assert _rel(fam.run_numpy(x)["O"], p.evaluate(x)["O"]) <= 2e-3, (s, t)


def test_every_size_a_call_runs_at_is_verified_once(decode_family):
    """The first call at a binding of the sizes verifies the bucket graph there (within the
    stated bound), the next call at it does not; a graph wrong at that size is a ShapeError,
    never a wrong answer."""
    from dataclasses import replace
    p, fam = decode_family
    x = _inputs(p, {"S": 45}, seed=45)
    fam.run_numpy(x)
    check = fam.size_checks[(("S", 45),)]
    assert check.bound <= 1e-9 and check.tests >= 1
    fam.run_numpy(x)
    assert fam.size_checks[(("S", 45),)] is check
    assert "each verified on first use" in fam.summary()
    # a bucket whose region graph lets one padded key through: caught at the first new size
    piece = next(pc for part in fam.answer.parts for pc in part.pieces if pc.kind == "region")

    def loosen(n):
        if isinstance(n, MaskIter) and n.valid is not None:
            return replace(n, valid=(n.valid[0], n.valid[1] + 1))
        return n
    good = piece.result.graph
    piece.result.graph = replace(good, ops=tuple(replace(op, block=replace(op.block, ops=tuple(
        map(loosen, op.block.ops)))) if isinstance(op, GraphKernel) else op for op in good.ops))
    try:
        with pytest.raises(ShapeError, match="wrong for the valid sizes"):
            fam.check_sizes({"S": 50})
    finally:
        piece.result.graph = good
    assert fam.check_sizes({"S": 50}).bound <= 1e-9


def test_several_representatives_the_cheapest_replay_serves_a_bucket(decode_family):
    """Searched at two buckets; a third bucket replays both answers and keeps the cheaper,
    never worse than the replay of one alone, and equal to float64."""
    p, one = decode_family
    two = mp.superopt(p, workers=1, database=False, representative=[{"S": 64}, {"S": 8}])
    assert two.representatives == [{"S": 64}, {"S": 8}] and len(two.answers) == 2
    for s in (20, 100):
        bucket = two.bucket({"S": s})
        assert two.instance(bucket).estimated_time_us <= \
            one.instance(bucket).estimated_time_us + 1e-9
        x = _inputs(p, {"S": s}, seed=s)
        assert _rel(two.run_numpy(x)["O"], p.evaluate(x)["O"]) <= 2e-3, s
    with pytest.raises(mp.OptionError, match="representative names dims"):
        mp.superopt(p, workers=1, database=False, representative={"T": 4})


def test_mask_mutants_wrong_only_at_some_sizes_are_rejected_by_the_family_check():
    """Mutants of a chunked prefill's answer that move one mask boundary by one (the causal
    diagonal that moves with S - T; a valid part's rows or columns, one more or one fewer): each
    one that is wrong at some sizes of the bucket -- its outputs, run in float64 and cut back,
    differ from the program's at some (S, T) -- is rejected at the full bucket or at one of its
    edge bindings, what the family check runs at search time (docs/verifier.md, "Shape
    families"). Some moves change nothing that is kept (a padded query row's output is cut; the
    causal diagonal already hides the first padded key) and are equivalent."""
    from dataclasses import replace
    p = _chunked_prefill()
    rep = {"S": 64, "T": 16}
    fam = mp.superopt(p, workers=1, database=False, representative=rep)
    padded_program, graph = fam.answer.program, fam.answer.graph
    bindings = [rep] + family_bindings(p.dims, rep)
    sizes_to_run = [{"S": s, "T": t} for s in (1, 7, 20, 33, 50, 63, 64) for t in (1, 5, 15, 16)
                    if t <= s]
    inputs = {(b["S"], b["T"]): _inputs(p, b, seed=b["S"] * 31 + b["T"]) for b in sizes_to_run}

    def wrong_somewhere(g) -> bool:
        for b in sizes_to_run:
            x = inputs[(b["S"], b["T"])]
            out = g.run(pad_inputs(p, p.check_inputs(x), rep), sizes=b)
            y = cut_outputs(p, out, b)["O"]
            if not _rel(np.asarray(y), p.evaluate(x)["O"]) <= 1e-9:
                return True
        return False

    assert not wrong_somewhere(graph)
    sites = [(ki, j) for ki, op in enumerate(graph.ops) if isinstance(op, GraphKernel)
             for j, n in enumerate(op.block.ops) if isinstance(n, MaskIter)]
    assert sites
    wrong = 0
    for ki, j in sites:
        node = graph.ops[ki].block.ops[j]
        changes = [replace(node, offset=node.offset + d) for d in (1, -1)]
        if node.valid is not None:
            rows, cols = node.valid
            changes += [replace(node, valid=(rows + d, cols)) for d in (1, -1)]
            changes += [replace(node, valid=(rows, cols + d)) for d in (1, -1)]
        for changed in changes:
            op = graph.ops[ki]
            ops = list(op.block.ops)
            ops[j] = changed
            g = replace(graph, ops=tuple(
                replace(op, block=replace(op.block, ops=tuple(ops))) if i == ki else o
                for i, o in enumerate(graph.ops)))
            if wrong_somewhere(g):
                wrong += 1
                assert any(not verify(padded_program, g, sizes=b).equivalent
                           for b in bindings), changed
    assert wrong >= 4


def test_one_compiled_bucket_serves_every_size_on_the_emulator_and_compiles_with_nvcc(
        decode_family):
    """A bucket's CUDA takes the valid sizes as kernel arguments (``mp_dim_S``): compiled once
    (the emulator's library, nvcc), run at several sizes, equal to the interpreter and to
    float64 at each; a missing size is a typed error."""
    from mirage_py.codegen_cuda import emit_cuda
    from mirage_py.codegen_cuda.emulator import EmulatedGraph
    from mirage_py.codegen_cuda.errors import CodegenError
    from mirage_py.codegen_cuda.nvcc import compile_with_nvcc, find_nvcc
    p, fam = decode_family
    inst = fam.instance({"S": 64})
    src = emit_cuda(inst.annotated, prefix="decode_s")
    assert any(spec.dims == ("S",) for spec in src.launches)
    assert "const int mp_dim_S" in src.cu() and "int mp_dim_S;" in src.header
    em = EmulatedGraph(src)
    for s in (64, 40, 33, 1):
        x = _inputs(p, {"S": s}, seed=s)
        padded_x = pad_inputs(p, p.check_inputs(x), {"S": 64})
        got = cut_outputs(p, em(padded_x, sizes={"S": s}), {"S": s})["O"]
        interp = fam.run_numpy(x)["O"]
        assert _rel(np.asarray(got, np.float64), interp) <= 2e-3, s
        assert _rel(np.asarray(got, np.float64), p.evaluate(x)["O"]) <= 2e-3, s
    with pytest.raises(CodegenError, match="sizes"):
        em(pad_inputs(p, p.check_inputs(_inputs(p, {"S": 8})), {"S": 64}))
    if find_nvcc() is not None:
        res = compile_with_nvcc(src.cu(), name="decode_s")
        assert res.warnings == [], res.warnings


def test_a_family_runs_through_the_gpu_runtime(decode_family, monkeypatch):
    """``FamilyProgram(inputs)`` on the GPU path (the CuPy stand-in that runs the emitted CUDA
    on the CPU emulator): each bucket compiled once and run at every size in it, outputs equal
    to float64."""
    import fake_cupy
    from mirage_py.codegen_cuda import runtime
    monkeypatch.setattr(runtime, "_MODULES", {})
    cp = fake_cupy.install(monkeypatch)
    compiled = fake_cupy.RawModule.compiled
    p, fam = decode_family
    fam._compiled.clear()
    for s in (40, 64, 17, 33):  # buckets 64, 64, 32, 64
        x = _inputs(p, {"S": s}, seed=s)
        out = fam({n: cp.asarray(v.astype(np.float16)) for n, v in x.items()})["O"]
        assert out.shape == (4, 1, 32)
        assert _rel(np.asarray(out, np.float64), p.evaluate(x)["O"]) <= 2e-3, s
    assert sorted(fam._compiled) == [(("S", 32),), (("S", 64),)]
    assert fake_cupy.RawModule.compiled - compiled == 2
    with pytest.raises(ShapeError):
        fam({"Q": cp.zeros((4, 1, 32), np.float16), "K": cp.zeros((4, 32, 300), np.float16),
             "V": cp.zeros((4, 300, 32), np.float16)})  # S = 300 is out of its range


# ---- a batch of 1 searched, other batches replayed --------------------------------------------

def _batched_norm_proj():
    """RMSNorm, a projection and a residual over (batch, tokens): a batch of 1 gives the batch
    dim no label, so the bucket of 1 and the others are labelled differently."""
    B, S = mp.dim("B", 1, 8), mp.dim("S", 1, 64)
    p = mp.Program("batched")
    x = p.input("X", (B, S, 64))
    g = p.input("G", (64,))
    w = p.input("W", (64, 64))
    p.output(mp.rms_norm(x, g) @ w + x, name="Y")
    return p


def test_labels_of_two_buckets_correspond_by_the_dims_they_name():
    """The tokens and features labels of the batch-1 bucket are the batch-2 bucket's second and
    third (the batch label, fresh, comes first there), found whatever order the second
    program lists its outputs in; programs of another outline do not correspond; a trace
    rescaled through the map grows the fresh batch label on a free grid axis (tiles kept) or
    keeps it whole in the block (part counts kept)."""
    from mirage_py.generator.block_search import Plan
    from mirage_py.generator.kernel_search import rescale_trace
    from mirage_py.generator.labels import LabelMap, infer_labels, label_correspondences
    p = _batched_norm_proj()
    one, two = padded(p, {"B": 1, "S": 16}), padded(p, {"B": 2, "S": 16})
    l1, l2 = infer_labels(one), infer_labels(two)
    (m,) = label_correspondences(one, l1, two, l2)
    assert isinstance(m, LabelMap) and len(m.rename) == 2 and len(m.fresh) == 1
    assert l2.sizes[m.fresh[0]] == 2
    for old, new in m.rename.items():
        assert l1.sizes[old] == l2.sizes[new]
    # two outputs listed the other way round in the second program: the same map
    q1, q2 = mp.Program("two_out"), mp.Program("two_out")
    for q, b, order in ((q1, 1, (0, 1)), (q2, 2, (1, 0))):
        x = q.input("X", (b, 16, 64))
        w = q.input("W", (64, 32))
        outs = [mp.exp(x), x @ w]
        for i in order:
            q.output(outs[i], name=f"Y{i}")
    (m2,) = label_correspondences(q1, infer_labels(q1), q2, infer_labels(q2))
    assert len(m2.rename) == 3 and len(m2.fresh) == 1
    other = mp.Program("other")
    x = other.input("X", (2, 16, 64))
    other.output(mp.exp(x), name="Y")
    assert label_correspondences(one, l1, other, infer_labels(other)) == []
    tokens = next(o for o in l1.sizes if l1.sizes[o] == 16)
    trace = ((Plan(((tokens, 16), (None, 1), (None, 1)), (None, 1)), 0),)
    (grown,) = rescale_trace(trace, l1.sizes, l2.sizes, 1.0, m)
    assert grown[0].grid == ((m.rename[tokens], 16), (m.fresh[0], 2), (None, 1))
    (kept,) = rescale_trace(trace, l1.sizes, l2.sizes, 0.0, m)
    assert kept[0].grid == ((m.rename[tokens], 16), (None, 1), (None, 1))
    assert rescale_trace(trace, l1.sizes, l2.sizes, 1.0) is None  # names alone differ


def test_a_family_searched_at_batch_1_replays_its_answer_at_other_batches():
    """Searched at B = 1 (the size a first compile usually sees); buckets B = 2, 4 and 8 replay
    that answer with the batch dim grown on the grid -- no search -- equal to float64 at
    batches 2, 3 and 7 (inside the buckets, padded)."""
    p = _batched_norm_proj()
    fam = mp.superopt(p, workers=1, database=False, progress=False,
                      representative={"B": 1, "S": 16})
    searched = fam.searches
    for b, s in ((2, 16), (3, 16), (7, 9)):
        x = _inputs(p, {"B": b, "S": s}, seed=b)
        assert _rel(fam.run_numpy(x)["Y"], p.evaluate(x)["Y"]) <= 2e-3, (b, s)
    assert fam.searches == searched
    for key, inst in fam.instances.items():
        if dict(key)["B"] > 1:
            assert {pc.result.source for part in inst.parts for pc in part.pieces
                    if pc.kind == "region"} == {"replay"}, key
