"""Index inputs and ``mp.take`` (the embedding lookup), through every stage: the Program API with
its typed errors, the float64 reference against NumPy and PyTorch eager, the μGraph interpreter,
the verifier (indices are known data drawn per test, the gather exact in the field), the cost
model, CUDA code (the emulator, nvcc), superopt, and the aten mapping of ``embedding`` and
``index_select``."""

from __future__ import annotations

import shutil

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.cost_model import kernel_costs
from mirage_py.errors import DTypeError, IndexRangeError, ShapeError, ValidationError
from mirage_py.ugraph import naive_lowering
from mirage_py.ugraph.graph import (BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                                    KernelGraph, KernelOp, OutputSaver, ThreadGraph, ThreadOp)
from mirage_py.verifier.equivalence import Verifier

V, D = 13, 16


def embed_norm(ids_shape=(2, 5), dtype="float16", index="int32", eps=1e-6):
    p = mp.Program("embed_norm")
    ids = p.input("ids", ids_shape, index)
    table = p.input("E", (V, D), dtype)
    w = p.input("w", (D,), dtype)
    p.output(mp.rms_norm(mp.take(table, ids), w, eps), name="y")
    return p


def numpy_embed_norm(xs, eps=1e-6):
    e = xs["E"][xs["ids"]]
    return e / np.sqrt(np.mean(e * e, axis=-1, keepdims=True) + eps) * xs["w"]


# ---- the Program API -------------------------------------------------------------------------

@pytest.mark.parametrize("ids_shape", [(7,), (2, 5), (2, 3, 4), ()])
def test_take_is_rows_of_the_table_in_the_shape_of_the_indices(ids_shape):
    p = mp.Program("take")
    ids = p.input("ids", ids_shape, "int64")
    table = p.input("E", (V, D), "float32")
    y = mp.take(table, ids)
    assert y.shape == tuple(ids_shape) + (D,) and y.dtype == "float32"
    p.output(y * 2.0, name="y")
    xs = p.random_inputs(3)
    assert xs["ids"].dtype.kind == "i" and xs["ids"].shape == tuple(ids_shape)
    assert xs["ids"].min() >= 0 and xs["ids"].max() < V
    np.testing.assert_array_equal(p.evaluate(xs)["y"], 2.0 * xs["E"][xs["ids"]])


def test_reference_equals_numpy_and_torch_embedding():
    torch = pytest.importorskip("torch")
    p = embed_norm((3, 6), dtype="float32")
    xs = p.random_inputs(1)
    got = p.evaluate(xs)["y"]
    np.testing.assert_allclose(got, numpy_embed_norm(xs), rtol=1e-12)
    e = torch.nn.functional.embedding(torch.from_numpy(xs["ids"]), torch.from_numpy(xs["E"]))
    want = e * torch.rsqrt(e.pow(2).mean(-1, keepdim=True) + 1e-6) * torch.from_numpy(xs["w"])
    np.testing.assert_allclose(got, want.numpy(), rtol=1e-9, atol=1e-12)


def test_a_table_of_higher_rank_gathers_along_its_first_dim():
    p = mp.Program("rows3")
    ids = p.input("ids", (4,), "int32")
    t = p.input("T", (6, 3, 2), "float32")
    p.output(mp.take(t, ids) + 1.0, name="y")
    xs = p.random_inputs(0)
    assert p.evaluate(xs)["y"].shape == (4, 3, 2)
    np.testing.assert_array_equal(p.evaluate(xs)["y"], xs["T"][xs["ids"]] + 1.0)


def test_index_bounds_are_the_fewest_rows_a_take_reads():
    p = mp.Program("two_tables")
    ids = p.input("ids", (4,), "int32")
    a = p.input("A", (9, D), "float32")
    b = p.input("B", (5, D), "float32")
    p.output(mp.take(a, ids) + mp.take(b, ids), name="y")
    assert p.index_bounds() == {"ids": 5}
    for seed in range(5):
        assert p.random_inputs(seed)["ids"].max() < 5


