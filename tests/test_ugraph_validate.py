"""One broken graph per validation rule, each a small edit of a valid hand-written graph.

Every case asserts the rule (``ValidationError.rule``) and that the message names the operator
that breaks it. The rule list is the one in the docstring of ``mirage_py.ugraph.validate``.
"""

import importlib
import re
from dataclasses import replace

import pytest

from mirage_py.errors import MirageError, ValidationError
from mirage_py.ugraph import (Accum, BlockOp, DTensor, Fused, GraphKernel, InputIter, KernelGraph,
                              KernelOp, MaskIter, OutputSaver, Phase, ThreadOp, attrs_of,
                              validate)
from ugraph_cases import R, one_kernel, rms_matmul, split_k, thread, tiled_matmul

MM, _ = tiled_matmul()     # ops: a, b, c = matmul, acc, save
RMS, _ = rms_matmul()      # ops: x, w, xw, sq (fused), ss (sum), acc_xw, acc_ss, y (fused), save
TWO, _ = split_k()         # graph kernel, graph kernel, kernel div


def block(g: KernelGraph, k: int = 0, **kw) -> KernelGraph:
    """``g`` with graph kernel ``k``'s block graph fields replaced."""
    gk = g.ops[k]
    ops = list(g.ops)
    ops[k] = replace(gk, block=replace(gk.block, **kw))
    return replace(g, ops=tuple(ops))


def node(g: KernelGraph, j: int, new, k: int = 0) -> KernelGraph:
    """``g`` with block node ``j`` of graph kernel ``k`` replaced (``None``: removed; a list:
    replaced by several)."""
    nodes = list(g.ops[k].block.ops)
    nodes[j:j + 1] = [] if new is None else (new if isinstance(new, list) else [new])
    return block(g, k, ops=tuple(nodes))


def kernel(g: KernelGraph, k: int, **kw) -> KernelGraph:
    ops = list(g.ops)
    ops[k] = replace(ops[k], **kw)
    return replace(g, ops=tuple(ops))


def test_base_graphs_are_valid():
    for g in (MM, RMS, TWO):
        for target in ("a100", "h100", "h200"):
            infos = validate(g, target)
            assert set(infos) == {k for k, o in enumerate(g.ops) if isinstance(o, GraphKernel)}
    info = validate(RMS)[0]
    assert info.shapes["x"] == (8, 64) and info.shapes["w"] == (64, 32)
    assert info.shapes["ss"] == (8, 1) and info.shapes["y"] == (8, 32)
    B, P = Phase.BODY, Phase.POST
    assert info.phases == {"x": B, "w": B, "xw": B, "sq": B, "ss": B, "acc_xw": P, "acc_ss": P,
                           "y": P}
    assert info.dtypes["x"] == "float16" and info.dtypes["xw"] == "float32"
    assert MM.validate("a100") is MM


SQ = RMS.ops[0].block.ops[3]

