"""Every operator's reference semantics (Program.evaluate) against hand-written NumPy."""

import math

import numpy as np
import pytest

import mirage_py as mp

RNG = np.random.default_rng(1234)


def run(shapes, build, dtype="float32", **arrays):
    """Build a one-output program over inputs ``shapes`` (name -> shape), evaluate it on random
    (or given) arrays; return (result, arrays, output tensor)."""
    p = mp.Program("t")
    ts = {n: p.input(n, s, dtype) for n, s in shapes.items()}
    out = build(*ts.values())
    p.output(out)
    xs = {n: arrays.get(n, RNG.standard_normal(s)) for n, s in shapes.items()}
    res = p.evaluate(xs)
    assert list(res) == ["out0"]
    assert isinstance(res["out0"], np.ndarray)
    assert res["out0"].shape == out.shape
    assert res["out0"].dtype == np.float64
    return res["out0"], xs, out


# ---- matmul -----------------------------------------------------------------------------------

@pytest.mark.parametrize("sa, sb", [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),          # batch on the left only
    ((3, 4), (2, 4, 5)),          # batch on the right only
    ((2, 1, 3, 4), (5, 4, 6)),    # batch dims broadcast against each other
    ((4,), (4, 5)),               # 1-D left: vector @ matrix
    ((3, 4), (4,)),               # 1-D right: matrix @ vector
    ((4,), (4,)),                 # vector @ vector -> scalar
    ((4,), (2, 4, 5)),            # vector @ batched matrix
    ((2, 3, 4), (4,)),            # batched matrix @ vector
])
def test_matmul(sa, sb):
    y, x, out = run({"A": sa, "B": sb}, lambda A, B: A @ B)
    ref = np.matmul(x["A"], x["B"])
    assert out.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-12, atol=1e-12)


def test_matmul_function_and_rmatmul_agree():
    p = mp.Program("t")
    A = p.input("A", (2, 3))
    B = p.input("B", (3, 2))
    assert mp.matmul(A, B) == A @ B
    assert A.__rmatmul__(B) == B @ A


# ---- elementwise binary, with Python scalars on either side -----------------------------------

BINARY = [
    (lambda a, b: a + b, np.add),
    (lambda a, b: a - b, np.subtract),
    (lambda a, b: a * b, np.multiply),
    (lambda a, b: a / b, np.divide),
]


@pytest.mark.parametrize("f, ref", BINARY)
@pytest.mark.parametrize("sa, sb", [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4)),
                                    ((2, 1, 4), (3, 1))])
def test_binary_broadcast(f, ref, sa, sb):
    y, x, out = run({"A": sa, "B": sb}, f)
    expect = ref(x["A"], x["B"])
    assert out.shape == expect.shape
    np.testing.assert_array_equal(y, expect)


@pytest.mark.parametrize("f, ref", BINARY)
@pytest.mark.parametrize("c", [2, 0.5, -3.25])
def test_binary_python_scalar_both_sides(f, ref, c):
    y, x, _ = run({"A": (3, 4)}, lambda A: f(A, c))
    np.testing.assert_array_equal(y, ref(x["A"], float(c)))
    y, x, _ = run({"A": (3, 4)}, lambda A: f(c, A))
    np.testing.assert_array_equal(y, ref(float(c), x["A"]))


def test_function_forms_of_binary_ops():
    lax = mp.lax
    for fn, ref in [(lax.add, np.add), (lax.sub, np.subtract), (lax.mul, np.multiply),
                    (lax.div, np.divide)]:
        y, x, _ = run({"A": (2, 3), "B": (2, 3)}, fn)
        np.testing.assert_array_equal(y, ref(x["A"], x["B"]))


def test_scalar_constant_keeps_tensor_dtype():
    p = mp.Program("t")
    A = p.input("A", (2,), "bfloat16")
    assert (A * 2).dtype == "bfloat16"
    assert (2 - A).dtype == "bfloat16"


def test_dtype_promotion_to_float32():
    p = mp.Program("t")
    A = p.input("A", (2,), "float16")
    B = p.input("B", (2,), "float32")
    assert (A + B).dtype == "float32"
    assert (A + A).dtype == "float16"


def test_numpy_scalars_are_numbers():
    y, x, _ = run({"A": (3,)}, lambda A: np.float64(2.0) * A + np.int64(1))
    np.testing.assert_array_equal(y, 2.0 * x["A"] + 1.0)


# ---- unary --------------------------------------------------------------------------------------

_erf = np.vectorize(math.erf)


