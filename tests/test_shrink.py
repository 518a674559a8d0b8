"""Verification at shrunk sizes (mirage_py/verifier/shrink.py, docs/verifier.md) and the
process-wide budget of kept verifier inputs.

The shrunk check must accept right graphs, reject wrong ones (mutants of graphs with long
extents, each also judged by the full-size check and by float64 evaluation), refuse -- checking
the full size instead -- where its argument does not hold (positions read, a degree bound that
grows with the extent), and say which sizes it ran at."""

from __future__ import annotations

import numpy as np
import pytest

import mirage_py as mp
from mirage_py.ugraph import naive_lowering, run
from mirage_py.verifier import Verifier
from mirage_py.verifier import equivalence
from mirage_py.verifier.mutate import mutants
from mirage_py.verifier import shrink as shrink_mod
from mirage_py.verifier.degree import reshape_runs
from mirage_py.verifier.shrink import LONG, SHORT, pinned, shrink, small_graph, small_program


def _mlp(d: int = 2048, f: int = 4096) -> mp.Program:
    """A decode step's SwiGLU MLP after an RMSNorm: the long extents are d and f."""
    p = mp.Program("mlp")
    x = p.input("X", (1, d))
    g = p.input("g", (d,))
    wg = p.input("Wg", (d, f))
    wu = p.input("Wu", (d, f))
    wd = p.input("Wd", (f, d))
    n = mp.rms_norm(x, g)
    p.output((mp.silu(n @ wg) * (n @ wu)) @ wd + x, name="Y")
    return p


def _found(program: mp.Program):
    """The superoptimiser's answer graph (several kernels, grids and loops)."""
    return mp.superopt(program, database=False, workers=1, progress=False).graph


@pytest.fixture(scope="module")
def mlp_answer():
    p = _mlp()
    return p, _found(p)


def test_right_graphs_accepted_at_shrunk_sizes(mlp_answer):
    p, g = mlp_answer
    for graph in (naive_lowering(p), g):
        r = mp.verify(p, graph)
        assert r.equivalent and r.bound <= 1e-9
        assert r.shrunk and all(n < e for e, n in r.shrunk.items())
        assert all(e >= LONG for e in r.shrunk)
        # the full-size check agrees
        full = Verifier(p, shrink=False).check(graph)
        assert full.equivalent and not full.shrunk


def test_shrunk_pair_keeps_the_structure(mlp_answer):
    p, g = mlp_answer
    r = mp.verify(p, g)
    delta = max(r.degree, r.exp_degree, 16)
    sh = shrink(p, g, delta)
    assert sh, sh.why
    # the same kernels and block programs; a grid axis or loop has the same parts or fewer,
    # never fewer than the degree bound
    assert len(sh.graph.ops) == len(g.ops)
    for a, b in zip(g.ops, sh.graph.ops):
        assert type(a) is type(b)
        if hasattr(a, "block"):
            assert a.block.ops == b.block.ops
            for n, m in zip(a.block.grid + (a.block.forloop,), b.block.grid + (b.block.forloop,)):
                assert m == n or (n % m == 0 and m >= delta)
    # the shrunk program means the same at its sizes: its float64 value equals the shrunk
    # graph's
    x = sh.program.random_inputs(0)
    want = sh.program.evaluate(x)["Y"]
    got = run(sh.graph, x)["Y"]
    assert np.allclose(got, want, rtol=1e-9, atol=1e-9)


def _shrunk_verdicts_of_mutants(p, g, x, limit, same_verdicts=True):
    """Every mutant of ``g`` that computes something else at full size (float64 evaluation) is
    rejected by the shrunk check, which (``same_verdicts``) agrees with the full-size check
    wherever it shrinks: (mutants that differ, shrunk checks made)."""
    want = p.evaluate(x)["Y"]
    v_small, v_full = Verifier(p), Verifier(p, shrink=False)
    differing = shrunk_checks = 0
    for m in mutants(g, limit=limit):
        try:
            got = run(m.graph, x)["Y"]
        except Exception:  # a mutant the interpreter cannot run: nothing to compare
            continue
        r = v_small.check(m.graph, tests=1)
        if r.shrunk:
            shrunk_checks += 1
            if same_verdicts:
                assert r.equivalent == v_full.check(m.graph, tests=1).equivalent, m.kind
        if not np.allclose(got, want, rtol=1e-7, atol=1e-7):
            differing += 1
            assert not r.equivalent, str(m)
    return differing, shrunk_checks


