"""Abstract expressions and the subexpression oracle that prunes the search.

An abstract expression forgets indices and keeps the algebra: every tensor of a candidate (and of
the target program) gets one, built bottom-up (input -> variable, matmul over k -> sum(k, a*b),
sum over n -> sum(n, x), for-loop accumulation over F iterations -> sum(F, x), elementwise ops as
themselves).

Normal form (the canonical form we decide by, instead of asking a solver each time):

* a **polynomial** is a set of monomials (numeric coefficients from repeated terms are dropped,
  constants are atoms; a negation or subtraction multiplies by the constant atom -1 and
  ``x + x`` is ``2 * x``, so that ``a - b`` and ``a + b``, ``x - x``, ``x + x`` and ``x``,
  ``concat([-b, a])`` and ``concat([b, a])`` stay apart);
* a **monomial** is ``(S, factors)``: ``S`` a sorted tuple of ``(label, size)``, one entry per
  *independent* sum the monomial sits under, labelled with the dimension label it sums over (see
  :mod:`labels`), and ``factors`` a sorted tuple of ``(atom, power)`` with non-zero integer
  powers. A sum over a label the monomial already sums over exactly once merges into that entry
  (sum(a, sum(b, x)) = sum(a*b, x): a sum over a split range equals the full sum); a product of
  sums keeps separate entries, so (sum x)^2 and sum(x^2) stay apart, and a sum over a label the
  target never sums over is told apart from the target's sums;
* an **atom** is a variable (an input, or a mask), a constant (other than 1), ``exp(P)``, an
  uninterpreted function ``f(P)`` (sqrt, silu, ..., keyed by name and attributes; a binary one
  such as ``maximum(a, b)`` takes ``a + b``), ``inv(P)`` for the reciprocal of a polynomial that
  is not a plain product, a *selection* ``max[l:n](P)`` / ``min[l:n](P)`` over ``n`` elements of
  dimension label ``l`` (nested selections of one kind over one label merge, like sums: the max
  of chunk maxima is the max), or a *slice* ``P[l: a..b]`` of the dim labelled ``l``.

The axioms behind it: + and * are associative and commutative; * distributes over +; sums of sums
merge (sum(a, sum(b, x)) = sum(a*b, x)); sums distribute over + and commute with * and / by terms
that do not depend on the summed index (index-free, so applied everywhere: an over-approximation,
which only keeps more candidates, never loses one); x/y = x * y^-1 for plain products.

``is_subexpression(e, target)`` holds when e's polynomial embeds in a polynomial of the target
(the target's own, an atom's argument, or an atom by itself): there is one cofactor monomial C with
every monomial m of e mapped to a distinct monomial m*C of that polynomial, where m is a "part" of
m*C (each atom's power has the same sign and no larger magnitude, and S divides). A useful value
must pass; a complete candidate needs its outputs' normal forms equal to the target's.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Iterable

from ..errors import MirageError
from ..lax.ops import EXACT_POW, OPS, lax_class

# Atom: ("var", name) | ("const", v) | ("exp", Poly) | ("uf", name, Poly) | ("inv", Poly)
#       | ("sel", "max" | "min", ((label, n),), Poly) | ("slice", label, start, stop, Poly)
# Mono: (S, ((atom, power), ...)) with factors sorted by atom
# Poly: frozenset of Mono
Atom = tuple
Mono = tuple
Poly = frozenset

ONE: Poly = frozenset({((), ())})


def _prod(s: tuple) -> int:
    n = 1
    for _, x in s:
        n *= x
    return n


def _base(label: str) -> str:
    # "l3/32" (the parts of a split reduction) sums over the same index as "l3"
    return label.split("/")[0]


def var(name: str) -> Poly:
    return frozenset({((), ((("var", name), 1),))})


def const(value: float | None = None) -> Poly:
    """A constant: an atom of its own, so that templates differing only in a constant (a scaling
    factor, 1/n of a mean) stay apart; 1.0 is the empty product."""
    if value is None or value == 1.0:
        return ONE
    return frozenset({((), ((("const", float(value)), 1),))})


@lru_cache(maxsize=None)
def canon(p: Poly) -> str:
    """A canonical string for a polynomial: equal polynomials give equal strings in every
    process (frozenset iteration order is not canonical, so nothing may depend on it)."""
    return "+".join(sorted(_mono_key(m) for m in p))


def _mono_key(m: Mono) -> str:
    sums = ",".join(f"{l}:{n}" for l, n in m[0])
    return f"[{sums}]" + "*".join(f"{_key(a)}^{k}" for a, k in m[1])


@lru_cache(maxsize=None)
def _key(atom: Atom) -> str:
    if atom[0] in ("var", "const"):
        return f"{atom[0]}:{atom[1]!r}"
    if atom[0] == "uf":
        return f"uf:{atom[1]}({canon(atom[2])})"
    if atom[0] == "sel":
        return f"sel:{atom[1]}[{atom[2][0][0]}:{atom[2][0][1]}]({canon(atom[3])})"
    if atom[0] == "slice":
        return f"slice:{atom[1]}:{atom[2]}:{atom[3]}({canon(atom[4])})"
    return f"{atom[0]}({canon(atom[1])})"


def _mono_mul(a: Mono, b: Mono) -> Mono:
    powers: dict[Atom, int] = {}
    for at, p in a[1] + b[1]:
        powers[at] = powers.get(at, 0) + p
    factors = tuple(sorted(((at, p) for at, p in powers.items() if p), key=lambda f: _key(f[0])))
    return (tuple(sorted(a[0] + b[0])), factors)


@lru_cache(maxsize=1 << 16)
def add(a: Poly, b: Poly) -> Poly:
    return a | b


@lru_cache(maxsize=1 << 16)
def mul(a: Poly, b: Poly) -> Poly:
    return frozenset(_mono_mul(x, y) for x in a for y in b)


@lru_cache(maxsize=1 << 16)
def div(a: Poly, b: Poly) -> Poly:
    if len(b) == 1:
        (s, factors), = b
        if not s:
            return mul(a, frozenset({((), tuple((at, -p) for at, p in factors))}))
    return mul(a, frozenset({((), ((("inv", b), 1),))}))


@lru_cache(maxsize=1 << 16)
def exp(a: Poly) -> Poly:
    return frozenset({((), ((("exp", a), 1),))})


@lru_cache(maxsize=1 << 16)
def uf(name: str, a: Poly) -> Poly:
    return frozenset({((), ((("uf", name, a), 1),))})


def _atom(at: Atom) -> Poly:
    return frozenset({((), ((at, 1),))})


@lru_cache(maxsize=1 << 16)
def selected(op: str, n: int, a: Poly, label: str = "_") -> Poly:
    """max / min (``op``) over ``n`` elements of dimension label ``label``; a selection of the
    same kind over the same label merges (the max of chunk maxima is the max)."""
    if n == 1:
        return a
    label = _base(label)
    if len(a) == 1:
        (s, factors), = a
        if not s and len(factors) == 1 and factors[0][1] == 1:
            at = factors[0][0]
            if at[0] == "sel" and at[1] == op and at[2][0][0] == label:
                return _atom(("sel", op, ((label, at[2][0][1] * n),), at[3]))
    return _atom(("sel", op, ((label, n),), a))


@lru_cache(maxsize=1 << 16)
def sliced(a: Poly, label: str, start: int, stop: int) -> Poly:
    return _atom(("slice", _base(label), start, stop, a))


def _uf_key(op: str, attrs: dict | None) -> str:
    if not attrs:
        return op
    return op + "(" + ",".join(f"{k}={attrs[k]!r}" for k in sorted(attrs)) + ")"


def _sum_mono(label: str, n: int, m: Mono) -> Mono:
    s = list(m[0])
    same = [i for i, (l, _) in enumerate(s) if l == label]
    if len(same) == 1:
        s[same[0]] = (label, s[same[0]][1] * n)
    else:
        s.append((label, n))
    return (tuple(sorted(s)), m[1])


@lru_cache(maxsize=1 << 16)
def summed(n: int, a: Poly, label: str = "_") -> Poly:
    """sum over ``n`` elements of dimension label ``label``."""
    if n == 1:
        return a
    label = _base(label)
    return frozenset(_sum_mono(label, n, m) for m in a)


def apply(op: str, args: list[Poly], reduce: tuple = (), attrs: dict | None = None) -> Poly:
    """Abstract expression of operator ``op`` (the op-table names) on argument expressions;
    ``reduce`` lists ``(label, size)`` of the contracted dim (matmul) or reduced dims (sum, max,
    min), or ``(label, start, stop)`` of a slice's dim; ``attrs``: the operator's attributes."""
    if op == "add":  # x + x is 2x, not x (a value would shadow its double)
        return mul(args[0], const(2.0)) if args[0] == args[1] else add(args[0], args[1])
    if op == "sub":  # a - b apart from a + b (and x - x from x): b times the constant -1
        return add(args[0], mul(args[1], const(-1.0)))
    if op == "mul":
        return mul(args[0], args[1])
    if op == "div":
        return div(args[0], args[1])
    if op == "cast":
        return args[0]
    if op == "neg":  # kept apart from x itself: concat([-b, a]) is not concat([b, a])
        return mul(args[0], const(-1.0))
    if op == "square":
        return mul(args[0], args[0])
    if op == "exp":
        return exp(args[0])
    if op == "take":  # rows picked by known indices: linear in the table, the indices a
        # factor (as a mask is in where), so a candidate that reads the table ungathered differs
        return mul(args[0], args[1])
    if op == "where":  # b + m (a - b), coefficients dropped
        m, a, b = args
        return add(b, mul(m, add(a, b)))
    if op == "pow":
        e = float((attrs or {})["exponent"])
        if e.is_integer() and abs(e) <= EXACT_POW:
            out = ONE
            for _ in range(abs(int(e))):
                out = mul(out, args[0])
            return div(ONE, out) if e < 0 else out
        return uf(_uf_key(op, attrs), args[0])
    if op == "matmul":
        out = mul(args[0], args[1])
        for label, n in reduce:
            out = summed(n, out, label)
        return out
    if op == "sum":
        out = args[0]
        for label, n in reduce:
            out = summed(n, out, label)
        return out
    if op in ("max", "min"):
        out = args[0]
        for label, n in reduce:
            out = selected(op, n, out, label)
        return out
    if op == "slice":
        (label, start, stop), = reduce
        return sliced(args[0], label, start, stop)
    if op in ("reshape", "transpose", "concat"):
        out = args[0]
        for a in args[1:]:
            out = add(out, a)
        return out
    # sqrt, silu, gelu, relu, sigmoid, ..., maximum, minimum: uninterpreted functions of their
    # arguments (a binary one of their sum); an operator the verifier computes exactly needs a
    # rule above (tests/test_op_table.py walks the table)
    if op not in OPS or lax_class(op, attrs or {}) not in ("uf", "select"):
        raise MirageError(f"abstract expression: no rule for operator {op!r} (Lax class "
                          f"{OPS[op].lax if op in OPS else 'unknown'}); add one to "
                          "generator/absexpr.apply")
    arg = args[0] if len(args) == 1 else add(args[0], args[1])
    return uf(_uf_key(op, attrs), arg)


# ---- the oracle -----------------------------------------------------------------------------

def _atoms(p: Poly) -> Iterable[Atom]:
    for _, factors in p:
        for at, _ in factors:
            yield at


def _has_args(at: Atom) -> bool:
    return at[0] in ("exp", "uf", "inv", "sel", "slice")


@lru_cache(maxsize=None)
def subpolys(target: Poly) -> frozenset:
    """Every polynomial a useful value may embed into: the target, atom arguments, atoms alone."""
    out = {target}
    for at in _atoms(target):
        out.add(frozenset({((), ((at, 1),))}))
        if _has_args(at):
            out |= subpolys(at[-1])
    return frozenset(out)


def _part_of(m: Mono, big: Mono) -> bool:
    if len(m[0]) > len(big[0]):
        return False
    for label in {l for l, _ in m[0]}:
        mine = [n for l, n in m[0] if l == label]
        theirs = [n for l, n in big[0] if l == label]
        if len(mine) > len(theirs) or _prod((("", x) for x in theirs)) % \
                _prod((("", x) for x in mine)):
            return False
    bp = dict(big[1])
    for at, p in m[1]:
        q = bp.get(at, 0) or (_sel_part(at, bp) if at[0] == "sel" else 0)
        if q == 0 or (p > 0) != (q > 0) or abs(p) > abs(q):
            return False
    return True


def _sel_part(at: Atom, bp: dict) -> int:
    """The power of a selection in ``bp`` that ``at`` is a part of: the same kind, label and
    argument over a multiple of ``at``'s elements (a chunk's max is part of the row's max)."""
    op, ((label, n),), arg = at[1], at[2], at[3]
    for b, q in bp.items():
        if b[0] == "sel" and b[1] == op and b[3] == arg and b[2][0][0] == label and \
                b[2][0][1] % n == 0:
            return q
    return 0


