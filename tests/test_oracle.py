"""The normal-form oracle agrees with the z3 baseline, and is much faster."""

import time

import mirage_py as mp
from mirage_py.generator import absexpr as ae
from mirage_py.generator.block_search import saturate
from mirage_py.generator.kernel_search import Searcher
from mirage_py.generator.oracle_z3 import oracle_z3
from mirage_py.targets import get_target


def _corpus(p, max_plans=6):
    """Every value the block search meets (accepted or not) on a few plans of program p."""
    sub = mp.partition(p, uninterpreted=True)[0]
    s = Searcher(sub, get_target("h100"))
    seen = []
    orig = s.ctx.oracle.__call__

    def record(e):
        seen.append(e)
        return orig(e)
    s.ctx.oracle = type("R", (), {"__call__": staticmethod(record), "_pool": s.ctx.oracle._pool,
                                  "targets": s.ctx.oracle.targets})()
    for plan in s.plans(s.avail0)[:max_plans]:
        saturate(plan, s.avail0, s.ctx)
    return s, list(dict.fromkeys(seen))


def _programs():
    a = mp.Program("norm_linear")
    X = a.input("X", (8, 256))
    W = a.input("W", (256, 512))
    a.output(mp.rms_norm(X) @ W)
    b = mp.Program("lowrank")
    X = b.input("X", (16, 128))
    W = b.input("W", (128, 256))
    A = b.input("A", (128, 16))
    B = b.input("B", (16, 256))
    b.output(X @ W + (X @ A) @ B)
    c = mp.Program("attn")
    Q = c.input("Q", (2, 16, 64))
    K = c.input("K", (2, 64, 512))
    V = c.input("V", (2, 512, 64))
    E = mp.exp(Q @ K)
    c.output(E / mp.sum(E, axis=-1, keepdims=True) @ V)
    return [a, b, c]


def test_normal_form_oracle_agrees_with_z3():
    total = agree = 0
    t_nf = t_z3 = 0.0
    for p in _programs():
        s, corpus = _corpus(p)
        assert len(corpus) > 10
        z = oracle_z3(s.ctx.oracle.targets)
        ae._embeds.cache_clear()  # time the matcher cold, as the search first meets a value
        fresh = ae.Oracle(s.ctx.oracle.targets)
        for e in corpus[:60]:
            t0 = time.perf_counter()
            a = fresh(e)
            t1 = time.perf_counter()
            b = z(e)
            t2 = time.perf_counter()
            t_nf += t1 - t0
            t_z3 += t2 - t1
            total += 1
            agree += a == b
            assert a == b, ae.to_text(e)
    print(f"\noracle: {total} queries agree; normal form {t_nf * 1e3:.1f} ms, "
          f"z3 {t_z3 * 1e3:.0f} ms ({t_z3 / max(t_nf, 1e-9):.0f}x)")
    assert agree == total
    assert t_nf < t_z3
