"""Every user error raises a subclass of MirageError whose message names the operator and shapes."""

import contextlib
import json

import numpy as np
import pytest

import mirage_py as mp


@pytest.fixture
def p():
    return mp.Program("prog")


@contextlib.contextmanager
def raises(exc, *needles):
    """pytest.raises for ``exc`` (which must be a MirageError) plus substrings of the message."""
    assert issubclass(exc, mp.MirageError)
    with pytest.raises(exc) as info:
        yield info
    msg = str(info.value)
    for n in needles:
        assert n in msg, f"{n!r} not in {msg!r}"


def test_hierarchy():
    for e in (mp.ShapeError, mp.DTypeError, mp.ProgramError, mp.SerializationError):
        assert issubclass(e, mp.MirageError)
    assert issubclass(mp.ShapeError, ValueError)
    assert issubclass(mp.DTypeError, TypeError)


# ---- shapes -------------------------------------------------------------------------------

def test_matmul_inner_dims(p):
    A = p.input("A", (3, 4))
    B = p.input("B", (5, 6))
    with raises(mp.ShapeError, "matmul", "(3, 4)", "(5, 6)", "4 != 5"):
        A @ B


def test_matmul_inner_dims_1d_names_user_shapes(p):
    a = p.input("a", (3,))
    B = p.input("B", (4, 5))
    with raises(mp.ShapeError, "matmul", "(3,)", "(4, 5)"):
        a @ B
    with raises(mp.ShapeError, "matmul", "(4, 5)", "(3,)"):
        B @ a


def test_matmul_batch_dims(p):
    A = p.input("A", (2, 3, 4))
    B = p.input("B", (5, 4, 6))
    with raises(mp.ShapeError, "matmul", "(2, 3, 4)", "(5, 4, 6)", "broadcast"):
        A @ B


def test_matmul_scalars(p):
    A = p.input("A", (3, 4))
    s = mp.sum(A)
    with raises(mp.ShapeError, "matmul", "()", "(3, 4)"):
        s @ A
    with raises(mp.ShapeError, "matmul"):
        mp.matmul(A, 2.0)


@pytest.mark.parametrize("op", [lambda a, b: a + b, lambda a, b: a - b, lambda a, b: a * b,
                                lambda a, b: a / b])
def test_binary_no_broadcast(p, op):
    A = p.input("A", (3, 4))
    B = p.input("B", (2, 4))
    with raises(mp.ShapeError, "(3, 4)", "(2, 4)", "do not broadcast") as info:
        op(A, B)
    assert str(info.value).split(":")[0] in ("add", "sub", "mul", "div")


def test_binary_operand_types(p):
    A = p.input("A", (3,))
    with raises(mp.ShapeError, "add", "ndarray"):
        np.ones(3) + A
    with raises(mp.ShapeError, "mul", "str"):
        A * "x"
    with raises(mp.ShapeError, "add"):
        mp.lax.add(1, 2)


@pytest.mark.parametrize("f, needles", [
    (lambda A: mp.sum(A, axis=3), ("sum", "axis 3", "(2, 3, 4)")),
    (lambda A: mp.sum(A, axis=-4), ("sum", "axis -4", "(2, 3, 4)")),
    (lambda A: mp.sum(A, axis=(0, 0)), ("sum", "repeated", "(2, 3, 4)")),
    (lambda A: mp.sum(A, axis=(0, -3)), ("sum", "repeated", "(2, 3, 4)")),
    (lambda A: mp.sum(A, axis=1.5), ("sum", "1.5", "(2, 3, 4)")),
    (lambda A: mp.sum(A, axis="x"), ("sum", "(2, 3, 4)")),
    (lambda A: mp.mean(A, axis=5), ("mean", "axis 5", "(2, 3, 4)")),
])
def test_bad_axes(p, f, needles):
    A = p.input("A", (2, 3, 4))
    with raises(mp.ShapeError, *needles):
        f(A)


@pytest.mark.parametrize("shape, needles", [
    ((5, 5), ("reshape", "(2, 3, 4)", "24 elements", "(5, 5)", "25 elements")),
    ((5, -1), ("reshape", "(2, 3, 4)", "(5, -1)")),
    ((-1, -1), ("reshape", "(2, 3, 4)", "(-1, -1)")),
    ((0, 24), ("reshape", "(2, 3, 4)", "(0, 24)")),
    ((2.0, 12), ("reshape", "(2, 3, 4)")),
    (1.5, ("reshape", "(2, 3, 4)", "1.5")),
])
def test_bad_reshape(p, shape, needles):
    A = p.input("A", (2, 3, 4))
    with raises(mp.ShapeError, *needles):
        mp.reshape(A, shape)


