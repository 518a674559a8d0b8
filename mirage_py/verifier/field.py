"""Finite-field semantics of every operator, and the field backend of the interpreter.

A tensor's field value is a pair: its value mod a prime ``p`` and its value mod a prime ``q``
with ``q | p - 1`` (here ``p = 2q + 1``, a safe prime). ``+ - *``, matmul and sums act on both
parts; ``exp(x) = g^(x mod q) mod p`` with ``g`` of order ``q`` takes the q part and yields a p
part only (the q part of an exp result is *undefined*: exp of it would be a nested exp, outside
Lax, and raises :class:`~mirage_py.verifier.errors.NestedExpError`). Since ``g`` has order ``q``,
``exp(a + b) = exp(a) * exp(b)`` and ``exp(0) = 1`` hold exactly, so every identity that follows
from the field axioms and the exponential law is preserved.

Representation (chosen for speed, see docs/verifier.md): a residue is a float64 holding an
integer, exact as long as its magnitude stays below ``2^53``. Reduced residues are *balanced*,
``|x| <= R = (m+1)/2 + 2``; reduction is ``x - rint(x / m) * m`` (four vector passes, no
branches). Reduction is *lazy*: every array carries a bound on its magnitude, and an operation
reduces its operands only when the exact result could otherwise pass ``2^52`` (or when it needs
canonical values: exp, uninterpreted functions, inverses). So a matmul is one float64 BLAS call
on reduced operands whenever ``K * R^2 <= 2^52`` -- ``K <= 8192`` for the primes below; longer
contractions are split -- and its result can go straight into sums and accumulators. Outputs
are compared in canonical form ``[0, m)``.

Division multiplies by the modular inverse ``b^(m-2)``; a **zero divisor** gives 0 (that is what
``0^(m-2)`` is) and is counted, so the verifier can treat a test that hit one as inconclusive
rather than as a counterexample.

Constants (``1e-6``, ``1/4096``, ``0.125``) are the exact rationals ``fractions.Fraction(float)``
mapped into both fields (their denominators are powers of two, always invertible).

Non-Lax elementwise operators (sqrt, silu, gelu, relu, and the sqrt inside rms_norm) are
*uninterpreted functions*: a pseudo-random function of the argument's p value (a 64-bit hash
keyed by the seed, the test and the operator name), giving fresh p and q values. It is the same
function wherever the operator appears in either graph within one test, so two graphs that agree
for every such function agree for the real one (the converse need not hold: a candidate that
rewrites ``sqrt(a) * sqrt(b)`` as ``sqrt(a * b)`` is rejected).

Operators with attributes (a clamp's bounds, a leaky ReLU's slope, a non-integer power) are
uninterpreted functions keyed by name *and* attributes: ``clamp(-1, 1)`` and ``clamp(-2, 2)`` are
different functions. ``pow`` with an integer exponent up to ``EXACT_POW`` is exact (products, a
division for negative exponents); ``cast`` is the identity; ``where(mask, a, b)`` is
``b + mask * (a - b)`` with the mask's exact 0/1 values; slices and concatenations move residues.

**max and min** (reductions, ``maximum``/``minimum``, loop accumulators of kind max/min) are
random functions of the *multiset* of values they select from: every value carries, per kind, a
multiset hash of what it was selected from (``FieldValue.sel``: the sum mod 2^64 of a 64-bit hash
of each element's canonical p residue; a value that is itself a max contributes its own multiset,
so ``max(max(A), max(B)) = max(A + B)`` holds exactly), and the result is a fresh nonzero pair
drawn from that hash. Chunked maxima, running maxima over loop iterations and the full maximum
therefore agree, and ``exp(x - m)`` with ``m`` a fresh value is exactly the shift the softmax
identity cancels (docs/verifier.md, "max, min and shift invariance").

The q part is computed lazily: only values that reach an exp argument ever need it, so the
q parts of, say, the weight matrices of a gated MLP are never drawn or multiplied.
"""

from __future__ import annotations

import zlib
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from typing import Any, Callable

import numpy as np

from ..lax import ops as _ops
from ..lax.backend import Backend
from .errors import FieldValueError, NestedExpError, UnverifiableOperatorError

#: Safe primes p = 2q + 1 (q prime) with 4096 * (p - 1)^2 < 2^53, largest first. Each test
#: uses one pair, rotating through the table, so no fixed prime is a blind spot.
SAFE_PRIMES: tuple[int, ...] = (1482863, 1482827, 1482263, 1482023, 1481783, 1481603, 1481387,
                                1481099)
