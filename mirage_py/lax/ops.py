"""The operator vocabulary and its semantics: one table shared by every stage.

Each operator has one :class:`OpSpec` entry that says what kind of operator it is (elementwise,
matmul, reduction, shape change), how it sits in the Lax fragment, and how to compute it on NumPy
arrays. The program reference (:meth:`Program.evaluate`), the μGraph interpreter and the verifier
all compute through this table, so an operator means the same thing everywhere. The verifier adds
finite-field versions beside the float ones (``OpSpec.field``), keyed by the same names.

Lax classes (:func:`lax_class` gives a node's; ``pow`` depends on its exponent):

* ``multilinear`` -- sums and products of the inputs (add, sub, mul, neg, square, matmul, sum,
  reshape, transpose, slice, concat, where with a 0/1 mask, cast, constants, masks, ``pow`` with
  a small non-negative integer exponent): polynomials, so random testing over a field applies
  directly.
* ``div``         -- division (and ``pow`` with a negative integer exponent), computed with
  modular inverses in the field.
* ``exp``         -- exponentiation; Lax as long as it is not nested inside another exp.
* ``uf``          -- non-Lax elementwise functions (sqrt, silu, gelu, relu, sigmoid, tanh, log,
  sin, cos, ...). They split a program into Lax subprograms; the verifier can still treat them as
  uninterpreted functions (keyed by name and attributes).
* ``select``      -- the order-based operators max / min (reductions) and maximum / minimum
  (elementwise): non-Lax; the verifier models each as a random function of the *multiset* of
  values it selects from (docs/verifier.md), which keeps chunked maxima and softmax's shift
  invariance exact.

``uf`` and ``select`` results are *opaque*: fresh variables to the verifier, so an exp reached
through one is not nested in the exp below it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from .shapes import resolve

# dtypes a device tensor may have, with their storage size in bytes
DTYPES: dict[str, int] = {"float16": 2, "bfloat16": 2, "float32": 4, "int32": 4, "int64": 8}
#: the float dtypes: values every operator computes on
FLOAT_DTYPES: tuple[str, ...] = ("float16", "bfloat16", "float32")
#: the index dtypes: integer inputs (token ids, positions) that only ``take`` reads, as known
#: data (the verifier draws valid indices per test, as it computes masks)
INDEX_DTYPES: tuple[str, ...] = ("int32", "int64")


def is_index(dtype: str) -> bool:
    """Is ``dtype`` an index dtype (int32, int64)?"""
    return dtype in INDEX_DTYPES

#: integer exponents ``pow`` computes exactly in the field by repeated multiplication
EXACT_POW = 8

_erf = np.frompyfunc(math.erf, 1, 1)


def _gelu(x: np.ndarray, *, approximate: str = "none") -> np.ndarray:
    # exact (erf-based) GELU, the default of PyTorch; "tanh": its tanh approximation
    x = np.asarray(x)
    if approximate == "tanh":
        c = np.asarray(math.sqrt(2.0 / math.pi), dtype=x.dtype)
        return 0.5 * x * (1.0 + np.tanh(c * (x + np.asarray(0.044715, dtype=x.dtype) * x ** 3)))
    return 0.5 * x * (1.0 + np.asarray(_erf(x / math.sqrt(2.0)), dtype=x.dtype))


def _silu(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return x / (1.0 + np.exp(-x))


def _sigmoid(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _softplus(x: np.ndarray) -> np.ndarray:
    # log(1 + e^x) without overflow for large x
    return np.logaddexp(np.zeros((), dtype=np.asarray(x).dtype), x)


def _mish(x: np.ndarray) -> np.ndarray:
    return x * np.tanh(_softplus(x))


def _leaky_relu(x: np.ndarray, *, negative_slope: float) -> np.ndarray:
    x = np.asarray(x)
    return np.where(x >= 0, x, x * np.asarray(negative_slope, dtype=x.dtype))


def _clamp(x: np.ndarray, *, lo: float | None = None, hi: float | None = None) -> np.ndarray:
    x = np.asarray(x)
    if lo is not None:
        x = np.maximum(x, np.asarray(lo, dtype=x.dtype))
    if hi is not None:
        x = np.minimum(x, np.asarray(hi, dtype=x.dtype))
    return x


def _pow(x: np.ndarray, *, exponent: float) -> np.ndarray:
    x = np.asarray(x)
    if float(exponent).is_integer() and abs(exponent) <= EXACT_POW:
        return np.power(x, int(exponent)) if exponent >= 0 else 1.0 / np.power(x, -int(exponent))
    return np.power(x, np.asarray(exponent, dtype=x.dtype))


def _where(mask: np.ndarray, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.where(np.asarray(mask) != 0, a, b)


def _sum(x: np.ndarray, *, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.sum(x, axis=axes, keepdims=keepdims)


def _max(x: np.ndarray, *, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.max(x, axis=axes, keepdims=keepdims)


def _min(x: np.ndarray, *, axes: tuple[int, ...], keepdims: bool) -> np.ndarray:
    return np.min(x, axis=axes, keepdims=keepdims)


def _slice(x: np.ndarray, *, axis: int, start: int, stop: int) -> np.ndarray:
    key = (slice(None),) * axis + (slice(start, stop),)
    return np.asarray(x)[key]


def _concat(*xs: np.ndarray, axis: int) -> np.ndarray:
    return np.concatenate(xs, axis=axis)


def _shape_text(shape: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def check_indices(table_shape: tuple[int, ...], ids: np.ndarray, opname: str = "take") -> None:
    """Raise :class:`~mirage_py.errors.IndexRangeError` unless every index is in
    ``[0, table_shape[0])``, naming the operator, the table's shape and the first bad index."""
    from ..errors import IndexRangeError  # noqa: PLC0415 -- errors imports nothing of ours
    ids = np.asarray(ids)
    if ids.dtype.kind not in "iu":
        from ..errors import DTypeError  # noqa: PLC0415
        raise DTypeError(f"{opname}: indices {_shape_text(ids.shape)} have dtype {ids.dtype}; "
                         "an index tensor holds integers (int32 or int64)")
    n = table_shape[0]
    bad = (ids < 0) | (ids >= n)
    if np.any(bad):
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        raise IndexRangeError(f"{opname}: index {int(ids[where])} at position {where} of the "
                              f"indices {_shape_text(ids.shape)} is out of range for the table "
                              f"{_shape_text(tuple(table_shape))} (valid 0 .. {n - 1})")