def test_mutants_rejected_at_shrunk_sizes(mlp_answer):
    """Every mutant of the found graph that computes something else (float64 evaluation at full
    size) is rejected by the shrunk check, and the shrunk check agrees with the full-size check
    on every mutant it judges."""
    p, g = mlp_answer
    differing, shrunk_checks = _shrunk_verdicts_of_mutants(p, g, p.random_inputs(1), 40)
    assert differing >= 10 and shrunk_checks >= 10


def test_big_program_with_short_extents_is_shrunk(monkeypatch):
    """A program whose largest tensor is over FULL_SIZE_BYTES as field values (KernelBench's
    112 x 64 x 512 x 512 RMSNorm: 14 GiB, no extent long) shrinks its extents of at least
    SHORT too; right graphs accepted, every mutant that computes something else rejected, and
    the verdicts equal to the full-size check's. Small programs keep their own size."""
    p = _mlp(256, 512)
    g = naive_lowering(p)
    assert not mp.verify(p, g).shrunk  # under the size: checked as it is
    monkeypatch.setattr(shrink_mod, "FULL_SIZE_BYTES", 0)  # "over the size", without the GiB
    r = mp.verify(p, g)
    assert r.equivalent and r.shrunk and set(r.shrunk) <= {256, 512}
    assert all(SHORT <= e < LONG and n < e for e, n in r.shrunk.items())
    differing, shrunk_checks = _shrunk_verdicts_of_mutants(p, g, p.random_inputs(2), 20)
    assert differing >= 3 and shrunk_checks >= 3


def test_positions_read_fall_back_to_full_size():
    """A causal mask reads positions: a graph wrong only near the diagonal's end could pass a
    shrunk check, so the full size is checked (and the answer says why)."""
    p = mp.Program("masked")
    s = p.input("S", (8, LONG))
    m = mp.causal_mask(8, LONG, offset=LONG - 8)
    p.output(mp.sum(mp.where(m, s, 0.0), axis=-1), name="Y")
    r = mp.verify(p, naive_lowering(p))
    assert r.equivalent and not r.shrunk
    assert "position" in r.full_size_why


def test_degree_growing_with_extent_falls_back():
    """A sum of fractions with distinct denominators along a long axis has a degree bound that
    grows with the extent: the argument needs it fixed, so the full size is checked."""
    p = mp.Program("fractions")
    a = p.input("A", (4, LONG))
    b = p.input("B", (4, LONG))
    p.output(mp.sum(a / b, axis=-1), name="Y")
    r = mp.verify(p, naive_lowering(p))
    assert r.equivalent and not r.shrunk
    assert r.full_size_why


def test_reshape_runs():
    """The axes a reshape maps onto each other; a run of one axis passes elements through."""
    assert reshape_runs((112, 64, 512, 512), (1, 7168, 512, 512)) == \
        [((0, 1), (0, 1)), ((2,), (2,)), ((3,), (3,))]
    assert reshape_runs((64,), (64, 1, 1)) == [((0,), (0, 1, 2))]
    assert reshape_runs((112, 8, 2097152), (112, 64, 512, 512)) == \
        [((0,), (0,)), ((1, 2), (1, 2, 3))]
    assert reshape_runs((6, 4), (4, 6)) == [((0, 1), (0, 1))]
    assert reshape_runs((4, 1), (4,)) == [((0, 1), (0,))]


def _instance_norm(n: int = LONG, centred: bool = False) -> mp.Program:
    """KernelBench's InstanceNorm and BatchNorm shapes at a small size: batch and channels
    merged by a reshape, the statistics over a long axis ``n`` that the reshapes pass through,
    the per-channel parameters reshaped to ``(C, 1)``; the mean subtracted where ``centred``
    (else an RMS statistic: a mean that is not subtracted)."""
    p = mp.Program("instance_norm")
    x = p.input("X", (2, 3, n))
    w = p.input("w", (3,))
    b = p.input("b", (3,))
    xr = mp.reshape(x, (1, 6, n))
    c = xr - mp.mean(xr, axis=-1, keepdims=True) if centred else xr
    y = c / mp.sqrt(mp.mean(c * c, axis=-1, keepdims=True) + 1e-5)
    y = mp.reshape(y, (2, 3, n)) * mp.reshape(w, (3, 1)) + mp.reshape(b, (3, 1))
    p.output(y, name="Y")
    return p