# (rule, broken graph, text the message must contain: it names the operator)
CASES = [
    # -- ssa
    ("ssa", node(MM, 2, BlockOp("c", "matmul", ("a", "nope"))), "block op matmul -> 'c'"),
    ("ssa", node(MM, 1, InputIter("a", 1, (R, 1, R), fmap=0)), "input iterator 'a'"),
    ("ssa", node(MM, 4, OutputSaver("ac", 0, (0, 1, R))), "output saver 'ac'"),
    ("ssa", node(RMS, 3, replace(SQ, thread=thread(("q", "square", "in9"), ninputs=1))),
     "fused thread graph -> 'sq'"),
    ("ssa", node(RMS, 3, replace(SQ, thread=thread(("q", "square", "in0"),
                                                   ("q", "neg", "q"), ninputs=1))),
     "fused thread graph -> 'sq'"),
    ("ssa", kernel(TWO, 1, inputs=("Q",)), "graph kernel #1"),
    ("ssa", kernel(TWO, 2, operands=("T", 3.0)), "kernel div -> 'C'"),
    ("ssa", kernel(TWO, 2, output=DTensor("P", (16, 32))), "kernel div -> 'P'"),
    ("ssa", replace(MM, inputs=MM.inputs + (DTensor("A", (64, 128)),)), "input 'A'"),
    # -- operator
    ("operator", node(MM, 2, BlockOp("c", "softmax", ("a", "b"))), "block op softmax -> 'c'"),
    ("operator", node(MM, 2, BlockOp("c", "matmul", ("a", "b", "a"))), "block op matmul -> 'c'"),
    ("operator", node(MM, 2, BlockOp("c", "exp", ("a", "b"))), "block op exp -> 'c'"),
    ("operator", node(MM, 2, BlockOp("c", "mul", (2.0, 3.0))), "block op mul -> 'c'"),
    ("operator", node(MM, 3, Accum("acc", "c", kind="rescale")), "accumulator rescale -> 'acc'"),
    ("operator", node(RMS, 3, replace(SQ, thread=thread(("q", "matmul", "in0", "in0"),
                                                        ninputs=1))),
     "fused thread graph -> 'sq'"),
    ("operator", node(RMS, 3, replace(SQ, thread=thread(("q", "square", "in0"), ninputs=2))),
     "fused thread graph -> 'sq'"),
    ("operator", node(RMS, 3, replace(SQ, operands=("x", 2.0))), "fused thread graph -> 'sq'"),
    ("operator", kernel(TWO, 2, op="conv"), "kernel conv -> 'C'"),
    ("operator", kernel(TWO, 2, operands=("S", "S", 3.0)), "kernel div -> 'C'"),
    ("operator", kernel(TWO, 2, operands=(1.0, 3.0)), "kernel div -> 'C'"),
    # -- shape
    ("shape", node(RMS, 2, BlockOp("xw", "matmul", ("w", "x"))), "block op matmul -> 'xw'"),
    ("shape", node(RMS, 4, BlockOp("ss", "sum", ("sq",), attrs_of(axes=(2,)))),
     "block op sum -> 'ss'"),
    ("shape", node(RMS, 7, Fused("y", ("acc_xw", "x"), RMS.ops[0].block.ops[7].thread)), None),
    ("shape", node(RMS, 2, BlockOp("xw", "add", ("x", "w"))), "block op add -> 'xw'"),
    ("shape", kernel(TWO, 2, output=DTensor("C", (16, 33))), "kernel div -> 'C'"),
    ("shape", kernel(TWO, 0, outputs=(DTensor("P", (0, 32)),)), "tensor 'P'"),
    # -- dtype
    ("dtype", replace(MM, inputs=(DTensor("A", (64, 128), "int8"), MM.inputs[1])), "tensor 'A'"),
    ("dtype", kernel(TWO, 2, output=DTensor("C", (16, 32), "float64")), "tensor 'C'"),
    ("dtype", KernelGraph("mix", (DTensor("A", (4, 4)), DTensor("B", (4, 4), "bfloat16")),
                          (KernelOp("add", ("A", "B"), DTensor("C", (4, 4))),), ("C",)),
     "kernel add -> 'C'"),
    # -- grid
    ("grid", block(MM, grid=(2, 0, 1)), "grid (2, 0, 1)"),
    ("grid", block(MM, grid=(2, 3)), "grid (2, 3)"),
    ("grid", block(MM, grid=(1, 65536, 1)), "grid.y = 65536"),
    # -- threads
    ("threads", block(MM, threads=100), "100 threads"),
    ("threads", block(MM, threads=2048), "2048 threads"),
    ("threads", block(MM, threads=0), "0 threads"),
    # -- forloop
    ("forloop", block(MM, forloop=0), "forloop range 0"),
    # -- imap
    ("imap", node(MM, 0, InputIter("a", 0, (2, R, R), fmap=1)), "input iterator 'a'"),
    ("imap", node(MM, 0, InputIter("a", 0, (0, R, R), fmap=2)), "input iterator 'a'"),
    ("imap", node(MM, 0, InputIter("a", 0, (0, 0, R), fmap=1)), "input iterator 'a'"),
    ("imap", node(MM, 0, InputIter("a", 0, (0, R), fmap=1)), "input iterator 'a'"),
    ("imap", node(MM, 4, OutputSaver("acc", 0, (0, 1, 5))), "output saver 'acc'"),
    ("imap", node(MM, 4, OutputSaver("acc", 0, (0, 0, R))), "output saver 'acc'"),
    # -- tile-divides
    ("tile-divides", block(MM, grid=(3, 3, 1)), "input iterator 'a'"),      # 64 % 3
    ("tile-divides", block(MM, forloop=3), "input iterator 'a'"),           # 128 % 3
    ("tile-divides", block(MM, grid=(2, 5, 1)), "input iterator 'b'"),      # 96 % 5
    # -- phase
    ("phase", node(MM, 4, [BlockOp("d", "add", ("c", "acc")), OutputSaver("d", 0, (0, 1, R))]),
     "block op add -> 'd'"),
    ("phase", node(MM, 4, [Accum("acc2", "acc"), OutputSaver("acc2", 0, (0, 1, R))]),
     "accumulator sum -> 'acc2'"),
    ("phase", node(MM, 4, OutputSaver("c", 0, (0, 1, R))), "output saver 'c'"),
    ("phase", node(RMS, 7, Fused("y", ("acc_xw", "ss"), RMS.ops[0].block.ops[7].thread)),
     "fused thread graph -> 'y'"),
    # -- output-coverage
    ("output-coverage", node(MM, 4, OutputSaver("acc", 0, (0, R, R))), "output saver 'acc'"),
    ("output-coverage", node(MM, 4, [OutputSaver("acc", 0, (0, 1, R)),
                                     OutputSaver("acc", 0, (0, 1, R))]), "output saver 'acc'"),
    ("output-coverage", node(MM, 4, None), "output #0 (C) is never saved"),
    ("output-coverage", kernel(MM, 0, outputs=(DTensor("C", (64, 192)),)), "output saver 'acc'"),
    ("output-coverage", replace(MM, outputs=("C", "D")), "graph output 'D'"),
    ("output-coverage", replace(MM, outputs=("C", "C")), "repeat a name"),
    # -- binding
    ("binding", node(MM, 0, InputIter("a", 2, (0, R, R), fmap=1)), "input iterator 'a'"),
    ("binding", node(MM, 4, OutputSaver("acc", 1, (0, 1, R))), "output saver 'acc'"),
]

