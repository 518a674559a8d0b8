"""Every operator of issue #16 through every stage, on a small program ``op(X @ W)`` each:

* reference (``Program.evaluate``) against NumPy written here;
* the μGraph interpreter: the naive lowering in float64 equals the reference; in GPU precision
  it is within the float16 tolerance;
* the generator: the search finds a fused kernel (fewer kernels than the naive lowering);
* the verifier accepts the naive lowering and the fused graph, and rejects every mutant of the
  fused graph whose float64 output differs;
* CUDA: the emitted code of the naive lowering and of the fused graph, run on the CPU emulator,
  equals the interpreter in GPU precision;
* the cost model prices both, and the fused graph lower.
"""

from __future__ import annotations

import math
import shutil
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.codegen_cuda import emit_cuda
from mirage_py.codegen_cuda.emulator import EmulatedGraph, build_emulator
from mirage_py.cost_model import estimate_us
from mirage_py.generator.kernel_search import Searcher
from mirage_py.targets import get_target
from mirage_py.ugraph import naive_lowering
from mirage_py.verifier import Verifier
from mirage_py.verifier.mutate import mutants

M, K, N = 16, 32, 64


@dataclass(frozen=True)
class Case:
    build: Callable  # (S = X @ W, B) -> output tensor
    ref: Callable  # (s = x @ w, b) -> array
    bshape: tuple = (N,)


def _softplus(s):
    return np.logaddexp(0, s)


def _norm(s, axes, eps=1e-5):
    mu = s.mean(axis=axes, keepdims=True)
    return (s - mu) / np.sqrt(((s - mu) ** 2).mean(axis=axes, keepdims=True) + eps)


def _softmax(s):
    e = np.exp(s - s.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)


_erf = np.vectorize(math.erf)
_TRIL = np.tril(np.ones((M, N)), N - M)