def test_reshapes_that_pass_a_long_dim_through_shrink_it():
    """A reshape that moves data only along short dims (batch and channels merged, a vector
    given unit dims) passes the long dim through unchanged: it shrinks; the right graph is
    accepted with the full size's bound and every mutant that computes something else is
    rejected, with the full size's verdicts."""
    p = _instance_norm()
    g = naive_lowering(p)
    assert pinned(p, g) == {2, 3, 6}
    r = mp.verify(p, g)
    assert r.equivalent and set(r.shrunk) == {LONG} and r.shrunk[LONG] < LONG, r.full_size_why
    full = Verifier(p, shrink=False).check(g)
    assert full.equivalent and full.degree == r.degree
    differing, shrunk_checks = _shrunk_verdicts_of_mutants(p, g, p.random_inputs(3), 30)
    assert shrunk_checks >= 3


def test_an_extent_a_mean_is_subtracted_over_is_pinned():
    """A centred statistic's extent is pinned (``_counted``): the shrunk program would sum
    fewer elements while keeping the full size's ``1/n``, and ``mean((x - m) * x)`` equals
    ``mean((x - m)^2)`` only because ``1/n`` is the reciprocal of the summed length -- a correct
    candidate written that way was rejected at the shrunk size (the LayerNorm + projection of
    benchmarks/whole_programs fell from 1 kernel to 2). Now it is accepted, at full size."""
    p = _instance_norm(centred=True)
    g = naive_lowering(p)
    assert LONG in pinned(p, g)
    r = mp.verify(p, g)
    assert r.equivalent and LONG not in (r.shrunk or {})
    q = mp.Program("instance_norm")
    x = q.input("X", (2, 3, LONG))
    w = q.input("w", (3,))
    b = q.input("b", (3,))
    xr = mp.reshape(x, (1, 6, LONG))
    m = mp.mean(xr, axis=-1, keepdims=True)
    c = xr - m
    y = c / mp.sqrt(mp.mean(c * xr, axis=-1, keepdims=True) + 1e-5)  # the other variance
    q.output(mp.reshape(y, (2, 3, LONG)) * mp.reshape(w, (3, 1)) + mp.reshape(b, (3, 1)),
             name="Y")
    assert mp.verify(p, naive_lowering(q)).equivalent


def test_a_reshape_of_a_long_dim_falls_back():
    """A reshape that splits the long dim (a group norm's groups) moves data along it: that
    extent is pinned, so the full size is checked and the answer says why."""
    p = mp.Program("split")
    x = p.input("X", (4, 2 * LONG))
    xr = mp.reshape(x, (4, 2, LONG))
    p.output(mp.reshape(xr - mp.mean(xr, axis=-1, keepdims=True), (4, 2 * LONG)), name="Y")
    r = mp.verify(p, naive_lowering(p))
    assert r.equivalent and not r.shrunk
    assert "reshaped" in r.full_size_why


def test_a_big_program_with_pinned_long_dims_shrinks_its_short_ones(monkeypatch):
    """An average pooling (KernelBench's 16 x 64 x 2048 x 2048: 32 GiB as field values): its
    window's slice and reshape pin every long extent, so the batch and channel dims shrink
    instead, until the program fits; right graph accepted, differing mutants rejected, the
    verdicts equal to the full size's."""
    p = mp.Program("avg_pool")
    x = p.input("X", (12, 4, 130))
    w = mp.reshape(mp.slice(x, axis=2, start=0, stop=128), (12, 4, 16, 8))
    p.output(mp.sum(w, axis=3) / 8.0, name="Y")
    g = naive_lowering(p)
    assert not mp.verify(p, g).shrunk  # under the size: checked as it is
    monkeypatch.setattr(shrink_mod, "FULL_SIZE_BYTES", 0)
    assert {130, 128, 16, 8} <= pinned(p, g)
    r = mp.verify(p, g)
    assert r.equivalent and set(r.shrunk) == {12, 4}, (r.shrunk, r.full_size_why)
    assert all(n < e for e, n in r.shrunk.items())
    differing, shrunk_checks = _shrunk_verdicts_of_mutants(p, g, p.random_inputs(4), 30)
    assert differing >= 2 and shrunk_checks >= 2


def test_small_program_and_graph_shrink_every_long_dim():
    p = _mlp(2048, 4096)
    sizes = {2048: 128, 4096: 256}
    sp = small_program(p, sizes)
    assert {t.name: t.shape for t in sp.inputs}["Wg"] == (128, 256)
    sg = small_graph(naive_lowering(p), sizes)
    assert {t.name: t.shape for t in sg.inputs}["Wd"] == (256, 128)
    assert mp.verify(sp, sg, sizes=None).equivalent


