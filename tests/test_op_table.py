"""Walks the operator table (``lax/ops.OPS``): every row has what each stage needs, so adding an
operator cannot half-succeed. Per row, a one-operator program (``EXAMPLES``) goes through

* the reference (``OpSpec.compute``, ``Program.evaluate``) and the μGraph interpreter (the naive
  lowering in float64 equals the reference);
* the verifier: a finite-field rule (``OpSpec.field``, filled by ``verifier/field.py``), and the
  naive lowering verified against the program;
* the search: an abstract expression (``generator/absexpr.apply``: a rule of its own for an
  operator the verifier computes exactly, an uninterpreted function for the others);
* code generation: a CUDA expression for an element-wise row (``codegen_cuda/cexpr.py``) and the
  CUDA of the naive lowering's pre-defined kernel (``emit_cuda``);
* the verifier's tests: a related operator to mutate into (``verifier/mutate.SWAP_OP``), or a
  stated reason;
* the torch frontend: the aten operator that maps onto the row (``frontend_torch/aten.TABLE``), or
  a stated reason.

docs/architecture.md ("The operator table") lists the same places.
"""

from __future__ import annotations

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.cexpr import elementwise
from mirage_py.generator import absexpr
from mirage_py.lax.ops import OPS, lax_class
from mirage_py.ugraph import naive_lowering
from mirage_py.verifier.mutate import SWAP_OP

R, C = 8, 16

