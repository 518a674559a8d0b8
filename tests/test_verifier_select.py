"""The verifier on max / min, masks and safe softmax (docs/verifier.md, "max, min and shift
invariance"): max and min are random functions of the multiset they select from, so chunked and
running maxima agree with the full one, softmax's shift cancels whatever the shift is, and a
candidate that selects from the wrong elements, swaps max and min, or rescales wrongly is
rejected. Numerics: attention with logits around 30 in float16, with and without the max."""

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.ugraph import (Accum, BlockGraph, BlockOp, DTensor, GraphKernel, InputIter,
                              KernelGraph, OutputSaver, attrs_of, naive_lowering)

R = -1


def _as_graph(program: mp.Program, name: str) -> KernelGraph:
    """A candidate for ``name``: the naive lowering of another program with the same interface."""
    g = naive_lowering(program)
    return KernelGraph(name, g.inputs, g.ops, g.outputs)


def _program(build, shapes, name="p", dtype="float32"):
    p = mp.Program(name)
    ts = [p.input(n, s, dtype) for n, s in shapes.items()]
    p.output(build(*ts), name="Y")
    return p


def verify(program, candidate_program, **kw):
    return mp.verify(program, _as_graph(candidate_program, program.name), **kw)


# ---- shift invariance -----------------------------------------------------------------------

def _plain_softmax(x, axis=-1):
    e = mp.exp(x)
    return e / mp.sum(e, axis, keepdims=True)


def test_safe_and_plain_softmax_are_equivalent_both_ways():
    shapes = {"X": (6, 16)}
    safe = _program(mp.softmax, shapes)
    plain = _program(_plain_softmax, shapes)
    assert verify(safe, plain)
    assert verify(plain, safe)


def test_any_per_row_shift_cancels_and_a_per_column_one_does_not():
    shapes = {"X": (6, 16)}
    safe = _program(mp.softmax, shapes)

    def shifted(x, m):
        e = mp.exp(x - m)
        return e / mp.sum(e, -1, keepdims=True)

    by_first = _program(lambda X: shifted(X, X[:, :1]), shapes)  # any value per row
    by_min = _program(lambda X: shifted(X, mp.min(X, -1, keepdims=True)), shapes)
    by_col = _program(lambda X: shifted(X, mp.max(X, 0, keepdims=True)), shapes)
    assert verify(safe, by_first)
    assert verify(safe, by_min)
    r = verify(safe, by_col)
    assert not r.equivalent and r.mismatch is not None


def test_attention_with_max_against_attention_without():
    shapes = {"Q": (2, 8, 16), "K": (2, 16, 8), "V": (2, 8, 16)}

    def att(safe):
        def f(Q, K, V):
            S = Q @ K * 0.25
            return (mp.softmax(S) if safe else _plain_softmax(S)) @ V
        return f

    assert verify(_program(att(True), shapes), _program(att(False), shapes))
    assert verify(_program(att(False), shapes), _program(att(True), shapes))


# ---- online softmax: the rescaling telescopes ---------------------------------------------------

def _online(rescale_right=True):
    """Attention over two key chunks as FlashAttention computes it: a running max, the first
    chunk's accumulators rescaled by exp(m1 - m) (or, wrongly, exp(m - m1))."""
    def f(Q, K, V):
        S = Q @ K
        s1, s2 = S[..., :8], S[..., 8:]
        m1 = mp.max(s1, -1, keepdims=True)
        m = mp.maximum(m1, mp.max(s2, -1, keepdims=True))
        e1, e2 = mp.exp(s1 - m1), mp.exp(s2 - m)
        r = mp.exp(m1 - m) if rescale_right else mp.exp(m - m1)
        acc = (e1 @ V[:, :8]) * r + e2 @ V[:, 8:]
        ell = mp.sum(e1, -1, keepdims=True) * r + mp.sum(e2, -1, keepdims=True)
        return acc / ell
    return f


def test_online_softmax_is_verified_and_a_wrong_rescale_rejected():
    shapes = {"Q": (4, 6, 8), "K": (4, 8, 16), "V": (4, 16, 8)}
    ref = _program(lambda Q, K, V: mp.softmax(Q @ K) @ V, shapes)
    assert verify(ref, _program(_online(True), shapes))
    r = verify(ref, _program(_online(False), shapes))
    assert not r.equivalent
    x = ref.random_inputs(seed=3)
    good = _program(_online(True), shapes).evaluate(x)["Y"]
    np.testing.assert_allclose(good, ref.evaluate(x)["Y"], rtol=1e-12)