def test_json_round_trip_keeps_index_inputs_and_take():
    p = embed_norm()
    q = mp.Program.loads(p.dumps())
    assert q == p and q.structural_hash() == p.structural_hash()
    assert [t.dtype for t in q.inputs] == ["int32", "float16", "float16"]


def test_index_tensors_used_as_floats_raise_typed_errors():
    p = mp.Program("bad")
    ids = p.input("ids", (2, 5), "int32")
    x = p.input("x", (2, 5), "float32")
    e = p.input("E", (V, D), "float32")
    with pytest.raises(DTypeError, match=r"add: operand 1 is an index tensor \(2, 5\) int32"):
        _ = x + ids
    with pytest.raises(DTypeError, match="index tensor"):
        _ = ids * 2.0
    with pytest.raises(DTypeError, match=r"exp: operand 0 is an index tensor \(2, 5\) int32"):
        mp.exp(ids)
    with pytest.raises(DTypeError, match=r"matmul: operand 0 is an index tensor"):
        _ = ids @ e[:5]
    with pytest.raises(DTypeError, match="cast: dtype 'int32'"):
        mp.cast(x, "int32")
    with pytest.raises(DTypeError, match=r"output 'o' is the index tensor \(2, 5\) int32"):
        p.output(ids, name="o")


def test_floats_used_as_indices_raise_typed_errors():
    p = mp.Program("bad")
    ids = p.input("ids", (2, 5), "int32")
    x = p.input("x", (2, 5), "float32")
    e = p.input("E", (V, D), "float32")
    with pytest.raises(DTypeError, match=r"take: the indices \(2, 5\) are float32.*"
                                         r"table \(13, 16\) float32"):
        mp.take(e, x)
    with pytest.raises(DTypeError, match=r"take: the table \(2, 5\) is an index tensor"):
        mp.take(ids, ids)
    with pytest.raises(ShapeError, match=r"take: the table must have at least one dim"):
        mp.take(mp.lax.const(1.0), ids)
    # the values given for an index input must be integers
    q = embed_norm()
    xs = q.random_inputs(0)
    xs["ids"] = xs["ids"].astype(np.float64)
    with pytest.raises(DTypeError, match="'ids' .* index tensor .* float64"):
        q.evaluate(xs)


@pytest.mark.parametrize("bad", [V, V + 7, -1])
def test_an_index_out_of_range_raises_index_range_error_everywhere(bad):
    p = embed_norm()
    xs = p.random_inputs(0)
    xs["ids"] = xs["ids"].copy()
    xs["ids"][1, 3] = bad
    msg = rf"take: index {bad} at position \(1, 3\) .* table \(13, 16\) \(valid 0 .. 12\)"
    with pytest.raises(IndexRangeError, match=msg):
        p.evaluate(xs)
    g = naive_lowering(p)
    for precision in ("float64", "gpu"):
        with pytest.raises(IndexRangeError, match=msg):
            g.run(xs, precision=precision)
    assert issubclass(IndexRangeError, mp.MirageError)
    assert not issubclass(IndexRangeError, IndexError)


# ---- the μGraph and the verifier ---------------------------------------------------------------

def test_the_naive_lowering_has_a_take_kernel_and_runs_like_the_reference():
    p = embed_norm()
    g = naive_lowering(p)
    assert g.ops[0].op == "take" and g.ops[0].operands == ("E", "ids")
    assert {t.name: t.dtype for t in g.inputs}["ids"] == "int32"
    xs = p.random_inputs(2)
    np.testing.assert_allclose(g.run(xs, precision="float64")["y"], p.evaluate(xs)["y"],
                               rtol=1e-12)
    gpu = g.run(xs, precision="gpu")["y"]
    np.testing.assert_allclose(gpu, numpy_embed_norm(xs), rtol=2e-2, atol=2e-2)


