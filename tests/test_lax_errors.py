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