CASES = {
    "sigmoid": Case(lambda S, B: mp.sigmoid(S) * B, lambda s, b: b / (1 + np.exp(-s))),
    "tanh": Case(lambda S, B: mp.tanh(S) + B, lambda s, b: np.tanh(s) + b),
    "log": Case(lambda S, B: mp.log(S * S + 1.0), lambda s, b: np.log(s * s + 1)),
    "abs": Case(lambda S, B: mp.abs(S) - B, lambda s, b: np.abs(s) - b),
    "softplus": Case(lambda S, B: mp.softplus(S), lambda s, b: _softplus(s)),
    "mish": Case(lambda S, B: mp.mish(S), lambda s, b: s * np.tanh(_softplus(s))),
    "gelu_tanh": Case(lambda S, B: mp.gelu(S, approximate="tanh"),
                      lambda s, b: 0.5 * s * (1 + np.tanh(0.7978845608028654 *
                                                          (s + 0.044715 * s ** 3)))),
    "leaky_relu": Case(lambda S, B: mp.leaky_relu(S, 0.1), lambda s, b: np.where(s > 0, s, .1 * s)),
    "clamp": Case(lambda S, B: mp.clamp(S, -0.5, 0.75), lambda s, b: np.clip(s, -0.5, 0.75)),
    "pow": Case(lambda S, B: S ** 3 + B, lambda s, b: s ** 3 + b),
    "pow_fractional": Case(lambda S, B: mp.pow(S * S + 1.0, 0.75), lambda s, b: (s * s + 1) ** .75),
    "cast": Case(lambda S, B: mp.cast(S, "float32") * B, lambda s, b: s * b),
    "maximum": Case(lambda S, B: mp.maximum(S, B), lambda s, b: np.maximum(s, b)),
    "minimum": Case(lambda S, B: mp.minimum(S, 0.25), lambda s, b: np.minimum(s, 0.25)),
    "max": Case(lambda S, B: mp.max(S, -1, keepdims=True), lambda s, b: s.max(-1, keepdims=True)),
    "min": Case(lambda S, B: mp.min(S, -1) * 2.0, lambda s, b: 2 * s.min(-1)),
    "where_causal": Case(lambda S, B: mp.where(mp.causal_mask(M, N), S, -100.0),
                         lambda s, b: np.where(_TRIL > 0, s, -100.0)),
    "where_window": Case(lambda S, B: mp.where(mp.sliding_window_mask(M, N, 8), 0.0, S + B),
                         lambda s, b: np.where(np.tril(np.ones((M, N)), N - M) -
                                               np.tril(np.ones((M, N)), N - M - 8) > 0, 0, s + b)),
    "slice_concat": Case(lambda S, B: mp.concat([-S[:, N // 2:], S[:, :N // 2]], -1) * B,
                         lambda s, b: np.concatenate([-s[:, N // 2:], s[:, :N // 2]], -1) * b),
    "softmax": Case(lambda S, B: mp.softmax(S), lambda s, b: _softmax(s)),
    "log_softmax": Case(lambda S, B: mp.log_softmax(S),
                        lambda s, b: s - s.max(-1, keepdims=True) -
                        np.log(np.exp(s - s.max(-1, keepdims=True)).sum(-1, keepdims=True))),
    "logsumexp": Case(lambda S, B: mp.logsumexp(S, -1, keepdims=True),
                      lambda s, b: np.log(np.exp(s).sum(-1, keepdims=True))),
    "layer_norm": Case(lambda S, B: mp.layer_norm(S, B), lambda s, b: _norm(s, -1) * b),
    "batch_norm": Case(lambda S, B: mp.batch_norm(S, B, B * B + 1.0),
                       lambda s, b: (s - b) / np.sqrt(b * b + 1 + 1e-5)),
    "group_norm": Case(lambda S, B: mp.group_norm(S, 4),
                       lambda s, b: _norm(s.reshape(M, 4, -1), -1).reshape(M, N)),
}
# operators the search does not fuse yet
NOT_FUSED: set[str] = set()


def program(name: str) -> mp.Program:
    c = CASES[name]
    p = mp.Program(name)
    X = p.input("X", (M, K))
    W = p.input("W", (K, N))
    B = p.input("B", c.bshape)
    p.output(c.build(X @ W, B), name="Y")
    return p


def inputs(p: mp.Program, seed: int = 0) -> dict:
    x = p.random_inputs(seed)
    x["X"] *= 0.25  # scores of standard deviation ~1.4
    return x


@dataclass
class Found:
    program: mp.Program
    naive: object
    fused: object | None


_FOUND: dict[str, Found] = {}


def found(name: str) -> Found:
    """The program, its naive lowering and the cheapest verified candidate of the search."""
    if name not in _FOUND:
        p = program(name)
        naive = naive_lowering(p)
        fused = None
        if name not in NOT_FUSED:
            cands = Searcher(p, get_target("h100")).search(max_kernels=2)
            cands.sort(key=lambda c: (estimate_us(c.graph, "h100"), c.graph.structural_hash()))
            v = Verifier(p)
            fused = next((c.graph for c in cands[:8] if v.check(c.graph, tests=1)), None)
        _FOUND[name] = Found(p, naive, fused)
    return _FOUND[name]


NAMES = sorted(CASES)
FUSED = [n for n in NAMES if n not in NOT_FUSED]


@pytest.mark.parametrize("name", NAMES)
def test_reference_and_interpreter(name):
    f = found(name)
    x = inputs(f.program)
    want = CASES[name].ref(x["X"] @ x["W"], x["B"])
    y = f.program.evaluate(x)["Y"]
    np.testing.assert_allclose(y, want, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(f.naive.run(x)["Y"], y, rtol=1e-12, atol=1e-12)
    n = mp.check_numerics(f.program, f.naive, x)
    assert n.ok, str(n)


@pytest.mark.parametrize("name", FUSED)
def test_search_fuses_and_the_verifier_accepts(name):
    f = found(name)
    assert f.fused is not None, f"{name}: the search found no verified candidate"
    assert f.fused.num_kernels < f.naive.num_kernels
    assert f.fused.num_kernels == 1
    v = Verifier(f.program)
    for g in (f.naive, f.fused):
        r = v.check(g)
        assert r.equivalent and r.bound <= 1e-9, f"{name}: {r}"
    x = inputs(f.program, 1)
    n = mp.check_numerics(f.program, f.fused, x)
    assert n.ok, f"{name}: {n}"
    assert estimate_us(f.fused, "h100") < estimate_us(f.naive, "h100")


MUTANTS = 16


def _differs(y, ref) -> bool:
    a = np.asarray(y["Y"], dtype=np.float64)
    if not np.isfinite(a).all():
        return True
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref)) > 1e-9


@pytest.mark.parametrize("name", FUSED)
def test_mutants_of_the_fused_graph_rejected(name):
    f = found(name)
    assert f.fused is not None
    v = Verifier(f.program)
    x = inputs(f.program, 2)
    ref = f.program.evaluate(x)["Y"]
    differ = rejected = 0
    for m in mutants(f.fused, limit=MUTANTS):
        with np.errstate(all="ignore"):
            y = m.graph.run(x)
        if _differs(y, ref):
            differ += 1
            r = v.check(m.graph, tests=1)
            assert not r.equivalent, f"{name}: accepted {m}"
            rejected += 1
    assert differ >= 4, f"{name}: only {differ} mutants differ"


@pytest.fixture(scope="module")
def emulated():
    if shutil.which("g++") is None:
        pytest.skip("needs g++")
    graphs = {}
    for name in NAMES:
        f = found(name)
        graphs[f"{name}_naive"] = f.naive
        if f.fused is not None:
            graphs[f"{name}_fused"] = f.fused
    srcs = {k: emit_cuda(g, prefix=f"ops_{k}") for k, g in graphs.items()}
    lib = build_emulator(list(srcs.values()))
    return graphs, srcs, lib


@pytest.mark.parametrize("name", NAMES)
def test_emulated_cuda_equals_the_interpreter(name, emulated):
    graphs, srcs, lib = emulated
    f = found(name)
    x = inputs(f.program, 3)
    for key in (f"{name}_naive", f"{name}_fused"):
        if key not in graphs:
            continue
        ref = graphs[key].run(x, precision="gpu")["Y"]
        out = EmulatedGraph(srcs[key], order=7, lib=lib)(x)["Y"]
        assert np.all(np.isfinite(out)), key
        err = np.linalg.norm(out - ref) / max(np.linalg.norm(ref), 1e-30)
        assert err <= 2e-3, (key, err)


def test_nvrtc_compiles_every_operator_kernel(emulated):
    """The same sources through NVRTC (what CuPy compiles with on a GPU), without a warning."""
    from mirage_py.codegen_cuda.nvrtc import compile_with_nvrtc, find_nvrtc
    from mirage_py.codegen_cuda.prelude import PRELUDE
    if find_nvrtc() is None:
        pytest.skip("needs NVRTC (nvidia-cuda-nvrtc)")
    _, srcs, _ = emulated
    ptx, log = compile_with_nvrtc(PRELUDE + "\n".join(k for s in srcs.values()
                                                      for k in s.kernels), "compute_90")
    assert log.strip() == "", log
    for s in srcs.values():
        for spec in s.launches:
            assert f".entry {spec.kernel}(" in ptx