@pytest.mark.parametrize("f, ref", [
    (lambda a: -a, np.negative),
    (lambda a: +a, lambda x: x),
    (mp.lax.neg, np.negative),
    (mp.exp, np.exp),
    (lambda a: mp.sqrt(a * a), lambda x: np.sqrt(x * x)),
    (mp.square, np.square),
    (mp.silu, lambda x: x / (1.0 + np.exp(-x))),
    (mp.gelu, lambda x: 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))),
    (mp.relu, lambda x: np.maximum(x, 0.0)),
])
def test_unary(f, ref):
    y, x, out = run({"A": (4, 5)}, f)
    assert out.shape == (4, 5)
    np.testing.assert_allclose(y, ref(x["A"]), rtol=1e-14, atol=1e-15)


def test_gelu_matches_math_erf_pointwise():
    xs = np.array([-3.0, -1.0, -0.5, 0.0, 0.25, 1.0, 2.5])
    y, _, _ = run({"A": (7,)}, mp.gelu, A=xs)
    for xi, yi in zip(xs, y):
        assert yi == pytest.approx(0.5 * xi * (1.0 + math.erf(xi / math.sqrt(2.0))), rel=1e-14,
                                   abs=1e-15)


def test_relu_and_sqrt_values():
    xs = np.array([-2.0, -0.0, 0.0, 3.0])
    y, _, _ = run({"A": (4,)}, mp.relu, A=xs)
    assert y.tolist() == [0.0, 0.0, 0.0, 3.0]
    y, _, _ = run({"A": (4,)}, mp.sqrt, A=np.array([0.0, 1.0, 4.0, 2.25]))
    assert y.tolist() == [0.0, 1.0, 2.0, 1.5]


def test_gelu_of_scalar_tensor():
    y, x, _ = run({"A": (3,)}, lambda A: mp.gelu(mp.sum(A)))
    s = x["A"].sum()
    assert y == pytest.approx(0.5 * s * (1 + math.erf(s / math.sqrt(2))))


# ---- reductions -------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [None, 0, 1, -1, 2, (0, 2), (2, 0), (-1, 0), (0, 1, 2), ()])
@pytest.mark.parametrize("keepdims", [False, True])
def test_sum(axis, keepdims):
    y, x, out = run({"A": (2, 3, 4)}, lambda A: mp.sum(A, axis=axis, keepdims=keepdims))
    ref = np.sum(x["A"], axis=axis, keepdims=keepdims)
    assert out.shape == np.shape(ref)
    np.testing.assert_allclose(y, ref, rtol=1e-13)


@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_mean(axis, keepdims):
    y, x, out = run({"A": (2, 3, 4)}, lambda A: mp.mean(A, axis=axis, keepdims=keepdims))
    ref = np.mean(x["A"], axis=axis, keepdims=keepdims)
    assert out.shape == np.shape(ref)
    np.testing.assert_allclose(y, ref, rtol=1e-13)


def test_mean_is_recorded_as_sum_over_n():
    p = mp.Program("t")
    A = p.input("A", (2, 6))
    m = mp.mean(A, axis=1)
    assert m.op == "div"
    assert m.inputs[0].op == "sum" and m.inputs[1].op == "const"
    assert m.inputs[1].attr("value") == 6.0


# ---- rms_norm -------------------------------------------------------------------------------

def _rms_ref(x, w=None, eps=1e-6):
    y = x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return y * w if w is not None else y


def test_rms_norm_default():
    y, x, out = run({"X": (3, 8)}, lambda X: mp.rms_norm(X))
    assert out.shape == (3, 8)
    np.testing.assert_allclose(y, _rms_ref(x["X"]), rtol=1e-13)


def test_rms_norm_weight_and_eps():
    y, x, _ = run({"X": (2, 3, 8), "W": (8,)}, lambda X, W: mp.rms_norm(X, W, eps=0.5))
    np.testing.assert_allclose(y, _rms_ref(x["X"], x["W"], 0.5), rtol=1e-13)


def test_rms_norm_eps_matters():
    xs = np.full((1, 4), 1e-3)
    y_small, _, _ = run({"X": (1, 4)}, lambda X: mp.rms_norm(X, eps=1e-12), X=xs)
    y_big, _, _ = run({"X": (1, 4)}, lambda X: mp.rms_norm(X, eps=1.0), X=xs)
    np.testing.assert_allclose(y_small, 1.0, rtol=1e-5)
    np.testing.assert_allclose(y_big, _rms_ref(xs, eps=1.0), rtol=1e-13)