def test_validation_refuses_index_tensors_where_floats_are_read():
    g = KernelGraph("bad", (DTensor("ids", (4,), "int32"), DTensor("x", (4,), "float16")),
                    (KernelOp("add", ("x", "ids"), DTensor("y", (4,), "float16")),), ("y",))
    with pytest.raises(ValidationError, match="index tensor"):
        mp.ugraph.validate(g)
    g = KernelGraph("bad", (DTensor("ids", (4,), "float16"), DTensor("E", (9, 8), "float16")),
                    (KernelOp("take", ("E", "ids"), DTensor("y", (4, 8), "float16")),), ("y",))
    with pytest.raises(ValidationError, match="take reads a table and an index tensor"):
        mp.ugraph.validate(g)


def test_the_verifier_draws_valid_indices_per_test():
    p = embed_norm((4, 8))
    v = Verifier(p)
    draws = [v.inputs(v.params(k), k)["ids"] for k in range(3)]
    for d in draws:
        assert d.dtype == np.int64 and d.shape == (4, 8) and d.min() >= 0 and d.max() < V
    assert not np.array_equal(draws[0], draws[1])  # fresh per test
    np.testing.assert_array_equal(draws[0], v.inputs(v.params(0), 0)["ids"])  # reproducible


def test_the_verifier_accepts_the_gather_with_a_small_bound():
    p = embed_norm()
    r = mp.verify(p, naive_lowering(p))
    assert r.equivalent and r.bound <= 1e-9, r


def _with_table(g: KernelGraph, ops_before: list, table: str) -> KernelGraph:
    take = g.ops[0]
    new = KernelOp("take", (table, take.operands[1]), take.output)
    return KernelGraph(g.name, g.inputs, tuple(ops_before) + (new,) + g.ops[1:], g.outputs)


def test_the_verifier_rejects_a_gather_from_the_transposed_table():
    p = mp.Program("square_table")
    ids = p.input("ids", (6,), "int32")
    e = p.input("E", (D, D), "float16")
    p.output(mp.take(e, ids) * 3.0, name="y")
    g = naive_lowering(p)
    assert mp.verify(p, g).equivalent
    et = KernelOp("transpose", ("E",), DTensor("Et", (D, D), "float16"), (("perm", (1, 0)),))
    bad = _with_table(g, [et], "Et")
    r = mp.verify(p, bad)
    assert not r.equivalent and r.mismatch is not None


def test_the_verifier_rejects_a_gather_of_the_neighbouring_row():
    p = embed_norm()
    g = naive_lowering(p)
    # the table rolled by one row: row i of the candidate is row i + 1 of the program's
    parts = [KernelOp("slice", ("E",), DTensor("lo", (V - 1, D), "float16"),
                      (("axis", 0), ("start", 1), ("stop", V))),
             KernelOp("slice", ("E",), DTensor("hi", (1, D), "float16"),
                      (("axis", 0), ("start", 0), ("stop", 1))),
             KernelOp("concat", ("lo", "hi"), DTensor("rolled", (V, D), "float16"),
                      (("axis", 0),))]
    r = mp.verify(p, _with_table(g, parts, "rolled"))
    assert not r.equivalent and r.mismatch.output == "y"


def test_the_verifier_rejects_the_indices_of_another_input():
    p = mp.Program("two_ids")
    a = p.input("a", (5,), "int32")
    b = p.input("b", (5,), "int32")
    e = p.input("E", (V, D), "float32")
    p.output(mp.take(e, a) - mp.take(e, b) * 0.5, name="y")
    g = naive_lowering(p)
    assert mp.verify(p, g).equivalent
    first = g.ops[0]
    swapped = KernelOp("take", (first.operands[0], "b" if first.operands[1] == "a" else "a"),
                       first.output)
    bad = KernelGraph(g.name, g.inputs, (swapped,) + g.ops[1:], g.outputs)
    assert not mp.verify(p, bad).equivalent


def test_the_verifier_tells_every_mutant_of_a_gather_program_apart_as_floats_do():
    """A mutant is accepted exactly when it computes the same floats (a swapped add is the
    same program; a gather of another table or other indices is not), and the mutants that
    touch the take kernel exist and are all rejected."""
    from mirage_py.verifier.mutate import mutants
    p = embed_norm()
    g = naive_lowering(p)
    ms = mutants(g, limit=60)
    xs = [p.random_inputs(s) for s in range(2)]
    touching = 0
    for m in ms:
        try:
            same = all(np.allclose(m.graph.run(x)["y"], p.evaluate(x)["y"], rtol=1e-9,
                                   atol=1e-12, equal_nan=True) for x in xs)
        except mp.MirageError:
            same = False
        assert mp.verify(p, m.graph).equivalent == same, str(m)
        touching += "take" in m.where
    assert touching and ms


