"""The field check refuses, before it starts, a check whose values cannot fit the memory left
(verifier/memory.py): KernelBench's 112 x 64 x 512 x 512 GroupNorm, whose reshape to
(112, 8, 2097152) pins its long extents, ended in an allocation deep in the field backend."""

from __future__ import annotations

import pytest

import mirage_py as mp
from mirage_py.errors import MirageError
from mirage_py.ugraph import naive_lowering
from mirage_py.verifier import memory
from mirage_py.verifier.errors import VerifierMemoryError


def _group_norm(n: int = 2, c: int = 8, h: int = 4, w: int = 4, groups: int = 2) -> mp.Program:
    """GroupNorm as the torch frontend captures it: reshape to (n, groups, rest), centre,
    normalise, reshape back, scale and shift per channel."""
    p = mp.Program("group_norm")
    x = p.input("x", (n, c, h, w))
    gw, gb = p.input("gw", (c,)), p.input("gb", (c,))
    rest = c // groups * h * w
    y = mp.reshape(x, (n, groups, rest))
    centred = y - mp.sum(y, axis=2, keepdims=True) / float(rest)
    var = mp.sum(mp.square(centred), axis=2, keepdims=True) / float(rest)
    z = mp.reshape(centred / mp.sqrt(var + 1e-5), (n, c, h, w))
    p.output(z * mp.reshape(gw, (c, 1, 1)) + mp.reshape(gb, (c, 1, 1)), name="y")
    return p


def test_live_peak_is_the_most_values_alive_at_once():
    """A chain's values die after their reader: the peak is two neighbours (plus what is still
    read later), not the sum of every value."""
    p = mp.Program("chain")
    x = p.input("x", (64, 64))
    y = mp.exp(mp.exp(mp.exp(x)))
    p.output(y, name="y")
    assert memory.live_peak_bytes(p) == 2 * 8 * 64 * 64
    q = _group_norm()
    assert 8 * 2 * 8 * 4 * 4 <= memory.live_peak_bytes(q) < 8 * sum(t.size for t in q.nodes())


def test_a_check_that_cannot_fit_is_refused_before_it_starts(monkeypatch):
    p = _group_norm()
    g = naive_lowering(p)
    assert mp.verify(p, g).equivalent  # fits: checked as before
    monkeypatch.setattr(memory, "headroom_bytes", lambda: memory.live_peak_bytes(p))
    with pytest.raises(VerifierMemoryError) as e:
        mp.verify(p, g)
    assert isinstance(e.value, MirageError) and isinstance(e.value, MemoryError)
    assert "(2, 8, 4, 4)" in str(e.value) and "group_norm" in str(e.value)
    monkeypatch.setattr(memory, "headroom_bytes", lambda: None)  # unknown: not refused
    assert mp.verify(p, g).equivalent
