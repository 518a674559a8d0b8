"""The operators of issue #16 in the frontend: reference semantics (Program.evaluate) against
hand-written NumPy and, where PyTorch is installed, against PyTorch's own functions; shape rules,
what composites record, serialization, Lax classes and partition."""

import math

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.lax import lax_class

RNG = np.random.default_rng(2024)


def run(shapes, build, arrays=None, dtype="float32"):
    p = mp.Program("t")
    ts = [p.input(n, s, dtype) for n, s in shapes.items()]
    out = build(*ts)
    p.output(out)
    arrays = arrays or {n: RNG.standard_normal(s) * 3 for n, s in shapes.items()}
    y = p.evaluate(arrays)["out0"]
    assert y.shape == out.shape and y.dtype == np.float64
    # the JSON round trip rebuilds every node through the checking operator functions
    assert mp.Program.loads(p.dumps()).structural_hash() == p.structural_hash()
    return y, arrays, p


_erf = np.vectorize(math.erf)


def _softplus(x):
    return np.log1p(np.exp(-np.abs(x))) + np.maximum(x, 0)


UNARY = [
    ("sigmoid", mp.sigmoid, lambda x: 1 / (1 + np.exp(-x))),
    ("tanh", mp.tanh, np.tanh),
    ("abs", mp.abs, np.abs),
    ("builtin_abs", abs, np.abs),
    ("softplus", mp.softplus, _softplus),
    ("mish", mp.mish, lambda x: x * np.tanh(_softplus(x))),
    ("gelu_tanh", lambda x: mp.gelu(x, approximate="tanh"),
     lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))),
    ("leaky_relu", lambda x: mp.leaky_relu(x, 0.2), lambda x: np.where(x > 0, x, 0.2 * x)),
    ("clamp", lambda x: mp.clamp(x, -1.5, 2.0), lambda x: np.minimum(np.maximum(x, -1.5), 2.0)),
    ("clamp_min", lambda x: mp.clamp(x, min=0.5), lambda x: np.maximum(x, 0.5)),
    ("clamp_max", lambda x: mp.clamp(x, max=0.5), lambda x: np.minimum(x, 0.5)),
    ("hardtanh", mp.hardtanh, lambda x: np.minimum(np.maximum(x, -1.0), 1.0)),
    ("pow3", lambda x: x ** 3, lambda x: x * x * x),
    ("pow_neg2", lambda x: mp.pow(x, -2), lambda x: 1 / (x * x)),
    ("pow0", lambda x: mp.pow(x, 0), lambda x: np.ones_like(x)),
]


@pytest.mark.parametrize("name, f, ref", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, f, ref):
    y, x, _ = run({"A": (4, 5)}, f)
    np.testing.assert_allclose(y, ref(x["A"]), rtol=1e-12, atol=1e-12)


def test_log_and_fractional_pow_on_positive_values():
    a = RNG.uniform(0.1, 5.0, (3, 4))
    y, _, _ = run({"A": (3, 4)}, mp.log, {"A": a})
    np.testing.assert_allclose(y, np.log(a), rtol=1e-14)
    y, _, _ = run({"A": (3, 4)}, lambda A: mp.pow(A, 1.5), {"A": a})
    np.testing.assert_allclose(y, a * np.sqrt(a), rtol=1e-13)