@lru_cache(maxsize=None)
def _sorted_monos(e: Poly) -> tuple:
    return tuple(sorted(e, key=_mono_key))


@lru_cache(maxsize=1 << 18)
def _embeds(e: Poly, p: Poly) -> bool:
    if len(e) > len(p):
        return False
    monos = _sorted_monos(e)
    first = monos[0]
    for cand in p:
        if not _part_of(first, cand):
            continue
        ratio = _prod(cand[0]) // _prod(first[0])
        cof = _mono_mul(cand, ((), tuple((at, -q) for at, q in first[1])))[1]
        used = {cand}
        ok = True
        for m in monos[1:]:
            factors = _mono_mul(m, ((), cof))[1]
            img = next((c for c in p if c[1] == factors and c not in used and
                        _prod(c[0]) == _prod(m[0]) * ratio and _part_of(m, c)), None)
            if img is None:
                ok = False
                break
            used.add(img)
        if ok:
            return True
    return False


class Oracle:
    """Memoised subexpression test against fixed target expressions."""

    def __init__(self, targets: Iterable[Poly]):
        self.targets = tuple(targets)
        self._pool = frozenset().union(*(subpolys(t) for t in self.targets)) \
            if self.targets else frozenset()
        self._memo: dict[Poly, bool] = {}
        self.queries = 0

    def __call__(self, e: Poly) -> bool:
        self.queries += 1
        r = self._memo.get(e)
        if r is None:
            r = any(_embeds(e, p) for p in self._pool)
            self._memo[e] = r
        return r

    def is_target(self, e: Poly) -> bool:
        return e in self.targets


