"""``mp.check_numerics``: the GPU-like interpreter against the float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.ugraph import naive_lowering
from mirage_py.verifier.numerics import NumericsReport


def prog(build, dtype="float16", **shapes):
    p = mp.Program("p")
    ins = {n: p.input(n, s, dtype) for n, s in shapes.items()}
    p.output(build(**ins), name="Y")
    return p


@pytest.mark.parametrize("name", ["lora", "ntrans", "gqa", "rmsnorm_linear"])
def test_fixtures_are_numerically_fine(name):
    fixtures = pytest.importorskip("benchmarks.fixtures")
    from benchmarks.programs import get_inputs, get_program
    p = get_program(name, 1)
    r = mp.check_numerics(p, fixtures.hand_built(name, 1), get_inputs(name, 1))
    assert isinstance(r, NumericsReport)
    assert r.ok, str(r)
    assert 0 < r.norm_rel < 1e-2 and r.norm_rel <= r.max_rel * 10 and not r.events


def test_float64_precision_is_exact_up_to_rounding():
    p = prog(lambda X, W: mp.rms_norm(X) @ W, X=(8, 64), W=(64, 32))
    r = mp.check_numerics(p, naive_lowering(p), precision="float64")
    assert r.ok and r.norm_rel < 1e-14


def test_errors_are_measured():
    p = prog(lambda X, W: X @ W, X=(8, 64), W=(64, 32), dtype="float32")
    wrong = naive_lowering(prog(lambda X, W: (X @ W) * 1.01, X=(8, 64), W=(64, 32),
                                dtype="float32"))
    r = mp.check_numerics(p, wrong, precision="float64")
    e = r.outputs["Y"]
    assert e.norm_rel == pytest.approx(0.01, rel=1e-6) and e.max_rel == pytest.approx(
        e.max_abs / np.abs(p.evaluate(p.random_inputs(0))["Y"]).max())
    assert not r.ok and not r.events  # too far from the reference, but nothing non-finite
    assert "NOT ok" in str(r)


def test_fp16_storage_overflow_is_flagged_with_its_operator():
    p = prog(lambda X: mp.exp(X), X=(4, 8))
    r = mp.check_numerics(p, naive_lowering(p), scale=20.0)  # e^(|x| ~ 20) > 65504
    assert not r.ok
    ev = [e for e in r.events if e.kind == "overflow"]
    assert ev and "kernel exp" in ev[0].where and "float16" in ev[0].detail
    assert not r.outputs["Y"].finite


def test_float32_overflow_is_flagged_once_where_it_starts():
    p = prog(lambda X: mp.exp(X) * 0.0 + X, X=(4, 8), dtype="float32")
    r = mp.check_numerics(p, naive_lowering(p), {"X": np.full((4, 8), 200.0)})
    # exp(200) overflows float32; the inf * 0 = nan after it is propagation, not reported
    assert [(e.kind, e.where.split(" ->")[0]) for e in r.events] == [("overflow", "kernel exp")]


def test_overflow_inside_a_fused_block_operator():
    from mirage_py.ugraph import (BlockGraph, DTensor, Fused, GraphKernel, InputIter,
                                  KernelGraph, OutputSaver, ThreadGraph, ThreadOp)
    g = KernelGraph("e", (DTensor("X", (4, 8), "float32"),), (GraphKernel(
        ("X",), (DTensor("Y", (4, 8), "float32"),), BlockGraph((2, 1, 1), 128, 1, (
            InputIter("x", 0, (0, -1, -1)),
            Fused("e", ("x",), ThreadGraph(1, (ThreadOp("y", "exp", ("in0",)),))),
            OutputSaver("e", 0, (0, -1, -1))))),), ("Y",))
    p = prog(lambda X: mp.exp(X), X=(4, 8), dtype="float32")
    assert mp.verify(p, g)
    r = mp.check_numerics(p, g, {"X": np.full((4, 8), 200.0)})
    assert len(r.events) == 1 and r.events[0].kind == "overflow"
    assert "graph kernel #0" in r.events[0].where and "fused exp(in0)" in r.events[0].where


def test_nan_and_division_by_zero_are_flagged():
    p = prog(lambda X: X * 0.0, X=(4, 8), dtype="float32")
    nan = naive_lowering(prog(lambda X: (X - X) / (X - X), X=(4, 8), dtype="float32"))
    r = mp.check_numerics(p, nan)
    assert [e.kind for e in r.events] == ["nan"] and "kernel div" in r.events[0].where
    inf = naive_lowering(prog(lambda X: X / (X - X), X=(4, 8), dtype="float32"))
    r = mp.check_numerics(p, inf)
    assert r.events[0].kind == "inf" and "division by zero" in r.events[0].detail
    assert not r.ok and not r.outputs["Y"].finite


def test_the_kept_float64_references_stay_within_their_byte_budget(monkeypatch):
    """References are kept per (program, probe, seed) so a structure's candidates share one;
    their bytes are bounded (oldest dropped), and one larger than the bound is not kept --
    the verdicts are the same either way."""
    from mirage_py.verifier import numerics

    monkeypatch.setattr(numerics, "_REFERENCES", {})
    monkeypatch.setattr(numerics, "REFERENCE_BYTES", 96 * 1024)
    verdicts = []
    for n in (32, 48, 64, 96, 128):  # outputs of 8-128 KB as float64
        p = mp.Program(f"scale{n}")
        x = p.input("x", (n, 128), "float32")
        p.output(mp.exp(x * 0.25) * 2.0, name="y")
        g = naive_lowering(p)
        verdicts.append(numerics.numerics_verdict(p, g, g, sample=False).ok)
        kept = sum(numerics._nbytes(r) for r in numerics._REFERENCES.values())
        assert kept <= numerics.REFERENCE_BYTES
    assert all(verdicts)
    assert not any(k[0] == p.structural_hash() for k in numerics._REFERENCES)  # 128 KB: not kept