def test_inputs_budget_is_shared_by_every_verifier(monkeypatch):
    """Kept inputs of all verifiers together stay within the budget (the least recently used
    verifier's are dropped and drawn again, the same values), and verdicts do not change."""
    p1, p2 = _mlp(64, 128), _mlp(64, 256)
    size = lambda p: sum(int(np.prod(t.shape)) * 8 for t in p.inputs)  # noqa: E731
    monkeypatch.setattr(equivalence, "CACHE_BYTES", int(1.5 * max(size(p1), size(p2))))
    v1, v2 = Verifier(p1), Verifier(p2)
    g1, g2 = naive_lowering(p1), naive_lowering(p2)
    first = v1.check(g1, tests=1)
    assert v1._cached_bytes > 0
    second = v2.check(g2, tests=1)
    assert v2._cached_bytes > 0 and v1._cached_bytes == 0  # v1's inputs made room
    assert equivalence._INPUTS.total() <= equivalence.CACHE_BYTES
    again = v1.check(g1, tests=1)
    assert first.equivalent and second.equivalent and again.equivalent
    assert first.primes == again.primes


# ---- memory that follows the live values -------------------------------------------------------

def test_lazy_numerics_still_rejects_an_outlier_sized_error(monkeypatch):
    """Drawn input by input (a model-size program's inputs, forced here), the numerics check
    still catches the sum of squares stored in float16 that only outlier features overflow,
    and still accepts the program in its own dtype."""
    from mirage_py.verifier import numerics
    from ugraph_cases import narrowed_rms_norm
    monkeypatch.setattr(numerics, "EAGER_BYTES", 0)
    p, naive, narrowed = narrowed_rms_norm()
    assert isinstance(numerics.stored_inputs(p, 0), numerics.LazyInputs)
    assert numerics.numerics_verdict(p, naive, naive).ok
    v = numerics.numerics_verdict(p, narrowed, naive)
    assert not v.ok and "outlier" in v.probe, v
    # the lazy inputs are the same every time they are read
    s = numerics.stored_inputs(p, 3)
    assert np.array_equal(s["X"], numerics.stored_inputs(p, 3)["X"])


def test_weights_widened_a_slice_at_a_time_give_the_float64_reference(monkeypatch):
    """A float16 weight read only by matmuls is widened in column (or row) slices; the result
    is the float64 evaluation of the widened weight."""
    from mirage_py.lax import program as program_mod
    monkeypatch.setattr(program_mod, "WIDEN_CHUNK", 64)  # many slices
    p = mp.Program("two_matmuls")
    x = p.input("X", (3, 32), "float16")
    w = p.input("W", (32, 48), "float16")
    v = p.input("V", (5, 3), "float16")
    p.output(v @ (x @ w), name="Y")
    rng = np.random.default_rng(0)
    xs = {n: rng.standard_normal(t.shape).astype(np.float16)
          for n, t in (("X", x), ("W", w), ("V", v))}
    want = xs["V"].astype(np.float64) @ (xs["X"].astype(np.float64) @ xs["W"].astype(np.float64))
    got = p.evaluate(xs)["Y"]
    assert got.dtype == np.float64
    assert np.allclose(got, want, rtol=1e-13, atol=1e-13)


def test_lean_order_drops_every_value_after_its_last_reader():
    p = _mlp(64, 128)
    order = p.lean_order()
    alive = set()
    for t, drop in order:
        assert all(i.digest in alive for i in t.inputs)  # every operand is still there
        alive.add(t.digest)
        alive -= set(drop)
    assert alive == {t.digest for t in p.output_tensors.values()}
    x = p.random_inputs(0)
    run_out = run(naive_lowering(p), x)["Y"]
    assert np.allclose(p.evaluate(x)["Y"], run_out, rtol=1e-10, atol=1e-10)


def test_shrinks_says_in_advance_where_the_check_will_run(mlp_answer):
    """``Verifier.shrinks`` (what a budget guesses a check's time by) agrees with where
    ``check`` runs: at shrunk sizes for the MLP's graphs, at full size where positions are
    read."""
    p, g = mlp_answer
    v = Verifier(p)
    for graph in (naive_lowering(p), g):
        assert v.shrinks(graph) and v.check(graph).shrunk
    assert not Verifier(p, shrink=False).shrinks(g)
    q = mp.Program("masked")
    s = q.input("S", (8, LONG))
    q.output(mp.sum(mp.where(mp.causal_mask(8, LONG, offset=LONG - 8), s, 0.0), axis=-1),
             name="Y")
    w = Verifier(q)
    assert not w.shrinks(naive_lowering(q)) and not w.check(naive_lowering(q)).shrunk
