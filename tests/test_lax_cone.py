"""Read cones (mirage_py.lax.cone) against perturbation: an input element is in an output
element's cone exactly when changing it changes that output element in a float64 evaluation
(for programs without selections or cancellations); never a dependence outside the cone."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

import mirage_py as mp
from mirage_py.lax.cone import cone_bytes, cone_masks, read_cone

from strategies import random_programs


def _perturbed(program: mp.Program, output: str, seed: int = 0):
    """(input name -> mask of the elements whose change moves the last element of ``output``,
    that element's value): each input element perturbed in turn, evaluated in float64 by NumPy
    (the reference semantics)."""
    rng = np.random.default_rng(seed)
    base_in = {t.name: rng.uniform(0.5, 1.5, t.shape) for t in program.inputs}
    base = program.evaluate(base_in)[output].reshape(-1)[-1]
    moved: dict[str, np.ndarray] = {}
    for name, arr in base_in.items():
        m = np.zeros(arr.size, dtype=bool)
        for i in range(arr.size):
            x = arr.copy().reshape(-1)
            x[i] += 0.37
            got = program.evaluate({**base_in, name: x.reshape(arr.shape)})[output]
            m[i] = got.reshape(-1)[-1] != base
        if m.any():
            moved[name] = m.reshape(arr.shape)
    return moved, base


def _programs():
    p = mp.Program("norm_linear")  # rms_norm(X + R) @ W: a row of X, R; a column of W
    x, r, w = p.input("X", (3, 8)), p.input("R", (3, 8)), p.input("W", (8, 5))
    p.output(mp.rms_norm(x + r) @ w, "Y")
    yield p, {"Y": {"X": 8, "R": 8, "W": 8}}
    p = mp.Program("down_norm_q")  # the decoder layer boundary: all of Wd reaches q
    h, wd, wq = p.input("H", (2, 6)), p.input("Wd", (6, 4)), p.input("Wq", (4, 3))
    s = h @ wd
    p.output(s, "S")
    p.output(mp.rms_norm(s) @ wq, "Q")
    yield p, {"S": {"H": 6, "Wd": 6}, "Q": {"H": 6, "Wd": 24, "Wq": 4}}
    p = mp.Program("attention")  # one query row: its q, all of K and V
    q, k, v = p.input("Q", (2, 3, 4)), p.input("K", (2, 4, 5)), p.input("V", (2, 5, 4))
    p.output(mp.softmax(q @ k) @ v, "O")
    yield p, {"O": {"Q": 4, "K": 20, "V": 5}}
    p = mp.Program("shapes")  # rotate-half (slices, concat), transpose, reshape, broadcast
    x, b = p.input("X", (2, 3, 4)), p.input("B", (4,))
    rot = mp.concat([-x[..., 2:], x[..., :2]], -1) * b
    p.output(mp.reshape(mp.transpose(rot, (2, 0, 1)), (4, 6)), "Y")
    yield p, {"Y": {"X": 1, "B": 1}}
    p = mp.Program("pooled")  # a reshape that groups: a mean over groups of 4
    x = p.input("X", (2, 8))
    p.output(mp.sum(mp.reshape(x, (2, 2, 4)), axis=-1), "Y")
    yield p, {"Y": {"X": 4}}


@pytest.mark.parametrize("program,expect", list(_programs()), ids=lambda x: getattr(x, "name", ""))
def test_cones_are_what_perturbation_finds(program, expect):
    for out, want in expect.items():
        assert read_cone(program, out) == want
        moved = _perturbed(program, out)[0]  # NumPy agrees: the same elements, no more or less
        masks = cone_masks(program, out)
        assert set(moved) == set(masks)
        for name, m in masks.items():
            assert np.array_equal(moved[name], m), name


def test_cone_bytes_is_the_largest_output_cone():
    p = next(q for q, _ in _programs() if q.name == "down_norm_q")
    # Q: 6 of H (float16), all 24 of Wd, 4 of Wq -- more than S's 12 elements
    assert cone_bytes(p) == 2 * (6 + 24 + 4)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_programs())
def test_no_dependence_outside_the_cone(program):
    """Over every operator (selections and cancellations included, where the cone may hold
    elements that do not move the value): whatever moves an output element is in its cone."""
    for out in program.output_tensors:
        if any(t.name == out for t in program.inputs):
            continue
        got, base = _perturbed(program, out)
        if not np.isfinite(base):
            continue
        masks = cone_masks(program, out)
        for name, m in got.items():
            assert name in masks and not (m & ~masks[name]).any(), (out, name)


def test_too_large_to_walk_is_no_information():
    """Above MAX_ELEMENTS in one tensor the walk is not taken: no cone (0 bytes), so the cost
    model's lower bound falls back to launches, round trips and bytes."""
    from mirage_py.cost_model import lower_bound_us
    from mirage_py.lax import cone
    p = mp.Program("big_scores")
    q, k = p.input("Q", (32, 4096, 64)), p.input("K", (32, 64, 4096))
    p.output(mp.sum(q @ k, axis=-1, keepdims=True), "S")
    assert p.output_tensors["S"].shape == (32, 4096, 1)
    assert cone_bytes(p) == 0
    assert lower_bound_us(p, "h100", kernels=1) > 0
    small = mp.Program("small_scores")
    q, k = small.input("Q", (2, 64, 64)), small.input("K", (2, 64, 64))
    small.output(mp.sum(q @ k, axis=-1, keepdims=True), "S")
    assert max(t.size for t in small.nodes()) <= cone.MAX_ELEMENTS
    assert cone_bytes(small) == 2 * (64 + 64 * 64)  # a row of Q, all of K
