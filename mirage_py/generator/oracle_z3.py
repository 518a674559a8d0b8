"""The z3 baseline of the subexpression oracle.

It answers the same question as :class:`absexpr.Oracle` -- does a value's normal form embed in a
polynomial of the target? -- by stating the definition as constraints and asking z3 for a
witness: integer cofactor powers ``c[a]`` per atom, an integer ratio ``R`` of sum sizes, and a
one-to-one map from the value's monomials to the target polynomial's, such that each mapped
monomial times the cofactor is the target monomial (powers add up, total sum sizes times ``R``
give the target's) and the value's monomial is a *part* of it (powers of the same sign and no
larger magnitude; per label, no more sums and sizes dividing).

The direct matcher in ``absexpr`` is what the search uses: ``tests/test_oracle.py`` keeps the two
in agreement on every value the search meets for several programs, and records how much faster
the matcher is (see ``docs/generator.md``). It needs z3, an extra: ``pip install
'mirage_py[z3]'`` (the test extra has it).
"""

from __future__ import annotations

import math

from ..errors import OptionError
from . import absexpr as ae

try:
    import z3
except ImportError:  # pragma: no cover - the test extra installs z3
    raise OptionError("generator.oracle_z3 needs z3, which is not installed; pip install "
                      "'mirage_py[z3]' (or pip install z3-solver)") from None


def _powers(m: ae.Mono) -> dict:
    return {ae._key(a): p for a, p in m[1]}


def _sums(m: ae.Mono) -> dict:
    out: dict[str, list[int]] = {}
    for label, n in m[0]:
        out.setdefault(label, []).append(n)
    return out


def embeds_z3(e: ae.Poly, p: ae.Poly, timeout_ms: int = 10000) -> bool:
    """z3's answer to: does ``e`` embed in ``p`` (see module docstring)?"""
    em, pm = list(e), list(p)
    if len(em) > len(pm):
        return False
    atoms = sorted({k for m in em + pm for k in _powers(m)})
    s = z3.Solver()
    s.set("timeout", timeout_ms)
    c = {a: z3.Int(f"c_{i}") for i, a in enumerate(atoms)}
    ratio = z3.Int("R")
    s.add(ratio >= 1)
    x = [[z3.Bool(f"x_{i}_{j}") for j in range(len(pm))] for i in range(len(em))]
    for i in range(len(em)):
        s.add(z3.PbEq([(x[i][j], 1) for j in range(len(pm))], 1))
    for j in range(len(pm)):
        s.add(z3.PbLe([(x[i][j], 1) for i in range(len(em))], 1))
    for i, m in enumerate(em):
        mp_, ms = _powers(m), _sums(m)
        for j, big in enumerate(pm):
            bp, bs = _powers(big), _sums(big)
            conds = [ratio * math.prod(n for _, n in m[0]) == math.prod(n for _, n in big[0])]
            if len(m[0]) > len(big[0]):
                conds.append(z3.BoolVal(False))
            for a in atoms:
                ea, ba = mp_.get(a, 0), bp.get(a, 0)
                conds.append(c[a] + ea == ba)
                if ea != 0 and (ba == 0 or (ea > 0) != (ba > 0) or abs(ea) > abs(ba)):
                    conds.append(z3.BoolVal(False))
            for label, mine in ms.items():
                theirs = bs.get(label, [])
                if len(mine) > len(theirs) or math.prod(theirs) % math.prod(mine):
                    conds.append(z3.BoolVal(False))
            s.add(z3.Implies(x[i][j], z3.And(conds)))
    res = s.check()
    if res == z3.unknown:
        raise TimeoutError("z3 gave no answer in time")
    return res == z3.sat


def oracle_z3(targets) -> "callable":
    pool = frozenset().union(*(ae.subpolys(t) for t in targets))

    def ask(e: ae.Poly) -> bool:
        return any(embeds_z3(e, p) for p in pool if len(e) <= len(p))
    return ask