def test_softplus_and_mish_do_not_overflow():
    a = np.array([[-800.0, -30.0, 0.0, 30.0, 800.0]])
    y, _, _ = run({"A": (1, 5)}, mp.softplus, {"A": a})
    assert np.all(np.isfinite(y))
    np.testing.assert_allclose(y[0], [0.0, math.log1p(math.exp(-30)), math.log(2), 30.0, 800.0],
                               rtol=1e-14, atol=1e-300)
    y, _, _ = run({"A": (1, 5)}, mp.mish, {"A": a})
    np.testing.assert_allclose(y[0], [-0.0, -30 * math.tanh(math.log1p(math.exp(-30))), 0, 30,
                                      800], rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("op, ref", [(mp.maximum, np.maximum), (mp.minimum, np.minimum)])
@pytest.mark.parametrize("sa, sb", [((3, 4), (3, 4)), ((3, 4), (4,)), ((3, 1), (1, 4))])
def test_maximum_minimum(op, ref, sa, sb):
    y, x, _ = run({"A": sa, "B": sb}, op)
    np.testing.assert_array_equal(y, ref(x["A"], x["B"]))
    y, x, _ = run({"A": sa}, lambda A: op(A, 0.5))
    np.testing.assert_array_equal(y, ref(x["A"], 0.5))
    y, x, _ = run({"A": sa}, lambda A: op(-1.0, A))
    np.testing.assert_array_equal(y, ref(-1.0, x["A"]))


@pytest.mark.parametrize("op, ref", [(mp.max, np.max), (mp.min, np.min)])
@pytest.mark.parametrize("axis", [None, 0, -1, (0, 2)])
@pytest.mark.parametrize("keepdims", [False, True])
def test_max_min(op, ref, axis, keepdims):
    y, x, out = run({"A": (2, 3, 4)}, lambda A: op(A, axis, keepdims))
    expect = ref(x["A"], axis=axis, keepdims=keepdims)
    assert y.shape == np.shape(expect)
    np.testing.assert_array_equal(y, expect)


def test_max_over_size_one_axes_is_the_identity():
    p = mp.Program("t")
    A = p.input("A", (4, 1))
    assert mp.max(A, axis=1, keepdims=True) is A
    assert mp.min(A, axis=1).op == "reshape"
    assert mp.logsumexp(A, axis=1, keepdims=True) is A


def test_cast_changes_the_dtype_not_the_value():
    y, x, p = run({"A": (3,)}, lambda A: mp.cast(A, "float16") * 2)
    np.testing.assert_array_equal(y, 2 * x["A"])
    cast = next(t for t in p.nodes() if t.op == "cast")
    assert cast.dtype == "float16" and cast.attr("dtype") == "float16"
    A = p.inputs[0]
    assert mp.cast(A, "float32") is A


# ---- masks and where ------------------------------------------------------------------------

def test_causal_and_sliding_window_masks():
    def values(m):
        p = mp.Program("m")
        X = p.input("X", m.shape)
        p.output(mp.where(m, X, 0.0))
        return p.evaluate({"X": np.ones(m.shape)})["out0"]

    np.testing.assert_array_equal(values(mp.causal_mask(4, 4)), np.tril(np.ones((4, 4))))
    # fewer queries than keys: the queries are the last rows of a square mask
    np.testing.assert_array_equal(values(mp.causal_mask(2, 5)), np.tril(np.ones((5, 5)))[3:])
    np.testing.assert_array_equal(values(mp.causal_mask(3, 3, offset=1)),
                                  np.tril(np.ones((3, 3)), 1))
    want = np.tril(np.ones((5, 5))) - np.tril(np.ones((5, 5)), -2)
    np.testing.assert_array_equal(values(mp.sliding_window_mask(5, 5, 2)), want)


def test_where_broadcasts_the_mask_over_batch_dims():
    m = mp.causal_mask(3, 3)
    y, x, _ = run({"A": (2, 3, 3), "B": (3,)}, lambda A, B: mp.where(m, A, B))
    np.testing.assert_array_equal(y, np.where(np.tril(np.ones((3, 3))) > 0, x["A"], x["B"]))
    y, x, _ = run({"A": (2, 3, 3)}, lambda A: mp.where(m, -1e9, A))
    np.testing.assert_array_equal(y, np.where(np.tril(np.ones((3, 3))) > 0, -1e9, x["A"]))


def test_masks_take_the_dtype_of_what_they_meet():
    p = mp.Program("t")
    A = p.input("A", (3, 3), "bfloat16")
    assert (A * mp.causal_mask(3, 3)).dtype == "bfloat16"
    assert mp.where(mp.causal_mask(3, 3), A, 0.0).dtype == "bfloat16"


# ---- data movement ------------------------------------------------------------------------

def test_slice_split_concat_and_indexing():
    y, x, _ = run({"A": (2, 6)}, lambda A: mp.slice(A, 1, 2, 5))
    np.testing.assert_array_equal(y, x["A"][:, 2:5])
    y, x, _ = run({"A": (2, 6)}, lambda A: mp.concat(mp.split(A, 3, axis=1)[::-1], axis=1))
    np.testing.assert_array_equal(y, np.concatenate([x["A"][:, 4:], x["A"][:, 2:4],
                                                     x["A"][:, :2]], axis=1))
    y, x, _ = run({"A": (2, 6)}, lambda A: mp.concat(mp.split(A, [1, 5], axis=-1)[::-1], -1))
    np.testing.assert_array_equal(y, np.concatenate([x["A"][:, 1:], x["A"][:, :1]], axis=1))
    y, x, _ = run({"A": (2, 3, 6)}, lambda A: A[..., 1:4] + A[1, :, :3])
    np.testing.assert_array_equal(y, x["A"][..., 1:4] + x["A"][1, :, :3])
    y, x, _ = run({"A": (2, 3, 6)}, lambda A: A[:, -1])
    np.testing.assert_array_equal(y, x["A"][:, -1])


def test_rotate_half():
    def rotate_half(q):
        a, b = mp.split(q, 2, axis=-1)
        return mp.concat([-b, a], axis=-1)

    y, x, _ = run({"Q": (3, 8), "C": (3, 8), "S": (3, 8)},
                  lambda Q, C, S: Q * C + rotate_half(Q) * S)
    q = x["Q"]
    rot = np.concatenate([-q[:, 4:], q[:, :4]], axis=1)
    np.testing.assert_allclose(y, q * x["C"] + rot * x["S"], rtol=1e-14)


# ---- composites -----------------------------------------------------------------------------

def _softmax(x, axis=-1):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


@pytest.mark.parametrize("axis", [-1, 0, 1])
def test_softmax_and_log_softmax(axis):
    y, x, p = run({"A": (3, 4, 5)}, lambda A: mp.softmax(A, axis))
    np.testing.assert_allclose(y, _softmax(x["A"], axis), rtol=1e-13)
    assert {t.op for t in p.nodes()} >= {"max", "exp", "sum", "div"}
    y, x, _ = run({"A": (3, 4, 5)}, lambda A: mp.log_softmax(A, axis))
    np.testing.assert_allclose(y, np.log(_softmax(x["A"], axis)), rtol=1e-12)


def test_softmax_is_safe_for_large_logits():
    a = np.array([[1000.0, 999.0, -1000.0]])
    y, _, _ = run({"A": (1, 3)}, mp.softmax, {"A": a})
    np.testing.assert_allclose(y, _softmax(a), rtol=1e-14)
    y, _, _ = run({"A": (1, 3)}, lambda A: mp.logsumexp(A, axis=-1), {"A": a})
    assert y[0] == pytest.approx(1000 + math.log1p(math.exp(-1)), rel=1e-15)


@pytest.mark.parametrize("axis, keepdims", [(-1, False), (1, True), ((0, 2), False), (None, True)])
def test_logsumexp(axis, keepdims):
    y, x, _ = run({"A": (2, 3, 4)}, lambda A: mp.logsumexp(A, axis, keepdims))
    ref = np.log(np.sum(np.exp(x["A"]), axis=axis, keepdims=keepdims))
    assert y.shape == ref.shape
    np.testing.assert_allclose(y, ref, rtol=1e-13)


def _norm(x, axes, eps):
    mu = x.mean(axis=axes, keepdims=True)
    return (x - mu) / np.sqrt(((x - mu) ** 2).mean(axis=axes, keepdims=True) + eps)


def test_layer_norm():
    y, x, _ = run({"X": (3, 8), "W": (8,), "B": (8,)}, lambda X, W, B: mp.layer_norm(X, W, B))
    np.testing.assert_allclose(y, _norm(x["X"], -1, 1e-5) * x["W"] + x["B"], rtol=1e-12)
    y, x, _ = run({"X": (2, 3, 4)}, lambda X: mp.layer_norm(X, eps=0.1, normalized_ndim=2))
    np.testing.assert_allclose(y, _norm(x["X"], (1, 2), 0.1), rtol=1e-12)


@pytest.mark.parametrize("shape", [(4, 12), (2, 6, 5)])
def test_group_norm(shape):
    c = shape[1]
    y, x, p = run({"X": shape, "W": (c,), "B": (c,)},
                  lambda X, W, B: mp.group_norm(X, 3, W, B, eps=1e-3))
    g = x["X"].reshape(shape[0], 3, -1)
    ref = _norm(g, -1, 1e-3).reshape(shape)
    bshape = (c,) + (1,) * (len(shape) - 2)
    ref = ref * x["W"].reshape(bshape) + x["B"].reshape(bshape)
    np.testing.assert_allclose(y, ref, rtol=1e-12)
    assert "reshape" in {t.op for t in p.nodes()}


@pytest.mark.parametrize("shape", [(4, 6), (2, 6, 3)])
def test_batch_norm_inference(shape):
    c = shape[1]
    var = RNG.uniform(0.5, 2.0, c)
    y, x, _ = run({"X": shape, "M": (c,), "V": (c,), "W": (c,), "B": (c,)},
                  lambda X, M, V, W, B: mp.batch_norm(X, M, V, W, B, eps=1e-4),
                  {"X": RNG.standard_normal(shape), "M": RNG.standard_normal(c), "V": var,
                   "W": RNG.standard_normal(c), "B": RNG.standard_normal(c)})
    b = (c,) + (1,) * (len(shape) - 2)
    ref = (x["X"] - x["M"].reshape(b)) / np.sqrt(x["V"].reshape(b) + 1e-4) * \
        x["W"].reshape(b) + x["B"].reshape(b)
    np.testing.assert_allclose(y, ref, rtol=1e-12)


# ---- against PyTorch ------------------------------------------------------------------------

def test_against_torch():
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    x = RNG.standard_normal((4, 6, 8)) * 4
    t = torch.tensor(x)
    w, b = RNG.standard_normal(6), RNG.standard_normal(6)
    mean, var = RNG.standard_normal(6), RNG.uniform(0.5, 2, 6)
    cases = [
        (mp.sigmoid, torch.sigmoid(t)), (mp.tanh, torch.tanh(t)), (mp.softplus, F.softplus(t)),
        (mp.mish, F.mish(t)), (mp.gelu, F.gelu(t)),
        (lambda X: mp.gelu(X, approximate="tanh"), F.gelu(t, approximate="tanh")),
        (lambda X: mp.leaky_relu(X, 0.01), F.leaky_relu(t, 0.01)),
        (lambda X: mp.hardtanh(X, -2, 2), F.hardtanh(t, -2, 2)),
        (lambda X: mp.clamp(X, -1, 3), torch.clamp(t, -1, 3)),
        (lambda X: mp.softmax(X, 1), torch.softmax(t, 1)),
        (lambda X: mp.log_softmax(X, -1), torch.log_softmax(t, -1)),
        (lambda X: mp.logsumexp(X, 2, keepdims=True), torch.logsumexp(t, 2, keepdim=True)),
        (lambda X: mp.max(X, 1), torch.amax(t, 1)), (lambda X: mp.min(X, -1), torch.amin(t, -1)),
        (lambda X: mp.layer_norm(X), F.layer_norm(t, (8,))),
        (lambda X: mp.group_norm(X, 3), F.group_norm(t, 3)),
        (lambda X: X ** 3, t ** 3),
    ]
    for f, ref in cases:
        y, _, _ = run({"X": x.shape}, f, {"X": x})
        np.testing.assert_allclose(y, ref.numpy(), rtol=1e-9, atol=1e-8)
    y, _, _ = run({"X": x.shape, "W": (6,), "B": (6,)},
                  lambda X, W, B: mp.group_norm(X, 2, W, B),
                  {"X": x, "W": w, "B": b})
    np.testing.assert_allclose(y, F.group_norm(t, 2, torch.tensor(w), torch.tensor(b)).numpy(),
                               rtol=1e-9, atol=1e-9)
    y, _, _ = run({"X": x.shape, "M": (6,), "V": (6,), "W": (6,), "B": (6,)},
                  lambda X, M, V, W, B: mp.batch_norm(X, M, V, W, B),
                  {"X": x, "M": mean, "V": var, "W": w, "B": b})
    ref = F.batch_norm(t, torch.tensor(mean), torch.tensor(var), torch.tensor(w),
                       torch.tensor(b), training=False)
    np.testing.assert_allclose(y, ref.numpy(), rtol=1e-9, atol=1e-9)
    causal = torch.ones(6, 8, dtype=torch.bool).tril(2)  # rows are the last 6 of 8 positions
    y, _, _ = run({"X": x.shape}, lambda X: mp.where(mp.causal_mask(6, 8), X, -5.0), {"X": x})
    np.testing.assert_array_equal(y, torch.where(causal, t, -5.0).numpy())


# ---- classification and partition -----------------------------------------------------------

def test_lax_classes():
    p = mp.Program("t")
    A = p.input("A", (4, 4))
    assert lax_class("pow", {"exponent": 3.0}) == "multilinear"
    assert lax_class("pow", {"exponent": -2.0}) == "div"
    assert lax_class("pow", {"exponent": 0.5}) == "uf"
    assert lax_class("max") == "select" and lax_class("where") == "multilinear"
    q = mp.Program("q")
    A = q.input("A", (4, 4))
    q.output(mp.where(mp.causal_mask(4, 4), A ** 2, 0.0) @ mp.concat([A[:, :2], A[:, 2:]], 1))
    assert q.is_lax and q.verifiable
    r = mp.Program("r")
    A = r.input("A", (4, 4))
    r.output(mp.softmax(A))
    assert not r.is_lax and r.verifiable and r.uninterpreted_ops == {"max"}
    # an exp reached through a max is not nested: the max is a fresh value to the verifier
    s = mp.Program("s")
    A = s.input("A", (4, 4))
    s.output(mp.exp(mp.max(mp.exp(A), -1)))
    assert s.verifiable and not s.nested_exp()


def test_partition_keeps_softmax_whole_only_in_uninterpreted_mode():
    p = mp.Program("att")
    Q = p.input("Q", (8, 4))
    K = p.input("K", (4, 8))
    V = p.input("V", (8, 4))
    S = mp.where(mp.causal_mask(8, 8), Q @ K, -1e4)
    p.output(mp.softmax(S) @ V, name="O")
    whole = mp.partition(p, uninterpreted=True)
    assert len(whole) == 1 and whole[0].verifiable and not whole[0].is_lax
    parts = mp.partition(p)
    assert len(parts) > 1
    x = p.random_inputs(seed=1)
    np.testing.assert_array_equal(parts.evaluate(x)["O"], p.evaluate(x)["O"])
    np.testing.assert_array_equal(whole.evaluate(x)["O"], p.evaluate(x)["O"])