def _take(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    # rows of ``table`` gathered by the integer ``ids``: shape ids.shape + table.shape[1:]
    table = np.asarray(table)
    check_indices(table.shape, ids)
    return table[np.asarray(ids, dtype=np.int64)]


def mask_values(shape: tuple[int, ...], *, offset: Any, window: Any = 0, valid: Any = None,
                sizes: Any = None) -> np.ndarray:
    """The 0/1 values of a position mask of ``shape`` (rows, cols): element (i, j) is 1 where
    ``d = j - i - offset`` satisfies ``d <= 0`` (causal: a query row sees keys up to its own
    position, shifted by ``offset``) and, with ``window > 0``, ``d > -window`` (sliding window:
    the last ``window`` keys), and, with ``valid = (rows_valid, cols_valid)``, ``i <
    rows_valid`` and ``j < cols_valid`` (the valid part of a tensor padded to a bucket, see
    lax/family.py). Leading dims, if any, repeat the same (rows, cols) pattern. Attributes may
    be expressions of dims (lax/shapes.py), resolved with ``sizes`` (dim name -> size)."""
    offset, window = resolve(offset, sizes or {}), resolve(window, sizes or {})
    rows, cols = shape[-2], shape[-1]
    d = np.arange(cols)[None, :] - np.arange(rows)[:, None] - offset
    keep = d <= 0
    if window > 0:
        keep &= d > -window
    if valid is not None:
        rv, cv = resolve(tuple(valid), sizes or {})
        keep &= (np.arange(rows)[:, None] < rv) & (np.arange(cols)[None, :] < cv)
    return np.broadcast_to(keep.astype(np.float64), shape)


def _pow_class(attrs: dict[str, Any]) -> str:
    e = float(attrs["exponent"])
    if not e.is_integer() or abs(e) > EXACT_POW:
        return "uf"
    return "multilinear" if e >= 0 else "div"


@dataclass(frozen=True)
class OpSpec:
    """One operator: its category, Lax class and float semantics.

    ``compute(*arrays, **attrs)`` evaluates it on NumPy arrays in whatever float dtype they have.
    ``attrs`` names the attributes a node of this operator carries (``optional`` those that may
    be left out: a gelu without ``approximate`` is the exact one). ``classify(attrs)``, where
    given, gives the Lax class of a node from its attributes (``pow``). ``cost``: what the cost
    model charges per element -- the arithmetic operations and function calls of the emitted
    CUDA expression (``expf`` is one, ``silu`` a negation, an ``expf``, an add and a division
    counted as three; uncalibrated). ``field`` is filled by
    :mod:`mirage_py.verifier.field` (``register()``, run when the verifier is imported) with the
    finite-field version: ``field["compute"](backend, *values, **attrs)`` on field values, and
    ``field["uninterpreted"] = True`` for the non-Lax elementwise operators, which the field
    models as random functions (docs/verifier.md).
    """

    name: str
    # "leaf", "unary", "binary", "ternary", "matmul", "reduce", "shape", "concat", "gather"
    category: str
    lax: str  # "multilinear", "div", "exp", "uf", "select"
    compute: Callable[..., np.ndarray] | None
    symbol: str = ""  # infix symbol for printing binary ops
    attrs: tuple[str, ...] = ()
    optional: tuple[str, ...] = ()
    classify: Callable[[dict[str, Any]], str] | None = None
    cost: int = 1
    field: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    @property
    def elementwise(self) -> bool:
        return self.category in ("unary", "binary", "ternary")

    @property
    def arity(self) -> int | None:
        """Operands a node takes (None: any number, as concat)."""
        return {"leaf": 0, "unary": 1, "binary": 2, "ternary": 3, "matmul": 2, "reduce": 1,
                "shape": 1, "gather": 2}.get(self.category)

    @property
    def is_lax(self) -> bool:
        return self.lax not in ("uf", "select")

    @property
    def opaque(self) -> bool:
        """The verifier gives results fresh values (an exp through one is not nested)."""
        return self.lax in ("uf", "select")


def lax_class(op: str, attrs: dict[str, Any] | tuple = ()) -> str:
    """The Lax class of a node of ``op`` with ``attrs`` (``pow``'s depends on its exponent)."""
    s = OPS[op]
    if s.classify is None:
        return s.lax
    return s.classify(dict(attrs))


def _table(*specs: OpSpec) -> dict[str, OpSpec]:
    return {s.name: s for s in specs}


_RED = ("axes", "keepdims")

OPS: dict[str, OpSpec] = _table(
    OpSpec("input", "leaf", "multilinear", None, attrs=("name",)),
    OpSpec("const", "leaf", "multilinear", None, attrs=("value",)),
    # a 0/1 position mask (causal, sliding window): known data, exact in the field
    OpSpec("mask", "leaf", "multilinear", None, attrs=("offset", "window", "valid"),
           optional=("valid",)),
    # unary elementwise
    OpSpec("neg", "unary", "multilinear", np.negative),
    OpSpec("square", "unary", "multilinear", np.square),
    OpSpec("exp", "unary", "exp", np.exp),
    OpSpec("sqrt", "unary", "uf", np.sqrt),
    OpSpec("silu", "unary", "uf", _silu, cost=3),
    OpSpec("gelu", "unary", "uf", _gelu, attrs=("approximate",), optional=("approximate",),
           cost=4),
    OpSpec("relu", "unary", "uf", lambda x: np.maximum(x, 0)),
    OpSpec("sigmoid", "unary", "uf", _sigmoid, cost=3),
    OpSpec("tanh", "unary", "uf", np.tanh),
    # rotary embeddings' tables from positions: sinf / cosf with full range reduction (positions
    # times frequencies reach thousands of radians), counted as a few operations each
    OpSpec("sin", "unary", "uf", np.sin, cost=4),
    OpSpec("cos", "unary", "uf", np.cos, cost=4),
    OpSpec("log", "unary", "uf", np.log),
    OpSpec("abs", "unary", "uf", np.abs),
    OpSpec("softplus", "unary", "uf", _softplus, cost=5),
    OpSpec("mish", "unary", "uf", _mish, cost=7),
    OpSpec("leaky_relu", "unary", "uf", _leaky_relu, attrs=("negative_slope",),
           cost=2),
    OpSpec("clamp", "unary", "uf", _clamp, attrs=("lo", "hi"), optional=("lo", "hi"), cost=2),
    OpSpec("pow", "unary", "uf", _pow, attrs=("exponent",), classify=_pow_class, cost=2),
    # storage rounding to another dtype: the identity on values (the float64 reference and the
    # field), a rounding in the interpreter's "gpu" precision
    OpSpec("cast", "unary", "multilinear", lambda x, *, dtype: np.asarray(x), attrs=("dtype",)),
    # binary elementwise, numpy broadcasting
    OpSpec("add", "binary", "multilinear", np.add, "+"),
    OpSpec("sub", "binary", "multilinear", np.subtract, "-"),
    OpSpec("mul", "binary", "multilinear", np.multiply, "*"),
    OpSpec("div", "binary", "div", np.divide, "/"),
    OpSpec("maximum", "binary", "select", np.maximum),
    OpSpec("minimum", "binary", "select", np.minimum),
    # where(mask, a, b): a where the 0/1 mask is 1, else b
    OpSpec("where", "ternary", "multilinear", _where),
    # contractions and reductions
    # precision: what a float32 matmul may lose for speed (lax/precision.py); the float
    # semantics are the product itself
    OpSpec("matmul", "matmul", "multilinear", lambda a, b, *, precision=None: np.matmul(a, b),
           "@", attrs=("precision",), optional=("precision",)),
    OpSpec("sum", "reduce", "multilinear", _sum, attrs=_RED),
    OpSpec("max", "reduce", "select", _max, attrs=_RED),
    OpSpec("min", "reduce", "select", _min, attrs=_RED),
    # element-order-preserving shape changes and data movement
    OpSpec("reshape", "shape", "multilinear", lambda x, *, shape: np.reshape(x, shape),
           attrs=("shape",)),
    OpSpec("transpose", "shape", "multilinear", lambda x, *, perm: np.transpose(x, perm),
           attrs=("perm",)),
    OpSpec("slice", "shape", "multilinear", _slice, attrs=("axis", "start", "stop")),
    OpSpec("concat", "concat", "multilinear", _concat, attrs=("axis",)),
    # take(table, ids): rows of a (V, ...) table gathered by an integer index tensor of any
    # shape (an embedding lookup); the indices are known data, so the result is linear in the
    # table (a data movement chosen per test by the indices: exact in the field)
    OpSpec("take", "gather", "multilinear", _take, cost=0),
)

UNARY_OPS = tuple(n for n, s in OPS.items() if s.category == "unary")
BINARY_OPS = tuple(n for n, s in OPS.items() if s.category == "binary")
REDUCE_OPS = tuple(n for n, s in OPS.items() if s.category == "reduce")


def spec(name: str) -> OpSpec:
    """The table entry for ``name``; a KeyError here is a bug, not user input."""
    return OPS[name]


def compute(op: str, args: list[np.ndarray], attrs: dict[str, Any]) -> np.ndarray:
    """Evaluate one operator on float arrays (errors from inf/nan are the caller's to check)."""
    s = OPS[op]
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        return s.compute(*args, **attrs)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    # round-to-nearest-even from float32 to bfloat16, kept in float32
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32)
    out = rounded.view(np.float32)
    return np.where(np.isnan(f), f, out)


def round_tf32(x: np.ndarray) -> np.ndarray:
    """Round float32 values to TF32 (10 mantissa bits, float32's exponent) as ``cvt.rna.tf32.f32``
    does: to nearest, ties away from zero; returned as float32."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    rounded = ((bits.astype(np.uint64) + 0x1000) & 0xFFFFE000).astype(np.uint32)
    return np.where(np.isfinite(f), rounded.view(np.float32), f)


def storage_round(x: np.ndarray, dtype: str) -> np.ndarray:
    """Round float values to what a device tensor of ``dtype`` stores, returned as float32
    (an index tensor's integers are returned as int64, unchanged)."""
    if dtype in INDEX_DTYPES:
        return np.asarray(x, dtype=np.int64)
    with np.errstate(over="ignore", invalid="ignore"):
        if dtype == "float16":
            x = np.asarray(x)  # float16 data is stored as it is
            return (x if x.dtype == np.float16 else x.astype(np.float16)).astype(np.float32)
        if dtype == "bfloat16":
            return _round_bf16(np.asarray(x, dtype=np.float32))
        if dtype == "float32":
            return np.asarray(x, dtype=np.float32)
    raise KeyError(dtype)