def test_rms_norm_is_decomposed():
    p = mp.Program("t")
    X = p.input("X", (2, 4))
    p.output(mp.rms_norm(X))
    ops = [t.op for t in p.nodes() if t.op not in ("input", "const")]
    assert sorted(ops) == sorted(["square", "sum", "div", "add", "sqrt", "div"])
    assert p.uninterpreted_ops == {"sqrt"}


# ---- shape changes ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(6, 4), (24,), (-1,), (2, -1), (4, 3, -1), (1, 24), 24, -1])
def test_reshape(shape):
    y, x, out = run({"A": (2, 3, 4)}, lambda A: mp.reshape(A, shape))
    ref = np.reshape(x["A"], shape)
    assert out.shape == ref.shape
    np.testing.assert_array_equal(y, ref)


def test_reshape_to_same_shape_is_identity():
    p = mp.Program("t")
    A = p.input("A", (2, 3))
    assert mp.reshape(A, (2, 3)) is A
    assert mp.reshape(A, (2, -1)) is A


@pytest.mark.parametrize("axes", [None, (1, 0, 2), (2, 0, 1), (-1, 0, 1), (0, 1, 2)])
def test_transpose(axes):
    y, x, out = run({"A": (2, 3, 4)}, lambda A: mp.transpose(A, axes))
    ref = np.transpose(x["A"], axes)
    assert out.shape == ref.shape
    np.testing.assert_array_equal(y, ref)


def test_transpose_default_reverses_and_T():
    y, x, out = run({"A": (2, 3, 4)}, lambda A: A.T)
    assert out.shape == (4, 3, 2)
    np.testing.assert_array_equal(y, x["A"].T)
    y, x, _ = run({"A": (3, 5)}, lambda A: A.T @ A)
    np.testing.assert_allclose(y, x["A"].T @ x["A"], rtol=1e-13)


# ---- programs with several outputs, default names ------------------------------------------

def test_default_output_names_and_multiple_outputs():
    p = mp.Program("t")
    A = p.input("A", (2, 3), "float32")
    B = p.input("B", (3, 2), "float32")
    p.output(A @ B)
    p.output(mp.exp(A), name="E")
    p.output(A - 1)
    assert [o.name for o in p.outputs] == ["out0", "E", "out2"]
    assert p.outputs[0].shape == (2, 2) and p.outputs[0].dtype == "float32"
    x = p.random_inputs(seed=3)
    y = p.evaluate(x)
    assert list(y) == ["out0", "E", "out2"]
    np.testing.assert_allclose(y["out0"], x["A"] @ x["B"], rtol=1e-13)
    np.testing.assert_array_equal(y["E"], np.exp(x["A"]))
    np.testing.assert_array_equal(y["out2"], x["A"] - 1.0)


def test_scalar_inputs():
    y, x, out = run({"s": (), "A": (2, 3)}, lambda s, A: A * s + mp.exp(s), s=np.array(0.5))
    assert out.shape == (2, 3)
    np.testing.assert_array_equal(y, x["A"] * 0.5 + np.exp(0.5))


def test_output_of_an_input_does_not_alias():
    p = mp.Program("t")
    A = p.input("A", (3,), "float32")
    p.output(A)
    x = np.arange(3.0)
    y = p.evaluate({"A": x})["out0"]
    y[0] = 99.0
    assert x[0] == 0.0


def test_evaluate_in_other_dtypes():
    p = mp.Program("t")
    A = p.input("A", (4, 4), "float32")
    p.output(mp.exp(A) @ A / 3)
    x = p.random_inputs(seed=5)
    for dt in (np.float32, np.float16):
        y = p.evaluate(x, dtype=dt)["out0"]
        assert y.dtype == dt
        a = x["A"].astype(dt)
        np.testing.assert_array_equal(y, (np.exp(a) @ a / dt(3)).astype(dt))


def test_lax_classification():
    p = mp.Program("t")
    A = p.input("A", (2, 2))
    p.output(mp.exp(mp.exp(A)))
    assert not p.is_lax and p.nested_exp() and not p.verifiable
    q = mp.Program("q")
    A = q.input("A", (2, 2))
    q.output(mp.exp(mp.sqrt(mp.exp(A))))  # an uninterpreted function breaks the nesting
    assert not q.is_lax and q.verifiable and not q.nested_exp()
    r = mp.Program("r")
    A = r.input("A", (2, 2))
    r.output(mp.exp(A) / mp.sum(mp.exp(A), axis=-1, keepdims=True) @ A)
    assert r.is_lax and r.verifiable and not r.uninterpreted_ops