# ---- cost model and CUDA -----------------------------------------------------------------------

def test_a_gather_costs_the_indices_and_the_rows_it_reads_not_the_table():
    p = mp.Program("big_vocab")
    ids = p.input("ids", (4, 8), "int32")
    e = p.input("E", (32000, 64), "float16")
    p.output(mp.take(e, ids) * 2.0, name="y")
    g = naive_lowering(p)
    take = kernel_costs(g, "h100")[0]
    assert take.bytes == 4 * 8 * 4 + 2 * (4 * 8 * 64) * 2  # ids, gathered rows, output
    assert take.bytes < 32000 * 64 * 2


def test_the_emitted_gather_runs_on_the_emulator_and_checks_its_indices():
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    from mirage_py.codegen_cuda.emulator import EmulatedGraph
    p = embed_norm((3, 4))
    g = naive_lowering(p)
    em = EmulatedGraph(g)
    xs = p.random_inputs(5)
    np.testing.assert_allclose(em(xs)["y"], numpy_embed_norm(xs), rtol=2e-2, atol=2e-2)
    # the gathered rows themselves, exactly (a copy of float16 values)
    q = mp.Program("rows")
    ids = q.input("ids", (5,), "int64")
    e = q.input("E", (V, D), "float16")
    q.output(mp.take(e, ids) * 1.0, name="y")
    xq = q.random_inputs(1)
    out = EmulatedGraph(naive_lowering(q))(xq)["y"]
    np.testing.assert_array_equal(out, xq["E"].astype(np.float16).astype(np.float32)[xq["ids"]])
    xs["ids"] = xs["ids"].copy()
    xs["ids"][0, 0] = V
    with pytest.raises(IndexRangeError, match=r"take -> .* index 13 in 'ids' .* \(13, 16\)"):
        em(xs)


def test_the_emitted_gather_compiles_with_nvcc():
    from mirage_py.codegen_cuda import emit_cuda
    from mirage_py.codegen_cuda.emit import translation_unit
    from mirage_py.codegen_cuda.nvcc import compile_with_nvcc, find_nvcc
    if find_nvcc() is None:
        pytest.skip("needs nvcc")
    srcs = [emit_cuda(naive_lowering(embed_norm()), prefix="take32"),
            emit_cuda(naive_lowering(embed_norm(index="int64", dtype="bfloat16")),
                      prefix="take64")]
    src = srcs[0]
    assert "g_ids[" in src.cu() and "const int* __restrict__ g_ids" in src.cu()
    assert "const long long* __restrict__ g_ids" in srcs[1].cu()
    res = compile_with_nvcc(translation_unit(srcs), name="take")
    assert res.warnings == [], res.warnings
    assert any("take" in r.kernel for r in res.resources)


# ---- superopt --------------------------------------------------------------------------------

def _gathers(graph: KernelGraph) -> list:
    return [n for op in graph.ops if isinstance(op, GraphKernel) for n in op.block.ops
            if isinstance(n, InputIter) and n.gather >= 0]