# ---- chunked maxima in a block graph ---------------------------------------------------------

def _row_max_graph(kind="max", reduce_op="max", chunks=4):
    """max(X, -1) with the row walked in chunks: a block reduction per chunk, an accumulator of
    ``kind`` over the loop."""
    m, n = 8, 64
    bg = BlockGraph((2, 1, 1), 64, chunks, (
        InputIter("x", 0, (0, R, R), fmap=1),
        BlockOp("c", reduce_op, ("x",), attrs_of(axes=(1,), keepdims=True)),
        Accum("a", "c", kind),
        OutputSaver("a", 0, (0, R, R)),
    ))
    return KernelGraph("rowmax", (DTensor("X", (m, n), "float32"),),
                       (GraphKernel(("X",), (DTensor("Y", (m, 1), "float32"),), bg),), ("Y",))


def test_chunked_max_equals_the_full_max():
    p = _program(lambda X: mp.max(X, -1, keepdims=True), {"X": (8, 64)}, "rowmax")
    g = _row_max_graph()
    r = mp.verify(p, g)
    assert r.equivalent
    x = p.random_inputs(seed=2)
    np.testing.assert_array_equal(g.run(x)["Y"], p.evaluate(x)["Y"])
    for wrong in (_row_max_graph("min", "max"), _row_max_graph("max", "min"),
                  _row_max_graph("sum", "max")):
        assert not mp.verify(p, wrong).equivalent


def test_max_over_part_of_the_row_is_rejected():
    p = _program(lambda X: mp.max(X[:, :48], -1, keepdims=True), {"X": (8, 64)}, "part")
    full = _program(lambda X: mp.max(X, -1, keepdims=True), {"X": (8, 64)}, "part")
    r = verify(p, full)
    assert not r.equivalent
    # and the value of a max is not that of any one element
    first = _program(lambda X: X[:, :1], {"X": (8, 64)}, "part")
    assert not verify(full, first).equivalent


def test_logsumexp_depends_on_the_max_value_and_chunks_still_agree():
    shapes = {"X": (4, 16)}
    lse = _program(lambda X: mp.logsumexp(X, -1), shapes)

    def two_chunks(X):
        m = mp.maximum(mp.max(X[:, :8], -1, keepdims=True), mp.max(X[:, 8:], -1, keepdims=True))
        return mp.reshape(mp.log(mp.sum(mp.exp(X - m), -1, keepdims=True)) + m, (4,))

    assert verify(lse, _program(two_chunks, shapes))
    # log is uninterpreted: shifting by another value is a different expression here
    other = _program(lambda X: mp.reshape(
        mp.log(mp.sum(mp.exp(X - mp.min(X, -1, keepdims=True)), -1, keepdims=True)) +
        mp.min(X, -1, keepdims=True), (4,)), shapes)
    assert not verify(lse, other).equivalent


def test_max_and_min_are_not_confused_and_maximum_is_symmetric():
    shapes = {"A": (4, 5), "B": (4, 5)}
    mx = _program(lambda A, B: mp.maximum(A, B) * 2, shapes)
    assert verify(mx, _program(lambda A, B: mp.maximum(B, A) * 2, shapes))
    assert not verify(mx, _program(lambda A, B: mp.minimum(A, B) * 2, shapes)).equivalent
    assert not verify(mx, _program(lambda A, B: mp.maximum(A, A) * 2, shapes)).equivalent


def test_clamp_keys_its_bounds():
    shapes = {"A": (4, 5)}
    p = _program(lambda A: mp.clamp(A, -1, 1), shapes)
    assert verify(p, _program(mp.hardtanh, shapes))
    assert not verify(p, _program(lambda A: mp.clamp(A, -1, 2), shapes)).equivalent
    assert not verify(p, _program(lambda A: mp.clamp(A, min=-1), shapes)).equivalent


# ---- exact operators: masks, where, pow, slices, concat ---------------------------------------

