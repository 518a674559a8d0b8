"""Two fusions a decode layer at real size needs (issue #28, item 5), checked on small programs
that take the same forms: the search's kernels are verified, evaluated in float64 against the
program's reference, and run on the CUDA emulator against the interpreter.

* a norm's weight between the normalisation and a matmul, ``rms_norm(x, g) @ W`` with a
  contracted dim too long for one tile: the one-pass form moves the row's scale out of the
  element-wise product with ``g`` (``((x * g) @ W) / r``), so one kernel loops over the
  contracted dim accumulating ``(x * g) @ W`` and ``sum(x^2)`` together;
* heads summed after a batched matmul, ``sum(o @ Wo, axis=0) + x`` (an attention's output
  projection and residual): one kernel loops over the heads one at a time, its accumulator
  summing them (the loop's chunk of one head is dropped from the tile).
"""

import shutil

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emulator import EmulatedGraph, build_emulator
from mirage_py.cost_model import estimate_us
from mirage_py.generator.kernel_search import Searcher
from mirage_py.generator.rewrite import forms
from mirage_py.targets import get_target
from mirage_py.ugraph.graph import GraphKernel
from mirage_py.verifier import verify

TARGET = get_target("h100")


def _norm_weight_matmul(d: int = 4096, heads: int = 2, hd: int = 128) -> mp.Program:
    p = mp.Program("norm_weight_matmul")
    x = p.input("X", (1, d), dtype="float16")
    g = p.input("g", (d,), dtype="float16")
    w = p.input("W", (heads, d, hd), dtype="float16")
    p.output((mp.rms_norm(x, g) @ w) * 0.25, name="Q")
    return p


def _heads_summed(d: int = 2048, heads: int = 16, hd: int = 128) -> mp.Program:
    p = mp.Program("heads_summed")
    x = p.input("X", (1, d), dtype="float16")
    o = p.input("O", (heads, 1, hd), dtype="float16")
    w = p.input("Wo", (heads, hd, d), dtype="float16")
    p.output(mp.sum(o @ w, axis=0) + x, name="H")
    return p


def _one_kernel_candidates(program: mp.Program) -> list:
    return [c.graph for form in forms(program)
            for c in Searcher(form, TARGET).search(max_kernels=1)]


def _rel(a, ref) -> float:
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def _check(program: mp.Program, graph) -> None:
    """``graph`` verifies against ``program`` and computes it (float64 interpreter against the
    float64 reference; the emulated CUDA against the interpreter in GPU precision)."""
    assert verify(program, graph).equivalent
    x = program.random_inputs(seed=3)
    ref = program.evaluate(x)
    got = graph.run(x, precision="float64")
    for k in ref:
        assert _rel(got[k], ref[k]) <= 1e-9, k
    if shutil.which("g++") is None:
        return
    src = emit_cuda(graph, prefix=program.name)
    out = EmulatedGraph(src, lib=build_emulator([src]))(x)
    gpu = graph.run(x, precision="gpu")
    for k in gpu:
        assert np.all(np.isfinite(out[k])), k
        assert _rel(out[k], gpu[k]) <= 1e-3, (k, _rel(out[k], gpu[k]))


def test_one_pass_form_moves_the_scale_out_of_the_weight_product():
    p = _norm_weight_matmul()
    fs = forms(p)
    assert len(fs) == 2  # the program and its one-pass form
    x = p.random_inputs(seed=1)
    ref = p.evaluate(x)["Q"]
    assert _rel(fs[1].evaluate(x)["Q"], ref) <= 1e-12
    ops = [t.op for t in fs[1].nodes()]
    # the matmul's left operand is x * g: no division reaches it
    mm = next(t for t in fs[1].nodes() if t.op == "matmul")
    assert mm.inputs[0].op == "mul" and "div" in ops
    assert all(i.op == "input" for i in mm.inputs[0].inputs)
    # nothing to move without a weight: rms_norm(x) @ W keeps its one form
    q = mp.Program("plain")
    xx = q.input("X", (1, 64))
    q.output(mp.rms_norm(xx) @ q.input("W", (64, 32)), name="Y")
    assert len(forms(q)) == 1


def test_norm_weight_matmul_is_one_looped_kernel():
    p = _norm_weight_matmul()
    looped = [g for g in _one_kernel_candidates(p)
              if isinstance(g.ops[0], GraphKernel) and g.ops[0].block.forloop > 1]
    assert looped, "no one-kernel candidate loops over the contracted dim"
    best = min(looped, key=lambda g: estimate_us(g, TARGET))
    _check(p, best)


def test_heads_summed_in_the_matmul_loop():
    p = _heads_summed()
    heads = p.inputs[1].shape[0]
    over_heads = [g for g in _one_kernel_candidates(p)
                  if isinstance(g.ops[0], GraphKernel) and g.ops[0].block.forloop == heads]
    assert over_heads, "no one-kernel candidate loops over the heads"
    for g in over_heads:
        _check(p, g)


@pytest.mark.parametrize("heads", [1, 4])
def test_heads_summed_without_residual_every_candidate_correct(heads):
    """Every one-kernel candidate of a head sum (one head: a sum over a dim of one) computes
    it: a dropped size-1 dim is never a wrong reduction."""
    p = mp.Program("size_one")
    o = p.input("O", (heads, 1, 64), dtype="float16")
    w = p.input("W", (heads, 64, 256), dtype="float16")
    p.output(mp.sum(o @ w, axis=0), name="Y")
    for g in _one_kernel_candidates(p):
        _check(p, g)


def test_one_pass_form_of_a_weighted_layer_norm_is_exact():
    """The centred terms of a LayerNorm with weight and bias move the same way (a term constant
    along the contracted dim times the weight becomes ``s * (g @ W)``): the form evaluates to
    the program and verifies against it."""
    p = mp.Program("ln_weight")
    x = p.input("X", (4, 64))
    g = p.input("g", (64,))
    b = p.input("b", (64,))
    w = p.input("W", (64, 32))
    p.output(mp.layer_norm(x, g, b) @ w, name="Y")
    fs = forms(p)
    assert len(fs) == 2
    xs = p.random_inputs(seed=2)
    xs["X"] = xs["X"] + 2.0
    assert _rel(fs[1].evaluate(xs)["Y"], p.evaluate(xs)["Y"]) <= 1e-10
    assert verify(p, mp.ugraph.naive_lowering(fs[1])).equivalent