def test_superopt_fuses_the_gather_into_the_rms_norm_kernel():
    """embedding + rms_norm -> one kernel whose iterator gathers the rows through the indices,
    verified, equal to the reference in the interpreter and (the emitted CUDA) the emulator."""
    p = embed_norm((4, 16))
    opt = mp.superopt(p, workers=1, progress=False, database=False)
    assert all(v is not None and v.equivalent and v.bound <= 1e-9 for v in opt.verification)
    g = opt.annotated.graph
    assert opt.num_kernels == 1 < opt.naive_num_kernels, opt.summary()
    assert len(_gathers(g)) == 1 and not any(isinstance(op, KernelOp) for op in g.ops)
    assert opt.estimated_time_us < opt.naive_estimated_time_us
    xs = p.random_inputs(4)
    np.testing.assert_allclose(opt.run_numpy(xs)["y"], numpy_embed_norm(xs), rtol=2e-2,
                               atol=2e-2)
    assert mp.verify(p, g).equivalent
    if shutil.which("g++") is not None:
        from mirage_py.codegen_cuda.emulator import EmulatedGraph
        np.testing.assert_allclose(EmulatedGraph(g)(xs)["y"], numpy_embed_norm(xs), rtol=2e-2,
                                   atol=2e-2)


def _fused_by_hand(index_of_ids: str = "ids") -> tuple[mp.Program, KernelGraph]:
    """embedding + rms_norm as one graph kernel: one block per token, its row gathered."""
    p = embed_norm((2, 4))
    ins = ("E", index_of_ids, "w")
    ops = (InputIter("x", 0, (1, 0, -1), gather=1), InputIter("w", 2, (-1, -1, -1)),
           Fused("sq", ("x",), ThreadGraph(1, (ThreadOp("o", "square", ("in0",)),))),
           BlockOp("ss", "sum", ("sq",), (("axes", (2,)), ("keepdims", True))),
           Fused("y", ("x", "ss", "w"), ThreadGraph(3, (
               ThreadOp("a", "div", ("in1", float(D))), ThreadOp("b", "add", ("a", 1e-6)),
               ThreadOp("c", "sqrt", ("b",)), ThreadOp("d", "div", ("in0", "c")),
               ThreadOp("e", "mul", ("d", "in2"))))),
           OutputSaver("y", 0, (1, 0, -1)))
    gk = GraphKernel(ins, (DTensor("y", (2, 4, D), "float16"),),
                     BlockGraph((4, 2, 1), 64, 1, ops))
    g = KernelGraph("fused", tuple(DTensor(t.name, t.shape, t.dtype) for t in p.inputs), (gk,),
                    ("y",))
    return p, g


def test_a_gathering_iterator_through_the_stages():
    p, g = _fused_by_hand()
    mp.ugraph.validate(g)
    xs = p.random_inputs(6)
    np.testing.assert_allclose(g.run(xs)["y"], p.evaluate(xs)["y"], rtol=1e-12)
    r = mp.verify(p, g)
    assert r.equivalent and r.bound <= 1e-9
    assert mp.ugraph.serialize.loads(g.dumps()) == g
    assert "iter E[ids]" in str(g)
    # the cost: the gathered rows and the indices, not the table
    (k,) = kernel_costs(g, "h100")
    assert k.bytes < V * D * 2 + 2 * 4 * D * 2 * 2
    # an index tensor read as data, or floats used as indices, is no valid kernel
    bad = KernelGraph(g.name, g.inputs, (GraphKernel(("E", "E", "w"), g.ops[0].outputs,
                                                     g.ops[0].block),), g.outputs)
    with pytest.raises(ValidationError, match="not an index tensor"):
        mp.ugraph.validate(bad)


def test_the_verifier_rejects_a_fused_gather_of_other_indices():
    p = mp.Program("two_ids")
    ids = p.input("ids", (2, 4), "int32")
    p.input("other", (2, 4), "int32")
    e = p.input("E", (V, D), "float16")
    w = p.input("w", (D,), "float16")
    p.output(mp.rms_norm(mp.take(e, ids), w), name="y")
    _, g = _fused_by_hand()
    good = KernelGraph("g", tuple(DTensor(t.name, t.shape, t.dtype) for t in p.inputs),
                       g.ops, g.outputs)
    assert mp.verify(p, good).equivalent
    gk = g.ops[0]
    wrong = KernelGraph("w", good.inputs, (GraphKernel(("E", "other", "w"), gk.outputs,
                                                       gk.block),), g.outputs)
    r = mp.verify(p, wrong)
    assert not r.equivalent and r.mismatch is not None