@pytest.mark.parametrize("perm", [(0, 1), (0, 1, 1), (0, 1, 3), (0, 1, 2, 3), (0, 1, -4), 2,
                                  (0, 1, 1.0)])
def test_bad_transpose(p, perm):
    A = p.input("A", (2, 3, 4))
    with raises(mp.ShapeError, "transpose", "not a permutation", "(2, 3, 4)"):
        mp.transpose(A, perm)


def test_rms_norm_errors(p):
    X = p.input("X", (2, 8))
    W = p.input("W", (4,))
    with raises(mp.ShapeError, "rms_norm", "(4,)", "(8,)", "(2, 8)"):
        mp.rms_norm(X, W)
    with raises(mp.ShapeError, "rms_norm", "eps", "(2, 8)"):
        mp.rms_norm(X, eps=0.0)
    with raises(mp.ShapeError, "rms_norm", "eps"):
        mp.rms_norm(X, eps=-1e-6)
    with raises(mp.ShapeError, "rms_norm", "()"):
        mp.rms_norm(mp.sum(X))


def test_non_tensor_operands():
    with raises(mp.ShapeError, "exp", "list"):
        mp.exp([1.0])
    with raises(mp.ShapeError, "matmul", "ndarray"):
        mp.matmul(np.ones((2, 2)), np.ones((2, 2)))
    with raises(mp.ShapeError, "rms_norm", "float"):
        mp.rms_norm(1.0)


# ---- inputs, dtypes, programs -------------------------------------------------------------

@pytest.mark.parametrize("shape", [(0, 3), (-1,), (2.5,), (True, 2), 3, "ab"])
def test_bad_input_shape(p, shape):
    with raises(mp.ShapeError, "input 'X'", repr(shape)):
        p.input("X", shape)


@pytest.mark.parametrize("dtype", ["float64", "int8", "fp16", None, np.float16])
def test_bad_dtype(p, dtype):
    with raises(mp.DTypeError, "input 'X'", "(2, 3)", repr(dtype), "float16"):
        p.input("X", (2, 3), dtype)


def test_float16_bfloat16_do_not_mix(p):
    A = p.input("A", (2, 3), "float16")
    B = p.input("B", (2, 3), "bfloat16")
    for f, name in [(lambda a, b: a + b, "add"), (lambda a, b: a * b, "mul"),
                    (lambda a, b: a / b, "div"), (lambda a, b: a - b, "sub")]:
        with raises(mp.DTypeError, name, "float16 (2, 3)", "bfloat16 (2, 3)"):
            f(A, B)
    C = p.input("C", (3, 2), "bfloat16")
    with raises(mp.DTypeError, "matmul", "float16 (2, 3)", "bfloat16 (3, 2)"):
        A @ C


def test_bad_input_name(p):
    with raises(mp.ProgramError, "input", "'1x'"):
        p.input("1x", (2,))
    with raises(mp.ProgramError, "input"):
        p.input(3, (2,))


def test_bad_program_name():
    with raises(mp.ProgramError, "name"):
        mp.Program("")


def test_duplicate_input(p):
    p.input("X", (2, 3))
    with raises(mp.ProgramError, "'prog'", "input 'X'", "twice"):
        p.input("X", (4,))


def test_output_with_foreign_input(p):
    q = mp.Program("other")
    Y = q.input("Y", (2, 3))
    X = p.input("X", (2, 3))
    with raises(mp.ProgramError, "'prog'", "input 'Y'", "(2, 3)", "not an input of this program"):
        p.output(X + Y)


def test_output_with_foreign_input_of_same_name_but_other_shape(p):
    q = mp.Program("other")
    Xq = q.input("X", (3, 3))
    p.input("X", (2, 3))
    with raises(mp.ProgramError, "input 'X'", "(3, 3)", "not an input of this program"):
        p.output(mp.exp(Xq))