# the operators and nodes of issue #16 (MM's tiles: a (32, 32) per iteration, b (32, 32))
MASK = MaskIter("m", (64, 128), 0, 0, (0, R, R), fmap=1)
CASES += [
    ("operator", node(MM, 2, BlockOp("c", "leaky_relu", ("a",))), "block op leaky_relu -> 'c'"),
    ("operator", node(MM, 2, BlockOp("c", "where", ("a", "b"))), "block op where -> 'c'"),
    ("operator", node(RMS, 3, replace(SQ, thread=thread(("q", "leaky_relu", "in0"),
                                                        ninputs=1))),
     "thread op 'q'"),
    ("operator", kernel(TWO, 2, op="pow", operands=("S",)), "kernel pow -> 'C'"),
    ("shape", node(MM, 2, BlockOp("c", "slice", ("a",), attrs_of(axis=1, start=16, stop=48))),
     "block op slice -> 'c'"),
    ("shape", node(MM, 2, BlockOp("c", "reshape", ("a",), attrs_of(shape=(16, 48)))),
     "block op reshape -> 'c'"),
    ("shape", node(MM, 2, BlockOp("c", "max", ("a",), attrs_of(axes=(2,)))),
     "block op max -> 'c'"),
    ("shape", node(MM, 2, BlockOp("c", "concat", ("a", 1.0), attrs_of(axis=0))),
     "block op concat -> 'c'"),
    ("shape", node(MM, 0, [MASK, replace(MASK, out="a", shape=(64,))]), "mask iterator 'a'"),
    ("shape", node(MM, 0, [MASK, replace(MASK, out="a", window=-1)]), "mask iterator 'a'"),
    ("shape", kernel(TWO, 2, op="mask", operands=("S",), attrs=attrs_of(offset=0, window=0)),
     "kernel mask -> 'C'"),
    ("shape", kernel(TWO, 2, op="slice", operands=("S",),
                     attrs=attrs_of(axis=1, start=0, stop=64)), "kernel slice -> 'C'"),
    ("imap", node(MM, 0, [replace(MASK, imap=(2, R, R)), InputIter("a", 0, (0, R, R), fmap=1)]),
     "mask iterator 'm'"),
    ("tile-divides", node(MM, 0, [replace(MASK, shape=(63, 128)),
                                  InputIter("a", 0, (0, R, R), fmap=1)]), "mask iterator 'm'"),
    ("dtype", kernel(TWO, 2, op="cast", operands=("S",), attrs=attrs_of(dtype="bfloat16")),
     "kernel cast -> 'C'"),
]