def test_the_emitted_fused_gather_runs_on_the_emulator_and_compiles_with_nvcc():
    from mirage_py.codegen_cuda import emit_cuda
    from mirage_py.codegen_cuda.emit import translation_unit
    from mirage_py.codegen_cuda.nvcc import compile_with_nvcc, find_nvcc
    p, g = _fused_by_hand()
    src = emit_cuda(g, prefix="fused_gather")
    assert "(long long)g_ids[" in src.cu()
    if shutil.which("g++") is not None:
        from mirage_py.codegen_cuda.emulator import EmulatedGraph
        xs = p.random_inputs(7)
        np.testing.assert_allclose(EmulatedGraph(src)(xs)["y"], numpy_embed_norm(xs),
                                   rtol=2e-2, atol=2e-2)
    if find_nvcc() is not None:
        res = compile_with_nvcc(translation_unit([src]), name="fused_gather")
        assert res.warnings == [], res.warnings


# ---- the torch frontend ----------------------------------------------------------------------

class _EmbedNorm:
    @staticmethod
    def make(vocab=50, dim=32, dtype=None):
        torch = pytest.importorskip("torch")

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.emb = torch.nn.Embedding(vocab, dim)
                self.norm = torch.nn.RMSNorm(dim, eps=1e-6)
                with torch.no_grad():
                    self.norm.weight.uniform_(0.5, 1.5)

            def forward(self, ids):
                return self.norm(self.emb(ids))

        torch.manual_seed(0)
        m = M().eval()
        return m.to(dtype) if dtype is not None else m


def test_from_torch_captures_embedding_and_rms_norm_equal_to_eager():
    torch = pytest.importorskip("torch")
    m = _EmbedNorm.make()
    ids = torch.randint(0, 50, (2, 7), generator=torch.Generator().manual_seed(1))
    p = mp.from_torch(m, (ids,))
    assert {t.name: t.dtype for t in p.inputs}["ids"] == "int64"
    assert any(t.op == "take" for t in p.nodes())
    got = p.evaluate(p.bind(m, ids))["out0"]
    with torch.no_grad():
        want = m(ids).numpy()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_compile_runs_embedding_and_norm_with_no_eager_operator():
    torch = pytest.importorskip("torch")
    m = _EmbedNorm.make(dtype=torch.float16)
    ids = torch.randint(0, 50, (2, 8), generator=torch.Generator().manual_seed(2))
    cm = mp.compile(m, (ids,), workers=1, time_budget_s=15, progress=False)
    with torch.no_grad():
        got, want = cm(ids).float(), m(ids).float()
    assert (got - want).abs().max().item() <= 2e-2 * want.abs().max().item()
    assert cm.eager_ops() == []
    rows = cm.regions()
    assert rows and all(r["verified"] for r in rows)
    assert sum(r["kernels"] for r in rows) == 1 < sum(r["kernels_naive"] for r in rows)


def test_index_select_along_dim_zero_and_one():
    torch = pytest.importorskip("torch")

    def f(x, idx):
        return torch.index_select(x, 0, idx) * 2.0 + torch.index_select(x.t(), 1, idx).t()

    x = torch.randn(9, 9)
    idx = torch.tensor([3, 0, 8, 3], dtype=torch.int64)
    p = mp.from_torch(f, (x, idx))
    assert sum(t.op == "take" for t in p.nodes()) == 2
    got = p.evaluate(p.bind(f, x, idx))["out0"]
    np.testing.assert_allclose(got, f(x, idx).numpy(), rtol=1e-6, atol=1e-6)