def is_subexpression(e: Poly, target: Poly) -> bool:
    return Oracle([target])(e)


def mask_var(t) -> Poly:
    """A mask leaf's variable: one per distinct mask (shape, offset, window)."""
    valid = f":{t.attr('valid')}" if t.attr("valid") is not None else ""
    return var(f"mask{t.shape}:{t.attr('offset')}:{t.attr('window')}{valid}")


def of_program(program, labels=None) -> dict[str, Poly]:
    """Abstract expression of every node of a program, keyed by node digest; ``labels``
    (:func:`labels.infer_labels`) names the dims: a reduction over a dim sums (or selects) over
    each of its label components."""
    if labels is None:
        from .labels import infer_labels
        labels = infer_labels(program)
    dims, comps = labels.node_dims, labels.node_components
    out: dict[str, Poly] = {}
    for t in program.nodes():
        if t.op == "input":
            out[t.digest] = var(t.name)
        elif t.op == "const":
            out[t.digest] = const(t.attr("value"))
        elif t.op == "mask":
            out[t.digest] = mask_var(t)
        else:
            red: tuple = ()
            if t.op == "matmul":
                a = t.inputs[0]
                red = comps[a.digest][-1]
            elif t.op in ("sum", "max", "min"):
                a = t.inputs[0]
                red = tuple(c for ax in t.attr("axes") for c in comps[a.digest][ax])
            elif t.op == "slice":
                a = t.inputs[0]
                red = ((dims[a.digest][t.attr("axis")] or "_", t.attr("start"), t.attr("stop")),)
            attrs = {k: v for k, v in t.attrs}
            out[t.digest] = apply(t.op, [out[i.digest] for i in t.inputs], red, attrs)
    return out


def to_text(p: Poly) -> str:
    """Readable form, e.g. ``sum[l1:512](X*W*sqrt(...)^-1)``."""
    def atom(at: Atom) -> str:
        if at[0] == "var":
            return at[1]
        if at[0] == "const":
            return repr(at[1])
        if at[0] == "exp":
            return f"exp({to_text(at[1])})"
        if at[0] == "uf":
            return f"{at[1]}({to_text(at[2])})"
        if at[0] == "sel":
            return f"{at[1]}[{at[2][0][0]}:{at[2][0][1]}]({to_text(at[3])})"
        if at[0] == "slice":
            return f"({to_text(at[4])})[{at[1]}: {at[2]}..{at[3]}]"
        return f"1/({to_text(at[1])})"

    def mono(m: Mono) -> str:
        body = "*".join(atom(a) + (f"^{p}" if p != 1 else "") for a, p in m[1]) or "1"
        sums = "".join(f"sum[{l}:{n}]" for l, n in m[0])
        return f"{sums}({body})" if m[0] else body
    return " + ".join(sorted(mono(m) for m in p))