def test_bad_outputs(p):
    X = p.input("X", (2,))
    with raises(mp.ProgramError, "output", "ndarray"):
        p.output(np.ones(2))
    with raises(mp.ProgramError, "output", "constant"):
        p.output(mp.lax.const(1.0))
    with raises(mp.ProgramError, "'X'", "already used"):
        p.output(X + 1, name="X")
    p.output(X + 1, name="Y")
    with raises(mp.ProgramError, "'Y'", "already used"):
        p.output(X + 2, name="Y")
    with raises(mp.ProgramError, "'a b'"):
        p.output(X + 3, name="a b")


def test_const_errors():
    with raises(mp.ShapeError, "const", "inf"):
        mp.lax.const(float("inf"))
    with raises(mp.ShapeError, "const", "nan"):
        mp.lax.const(float("nan"))
    with raises(mp.ShapeError, "const", "'x'"):
        mp.lax.const("x")
    with raises(mp.DTypeError, "const", "int8"):
        mp.lax.const(1.0, "int8")


# ---- evaluate inputs ----------------------------------------------------------------------

@pytest.fixture
def prog():
    p = mp.Program("prog")
    A = p.input("A", (2, 3), "float32")
    B = p.input("B", (3, 4), "float32")
    p.output(A @ B)
    return p


def test_evaluate_missing_input(prog):
    with raises(mp.ProgramError, "'prog'", "missing", "B"):
        prog.evaluate({"A": np.ones((2, 3))})


def test_evaluate_extra_input(prog):
    with raises(mp.ProgramError, "'prog'", "unknown", "C"):
        prog.evaluate({"A": np.ones((2, 3)), "B": np.ones((3, 4)), "C": np.ones(1)})


def test_evaluate_wrong_shape(prog):
    with raises(mp.ShapeError, "'prog'", "'B'", "(4, 3)", "declared (3, 4)"):
        prog.evaluate({"A": np.ones((2, 3)), "B": np.ones((4, 3))})


def test_evaluate_not_a_mapping(prog):
    with raises(mp.ProgramError, "'prog'", "dict"):
        prog.evaluate([np.ones((2, 3)), np.ones((3, 4))])


def test_evaluate_non_numeric_input(prog):
    with raises(mp.DTypeError, "'prog'", "'A'", "(2, 3)"):
        prog.evaluate({"A": np.full((2, 3), "x"), "B": np.ones((3, 4))})


def test_partition_evaluate_checks_inputs_too(prog):
    with raises(mp.ProgramError, "missing", "A"):
        mp.partition(prog).evaluate({"B": np.ones((3, 4))})


# ---- serialization --------------------------------------------------------------------------

def _doc(prog):
    return json.loads(prog.dumps())


@pytest.mark.parametrize("text, needle", [
    ("{not json", "does not parse"),
    ("[1, 2]", "must be an object"),
    ("", "does not parse"),
    ('{"format": "something else"}', "not a serialized program"),
    ('{"format": "mirage_py.program", "version": 99}', "version 99"),
    ('{"format": "mirage_py.program", "version": 1}', "malformed"),
])
def test_malformed_json(text, needle):
    with raises(mp.SerializationError, needle):
        mp.Program.loads(text)


def test_loads_not_a_string():
    with raises(mp.SerializationError):
        mp.Program.loads(None)


def test_json_with_wrong_recorded_shape(prog):
    doc = _doc(prog)
    doc["nodes"][-1]["shape"] = [2, 5]
    with raises(mp.SerializationError, "matmul", "(2, 5)", "(2, 4)"):
        mp.Program.from_json(doc)


def test_json_with_incompatible_operands(prog):
    doc = _doc(prog)
    doc["nodes"][1]["shape"] = [5, 4]  # B is now (5, 4): matmul inner dims differ
    with raises(mp.SerializationError, "matmul", "(2, 3)", "(5, 4)"):
        mp.Program.from_json(doc)


def test_json_with_unknown_operator(prog):
    doc = _doc(prog)
    doc["nodes"][-1]["op"] = "frobnicate"
    with raises(mp.SerializationError, "frobnicate"):
        mp.Program.from_json(doc)


def test_json_with_dangling_reference(prog):
    doc = _doc(prog)
    doc["nodes"][-1]["inputs"] = [0, 7]
    with raises(mp.SerializationError, "malformed"):
        mp.Program.from_json(doc)