def test_positions_from_arange_become_a_slice_of_the_table():
    torch = pytest.importorskip("torch")

    class Pos(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = torch.nn.Embedding(20, 8)
            self.wpe = torch.nn.Embedding(16, 8)

        def forward(self, ids):
            pos = torch.arange(0, ids.shape[1], dtype=torch.long)
            # 1-D positions, and (1, T) ones as GPT-2 makes them: both a slice
            return self.wte(ids) + self.wpe(pos) + self.wpe(pos.unsqueeze(0))

    m = Pos().eval()
    ids = torch.randint(0, 20, (2, 6), generator=torch.Generator().manual_seed(3))
    p = mp.from_torch(m, (ids,))
    assert sum(t.op == "take" for t in p.nodes()) == 1  # the positions: a slice
    got = p.evaluate(p.bind(m, ids))["out0"]
    with torch.no_grad():
        np.testing.assert_allclose(got, m(ids).numpy(), rtol=1e-6, atol=1e-6)


def test_an_embedding_of_float_indices_is_not_captured():
    torch = pytest.importorskip("torch")
    from mirage_py.frontend_torch.aten import (TABLE, Boundary, NodeContext, Unsupported,
                                               input_dtype, make_input)
    ctx = NodeContext(None, None, lambda b: make_input(b.key, b.shape, input_dtype(b.dtype)),
                      lambda v, w: None)
    with pytest.raises(Unsupported, match="indices are a float32 tensor"):
        TABLE["embedding"](ctx, Boundary("w", (5, 4), torch.float32),
                           Boundary("i", (3,), torch.float32))


def test_numerics_probes_and_graphs_know_the_valid_indices():
    from mirage_py.ugraph.graph import index_bounds
    from mirage_py.verifier.numerics import PROBES, numerics_verdict, stored_inputs
    p = embed_norm((3, 5))
    stored = stored_inputs(p, 0)
    assert stored["ids"].dtype.kind == "i" and stored["ids"].max() < V
    for probe in PROBES:
        np.testing.assert_array_equal(probe.inputs(p, 0, stored)["ids"], stored["ids"])
    g = naive_lowering(p)
    assert index_bounds(g) == {"ids": V}
    assert index_bounds(_fused_by_hand()[1]) == {"ids": V}
    q, fused = _fused_by_hand()
    assert numerics_verdict(q, fused, naive_lowering(q), seed=0, target="h100").ok


class _Buffers:
    """Token ids viewed and sliced, and BERT's index buffers: ``position_ids`` (``arange``) and
    ``token_type_ids`` (zeros) sliced, gathered and expanded -- all of it before the lookups."""

    @staticmethod
    def make():
        torch = pytest.importorskip("torch")

        class M(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.wte = torch.nn.Embedding(20, 8)
                self.wpe = torch.nn.Embedding(16, 8)
                self.tte = torch.nn.Embedding(3, 8)
                self.register_buffer("position_ids", torch.arange(16).expand((1, -1)),
                                     persistent=False)
                tt = torch.zeros((1, 16), dtype=torch.long)
                tt[0, 1::3] = 2  # not a range and not all one value
                self.register_buffer("token_type_ids", tt, persistent=False)

            def forward(self, ids):
                t = ids.shape[1] // 2
                flat = ids.view(-1, t)  # (2, 2t) -> (4, t): a view of the token ids
                pos = self.position_ids[:, 1:t + 1]
                types = torch.gather(self.token_type_ids.expand(1, -1), 1, pos)
                x = self.wte(flat) + self.wpe(pos) + self.tte(types.expand(flat.shape[0], t))
                return x * 2.0 + self.wte(ids[:, 1:3]).mean(dim=(0, 1))

        torch.manual_seed(0)
        return M().eval()


def test_index_views_and_index_buffers_run_in_the_region():
    torch = pytest.importorskip("torch")
    m = _Buffers.make()
    ids = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(4))
    cm = mp.compile(m, (ids,), workers=1, time_budget_s=15, progress=False)
    with torch.no_grad():
        got, want = cm(ids), m(ids)
        ids2 = torch.randint(0, 20, (2, 8), generator=torch.Generator().manual_seed(5))
        got2, want2 = cm(ids2), m(ids2)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got2.numpy(), want2.numpy(), rtol=1e-5, atol=1e-5)
    assert cm.eager_ops() == []
    assert all(r["verified"] for r in cm.regions())
    # a changed index buffer is seen (its value is checked at every call)
    m.token_type_ids[0, 0] = 1
    with torch.no_grad():
        np.testing.assert_allclose(cm(ids).numpy(), m(ids).numpy(), rtol=1e-5, atol=1e-5)