EXACT = float(2 ** 53)


# ---- modular arithmetic on balanced float64 residues ----------------------------------------

LIMIT = float(2 ** 52)  # largest magnitude an unreduced array may reach (exact below 2^53)
CHUNK = 1 << 15  # elements per piece in cache-blocked elementwise pipelines


class Modulus:
    """Arithmetic mod a prime ``m`` on float64 arrays of integers with magnitude bounds.

    Operations take and return ``(array, bound)`` pairs; ``bound`` bounds ``|array|``. Results
    are reduced only when needed to stay exact (see module docstring).
    """

    def __init__(self, m: int):
        self.m = int(m)
        self.mf = float(m)
        self.inv = 1.0 / m
        self.bound = (m + 1) / 2 + 2  # |reduced residue| <= bound (rint may be off by one)
        self.kmax = int(LIMIT // (self.bound * self.bound))  # longest exact contraction

    def __repr__(self) -> str:
        return f"Modulus({self.m})"

    # reduction ------------------------------------------------------------------------------
    def red(self, x: Any, inplace: bool = False) -> Any:
        """Balanced residue of integer-valued floats ``|x| < 2^53``."""
        if np.ndim(x) == 0:
            return self.scalar(int(x))
        x = np.asarray(x, dtype=np.float64)
        if x.size > 2 * CHUNK and x.flags.c_contiguous:
            # cache-sized pieces: the four passes then run out of L2, not main memory
            flat = x.reshape(-1)
            out = flat if inplace else np.empty_like(flat)
            tmp = np.empty(CHUNK)
            for s in range(0, flat.size, CHUNK):
                xs = flat[s:s + CHUNK]
                r = tmp[:xs.size]
                np.multiply(xs, self.inv, out=r)
                np.rint(r, out=r)
                r *= self.mf
                np.subtract(xs, r, out=out[s:s + CHUNK])
            return out.reshape(x.shape)
        r = np.multiply(x, self.inv)
        np.rint(r, out=r)
        r *= self.mf
        if inplace:
            np.subtract(x, r, out=x)
            return x
        np.subtract(x, r, out=r)
        return r

    def norm(self, x: Any, b: float) -> tuple[Any, float]:
        """``(x, b)`` reduced if it is not already."""
        return (x, b) if b <= self.bound else (self.red(x), self.bound)

    def scalar(self, v: int) -> np.float64:
        v %= self.m
        return np.float64(v - self.m if v > self.m // 2 else v)

    def canon(self, x: Any) -> Any:
        """Canonical residues in ``[0, m)`` (of any exact integer floats)."""
        return np.remainder(x, self.mf)

    def balanced(self, canon: Any) -> Any:
        """Canonical ``[0, m)`` -> balanced."""
        c = np.asarray(canon, dtype=np.float64)
        return np.where(c > self.m // 2, c - self.mf, c)

    def _fresh(self, x: Any, b: float) -> tuple[Any, float]:
        # a freshly computed array: reduce in place when it got too big
        if b > LIMIT:
            return self.red(x, inplace=np.ndim(x) > 0), self.bound
        return x, b

    # ring operations on (array, bound) ------------------------------------------------------
    def add(self, a: Any, ba: float, b: Any, bb: float) -> tuple[Any, float]:
        if ba + bb > EXACT:
            (a, ba), (b, bb) = self.norm(a, ba), self.norm(b, bb)
        return self._fresh(np.add(a, b), ba + bb)

    def sub(self, a: Any, ba: float, b: Any, bb: float) -> tuple[Any, float]:
        if ba + bb > EXACT:
            (a, ba), (b, bb) = self.norm(a, ba), self.norm(b, bb)
        return self._fresh(np.subtract(a, b), ba + bb)

    def neg(self, a: Any, ba: float) -> tuple[Any, float]:
        return np.negative(a), ba

    def mul(self, a: Any, ba: float, b: Any, bb: float) -> tuple[Any, float]:
        if ba * bb > LIMIT:
            (a, ba), (b, bb) = self.norm(a, ba), self.norm(b, bb)
        return np.multiply(a, b), ba * bb

    def square(self, a: Any, ba: float) -> tuple[Any, float]:
        return self.mul(a, ba, a, ba)

    def matmul(self, a: np.ndarray, ba: float, b: np.ndarray, bb: float) -> tuple[Any, float]:
        k = a.shape[-1]
        if k * ba * bb > LIMIT:
            (a, ba), (b, bb) = self.norm(a, ba), self.norm(b, bb)
        if k * ba * bb <= LIMIT:
            return np.matmul(a, b), k * ba * bb
        acc = None
        for s in range(0, k, self.kmax):
            part = self.red(np.matmul(a[..., s:s + self.kmax], b[..., s:s + self.kmax, :]),
                            inplace=True)
            acc = part if acc is None else self.red(acc + part, inplace=True)
        return acc, self.bound

    def sum(self, x: Any, bx: float, axes: tuple[int, ...], keepdims: bool) -> tuple[Any, float]:
        x = np.asarray(x)
        n = 1
        for a in axes:
            n *= x.shape[a]
        if n * bx > LIMIT:
            x, bx = self.norm(x, bx)
        if n * bx <= LIMIT:
            return np.sum(x, axis=axes, keepdims=keepdims), n * bx
        # absurdly long sums: reduce pairwise halves (never needed at realistic sizes)
        ax = axes[0]
        h = x.shape[ax] // 2
        lo = self.norm(*self.sum(np.take(x, range(h), axis=ax), bx, (ax,), True))
        hi = self.norm(*self.sum(np.take(x, range(h, x.shape[ax]), axis=ax), bx, (ax,), True))
        s, bs = self.add(lo[0], lo[1], hi[0], hi[1])
        rest = tuple(a for a in axes if a != ax)
        if rest:
            s, bs = self.sum(s, bs, rest, True)
        return (s if keepdims else np.squeeze(s, axis=axes)), bs

    # reduced-only helpers -------------------------------------------------------------------
    def mulred(self, a: Any, b: Any) -> Any:
        """Product of reduced residues, reduced."""
        p = np.multiply(a, b)
        return self.red(p, inplace=np.ndim(p) > 0)

    def pow(self, a: Any, e: int) -> Any:
        """``a^e`` elementwise (a reduced, e >= 0) by square-and-multiply; reduced."""
        result = None
        base = a
        while e:
            if e & 1:
                result = base if result is None else self.mulred(result, base)
            e >>= 1
            if e:
                base = self.mulred(base, base)
        if result is None:
            return np.ones_like(np.asarray(a, dtype=np.float64))
        return result

    def inverse(self, a: Any, ba: float) -> tuple[Any, int]:
        """Modular inverse ``a^(m-2)`` (0 for 0), reduced, and the number of zero elements."""
        a, _ = self.norm(a, ba)
        zeros = int(np.count_nonzero(np.asarray(a) == 0))
        return self.pow(a, self.m - 2), zeros

    def const(self, v: float) -> np.float64:
        """The exact rational ``Fraction(v)`` mod m."""
        f = Fraction(v)
        return self.scalar(f.numerator * pow(f.denominator, -1, self.m))


# ---- lazily computed q parts -----------------------------------------------------------------

class QCell:
    """A value mod q computed on demand from other cells (memoised; evaluated iteratively so
    long accumulator chains do not recurse). The value is an ``(array, bound)`` pair; ``fn``
    takes the dependencies' pairs and returns one. ``zero`` tells, once computed, whether a
    zero divisor was met on the way (``zero_check(*dep_pairs)`` says so for this step)."""

    __slots__ = ("_value", "_fn", "_deps", "_check", "zero")

    def __init__(self, fn: Callable[..., Any] | None = None, deps: tuple["QCell", ...] = (),
                 value: Any = None, zero: bool = False,
                 zero_check: Callable[..., bool] | None = None):
        self._value = value
        self._fn = fn
        self._deps = deps
        self._check = zero_check
        self.zero = zero

    @classmethod
    def ready(cls, value: Any, bound: float, zero: bool = False) -> "QCell":
        return cls(value=(value, bound), zero=zero)

    @property
    def forced(self) -> bool:
        return self._fn is None

    def get(self) -> tuple[Any, float]:
        if self._fn is None:
            return self._value
        stack = [self]
        while stack:
            cell = stack[-1]
            if cell._fn is None:
                stack.pop()
                continue
            pending = [d for d in cell._deps if d._fn is not None]
            if pending:
                stack.extend(pending)
                continue
            vals = [d._value for d in cell._deps]
            cell._value = cell._fn(*vals)
            cell.zero = any(d.zero for d in cell._deps) or \
                (cell._check is not None and bool(cell._check(*vals)))
            cell._fn = None
            cell._deps = ()
            cell._check = None
            stack.pop()
        return self._value


class FieldValue:
    """A tensor's value in the field: ``p`` (residues mod p, float64 integers, ``|p| <= pb``),
    ``q`` (a :class:`QCell` holding the residues mod q, or None when undefined -- an exp
    result), ``zero`` (whether a zero divisor was met computing the p part) and ``sel`` (for
    values that are maxima or minima, or hold some: kind -> uint64 array of the per-element
    multiset hash a further max / min of that kind builds on; elements that are no such value
    hold the hash of their own residue)."""

    __slots__ = ("p", "pb", "q", "zero", "sel")

    def __init__(self, p: Any, pb: float, q: QCell | None, zero: bool = False,
                 sel: dict[str, np.ndarray] | None = None):
        self.p = p
        self.pb = pb
        self.q = q
        self.zero = zero
        self.sel = sel

    @property
    def shape(self) -> tuple[int, ...]:
        return np.shape(self.p)

    @property
    def ndim(self) -> int:
        return np.ndim(self.p)

    def __repr__(self) -> str:
        return f"FieldValue(shape={self.shape}, q={'undefined' if self.q is None else 'defined'})"


# ---- per-test field parameters ---------------------------------------------------------------

def _seed(*parts: Any) -> np.random.SeedSequence:
    ent = [p if isinstance(p, int) else zlib.crc32(str(p).encode()) for p in parts]
    return np.random.SeedSequence([abs(int(e)) for e in ent])


_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(z: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser on uint64 arrays (wrapping arithmetic; NumPy warns about the wrap on
    0-d values only, so that warning is off)."""
    with np.errstate(over="ignore"):
        z = z ^ (z >> np.uint64(30))
        z = z * _M1
        z = z ^ (z >> np.uint64(27))
        z = z * _M2
        return z ^ (z >> np.uint64(31))


class FieldParams:
    """One test's field: primes p = 2q + 1, a generator g of the order-q subgroup drawn at
    random (so ``exp(c)`` for a constant c is random too), tables for ``g^k``, and the keys of
    the uninterpreted functions."""

    def __init__(self, p: int, seed: int = 0, test: int = 0):
        if (p - 1) % 2:
            raise ValueError(f"p = {p} is not a safe prime")
        self.p_int, self.q_int = p, (p - 1) // 2
        self.P, self.Q = Modulus(p), Modulus(self.q_int)
        self.seed, self.test = seed, test
        rng = np.random.default_rng(_seed(seed, test, "generator"))
        while True:
            h = int(rng.integers(2, p - 1))
            g = h * h % p  # quadratic residues: the subgroup of order q
            if g != 1:
                break
        self.g = g
        # g^k = t_lo[k & (step-1)] * t_hi[k >> shift]: two tables of about sqrt(q) entries
        self.shift = (self.q_int.bit_length() + 1) // 2
        self.step = 1 << self.shift
        # exponents are brought into [-q, 2q) by one floor step and shifted by q (g^q = 1)
        self.t_lo = self._powers(g, self.step)  # g^i, i < step
        self.t_hi = self._powers(pow(g, self.step, p), ((3 * self.q_int) >> self.shift) + 1)
        self._uf_keys: dict[str, tuple[np.uint64, np.uint64]] = {}

    def _powers(self, base: int, n: int) -> np.ndarray:
        arr = np.array([1.0])
        while arr.size < n:
            mult = float(self.P.scalar(pow(base, arr.size, self.p_int)))
            arr = np.concatenate([arr, self.P.mulred(arr, mult)])
        return arr[:n]

    def exp(self, xq: Any, bound: float) -> Any:
        """``g^(x mod q)`` for integer floats ``x`` (``|x| <= bound < 2^53``); returns residues
        mod p bounded by ``P.bound ** 2`` (a product of two table entries, not yet reduced).
        Big arrays go through in cache-sized pieces (about three times faster)."""
        x = np.ascontiguousarray(xq, dtype=np.float64)
        if x.size <= 2 * CHUNK:
            return self._exp(x)
        flat = x.reshape(-1)
        out = np.empty_like(flat)
        for s in range(0, flat.size, 2 * CHUNK):
            out[s:s + 2 * CHUNK] = self._exp(flat[s:s + 2 * CHUNK])
        return out.reshape(x.shape)

    def _exp(self, x: np.ndarray) -> np.ndarray:
        Q = self.Q
        t = np.multiply(x, Q.inv)
        np.floor(t, out=t)
        t *= Q.mf
        np.subtract(x, t, out=t)  # x mod q, give or take one q
        t += Q.mf
        i = t.astype(np.int64)  # in [0, 3q)
        lo = np.bitwise_and(i, self.step - 1)
        np.right_shift(i, self.shift, out=i)
        r = np.take(self.t_lo, lo)
        r *= np.take(self.t_hi, i)
        return r

    def uf_keys(self, name: str) -> tuple[np.uint64, np.uint64]:
        if name not in self._uf_keys:
            k = _seed(self.seed, self.test, "uf", name).generate_state(2, np.uint64)
            self._uf_keys[name] = (k[0], k[1])
        return self._uf_keys[name]

    def uf(self, name: str, xp: Any) -> tuple[Any, Any]:
        """Uninterpreted function ``name`` of balanced p residues -> (p part, q part)."""
        k1, k2 = self.uf_keys(name)
        x = np.asarray(self.P.canon(xp)).astype(np.uint64)
        h1 = _mix(x ^ k1)
        h2 = _mix(h1 ^ k2)
        # values drawn from the nonzero residues, so a function value is never a zero divisor
        vp = self.P.balanced((h1 % np.uint64(self.p_int - 1)).astype(np.float64) + 1.0)
        vq = self.Q.balanced((h2 % np.uint64(self.q_int - 1)).astype(np.float64) + 1.0)
        if np.ndim(xp) == 0:
            return np.float64(vp), np.float64(vq)
        return vp, vq

    def element_hash(self, kind: str, xp: Any) -> np.ndarray:
        """64-bit hash of each element's canonical p residue, keyed by test and ``kind`` (an
        element's contribution to the multiset hash of a max or min)."""
        k1, _ = self.uf_keys(f"select:{kind}")
        x = np.asarray(self.P.canon(xp)).astype(np.uint64)
        return _mix(x ^ k1)

    def select(self, kind: str, h: np.ndarray) -> tuple[Any, Any]:
        """The max / min (``kind``) of the multisets whose hashes are ``h``: fresh nonzero
        (p, q) residues, a random function of the hash."""
        _, k2 = self.uf_keys(f"select:{kind}")
        h1 = _mix(np.asarray(h, dtype=np.uint64) ^ k2)
        h2 = _mix(h1 ^ k2)
        vp = self.P.balanced((h1 % np.uint64(self.p_int - 1)).astype(np.float64) + 1.0)
        vq = self.Q.balanced((h2 % np.uint64(self.q_int - 1)).astype(np.float64) + 1.0)
        return vp, vq

    def __repr__(self) -> str:
        return f"FieldParams(p={self.p_int}, q={self.q_int}, g={self.g})"


# ---- random inputs ---------------------------------------------------------------------------

_CHUNK = 1 << 22
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="mirage-field-rng")
    return _POOL


def uniform_residues(mod: Modulus, shape: tuple[int, ...], ss: np.random.SeedSequence) -> np.ndarray:
    """Independent uniform residues (balanced) of ``shape``; big arrays are drawn in fixed
    chunks with their own child seeds on two threads, so the result does not depend on the
    thread count."""
    n = int(np.prod(shape, dtype=np.int64))
    out = np.empty(n, dtype=np.float64)
    half = float((mod.m - 1) // 2)

    def fill(lo: int, hi: int, child: np.random.SeedSequence) -> None:
        rng = np.random.Generator(np.random.SFC64(child))  # fast, passes BigCrush
        for s in range(lo, hi, CHUNK):  # cache-sized pieces: one trip to memory, not four
            seg = out[s:min(s + CHUNK, hi)]
            rng.random(out=seg)
            seg *= mod.mf
            np.floor(seg, out=seg)
            seg -= half

    bounds = list(range(0, n, _CHUNK)) or [0]
    children = ss.spawn(len(bounds))
    if len(bounds) == 1:
        fill(0, n, children[0])
    else:
        futs = [_pool().submit(fill, lo, min(lo + _CHUNK, n), c) for lo, c in zip(bounds, children)]
        for f in futs:
            f.result()
    return out.reshape(shape)


def random_input(params: FieldParams, name: str, shape: tuple[int, ...], seed: int,
                 test: int) -> FieldValue:
    """A fresh uniformly random input: p part drawn now, q part drawn when first needed (the
    two are independent, as for an integer drawn uniformly mod p*q)."""
    p = uniform_residues(params.P, shape, _seed(seed, test, "input", name, 0))
    q = QCell(lambda: (uniform_residues(params.Q, shape, _seed(seed, test, "input", name, 1)),
                       params.Q.bound))
    return FieldValue(p, params.P.bound, q)


def random_indices(name: str, shape: tuple[int, ...], bound: int, seed: int,
                   test: int) -> np.ndarray:
    """Known data of one test for an index input: valid indices drawn uniformly from
    ``[0, bound)`` (``bound``: the fewest rows of a table the input picks from), fresh per
    test like the field's other random choices."""
    rng = np.random.default_rng(_seed(seed, test, "indices", name, bound))
    return rng.integers(0, max(int(bound), 1), size=tuple(shape), dtype=np.int64)


# ---- the backend -----------------------------------------------------------------------------

class FieldBackend(Backend):
    """Interpreter / reference backend computing in the field of one test.

    Values are :class:`FieldValue`; zero divisors are recorded on the values they affect
    (``FieldValue.zero``, ``QCell.zero``), so whether an output depends on a division by zero
    is known however the value was computed (memoised kernels included).
    """

    name = "field"

    def __init__(self, params: FieldParams):
        self.params = params
        self.P, self.Q = params.P, params.Q
        self._consts: dict[float, FieldValue] = {}

    # values -------------------------------------------------------------------------------
    def input(self, value: Any, dtype: str) -> FieldValue:
        if _ops.is_index(dtype):  # token ids: known integers, drawn per test (random_indices)
            return self.index(value)
        if not isinstance(value, FieldValue):
            raise FieldValueError(f"field backend: {self.where or 'input'} must be a FieldValue, "
                                  f"got {type(value).__name__}")
        return value

    def data(self, array: np.ndarray) -> FieldValue:
        """Known integer data (a mask's 0/1 values), exact in both fields."""
        a = np.asarray(array, dtype=np.float64)
        return FieldValue(self.P.red(a), self.P.bound, QCell.ready(self.Q.red(a), self.Q.bound))

    def scalar(self, v: float) -> FieldValue:
        c = self._consts.get(v)
        if c is None:
            c = FieldValue(self.P.const(v), self.P.bound,
                           QCell.ready(self.Q.const(v), self.Q.bound))
            self._consts[v] = c
        return c

    # lifting helpers ------------------------------------------------------------------------
    @staticmethod
    def lazy_q(fn: Callable[..., Any], *args: FieldValue,
               zero_check: Callable[..., bool] | None = None) -> QCell | None:
        """The q part of an operation: ``fn`` maps the operands' (array, bound) pairs to one."""
        cells = tuple(a.q for a in args)
        if any(c is None for c in cells):
            return None
        return QCell(fn, cells, zero_check=zero_check)

    def lift(self, name: str, *args: FieldValue, **kw: Any) -> FieldValue:
        """Apply Modulus operation ``name`` to the p parts now and to the q parts lazily."""
        pop, qop = getattr(self.P, name), getattr(self.Q, name)
        flat = [v for a in args for v in (a.p, a.pb)]
        p, pb = pop(*flat, **kw)
        q = self.lazy_q(lambda *qs: qop(*[v for pair in qs for v in pair], **kw), *args)
        return FieldValue(p, pb, q, any(a.zero for a in args))

    # arithmetic -----------------------------------------------------------------------------
    def elementwise(self, op: str, args: list[Any],
                    attrs: dict[str, Any] | None = None) -> FieldValue:
        impl = _ops.OPS[op].field.get("compute") if op in _ops.OPS else None
        if impl is None:
            raise UnverifiableOperatorError(f"{self.where or op}: operator {op!r} has no "
                                           "finite-field semantics")
        return impl(self, *args, **(attrs or {}))

    def reduce(self, op: str, x: FieldValue, axes: tuple[int, ...], keepdims: bool) -> FieldValue:
        if op == "sum":
            return self.sum(x, axes, keepdims)
        h = np.sum(self.select_hash(op, x), axis=axes, keepdims=keepdims, dtype=np.uint64)
        return self.selected(op, h, x.zero)

    def matmul(self, a: FieldValue, b: FieldValue) -> FieldValue:
        return self.lift("matmul", a, b)

    def sum(self, x: FieldValue, axes: tuple[int, ...], keepdims: bool) -> FieldValue:
        return self.lift("sum", x, axes=axes, keepdims=keepdims)

    def divide(self, a: FieldValue, b: FieldValue) -> FieldValue:
        P, Q = self.P, self.Q
        inv, zeros = P.inverse(b.p, b.pb)
        p, pb = P.mul(a.p, a.pb, inv, P.bound)

        def qdiv(x: tuple[Any, float], y: tuple[Any, float]) -> tuple[Any, float]:
            return Q.mul(x[0], x[1], Q.inverse(y[0], y[1])[0], Q.bound)

        def qzero(x: tuple[Any, float], y: tuple[Any, float]) -> bool:
            return bool(np.any(np.remainder(y[0], Q.mf) == 0))

        return FieldValue(p, pb, self.lazy_q(qdiv, a, b, zero_check=qzero),
                          a.zero or b.zero or zeros > 0)

    def exp(self, a: FieldValue) -> FieldValue:
        if a.q is None:
            raise NestedExpError(f"{self.where or 'exp'}: exp of a value that already went "
                                 "through exp (nested exp is outside the Lax fragment)")
        xq, bq = a.q.get()
        return FieldValue(self.params.exp(xq, bq), self.P.bound ** 2, None, a.q.zero)

    def uninterpreted(self, name: str, a: FieldValue) -> FieldValue:
        vp, vq = self.params.uf(name, a.p)
        return FieldValue(vp, self.P.bound, QCell.ready(vq, self.Q.bound, a.zero), a.zero)

    # max and min: random functions of the multiset selected from ------------------------------
    def select_hash(self, kind: str, x: FieldValue) -> np.ndarray:
        """Per element, the multiset hash a max / min of ``kind`` builds on: the element's own
        multiset where it is such a selection already (flattening), else its residue's hash."""
        if x.sel is not None and kind in x.sel:
            return x.sel[kind]
        return np.asarray(self.params.element_hash(kind, x.p))

    def selected(self, kind: str, h: np.ndarray, zero: bool) -> FieldValue:
        h = np.asarray(h, dtype=np.uint64)
        vp, vq = self.params.select(kind, h)
        return FieldValue(vp, self.P.bound, QCell.ready(vq, self.Q.bound, zero), zero,
                          {kind: h})

    def select2(self, kind: str, a: FieldValue, b: FieldValue) -> FieldValue:
        """Elementwise maximum / minimum: the multiset of the two operands (broadcast)."""
        with np.errstate(over="ignore"):
            h = np.add(self.select_hash(kind, a), self.select_hash(kind, b), dtype=np.uint64)
        return self.selected(kind, h, a.zero or b.zero)

    # data movement --------------------------------------------------------------------------
    def layout(self, x: FieldValue, fn: Callable[[np.ndarray], np.ndarray]) -> FieldValue:
        q = None if x.q is None else QCell(lambda v: (fn(v[0]), v[1]), (x.q,))
        sel = None if x.sel is None else {k: fn(h) for k, h in x.sel.items()}
        return FieldValue(fn(x.p), x.pb, q, x.zero, sel)

    def combine(self, fn: Callable[[list[np.ndarray]], np.ndarray], xs: list[Any]) -> FieldValue:
        p = fn([x.p for x in xs])
        cells = tuple(x.q for x in xs)
        q = None if any(c is None for c in cells) else \
            QCell(lambda *vs: (fn([v[0] for v in vs]), max(v[1] for v in vs)), cells)
        kinds = sorted({k for x in xs if x.sel is not None for k in x.sel})
        sel = {k: fn([np.broadcast_to(self.select_hash(k, x), np.shape(x.p)) for x in xs])
               for k in kinds} or None
        return FieldValue(p, max(x.pb for x in xs), q, any(x.zero for x in xs), sel)

    # comparisons ----------------------------------------------------------------------------
    def canonical(self, x: FieldValue) -> np.ndarray:
        """The p part in canonical form ``[0, p)`` (what outputs are compared on)."""
        return np.asarray(self.P.canon(x.p))


# ---- the field column of the op table ----------------------------------------------------------

def _lifted(name: str, arity: int) -> Callable[..., FieldValue]:
    def impl(be: FieldBackend, *args: FieldValue) -> FieldValue:
        return be.lift(name, *args[:arity])
    impl.__name__ = f"field_{name}"
    return impl


def _uf(name: str) -> Callable[..., FieldValue]:
    def impl(be: FieldBackend, a: FieldValue, **attrs: Any) -> FieldValue:
        key = name if not attrs else \
            name + "(" + ",".join(f"{k}={attrs[k]!r}" for k in sorted(attrs)) + ")"
        return be.uninterpreted(key, a)
    impl.__name__ = f"field_uf_{name}"
    return impl


def _pow(be: FieldBackend, a: FieldValue, *, exponent: float) -> FieldValue:
    """Integer exponents exactly: square-and-multiply on lifted products (q parts lazily), then
    one division for a negative exponent; any other exponent is an uninterpreted function."""
    if _ops.lax_class("pow", {"exponent": exponent}) == "uf":
        return _uf("pow")(be, a, exponent=exponent)
    k = abs(int(exponent))
    result, base = None, a
    while k:
        if k & 1:
            result = base if result is None else be.lift("mul", result, base)
        k >>= 1
        if k:
            base = be.lift("mul", base, base)
    if result is None:  # x ** 0: ones of x's shape
        result = be.lift("add", be.lift("mul", a, be.scalar(0.0)), be.scalar(1.0))
    return be.divide(be.scalar(1.0), result) if exponent < 0 else result


def _where(be: FieldBackend, m: FieldValue, a: FieldValue, b: FieldValue) -> FieldValue:
    # exact for a 0/1 mask: b + m (a - b)
    return be.lift("add", b, be.lift("mul", m, be.lift("sub", a, b)))


FIELD_COMPUTE: dict[str, Callable[..., FieldValue]] = {
    "add": _lifted("add", 2), "sub": _lifted("sub", 2), "mul": _lifted("mul", 2),
    "div": lambda be, a, b: be.divide(a, b),
    "neg": _lifted("neg", 1), "square": _lifted("square", 1),
    "exp": lambda be, a: be.exp(a),
    "pow": _pow,
    "cast": lambda be, a, *, dtype: a,
    "where": _where,
    "maximum": lambda be, a, b: be.select2("max", a, b),
    "minimum": lambda be, a, b: be.select2("min", a, b),
    "matmul": lambda be, a, b, *, precision=None: be.matmul(a, b),  # exact: no rounding
    "sum": lambda be, a, *, axes, keepdims=False: be.sum(a, tuple(axes), keepdims),
    "max": lambda be, a, *, axes, keepdims=False: be.reduce("max", a, tuple(axes), keepdims),
    "min": lambda be, a, *, axes, keepdims=False: be.reduce("min", a, tuple(axes), keepdims),
    "reshape": lambda be, a, *, shape: be.layout(a, lambda x: x.reshape(shape)),
    "transpose": lambda be, a, *, perm: be.layout(a, lambda x: x.transpose(perm)),
    "slice": lambda be, a, **at: be.compute("slice", [a], at),
    "concat": lambda be, *xs, axis: be.concat(list(xs), axis),
    # rows picked by known indices: a data movement of the table's residues, exact
    "take": lambda be, table, ids: be.take(table, ids),
}


def register() -> None:
    """Fill the ``field`` slot of the shared op table: ``field["compute"](backend, *args,
    **attrs)``; uninterpreted operators (Lax class ``uf``) get ``field["uninterpreted"] = True``.
    Every operator but the leaves gets field semantics (leaves are inputs, constants and masks,
    which the walks give values directly)."""
    for name, spec in _ops.OPS.items():
        if name in FIELD_COMPUTE:
            spec.field["compute"] = FIELD_COMPUTE[name]
        elif spec.lax == "uf" and spec.elementwise:
            spec.field["compute"] = _uf(name)
            spec.field["uninterpreted"] = True
        elif spec.category != "leaf":
            raise UnverifiableOperatorError(f"operator {name!r} has no finite-field semantics")


register()


__all__ = ["SAFE_PRIMES", "Modulus", "QCell", "FieldValue", "FieldParams", "FieldBackend",
           "random_input", "random_indices", "uniform_residues", "register", "FIELD_COMPUTE"]