def test_json_with_wrong_arity_and_attrs(prog):
    doc = _doc(prog)
    doc["nodes"][-1]["inputs"] = [0]
    with raises(mp.SerializationError, "matmul", "2 operand"):
        mp.Program.from_json(doc)
    doc = _doc(prog)
    doc["nodes"][-1]["attrs"] = {"perm": [1, 0]}
    with raises(mp.SerializationError, "matmul", "perm"):
        mp.Program.from_json(doc)


def test_json_with_bad_dtype_or_duplicate_input(prog):
    doc = _doc(prog)
    doc["nodes"][0]["dtype"] = "int32"
    with raises(mp.SerializationError, "int32"):
        mp.Program.from_json(doc)
    doc = _doc(prog)
    doc["nodes"][1]["attrs"]["name"] = "A"
    with raises(mp.SerializationError, "input 'A'", "twice"):
        mp.Program.from_json(doc)


def test_load_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        mp.Program.load(str(tmp_path / "nope.json"))


# ---- the operators of issue #16 -------------------------------------------------------------

def test_concat_errors(p):
    A = p.input("A", (2, 3))
    B = p.input("B", (4, 5))
    H = p.input("H", (2, 3), "bfloat16")
    with raises(mp.ShapeError, "concat", "(2, 3)", "(4, 5)", "differ outside axis 1"):
        mp.concat([A, B], axis=1)
    with raises(mp.ShapeError, "concat", "axis 2", "(2, 3)"):
        mp.concat([A, A], axis=2)
    with raises(mp.ShapeError, "concat", "(2, 3)", "(2,)", "rank"):
        mp.concat([A, mp.sum(A, 1)], axis=0)
    with raises(mp.DTypeError, "concat", "bfloat16", "float16"):
        mp.concat([A, H], axis=0)
    with raises(mp.ShapeError, "concat", "at least one"):
        mp.concat([])
    with raises(mp.ShapeError, "concat", "int"):
        mp.concat(A.shape, 0)


@pytest.mark.parametrize("args, needles", [
    ((1, 2, 9), ("slice", "2:9", "axis 1", "(2, 6)")),
    ((1, 3, 3), ("slice", "3:3", "(2, 6)")),
    ((1, -1, 3), ("slice", "-1:3", "(2, 6)")),
    ((2, 0, 1), ("slice", "axis 2", "(2, 6)")),
    ((1, 0.5, 2), ("slice", "start", "(2, 6)")),
])
def test_slice_errors(p, args, needles):
    A = p.input("A", (2, 6))
    with raises(mp.ShapeError, *needles):
        mp.slice(A, *args)


def test_split_and_indexing_errors(p):
    A = p.input("A", (2, 6))
    with raises(mp.ShapeError, "split", "6 elements", "4 equal parts", "(2, 6)"):
        mp.split(A, 4, axis=1)
    with raises(mp.ShapeError, "split", "[2, 3]", "(2, 6)"):
        mp.split(A, [2, 3], axis=1)
    with raises(mp.ShapeError, "indexing", "step 2", "(2, 6)"):
        A[:, ::2]
    with raises(mp.ShapeError, "indexing", "index 2", "axis 0", "(2, 6)"):
        A[2]
    with raises(mp.ShapeError, "indexing", "3 indices", "(2, 6)"):
        A[0, 1, 2]
    with raises(mp.ShapeError, "indexing", "selects nothing", "(2, 6)"):
        A[:, 4:2]


def test_mask_and_where_errors(p):
    S = p.input("S", (2, 4, 6))
    with raises(mp.ShapeError, "where", "mask (4, 4)", "(2, 4, 6)"):
        mp.where(mp.causal_mask(4, 4), S, 0.0)
    with raises(mp.ShapeError, "where", "mask (6, 4)", "(2, 4, 6)"):
        mp.where(mp.causal_mask(6, 4), S, 0.0)
    with raises(mp.ShapeError, "where", "mask (1, 6)", "(2, 4, 6)", "cover the last two dims"):
        mp.where(mp.causal_mask(1, 6), S, 0.0)
    with raises(mp.ShapeError, "where", "condition must be a mask", "add", "(2, 4, 6)"):
        mp.where(S + 1, S, 0.0)
    with raises(mp.ShapeError, "where", "at least one", "(4, 6)"):
        mp.where(mp.causal_mask(4, 6), 1.0, 0.0)
    with raises(mp.ShapeError, "causal_mask", "rows", "0"):
        mp.causal_mask(0, 4)
    with raises(mp.ShapeError, "sliding_window_mask", "window", "(4, 4)"):
        mp.sliding_window_mask(4, 4, 0)
    with raises(mp.ShapeError, "causal_mask", "offset", "1.5"):
        mp.causal_mask(4, 4, offset=1.5)
    q = mp.Program("q")
    with raises(mp.ProgramError, "constant", "mask"):
        q.output(mp.causal_mask(2, 2))