def test_masks_are_exact_data():
    shapes = {"S": (2, 6, 6)}
    where = _program(lambda S: mp.exp(mp.where(mp.causal_mask(6, 6), S, -30.0)), shapes)
    # exp(-30) is exp of a constant, a random field value: not the zero exp(s) * mask gives
    times = _program(lambda S: mp.exp(S) * mp.causal_mask(6, 6), shapes)
    assert not verify(where, times).equivalent
    split = _program(lambda S: mp.exp(mp.where(mp.causal_mask(6, 6), S, 0.0) +
                                      mp.where(mp.causal_mask(6, 6), S * 0.0, -30.0)), shapes)
    assert verify(where, split)
    shifted = _program(lambda S: mp.exp(mp.where(mp.causal_mask(6, 6, offset=1), S, -30.0)),
                       shapes)
    assert not verify(where, shifted).equivalent
    window = _program(lambda S: mp.exp(mp.where(mp.sliding_window_mask(6, 6, 6), S, -30.0)),
                      shapes)
    assert verify(where, window)  # a window as long as the sequence hides nothing more


def test_integer_powers_are_exact_and_others_uninterpreted():
    shapes = {"A": (3, 4)}
    assert verify(_program(lambda A: A ** 3, shapes), _program(lambda A: A * A * A, shapes))
    assert verify(_program(lambda A: A ** -2, shapes), _program(lambda A: 1 / (A * A), shapes))
    assert not verify(_program(lambda A: A ** 3, shapes),
                      _program(lambda A: A * A, shapes)).equivalent
    half = _program(lambda A: mp.pow(A * A, 0.5), shapes)
    assert verify(half, _program(lambda A: mp.pow(A * A, 0.5), shapes))
    assert not verify(half, _program(lambda A: mp.sqrt(A * A), shapes)).equivalent


def test_rotate_half_by_slices_and_concat():
    shapes = {"Q": (4, 8)}

    def rot(Q):
        a, b = mp.split(Q, 2, -1)
        return mp.concat([-b, a], -1)

    p = _program(rot, shapes)
    assert verify(p, _program(lambda Q: mp.concat([-Q[:, 4:], Q[:, :4]], -1), shapes))
    assert not verify(p, _program(lambda Q: mp.concat([Q[:, 4:], -Q[:, :4]], -1),
                                  shapes)).equivalent
    assert not verify(p, _program(lambda Q: mp.concat([-Q[:, :4], Q[:, 4:]], -1),
                                  shapes)).equivalent


# ---- the degree of a max --------------------------------------------------------------------

def test_a_max_counts_as_one_fresh_variable():
    p = _program(mp.softmax, {"X": (4, 8)})
    r = verify(p, p)
    # numerator exp, denominator a sum of exps, max cancels: the same degrees as the plain form
    q = _program(_plain_softmax, {"X": (4, 8)})
    assert r.degree == verify(q, q).degree
    assert r.exp_degree == 2 * 1 and r.bound <= 1e-9


# ---- numerics: logits around 30 in float16 ----------------------------------------------------

def _attention(safe: bool, causal: bool = False, s: int = 64):
    p = mp.Program("att")
    Q = p.input("Q", (2, s, 32))
    K = p.input("K", (2, 32, s))
    V = p.input("V", (2, s, 32))
    S = (Q @ K) * (1 / 32 ** 0.5)
    if causal:
        S = mp.where(mp.causal_mask(s, s), S, -1e4)
    p.output((mp.softmax(S) if safe else _plain_softmax(S)) @ V, name="O")
    return p


def _logits_30(p, seed=0):
    x = p.random_inputs(seed)
    x["Q"] *= 3.0
    x["K"] *= 3.0
    s = np.abs(np.einsum("bsd,bdt->bst", x["Q"], x["K"]) / 32 ** 0.5)
    assert 25 <= s.max() <= 80  # logits reach ~30 and beyond
    return x


@pytest.mark.parametrize("causal", [False, True])
def test_safe_attention_in_float16_with_large_logits(causal):
    p = _attention(True, causal)
    x = _logits_30(p)
    n = mp.check_numerics(p, naive_lowering(p), x)
    assert n.ok and n.outputs["O"].max_rel <= 2e-2, str(n)
    unsafe = _attention(False, causal)
    n = mp.check_numerics(unsafe, naive_lowering(unsafe), x)
    assert not n.ok and any(e.kind == "overflow" for e in n.events), str(n)