# one program per row: the row's operator applied to inputs x (R, C) and w (C, C), float16
EXAMPLES = {
    "mask": lambda x, w: mp.where(mp.causal_mask(R, C, C - R), x, -1e4),
    "neg": lambda x, w: -x,
    "square": lambda x, w: mp.square(x),
    "exp": lambda x, w: mp.exp(x),
    "sqrt": lambda x, w: mp.sqrt(x * x + 1.0),
    "silu": lambda x, w: mp.silu(x),
    "gelu": lambda x, w: mp.gelu(x, approximate="tanh"),
    "relu": lambda x, w: mp.relu(x),
    "sigmoid": lambda x, w: mp.sigmoid(x),
    "tanh": lambda x, w: mp.tanh(x),
    "sin": lambda x, w: mp.sin(x),
    "cos": lambda x, w: mp.cos(x * 4.0),
    "log": lambda x, w: mp.log(x * x + 1.0),
    "abs": lambda x, w: mp.abs(x),
    "softplus": lambda x, w: mp.softplus(x),
    "mish": lambda x, w: mp.mish(x),
    "leaky_relu": lambda x, w: mp.leaky_relu(x, 0.1),
    "clamp": lambda x, w: mp.clamp(x, -0.5, 0.75),
    "pow": lambda x, w: mp.pow(x, 3),
    "cast": lambda x, w: mp.cast(x, "float32"),
    "add": lambda x, w: x + x @ w,
    "sub": lambda x, w: x - x @ w,
    "mul": lambda x, w: x * (x @ w),
    "div": lambda x, w: x / (x * x + 1.0),
    "maximum": lambda x, w: mp.maximum(x, x @ w),
    "minimum": lambda x, w: mp.minimum(x, 0.25),
    "where": lambda x, w: mp.where(mp.causal_mask(R, C, C - R), x, x @ w),
    "matmul": lambda x, w: x @ w,
    "sum": lambda x, w: mp.sum(x, axis=-1, keepdims=True),
    "max": lambda x, w: mp.max(x, axis=-1, keepdims=True),
    "min": lambda x, w: mp.min(x, axis=-1),
    "reshape": lambda x, w: mp.reshape(x, (R, 2, C // 2)),
    "transpose": lambda x, w: mp.transpose(x),
    "slice": lambda x, w: x[:, 2:10],
    "concat": lambda x, w: mp.concat([x, x @ w], axis=-1),
    # rows of w picked by an int32 index input ``ids`` (R,) that example() declares
    "take": lambda x, w, ids: mp.take(w, ids) + x,
}
# rows whose example also reads an index input ``ids`` (R,) int32
WITH_INDICES = {"take"}
# leaves every program has: inputs, and the constants of the examples above
LEAVES_IN_EVERY_PROGRAM = {"input": "every example reads x", "const": "x * x + 1.0, -1e4, ..."}

# mutants (verifier/mutate.py): rows without a related operator are mutated otherwise
NO_SWAP = {
    "input": "kind `input`: a kernel reads another input of the same shape",
    "const": "kind `const`: a constant doubled or moved by 1e-3",
    "mask": "kind `mask`: another offset or window",
    "matmul": "kinds `swap`, `operand`, `scale`, `imap`: operands swapped or misplaced",
    "sum": "kinds `axis` and `accum`: another axis, keepdims flipped, another kind",
    "reshape": "kinds `imap` / `omap`: a shape change is a layout, mutated as one",
    "transpose": "kinds `imap` / `omap`: a shape change is a layout, mutated as one",
    "slice": "kinds `imap` / `operand`: another part of the tile",
    "concat": "kinds `swap` / `operand`: parts swapped or replaced",
    "take": "kind `take`: the neighbouring row (a rolled table) or a transposed square table",
}

# the aten operator (frontend_torch/aten.TABLE) each row comes from, or why none is needed
ATEN = {
    "neg": "neg", "square": "square", "exp": "exp", "sqrt": "sqrt", "silu": "silu",
    "gelu": "gelu", "relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "sin": "sin", "cos": "cos", "log": "log",
    "abs": "abs", "softplus": "softplus", "mish": "mish", "leaky_relu": "leaky_relu",
    "clamp": "clamp", "pow": "pow", "cast": "_to_copy", "add": "add", "sub": "sub", "mul": "mul",
    "div": "div", "maximum": "maximum", "minimum": "minimum", "where": "where", "matmul": "mm",
    "sum": "sum", "max": "amax", "min": "amin", "reshape": "view", "transpose": "permute",
    "slice": "slice", "concat": "cat", "take": "embedding",
}
NO_ATEN = {
    "input": "a graph placeholder, parameter or eager result (aten.NodeContext.sym)",
    "const": "a number or a uniform constant tensor (aten.NodeContext.sym)",
    "mask": "a folded 0/1 constant of a causal or sliding-window pattern (aten.match_mask)",
}


def example(op: str) -> mp.Program:
    p = mp.Program(f"row_{op}")
    x = p.input("x", (R, C), "float16")
    w = p.input("w", (C, C), "float16")
    if op in WITH_INDICES:
        ids = p.input("ids", (R,), "int32")
        p.output(EXAMPLES[op](x, w, ids), name="y")
    else:
        p.output(EXAMPLES[op](x, w), name="y")
    return p


def node_of(p: mp.Program, op: str):
    return next(t for t in p.nodes() if t.op == op)


def test_every_row_has_an_example_and_every_example_a_row():
    assert set(EXAMPLES) | set(LEAVES_IN_EVERY_PROGRAM) == set(OPS)
    for op in EXAMPLES:
        assert node_of(example(op), op) is not None, op


@pytest.mark.parametrize("op", sorted(EXAMPLES))
def test_the_row_through_every_stage(op):
    spec = OPS[op]
    p = example(op)
    t = node_of(p, op)
    xs = p.random_inputs(0)
    # reference and interpreter
    assert spec.category == "leaf" or callable(spec.compute)
    want = p.evaluate(xs)["y"]
    naive = naive_lowering(p)
    np.testing.assert_allclose(naive.run(xs, precision="float64")["y"], want, rtol=1e-12,
                               atol=1e-12)
    # verifier: a field rule, and the naive lowering verified
    assert spec.category == "leaf" or spec.field.get("compute"), op
    assert mp.verify(p, naive).equivalent
    # search: an abstract expression; an exact row has a rule of its own
    expr = absexpr.of_program(p)[t.digest]
    opaque = {a[1].split("(")[0] for _, factors in expr for a, _ in factors if a[0] == "uf"}
    assert (op in opaque) == (lax_class(op, t.attr_dict) in ("uf", "select") and
                              spec.category != "reduce"), (op, absexpr.to_text(expr))
    # code generation
    if spec.elementwise:
        args = ["a", "b", "c"][:spec.arity]
        assert elementwise(op, args, attrs=t.attr_dict)
    assert emit_cuda(naive).kernels
    # mutants, aten
    assert op in SWAP_OP or op in NO_SWAP, f"{op}: no related operator in mutate.SWAP_OP"
    assert (op in ATEN) != (op in NO_ATEN), op


def test_every_row_maps_from_aten_or_says_why_not():
    pytest.importorskip("torch")
    from mirage_py.frontend_torch.aten import TABLE
    assert set(ATEN) | set(NO_ATEN) == set(OPS)
    missing = {op: name for op, name in ATEN.items() if name not in TABLE}
    assert not missing, f"aten operators with no translator: {missing}"
    assert all(op not in SWAP_OP for op in NO_SWAP)


def test_an_exact_operator_without_an_abstract_rule_is_refused():
    """The search's fallback (an uninterpreted function) is only for the operators the verifier
    treats as such: a Lax operator with no rule of its own raises instead of being searched
    as an opaque function."""
    from mirage_py.errors import MirageError
    with pytest.raises(MirageError, match="no rule for operator 'no_such_op'"):
        absexpr.apply("no_such_op", [absexpr.var("x")])