def test_elementwise_attribute_errors(p):
    A = p.input("A", (2, 3))
    with raises(mp.ShapeError, "clamp", "min 2", "max 1", "(2, 3)"):
        mp.clamp(A, 2, 1)
    with raises(mp.ShapeError, "clamp", "give min, max", "(2, 3)"):
        mp.clamp(A)
    with raises(mp.ShapeError, "clamp", "finite", "inf"):
        mp.clamp(A, max=float("inf"))
    with raises(mp.ShapeError, "leaky_relu", "negative_slope", "(2, 3)"):
        mp.leaky_relu(A, "0.1")
    with raises(mp.ShapeError, "pow", "exponent", "tensor", "(2, 3)"):
        mp.pow(A, A)
    with raises(mp.ShapeError, "pow", "exponent", "nan"):
        A ** float("nan")
    with raises(mp.ShapeError, "pow", "exponent", "tensor", "(2, 3)"):
        2.0 ** A
    with raises(mp.ShapeError, "gelu", "approximate", "'fast'", "(2, 3)"):
        mp.gelu(A, approximate="fast")
    with raises(mp.DTypeError, "cast", "float64", "(2, 3)"):
        mp.cast(A, "float64")
    with raises(mp.ShapeError, "maximum", "(2, 3)", "(4,)"):
        mp.maximum(A, p.input("B", (4,)))


def test_reduction_and_composite_errors(p):
    A = p.input("A", (2, 6))
    with raises(mp.ShapeError, "max", "axis 2", "(2, 6)"):
        mp.max(A, 2)
    with raises(mp.ShapeError, "min", "repeated axis", "(2, 6)"):
        mp.min(A, (1, -1))
    with raises(mp.ShapeError, "softmax", "axis 3", "(2, 6)"):
        mp.softmax(A, 3)
    with raises(mp.ShapeError, "logsumexp", "axis -3", "(2, 6)"):
        mp.logsumexp(A, -3)
    with raises(mp.ShapeError, "group_norm", "4 groups", "6 channels", "(2, 6)"):
        mp.group_norm(A, 4)
    with raises(mp.ShapeError, "group_norm", "weight", "(3,)", "(6,)", "(2, 6)"):
        mp.group_norm(A, 2, p.input("W", (3,)))
    with raises(mp.ShapeError, "batch_norm", "running_var", "(2,)", "(6,)", "(2, 6)"):
        mp.batch_norm(A, p.input("M", (6,)), p.input("V", (2,)))
    with raises(mp.ShapeError, "layer_norm", "normalized_ndim", "(2, 6)"):
        mp.layer_norm(A, normalized_ndim=3)
    with raises(mp.ShapeError, "layer_norm", "eps", "(2, 6)"):
        mp.layer_norm(A, eps=-1.0)


def test_rebuilding_new_operators_checks_attributes(prog):
    doc = json.loads(prog.dumps())
    doc["nodes"].append({"id": 99, "op": "clamp", "inputs": [0], "attrs": {"lo": {"f": "2.0"},
                         "hi": {"f": "1.0"}}, "shape": [2, 3], "dtype": "float16"})
    with raises(mp.SerializationError, "clamp", "min 2.0", "max 1.0"):
        mp.Program.from_json(doc)
    doc["nodes"][-1] = {"id": 99, "op": "pow", "inputs": [0], "attrs": {}, "shape": [2, 3],
                        "dtype": "float16"}
    with raises(mp.SerializationError, "pow", "missing attribute", "exponent"):
        mp.Program.from_json(doc)
    doc["nodes"][-1] = {"id": 99, "op": "mask", "inputs": [], "attrs": {"offset": 0,
                        "window": 0}, "shape": [2, 3, 4], "dtype": "float16"}
    with raises(mp.SerializationError, "mask", "(2, 3, 4)", "(rows, cols)"):
        mp.Program.from_json(doc)