@pytest.mark.parametrize("rule, graph, names", CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_each_rule(rule, graph, names):
    with pytest.raises(ValidationError) as e:
        validate(graph, "h100")
    err = e.value
    assert err.rule == rule, str(err)
    assert isinstance(err, MirageError) and isinstance(err, ValueError)
    msg = str(err)
    assert msg.endswith(f"[rule: {rule}]")
    if names is not None:
        assert names in msg, msg
    # op is the kernel ("graph kernel #0", "kernel div -> 'C'"), "graph input", or None for
    # graph-level rules; block-level messages name the block node after the kernel
    assert err.op is None or err.op == "graph input" or \
        re.fullmatch(r"graph kernel #\d+|kernel \w+ -> '\w+'", err.op), err.op
    if err.op is not None:
        assert msg.startswith(err.op + ": ")
        assert msg.count(err.op) == 1, msg  # said once, not repeated


def test_every_documented_rule_is_tested():
    # (the package exports the function validate, which hides the module of the same name)
    doc = importlib.import_module("mirage_py.ugraph.validate").__doc__
    documented = set(re.findall(r"^``([a-z-]+)``", doc, re.M))
    assert len(documented) == 13
    assert documented == {c[0] for c in CASES} | {"smem"}


def test_block_messages_name_the_block_node():
    cases = {
        "matmul -> 'xw'": node(RMS, 2, BlockOp("xw", "matmul", ("w", "x"))),
        "fused thread graph -> 'y'": node(RMS, 7, Fused("y", ("acc_xw", "x"),
                                                          RMS.ops[0].block.ops[7].thread)),
    }
    for text, g in cases.items():
        with pytest.raises(ValidationError, match=re.escape(text)) as e:
            validate(g)
        assert e.value.op == "graph kernel #0"


# -- shared memory: a block that fits an H100 (227 KB) but not an A100 (164 KB) ---------------

def big_tiles(k: int = 1536) -> KernelGraph:
    # two invariant float16 tiles of 32 x k (96 KB each at k = 1536) and a 4 KB float32 result
    g, _ = tiled_matmul(M=64, K=k, N=96, grid=(2, 3, 1), forloop=1)
    return node(node(g, 0, InputIter("a", 0, (0, R, R))), 1, InputIter("b", 1, (R, 1, R)))


def test_smem_fits_h100_but_not_a100():
    g = big_tiles()
    info = validate(g, "h100")[0]
    assert 164 * 1024 < info.smem_bytes <= 227 * 1024
    # with forloop 1 everything is loop-invariant and stays: a, b (float16), c, acc (float32)
    assert info.smem_bytes == 2 * 32 * 1536 * 2 + 2 * 32 * 32 * 4
    validate(g, "h200")
    with pytest.raises(ValidationError) as e:
        validate(g, "a100")
    assert e.value.rule == "smem" and e.value.op == "graph kernel #0"
    assert "a100" in str(e.value) and str(info.smem_bytes) in str(e.value)
    with pytest.raises(ValidationError, match=r"\[rule: smem\]"):
        validate(big_tiles(k=2048), "h100")  # 260 KB: too big everywhere


def test_smem_counts_live_tiles_only():
    # body tiles die after their last use, so a chain of elementwise ops costs two tiles at most
    base = tiled_matmul(forloop=1)[0]
    chain = [BlockOp(f"e{i}", "mul", (f"e{i - 1}" if i else "c", 2.0)) for i in range(6)]
    long = node(base, 4, chain + [OutputSaver("e5", 0, (0, 1, R))])
    short = node(base, 4, [BlockOp("e5", "mul", ("c", 2.0)), OutputSaver("e5", 0, (0, 1, R))])
    assert validate(long)[0].smem_bytes == validate(short)[0].smem_bytes


def test_fused_intermediates_live_in_registers():
    # one Fused op with three thread ops costs what one block op costs
    base = tiled_matmul(forloop=1)[0]
    fused = node(base, 4, [Fused("f", ("c",), thread(("u", "mul", "in0", 2.0), ("v", "exp", "u"),
                                                     ("w", "add", "v", 1.0), ninputs=1)),
                           OutputSaver("f", 0, (0, 1, R))])
    one = node(base, 4, [BlockOp("f", "exp", ("c",)), OutputSaver("f", 0, (0, 1, R))])
    assert validate(fused)[0].smem_bytes == validate(one)[0].smem_bytes


def test_validation_errors_are_reported_for_the_right_kernel():
    bad = kernel(TWO, 1, block=replace(TWO.ops[1].block, threads=33))
    with pytest.raises(ValidationError) as e:
        validate(bad)
    assert e.value.op == "graph kernel #1" and e.value.rule == "threads"


def test_concat_validates():
    g = one_kernel("cat", [DTensor("A", (16, 32)), DTensor("B", (16, 48))],
                   [DTensor("Y", (16, 80))], (2, 1, 1), 1, [
                       InputIter("a", 0, (0, R, R)), InputIter("b", 1, (0, R, R)),
                       BlockOp("c", "concat", ("a", "b"), attrs_of(axis=1)),
                       OutputSaver("c", 0, (0, R, R))])
    assert validate(g)[0].shapes["c"] == (8, 80)
    bad = node(g, 2, BlockOp("c", "concat", ("a", "b"), attrs_of(axis=0)))
    with pytest.raises(ValidationError, match="block op concat") as e:
        validate(bad)
    assert e.value.rule == "shape"


def test_unknown_target_is_a_typed_error():
    with pytest.raises(MirageError, match="unknown target"):
        validate(MM, "v100")


def test_a_where_mask_mixes_no_half_types():
    """A bfloat16 program's causal mask (0 and 1, held as float16) is no float16 operand mixed
    into bfloat16 arithmetic: the program lowers, validates and equals its float64 evaluation."""
    import numpy as np
    import mirage_py as mp
    p = mp.Program("masked_bf16")
    s = p.input("s", (2, 8, 8), "bfloat16")
    p.output(mp.softmax(mp.where(mp.causal_mask(8, 8), s, -1e4), axis=-1), name="y")
    opt = mp.superopt(p, workers=1, progress=False, database=False, time_budget_s=10)
    x = p.random_inputs(0)
    want = p.evaluate(x)["y"]
    got = opt.run_numpy(x)["y"]
    assert np.abs(np.asarray(got, np.float64) - want).max() < 2e-2
