"""Finite-field semantics: exactness of the modular arithmetic (against Python integers and
against galois), exp in the order-q subgroup, uninterpreted functions, lazy q parts, and the
interpreter / program reference running on the field backend."""

from __future__ import annotations

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.lax.ops import OPS
from mirage_py.ugraph import naive_lowering, run
from mirage_py.verifier.errors import FieldValueError, NestedExpError, UnverifiableOperatorError
from mirage_py.verifier.field import (SAFE_PRIMES, FieldBackend, FieldParams, FieldValue, Modulus,
                                      QCell, random_input)

P0 = SAFE_PRIMES[0]


def _ints(x, m):
    return np.remainder(np.asarray(x), float(m)).astype(np.int64)


def _rand(rng, m, shape):
    return np.floor(rng.random(shape) * m) - (m - 1) // 2


def test_safe_primes_and_exact_contraction():
    import sympy
    for p in SAFE_PRIMES:
        q = (p - 1) // 2
        assert sympy.isprime(p) and sympy.isprime(q)
        assert 4096 * (p - 1) ** 2 < 2 ** 53  # one BLAS call per K=4096 matmul, even unbalanced
        assert Modulus(p).kmax >= 4096


@pytest.mark.parametrize("m", [P0, (P0 - 1) // 2])
def test_ring_ops_match_python_integers(m):
    M = Modulus(m)
    rng = np.random.default_rng(1)
    a, b = _rand(rng, m, (7, 9)), _rand(rng, m, (7, 9))
    ai, bi = a.astype(np.int64).astype(object), b.astype(np.int64).astype(object)
    B = M.bound
    for name, got, want in [
        ("add", M.add(a, B, b, B)[0], ai + bi), ("sub", M.sub(a, B, b, B)[0], ai - bi),
        ("mul", M.mul(a, B, b, B)[0], ai * bi), ("neg", M.neg(a, B)[0], -ai),
        ("square", M.square(a, B)[0], ai * ai),
    ]:
        assert np.array_equal(_ints(got, m), np.array(want % m, dtype=np.int64)), name
    # chains of unreduced values stay exact: multiply products, add many of them
    x, bx = a, B
    for _ in range(6):
        x, bx = M.mul(x, bx, b, B)
        ai = ai * bi
        x, bx = M.add(x, bx, x, bx)
        ai = ai + ai
        assert bx <= 2 ** 53
    assert np.array_equal(_ints(x, m), np.array(ai % m, dtype=np.int64))
    red = M.red(x)
    assert np.abs(red).max() <= M.bound


def test_matmul_and_sum_exact_including_split_contraction():
    M = Modulus(P0)
    rng = np.random.default_rng(2)
    for k in (64, 4096, M.kmax + 37):  # the last one is split into chunks
        a, b = _rand(rng, P0, (3, k)), _rand(rng, P0, (k, 2))
        got, bound = M.matmul(a, M.bound, b, M.bound)
        assert bound <= 2 ** 53
        want = (a.astype(np.int64).astype(object) @ b.astype(np.int64).astype(object)) % P0
        assert np.array_equal(_ints(got, P0), want.astype(np.int64)), k
    x = _rand(rng, P0, (5, 3000, 2))
    s, _ = M.sum(x, M.bound, (1,), False)
    assert np.array_equal(_ints(s, P0), (x.astype(np.int64).astype(object).sum(axis=1) % P0).astype(np.int64))


def test_inverse_and_zero_divisor():
    M = Modulus(P0)
    x = np.array([1.0, 2.0, -5.0, 0.0, 12345.0])
    inv, zeros = M.inverse(x, M.bound)
    assert zeros == 1
    prod = _ints(M.mul(x, M.bound, inv, M.bound)[0], P0)
    assert list(prod) == [1, 1, 1, 0, 1]  # 0^-1 = 0


def test_constants_are_exact_rationals():
    M = Modulus(P0)
    for v in (1e-6, 1 / 4096, 0.125, -3.5, 4096.0):
        from fractions import Fraction
        f = Fraction(v)
        c = int(_ints(M.const(v), P0))
        assert (c * f.denominator - f.numerator) % P0 == 0
    assert int(_ints(M.mul(M.const(1 / 4096), M.bound, M.const(4096.0), M.bound)[0], P0)) == 1


def test_against_galois():
    galois = pytest.importorskip("galois")
    p = 10007  # a small prime keeps galois' field construction quick; same code path
    GF = galois.GF(p)
    M = Modulus(p)
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, p, (6, 40)), rng.integers(1, p, (40, 5))
    ga, gb = GF(a), GF(b)
    fa, fb = M.balanced(a.astype(float)), M.balanced(b.astype(float))
    assert np.array_equal(_ints(M.matmul(fa, M.bound, fb, M.bound)[0], p), np.asarray(ga @ gb))
    c = rng.integers(1, p, (6, 40))
    fc = M.balanced(c.astype(float))
    assert np.array_equal(_ints(M.mul(fa, M.bound, M.inverse(fc, M.bound)[0], M.bound)[0], p),
                          np.asarray(ga / GF(c)))
    assert np.array_equal(_ints(M.pow(fc, 5), p), np.asarray(GF(c) ** 5))


def test_exp_is_a_homomorphism_into_the_order_q_subgroup():
    fp = FieldParams(P0, seed=0, test=0)
    p, q = fp.p_int, fp.q_int
    assert pow(fp.g, q, p) == 1 and fp.g != 1
    rng = np.random.default_rng(4)
    x, y = _rand(rng, q, 5000), _rand(rng, q, 5000)
    Q, P = fp.Q, fp.P
    s, bs = Q.add(x, Q.bound, y, Q.bound)
    lhs = _ints(fp.exp(s, bs), p)
    eb = P.bound ** 2  # exp returns unreduced products of two table entries
    rhs = _ints(P.mul(fp.exp(x, Q.bound), eb, fp.exp(y, Q.bound), eb)[0], p)
    assert np.array_equal(lhs, rhs)
    k = _ints(x, q)
    for j in range(0, 5000, 97):
        assert int(_ints(fp.exp(x[j:j + 1], Q.bound), p)[0]) == pow(fp.g, int(k[j]), p)
    assert int(_ints(fp.exp(np.zeros(1), Q.bound), p)[0]) == 1
    # unreduced exponents (a matmul result), multiples of q and their neighbours
    big = np.array([2.0 ** 52 - 1, -(2.0 ** 52 - 1), 5 * q, -7 * q, 5 * q - 1, -7 * q + 1,
                    123456789012345.0])
    got = _ints(fp.exp(big, 2.0 ** 52), p)
    for v, e in zip(big, got):
        assert int(e) == pow(fp.g, int(v) % q, p)
    # a different test draws a different generator
    assert FieldParams(P0, seed=0, test=1).g != fp.g


def test_uninterpreted_functions():
    fp = FieldParams(P0, seed=0, test=0)
    x = np.arange(-500.0, 500.0)
    a1, q1 = fp.uf("sqrt", x)
    a2, _ = fp.uf("sqrt", x + P0)  # same residue, same value: a function of the value mod p
    b1, _ = fp.uf("silu", x)
    assert np.array_equal(a1, a2)
    assert not np.array_equal(a1, b1)
    assert np.count_nonzero(_ints(a1, P0) == 0) == 0 and np.count_nonzero(_ints(q1, fp.q_int)) == 1000
    assert not np.array_equal(FieldParams(P0, seed=0, test=1).uf("sqrt", x)[0], a1)
    assert len(np.unique(a1)) > 990  # pseudo-random, no structure


def test_field_slot_of_the_op_table_is_filled():
    for name, spec in OPS.items():
        if spec.category == "leaf":  # inputs, constants and masks get values directly
            continue
        assert "compute" in spec.field, name
    assert OPS["sqrt"].field.get("uninterpreted") and not OPS["exp"].field.get("uninterpreted")


def _program():
    p = mp.Program("f")
    X = p.input("X", (4, 8))
    W = p.input("W", (8, 6))
    p.output(mp.exp(X @ W) / mp.sum(mp.exp(X @ W), axis=-1, keepdims=True), name="S")
    p.output(mp.rms_norm(X) @ W, name="N")
    return p


def test_program_and_interpreter_agree_on_the_field():
    p = _program()
    fp = FieldParams(P0, seed=5, test=0)
    inputs = {t.name: random_input(fp, t.name, t.shape, 5, 0) for t in p.inputs}
    ref = p.evaluate(inputs, backend=FieldBackend(fp))
    got = run(naive_lowering(p), inputs, backend=FieldBackend(fp))
    lit = run(naive_lowering(p), inputs, backend=FieldBackend(fp), literal=True)
    for n in ref:
        r = np.remainder(ref[n].p, P0)
        assert np.array_equal(r, np.remainder(got[n].p, P0))
        assert np.array_equal(r, np.remainder(lit[n].p, P0))


def test_q_parts_are_lazy():
    p = mp.Program("lin")
    X = p.input("X", (4, 8))
    W = p.input("W", (8, 6))
    p.output(X @ W, name="Y")
    fp = FieldParams(P0)
    inputs = {t.name: random_input(fp, t.name, t.shape, 0, 0) for t in p.inputs}
    p.evaluate(inputs, backend=FieldBackend(fp))
    assert not inputs["X"].q.forced and not inputs["W"].q.forced  # no exp: never drawn
    p2 = mp.Program("e")
    X2 = p2.input("X", (4, 8))
    p2.output(mp.exp(X2 * 2.0), name="Y")
    inputs2 = {"X": random_input(fp, "X", (4, 8), 0, 0)}
    p2.evaluate(inputs2, backend=FieldBackend(fp))
    assert inputs2["X"].q.forced


def test_long_accumulator_chains_do_not_recurse():
    M = Modulus(P0)
    cell = QCell.ready(np.ones(3), M.bound)
    for _ in range(20000):
        cell = QCell(lambda v: M.add(v[0], v[1], np.ones(3), M.bound), (cell,))
    v, b = cell.get()
    assert np.array_equal(_ints(v, P0), [20001] * 3)


def test_nested_exp_raises_typed_error():
    p = mp.Program("nested")
    X = p.input("X", (2, 3))
    p.output(mp.exp(mp.exp(X)), name="Y")
    fp = FieldParams(P0)
    with pytest.raises(NestedExpError) as e:
        p.evaluate({"X": random_input(fp, "X", (2, 3), 0, 0)}, backend=FieldBackend(fp))
    assert isinstance(e.value, mp.MirageError)
    # exp through an uninterpreted function is fine: the function value has a fresh q part
    p2 = mp.Program("through_uf")
    X2 = p2.input("X", (2, 3))
    p2.output(mp.exp(mp.sqrt(mp.exp(X2))), name="Y")
    p2.evaluate({"X": random_input(fp, "X", (2, 3), 0, 0)}, backend=FieldBackend(fp))


def test_backend_type_errors():
    fp = FieldParams(P0)
    be = FieldBackend(fp)
    with pytest.raises(FieldValueError):
        be.input(np.zeros(3), "float16")
    with pytest.raises(UnverifiableOperatorError):
        be.elementwise("no_such_op", [])


def test_zero_divisor_is_recorded_on_the_values_it_reaches():
    fp = FieldParams(P0)
    be = FieldBackend(fp)
    x = FieldValue(np.array([1.0, 2.0]), fp.P.bound, QCell.ready(np.array([1.0, 2.0]), fp.Q.bound))
    z = FieldValue(np.array([3.0, 0.0]), fp.P.bound, QCell.ready(np.array([3.0, 1.0]), fp.Q.bound))
    y = be.divide(x, z)
    assert y.zero and not be.divide(x, x).zero
    assert np.remainder(y.p[1], P0) == 0
    assert be.elementwise("add", [y, x]).zero


def test_cache_blocked_paths_match_the_plain_ones():
    fp = FieldParams(P0)
    M = fp.P
    rng = np.random.default_rng(7)
    x = np.floor(rng.random((3, 70001)) * 2.0 ** 50) - 2.0 ** 49  # > 2 chunks, odd tail
    red = M.red(x)
    assert np.abs(red).max() <= M.bound
    assert np.array_equal(np.remainder(red, M.mf), np.remainder(x, M.mf))
    y = x.copy()
    assert M.red(y, inplace=True) is not None and np.array_equal(y, red)
    e = fp.exp(x, 2.0 ** 50)
    assert np.array_equal(e, np.concatenate([fp._exp(r) for r in x]).reshape(x.shape))
    assert np.array_equal(fp.exp(x.T, 2.0 ** 50), e.T)  # non-contiguous input


@pytest.mark.parametrize("case", ["tiled_matmul", "rms_matmul", "bias_add", "row_sum",
                                  "concat_mm", "split_k"])
def test_field_and_degree_backends_run_the_shared_ugraph_cases(case):
    from ugraph_cases import CASES

    from mirage_py.verifier.degree import DegreeBackend, Shaped
    g, _ = CASES[case]()
    fp = FieldParams(P0, seed=1, test=0)
    x = {t.name: random_input(fp, t.name, t.shape, 1, 0) for t in g.inputs}
    batched = run(g, x, backend=FieldBackend(fp))
    literal = run(g, x, backend=FieldBackend(fp), literal=True)
    for n in g.outputs:
        assert np.array_equal(np.remainder(batched[n].p, P0), np.remainder(literal[n].p, P0))
    degs = run(g, {t.name: Shaped(t.shape) for t in g.inputs}, backend=DegreeBackend())
    assert all(degs[n].shape == batched[n].shape for n in g.outputs)
