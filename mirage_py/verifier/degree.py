"""Degree bounds for the false-acceptance bound, computed by running the graph on a backend
whose values are degree records instead of numbers.

Every value a program or μGraph computes is, element by element, a rational function ``N / M``
of the *variables*: the inputs, the results of exp (under the model of docs/verifier.md: each a
uniform element of the order-q subgroup) and the results of uninterpreted functions (uniform
field elements). A :class:`Deg` record bounds, for every element of a tensor at once:

* ``dn``   -- the total degree of ``N``;
* ``den``  -- the factors of ``M``: each a :class:`Factor` (a divisor's numerator polynomial),
  with its degree and an *instance map* ``idx``: a tuple of integer arrays (*keys*), each
  broadcastable to the tensor's shape; two elements with the same uid and the same key values
  have literally the same factor. A factor distinct at every element of a large tensor (the
  divisor of ``x / (1 + |x|)``) is one key per axis, each varying along its axis only, so the
  map never takes the tensor's size;
* ``risk`` -- denominators that no longer show in ``M`` (hidden inside an exp or uninterpreted
  function argument, or moved to the numerator by a division) but whose vanishing would still
  change the value (``0^-1 = 0`` in the field).

The instance maps make sums exact where it matters: in ``sum_k X[i,k] * W[k,j] / r[i]`` every
summand has the *same* factor ``r[i]`` (its map is constant along ``k``), so the sum keeps
degree ``(2, 1)`` instead of growing a common denominator of degree ``K``. Factors whose map does
vary along a summed axis are combined conservatively: ``n`` distinct instances of a degree-f
factor give a common denominator of degree ``n f`` and raise the numerator by ``(n-1) f``.

Data movement (tiling, slicing, broadcasting, assembling) is applied to the keys with the same
NumPy functions the interpreter applies to values, on zero-stride views, so it costs next to
nothing; a reshape is applied run by run (the dims it maps onto each other), so a key is only
materialised over the run it moves along. Joining values (concat, stacking) encodes each
factor's keys as one array first: that one is as large as the joined parts.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, Callable, Sequence

import numpy as np

from ..lax import ops as _ops
from ..lax.backend import Backend
from .errors import UnverifiableOperatorError

_uids = itertools.count(1)


Keys = tuple  # of compact integer arrays, one rank, broadcastable to the value's shape


@dataclass(frozen=True)
class Factor:
    uid: int
    idx: Keys  # compact instance map (module doc), the value's rank
    deg: int
    vanish: bool = True  # False: provably never 0 in the field (e.g. a product of exp values)


def _compact(a: np.ndarray) -> np.ndarray:
    """Drop the repetition along zero-stride axes (keeps the rank)."""
    key = tuple(slice(0, 1) if (st == 0 and n > 1) else slice(None)
                for st, n in zip(a.strides, a.shape))
    return a[key]


def _constant_axes_dropped(a: np.ndarray) -> np.ndarray:
    """``a`` (a key a reshape copied) reduced to extent 1 along every axis it is constant
    along, whatever its strides."""
    a = _compact(a)
    for ax in range(a.ndim):
        if a.shape[ax] > 1:
            first = a[(slice(None),) * ax + (slice(0, 1),)]
            if np.array_equal(np.broadcast_to(first, a.shape), a):
                a = first
    return a


def _dummy(shape: tuple[int, ...]) -> np.ndarray:
    return np.broadcast_to(np.zeros((), dtype=np.int8), shape)


def _rank(idx: Keys, nd: int) -> Keys:
    return tuple(k.reshape((1,) * (nd - k.ndim) + k.shape) if k.ndim < nd else k for k in idx)


def _same(a: Keys, b: Keys) -> bool:
    return a is b or (len(a) == len(b) and all(
        x.shape == y.shape and (x is y or np.array_equal(x, y)) for x, y in zip(a, b)))


def _extent(idx: Keys, axis: int) -> int:
    """The compact extent of the map along ``axis``: 1 where no key varies along it."""
    return max(k.shape[axis] for k in idx)


def positions(shape: tuple[int, ...]) -> Keys:
    """A map distinct at every element of ``shape``: one key per axis of extent > 1, the
    axis's index (an element is named by its coordinates), each the size of its axis."""
    nd = len(shape)
    keys = tuple(np.arange(n).reshape((1,) * a + (n,) + (1,) * (nd - a - 1))
                 for a, n in enumerate(shape) if n > 1)
    return keys or (np.zeros((1,) * nd, dtype=np.int64),)


def _encoded(parts: list[Keys], shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """The maps of several values as one array each (at the values' shapes), equal where the
    key tuples are equal: the keys in mixed radix over their common range."""
    lo = [min(int(p[i].min()) for p in parts) for i in range(len(parts[0]))]
    span = [max(int(p[i].max()) for p in parts) - lo[i] + 1 for i in range(len(parts[0]))]
    if np.prod([float(x) for x in span]) >= 2.0 ** 62:
        raise UnverifiableOperatorError("degree: an instance map too large to encode")
    out = []
    for p, shape in zip(parts, shapes):
        code = np.zeros((1,) * len(shape), dtype=np.int64)
        for k, low, n in zip(p, lo, span):
            code = code * n + (k.astype(np.int64) - low)
        out.append(np.broadcast_to(code, shape))
    return out


class Deg:
    """Degree record of a tensor (see module docstring)."""

    __slots__ = ("shape", "dn", "den", "risk", "nonzero", "serial")

    def __init__(self, shape: tuple[int, ...], dn: int, den: tuple[Factor, ...] = (),
                 risk: tuple[Factor, ...] = (), nonzero: bool = False):
        self.shape = tuple(int(d) for d in shape)
        self.dn = int(dn)
        self.den = den
        self.risk = tuple(f for f in risk if f.vanish)
        self.nonzero = nonzero  # every element provably nonzero in the field
        self.serial = next(_uids)

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def dd(self) -> int:
        return sum(f.deg for f in self.den)

    @property
    def vanishing_dd(self) -> int:
        """Degree of the denominator factors that can vanish."""
        return sum(f.deg for f in self.den if f.vanish)

    @property
    def risk_deg(self) -> int:
        return sum(f.deg for f in self.risk)

    def __repr__(self) -> str:
        return (f"Deg(shape={self.shape}, dn={self.dn}, dd={self.dd}, risk={self.risk_deg}, "
                f"factors={len(self.den)})")


class Shaped:
    """A stand-in input for the degree backend: only a shape."""

    def __init__(self, shape: tuple[int, ...]):
        self.shape = tuple(shape)


def _merge(fa: Sequence[Factor], fb: Sequence[Factor], nd: int,
           multiply: bool) -> tuple[list[Factor], int, int]:
    """Union of two factor lists (ranks normalised to nd). Matching instances are shared
    (``multiply``: their degrees add, as in F * F). Returns the list and the degrees present
    only in a / only in b."""
    out = [Factor(f.uid, _rank(f.idx, nd), f.deg, f.vanish) for f in fa]
    used = [False] * len(out)
    only_b = 0
    for f in fb:
        idx = _rank(f.idx, nd)
        for i, g in enumerate(out):
            if not used[i] and g.uid == f.uid and _same(g.idx, idx):
                used[i] = True
                if multiply:
                    out[i] = Factor(g.uid, g.idx, g.deg + f.deg, g.vanish)
                break
        else:
            out.append(Factor(f.uid, idx, f.deg, f.vanish))
            used.append(True)
            only_b += f.deg
    only_a = sum(g.deg for g, u in zip(out[:len(fa)], used) if not u)
    return out, only_a, only_b


def _union(fa: Sequence[Factor], fb: Sequence[Factor], nd: int) -> tuple[Factor, ...]:
    return tuple(_merge(fa, fb, nd, False)[0])


class DegreeBackend(Backend):
    """Runs a program or μGraph on degree records; collects the exp-argument degree.

    ``primes``: the moduli the field tests use; a constant is *nonzero* when it is nonzero
    modulo all of them (it then never makes a zero divisor).
    """

    name = "degree"

    def __init__(self, primes: Sequence[int] = ()) -> None:
        self.primes = tuple(primes)
        self.max_exp_arg = 0  # numerator + denominator degree of the largest exp argument
        self.max_uf_arg = 0
        self.exp_count = 0
        self.uf_count = 0

    # values ---------------------------------------------------------------------------------
    def input(self, value: Any, dtype: str) -> Deg:
        if _ops.is_index(dtype):
            return self.index(value)
        return Deg(tuple(value.shape), 1)

    def index(self, value: Any) -> Shaped:
        """An index tensor: known data whose values vary per test, so only its shape counts
        (the degrees must hold for every choice of indices)."""
        return Shaped(tuple(value.shape))

    def take(self, table: Deg, ids: Any) -> Deg:
        """Picked rows keep the table's degrees. A denominator factor that is the same along
        the rows stays shared; one that varies along them is given an instance per picked
        element (which rows meet is unknown: distinct instances only over-count)."""
        lead = tuple(int(d) for d in ids.shape)
        shape = lead + table.shape[1:]

        def moved(f: Factor) -> Factor:
            idx = _rank(f.idx, table.ndim)
            if _extent(idx, 0) == 1:
                return Factor(f.uid, tuple(k.reshape((1,) * len(lead) + k.shape[1:])
                                           for k in idx), f.deg, f.vanish)
            return Factor(next(_uids), positions(shape), f.deg, f.vanish)

        return Deg(shape, table.dn, tuple(moved(f) for f in table.den),
                   tuple(moved(f) for f in table.risk), table.nonzero)

    def scalar(self, v: float) -> Deg:
        f = Fraction(v)
        nonzero = f != 0 and all(f.numerator % m for m in self.primes)
        return Deg((), 0, nonzero=nonzero)

    def data(self, array: np.ndarray) -> Deg:
        return Deg(np.shape(array), 0)

    # arithmetic -----------------------------------------------------------------------------
    def elementwise(self, op: str, args: list[Any], attrs: dict[str, Any] | None = None) -> Deg:
        spec = _ops.OPS.get(op)
        if spec is None or not spec.elementwise:
            raise UnverifiableOperatorError(f"{self.where or op}: {op!r} is not an elementwise "
                                           "operator")
        attrs = attrs or {}
        if op in ("add", "sub"):
            return self._add(args[0], args[1])
        if op == "mul":
            return self._mul(args[0], args[1])
        if op == "square":
            return self._mul(args[0], args[0])
        if op == "div":
            return self._div(args[0], args[1])
        if op in ("neg", "cast"):
            a = args[0]
            return Deg(a.shape, a.dn, a.den, a.risk, a.nonzero)
        if op == "where":  # b + m (a - b), m known 0/1 data
            m, a, b = args
            return self._add(b, self._mul(m, self._add(a, b)))
        if op == "exp":
            a = args[0]
            self.exp_count += 1
            self.max_exp_arg = max(self.max_exp_arg, a.dn + a.dd)
            return self._fresh(a)
        if _ops.lax_class(op, attrs) in ("uf", "select"):
            a = args[0] if len(args) == 1 else self._add(args[0], args[1])
            self.uf_count += 1
            self.max_uf_arg = max(self.max_uf_arg, a.dn + a.dd)
            return self._fresh(a)
        if op == "pow":  # an integer exponent: a product (and a division when negative)
            k = abs(int(attrs["exponent"]))
            a = args[0]
            r = Deg(a.shape, 0) if k == 0 else a
            for _ in range(k - 1):
                r = self._mul(r, a)
            return self._div(self.scalar(1.0), r) if attrs["exponent"] < 0 else r
        raise UnverifiableOperatorError(f"{self.where or op}: no degree rule for {op!r}")

    def reduce(self, op: str, x: Deg, axes: tuple[int, ...], keepdims: bool) -> Deg:
        s = self.sum(x, axes, keepdims)
        if op == "sum":
            return s
        # a max / min is a fresh variable (a random function of the multiset it selects from)
        self.uf_count += 1
        self.max_uf_arg = max(self.max_uf_arg, x.dn + x.dd)
        return self._fresh(s)

    def _fresh(self, a: Deg) -> Deg:
        # a new variable: an exp value (a power of g) or a function value (drawn from the
        # nonzero residues) -- never 0; a's denominators become risks
        return Deg(a.shape, 1, (), _union(a.risk, a.den, a.ndim), nonzero=True)

    def _add(self, a: Deg, b: Deg) -> Deg:
        shape = np.broadcast_shapes(a.shape, b.shape)
        nd = len(shape)
        den, only_a, only_b = _merge(a.den, b.den, nd, False)
        dn = max(a.dn + only_b, b.dn + only_a)
        return Deg(shape, dn, tuple(den), _union(a.risk, b.risk, nd))

    def _mul(self, a: Deg, b: Deg) -> Deg:
        shape = np.broadcast_shapes(a.shape, b.shape)
        nd = len(shape)
        den, _, _ = _merge(a.den, b.den, nd, True)
        return Deg(shape, a.dn + b.dn, tuple(den), _union(a.risk, b.risk, nd),
                   a.nonzero and b.nonzero)

    def _div(self, a: Deg, b: Deg) -> Deg:
        shape = np.broadcast_shapes(a.shape, b.shape)
        nd = len(shape)
        new: tuple[Factor, ...] = ()
        if b.dn > 0:
            # the instance of b's numerator an element divides by: b's own element position
            new = (Factor(b.serial, _rank(positions(b.shape), nd), b.dn, not b.nonzero),)
        den, _, _ = _merge(a.den, new, nd, True)
        risk = _union(_union(a.risk, b.risk, nd), b.den, nd)
        return Deg(shape, a.dn + b.dd, tuple(den), risk, a.nonzero and b.nonzero)

    def sum(self, x: Deg, axes: tuple[int, ...], keepdims: bool) -> Deg:
        axes = tuple(sorted(a % x.ndim for a in axes)) if x.ndim else ()
        dn = x.dn

        def reduce(fs: Sequence[Factor], raise_dn: bool) -> tuple[Factor, ...]:
            nonlocal dn
            out = []
            for f in fs:
                idx = _rank(f.idx, x.ndim)
                varying = [a for a in axes if _extent(idx, a) > 1]
                n = int(np.prod([x.shape[a] for a in varying], dtype=np.int64)) if varying else 1
                if n == 1:
                    kept = tuple(k[tuple(slice(0, 1) if a in axes else slice(None)
                                         for a in range(x.ndim))] for k in idx)
                    uid, deg = f.uid, f.deg
                else:
                    # n distinct instances: a new combined factor per remaining position
                    rest = tuple(1 if a in axes else _extent(idx, a) for a in range(x.ndim))
                    kept = positions(rest)
                    uid, deg = next(_uids), n * f.deg
                    if raise_dn:
                        dn += (n - 1) * f.deg
                if not keepdims:
                    kept = tuple(k.reshape(tuple(d for a, d in enumerate(k.shape)
                                                 if a not in axes)) for k in kept)
                out.append(Factor(uid, kept, deg, f.vanish))
            return tuple(out)

        den = reduce(x.den, True)
        risk = reduce(x.risk, False)
        shape = tuple(1 if a in axes else d for a, d in enumerate(x.shape)) if keepdims else \
            tuple(d for a, d in enumerate(x.shape) if a not in axes)
        return Deg(shape, dn, den, risk)

    def matmul(self, a: Deg, b: Deg) -> Deg:
        a2 = self.layout(a, lambda v: v[..., :, :, None])
        b2 = self.layout(b, lambda v: v[..., None, :, :])
        prod = self._mul(a2, b2)
        return self.sum(prod, (prod.ndim - 2,), False)

    # data movement --------------------------------------------------------------------------
    def _move(self, f: Factor, shape: tuple[int, ...], fn: Callable[[np.ndarray], np.ndarray]
              ) -> Factor:
        return Factor(f.uid, tuple(_compact(np.asarray(fn(np.broadcast_to(k, shape))))
                                   for k in _rank(f.idx, len(shape))), f.deg, f.vanish)

    def compute(self, op: str, args: Sequence[Any], attrs: dict[str, Any]) -> Any:
        if op == "reshape":
            return self.reshape(args[0], tuple(attrs["shape"]))
        return super().compute(op, args, attrs)

    def reshape(self, x: Deg, shape: tuple[int, ...]) -> Deg:
        """A row-major reshape, run by run (:func:`reshape_runs`): a key constant along a
        run's dims is constant along the dims it becomes; one that varies is materialised over
        that run only (the other dims at their compact extent) and reshaped there -- a group
        norm's per-group divisor reshaped from ``(112, 8, 2097152)`` to
        ``(112, 64, 512, 512)`` never takes the tensor's size."""
        if int(np.prod(shape, dtype=np.int64)) != int(np.prod(x.shape, dtype=np.int64)):
            return self.layout(x, lambda a: a.reshape(shape))  # NumPy names the error
        runs = reshape_runs(x.shape, shape)

        def key(k: np.ndarray) -> np.ndarray:
            k = _rank((k,), x.ndim)[0]
            parts = []
            for src, dst in runs:
                if all(k.shape[a] == 1 for a in src):
                    parts.append((tuple(1 for _ in src), tuple(1 for _ in dst)))
                else:
                    parts.append((tuple(x.shape[a] for a in src),
                                  tuple(shape[b] for b in dst)))
            full = tuple(n for src_n, _ in parts for n in src_n)
            moved = np.broadcast_to(k, full).reshape(tuple(n for _, dst_n in parts
                                                           for n in dst_n))
            return _constant_axes_dropped(moved)

        def move(f: Factor) -> Factor:
            return Factor(f.uid, tuple(key(k) for k in f.idx), f.deg, f.vanish)

        return Deg(shape, x.dn, tuple(move(f) for f in x.den), tuple(move(f) for f in x.risk),
                   x.nonzero)

    def layout(self, x: Deg, fn: Callable[[np.ndarray], np.ndarray]) -> Deg:
        shape = fn(_dummy(x.shape)).shape
        return Deg(shape, x.dn, tuple(self._move(f, x.shape, fn) for f in x.den),
                   tuple(self._move(f, x.shape, fn) for f in x.risk), x.nonzero)

    def combine(self, fn: Callable[[list[np.ndarray]], np.ndarray], xs: list[Any]) -> Deg:
        """Several values into one (concat, stack): every element is given every factor that
        any part has (a valid, conservative representation); a part that lacks a factor gets
        instances of its own."""
        shape = fn([_dummy(x.shape) for x in xs]).shape

        def merged(attr: str) -> tuple[list[Factor], dict[int, int]]:
            by_uid: dict[int, Factor] = {}
            for x in xs:
                for f in getattr(x, attr):
                    g = by_uid.get(f.uid)
                    if g is None or f.deg > g.deg:
                        by_uid[f.uid] = f
            out = []
            offset = 0
            for uid, top in by_uid.items():
                mine = [[f for f in getattr(x, attr) if f.uid == uid][:1] for x in xs]
                have = [(_rank(m[0].idx, x.ndim), x.shape) for m, x in zip(mine, xs) if m]
                codes = iter(_encoded([k for k, _ in have], [s for _, s in have]))
                parts = []
                everywhere = all(mine)
                for m, x in zip(mine, xs):
                    if m:
                        parts.append(next(codes))
                    else:
                        n = int(np.prod(x.shape, dtype=np.int64))
                        offset += n
                        parts.append(-offset + np.arange(n).reshape(x.shape))
                out.append(Factor(uid if everywhere else next(_uids),
                                  (_compact(np.asarray(fn(parts))),), top.deg, top.vanish))
            return out, {u: f.deg for u, f in by_uid.items()}

        den, degs = merged("den")
        risk, _ = merged("risk")
        total = sum(degs.values())
        dn = max(x.dn + total - x.dd for x in xs)
        return Deg(shape, dn, tuple(den), tuple(risk), all(x.nonzero for x in xs))


@dataclass
class DegreeSummary:
    """Degrees of one graph's outputs."""

    outputs: dict[str, Deg]
    max_exp_arg: int
    exp_count: int
    uf_count: int


def pair_degree(ref: Deg, cand: Deg) -> int:
    """Degree bound of the polynomial whose vanishing lets the pair agree at a random point:
    the numerator of ``ref - cand`` plus every denominator (shown or hidden) that can vanish."""
    d_num = max(ref.dn + cand.dd, cand.dn + ref.dd)
    return d_num + ref.vanishing_dd + cand.vanishing_dd + ref.risk_deg + cand.risk_deg


def reshape_runs(src: tuple[int, ...], dst: tuple[int, ...]
                 ) -> list[tuple[tuple[int, ...], tuple[int, ...]]]:
    """The dims a row-major reshape of ``src`` into ``dst`` maps onto each other, as axis
    numbers: the shortest runs of ``src`` and ``dst`` axes with equal products, in order, every
    axis in exactly one run (an extent-1 axis joins the run before it, or the first). A run of
    one axis of extent > 1 on each side passes its elements through unchanged."""
    runs: list[tuple[list[int], list[int]]] = []
    i = j = 0
    while i < len(src) or j < len(dst):
        ga, gb = [], []
        pa = pb = 1
        while True:
            if i < len(src) and (pa < pb or not ga or (src[i] == 1 and pa == pb)):
                pa *= src[i]
                ga.append(i)
                i += 1
            elif j < len(dst) and (pb < pa or not gb or (dst[j] == 1 and pa == pb)):
                pb *= dst[j]
                gb.append(j)
                j += 1
            else:
                break
        if not ga and not gb:
            break
        runs.append((ga, gb))
    # trailing extent-1 axes left over join the last run
    if runs and (i < len(src) or j < len(dst)):
        runs[-1][0].extend(range(i, len(src)))
        runs[-1][1].extend(range(j, len(dst)))
    return [(tuple(a), tuple(b)) for a, b in runs]


__all__ = ["Deg", "Factor", "DegreeBackend", "DegreeSummary", "Shaped", "pair_degree",
           "positions", "reshape_runs"]
