"""Tensors of a program: immutable, hashable expression nodes with inferred shapes and dtypes.

A :class:`Tensor` is one node of the program DAG: an operator name from the shared table
(:mod:`mirage_py.lax.ops`), its operand tensors, its attributes, and the shape and dtype that were
inferred when the operator was applied. Nodes are never mutated. Each carries a ``digest``, a
SHA-256 of its structure (operator, attributes, shape, dtype and the operands' digests), which
gives structural equality and a hash that is the same in every process.

The operator functions here (``matmul``, ``exp``, ``sum``, ``rms_norm``, ...) check their operands
and raise :class:`~mirage_py.errors.ShapeError` / :class:`~mirage_py.errors.DTypeError` with a
message that names the operator and the shapes.
"""

from __future__ import annotations

import builtins
import hashlib
import math
import json
import numbers
from typing import Any, Iterable, Sequence

from ..errors import DTypeError, ProgramError, ShapeError
from .ops import DTYPES, EXACT_POW, FLOAT_DTYPES, INDEX_DTYPES, OPS
from .precision import Float32Matmul
from .shapes import Affine, Dim, is_size, json_size, symbolic


def _fmt(shape: Sequence[int]) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _attr_value(v: Any) -> Any:
    # attributes must be hashable and JSON-representable: tuples of ints, ints, floats, bools, str
    if isinstance(v, list):
        return tuple(_attr_value(x) for x in v)
    return v


class Tensor:
    """One node of a tensor program. Build them with ``Program.input`` and the operators."""

    __slots__ = ("op", "inputs", "attrs", "shape", "dtype", "digest", "_hash")

    # make NumPy defer to our reflected operators (``array + tensor`` raises a clear error
    # instead of building an object array of Tensors)
    __array_ufunc__ = None

    def __init__(self, op: str, inputs: tuple["Tensor", ...], attrs: dict[str, Any],
                 shape: tuple[int, ...], dtype: str):
        _check_index_use(op, inputs, shape)
        self.op = op
        self.inputs = tuple(inputs)
        self.attrs = tuple(sorted((k, _attr_value(v)) for k, v in attrs.items()))
        self.shape = tuple(d if isinstance(d, Dim) else int(d) for d in shape)
        self.dtype = dtype
        key = json.dumps([op, [[k, _json_attr(v)] for k, v in self.attrs],
                          [json_size(d) for d in self.shape], dtype,
                          [t.digest for t in self.inputs]], separators=(",", ":"))
        self.digest = hashlib.sha256(key.encode()).hexdigest()
        self._hash = int(self.digest[:16], 16)

    # -- identity -------------------------------------------------------------------------------
    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:  # structural equality
        return isinstance(other, Tensor) and other.digest == self.digest

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, "_hash"):
            raise AttributeError("Tensor is immutable")
        object.__setattr__(self, name, value)

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    @property
    def attr_dict(self) -> dict[str, Any]:
        return dict(self.attrs)

    @property
    def name(self) -> str | None:
        """The input name for program inputs, else None."""
        return self.attr("name") if self.op == "input" else None

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        if symbolic(self.shape):
            raise ShapeError(f"{self.op} {_fmt(self.shape)}: a tensor with symbolic dims has no "
                             "fixed number of elements; bind its dims first (Program.at)")
        return math.prod(self.shape)

    @property
    def symbolic(self) -> bool:
        """Does a dim of this tensor take its size from a :class:`Dim`?"""
        return symbolic(self.shape)

    def __repr__(self) -> str:
        if self.op == "input":
            return f"Tensor(input {self.name!r}, shape={_fmt(self.shape)}, dtype={self.dtype})"
        return f"Tensor({self.op}, shape={_fmt(self.shape)}, dtype={self.dtype})"

    # -- operators ------------------------------------------------------------------------------
    def __matmul__(self, other: Any) -> "Tensor":
        return matmul(self, other)

    def __rmatmul__(self, other: Any) -> "Tensor":
        return matmul(other, self)

    def __add__(self, other: Any) -> "Tensor":
        return _binary("add", self, other)

    def __radd__(self, other: Any) -> "Tensor":
        return _binary("add", other, self)

    def __sub__(self, other: Any) -> "Tensor":
        return _binary("sub", self, other)

    def __rsub__(self, other: Any) -> "Tensor":
        return _binary("sub", other, self)

    def __mul__(self, other: Any) -> "Tensor":
        return _binary("mul", self, other)

    def __rmul__(self, other: Any) -> "Tensor":
        return _binary("mul", other, self)

    def __truediv__(self, other: Any) -> "Tensor":
        return _binary("div", self, other)

    def __rtruediv__(self, other: Any) -> "Tensor":
        return _binary("div", other, self)

    def __neg__(self) -> "Tensor":
        return _unary("neg", self)

    def __pow__(self, exponent: Any) -> "Tensor":
        return pow(self, exponent)

    def __rpow__(self, base: Any) -> "Tensor":
        raise ShapeError(f"pow: the exponent must be a constant number, got a tensor "
                         f"{_fmt(self.shape)} (base {base!r})")

    def __abs__(self) -> "Tensor":
        return _unary("abs", self)

    def __getitem__(self, key: Any) -> "Tensor":
        return getitem(self, key)

    def __pos__(self) -> "Tensor":
        return self

    def __bool__(self) -> bool:
        raise TypeError("a symbolic Tensor has no truth value")

    @property
    def T(self) -> "Tensor":
        return transpose(self)


def _check_index_use(op: str, inputs: Sequence["Tensor"], shape: tuple[int, ...]) -> None:
    """Index tensors (int32 / int64: token ids, positions) are program inputs that only
    ``take`` reads, as its second operand; every other use is a float operator meeting one."""
    for k, t in enumerate(inputs):
        if t.dtype in INDEX_DTYPES and not (op == "take" and k == 1):
            others = ", ".join(f"{_fmt(u.shape)} {u.dtype}" for u in inputs)
            raise DTypeError(f"{op}: operand {k} is an index tensor {_fmt(t.shape)} {t.dtype}, "
                             f"but {op} computes on floats (operands {others}; index tensors "
                             "only select rows, as the indices of mp.take)")


def _json_attr(v: Any) -> Any:
    if isinstance(v, float):
        return {"f": repr(v)}  # exact, and distinguishes 1.0 from 1
    if isinstance(v, tuple):
        return [_json_attr(x) for x in v]
    if isinstance(v, (Dim, Affine)):
        return json_size(v)
    return v


# ---- construction helpers ---------------------------------------------------------------------

def make_input(name: str, shape: Sequence[int], dtype: str) -> Tensor:
    if not isinstance(name, str) or not name.isidentifier():
        raise ProgramError(f"input: name {name!r} must be a Python identifier")
    try:
        dims = tuple(shape)
    except TypeError:
        raise ShapeError(f"input {name!r}: shape {shape!r} is not a sequence of ints") from None
    if not isinstance(dtype, str) or dtype not in DTYPES:
        raise DTypeError(f"input {name!r} {shape!r}: dtype {dtype!r} is not supported "
                         f"(choose one of {', '.join(DTYPES)})")
    # () is a scalar: partition parts receive 0-d values (a full sum, say) as inputs
    if not all(is_size(d) for d in dims):
        raise ShapeError(f"input {name!r}: shape {shape!r} must be a tuple of positive ints "
                         "and dims (mp.dim)")
    return Tensor("input", (), {"name": name}, dims, dtype)


def const(value: float, dtype: str = "float32") -> Tensor:
    """A scalar constant (shape ``()``); Python numbers in expressions become these."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ShapeError(f"const: value {value!r} is not a real number")
    if dtype not in FLOAT_DTYPES:
        raise DTypeError(f"const: dtype {dtype!r} is not supported for a constant "
                         f"(choose one of {', '.join(FLOAT_DTYPES)}; a number meeting an index "
                         "tensor in an expression lands here: index tensors only feed mp.take)")
    v = float(value)
    if v != v or v in (float("inf"), float("-inf")):
        raise ShapeError(f"const: value {value!r} must be finite")
    return Tensor("const", (), {"value": v}, (), dtype)


def _as_tensor(x: Any, like: Tensor, opname: str) -> Tensor:
    if isinstance(x, Tensor):
        return x
    if isinstance(x, numbers.Real) and not isinstance(x, bool):
        return const(float(x), like.dtype)
    raise ShapeError(f"{opname}: operand of type {type(x).__name__} is neither a Tensor nor a "
                     "Python number")


def _check_tensor(x: Any, opname: str) -> Tensor:
    if not isinstance(x, Tensor):
        raise ShapeError(f"{opname}: expected a Tensor, got {type(x).__name__}")
    return x


def _neutral(t: Tensor) -> bool:
    # constants and masks hold values every dtype stores exactly: they take the other side's
    return t.op in ("const", "mask")


def _result_dtype(opname: str, a: Tensor, b: Tensor) -> str:
    if _neutral(a):
        return b.dtype
    if _neutral(b) or a.dtype == b.dtype:
        return a.dtype
    if "float32" in (a.dtype, b.dtype):
        return "float32"
    raise DTypeError(f"{opname}: cannot combine {a.dtype} {_fmt(a.shape)} with {b.dtype} "
                     f"{_fmt(b.shape)}; cast explicitly (float16 and bfloat16 do not mix)")


def broadcast_shapes(opname: str, *shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy broadcasting, with an error that names the operator and the shapes."""
    nd = max(len(s) for s in shapes)
    out = []
    for i in range(nd):
        dims = {s[len(s) - nd + i] for s in shapes if len(s) - nd + i >= 0} - {1}
        if len(dims) > 1:
            raise ShapeError(f"{opname}: shapes {' and '.join(_fmt(s) for s in shapes)} do not "
                             "broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def _unary(op: str, x: Any) -> Tensor:
    x = _check_tensor(x, op)
    return Tensor(op, (x,), {}, x.shape, x.dtype)


def _binary(op: str, a: Any, b: Any) -> Tensor:
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise ShapeError(f"{op}: at least one operand must be a Tensor")
    a = _as_tensor(a, b if isinstance(b, Tensor) else a, op)
    b = _as_tensor(b, a, op)
    dtype = _result_dtype(op, a, b)
    shape = broadcast_shapes(op, a.shape, b.shape)
    return Tensor(op, (a, b), {}, shape, dtype)


# ---- public operator functions ----------------------------------------------------------------

def add(a: Any, b: Any) -> Tensor:
    return _binary("add", a, b)


def sub(a: Any, b: Any) -> Tensor:
    return _binary("sub", a, b)


def mul(a: Any, b: Any) -> Tensor:
    return _binary("mul", a, b)


def div(a: Any, b: Any) -> Tensor:
    return _binary("div", a, b)


def neg(x: Tensor) -> Tensor:
    return _unary("neg", x)


def exp(x: Tensor) -> Tensor:
    """Elementwise e**x (Lax unless nested inside another exp)."""
    return _unary("exp", x)


def sqrt(x: Tensor) -> Tensor:
    """Elementwise square root (non-Lax)."""
    return _unary("sqrt", x)


def square(x: Tensor) -> Tensor:
    """Elementwise x*x."""
    return _unary("square", x)


def silu(x: Tensor) -> Tensor:
    """Elementwise x * sigmoid(x) (non-Lax)."""
    return _unary("silu", x)


def gelu(x: Tensor, approximate: str = "none") -> Tensor:
    """Elementwise GELU (non-Lax): exact (erf), or its tanh approximation with
    ``approximate="tanh"`` (as ``torch.nn.functional.gelu``)."""
    x = _check_tensor(x, "gelu")
    if approximate not in ("none", "tanh"):
        raise ShapeError(f"gelu: approximate must be 'none' or 'tanh', got {approximate!r} "
                         f"(input {_fmt(x.shape)})")
    return Tensor("gelu", (x,), {"approximate": "tanh"} if approximate == "tanh" else {}, x.shape,
                  x.dtype)


def relu(x: Tensor) -> Tensor:
    """Elementwise max(x, 0) (non-Lax)."""
    return _unary("relu", x)


def sigmoid(x: Tensor) -> Tensor:
    """Elementwise 1 / (1 + e^-x) (non-Lax)."""
    return _unary("sigmoid", x)


def tanh(x: Tensor) -> Tensor:
    """Elementwise hyperbolic tangent (non-Lax)."""
    return _unary("tanh", x)


def sin(x: Tensor) -> Tensor:
    """Elementwise sine, radians (non-Lax)."""
    return _unary("sin", x)


def cos(x: Tensor) -> Tensor:
    """Elementwise cosine, radians (non-Lax)."""
    return _unary("cos", x)


def log(x: Tensor) -> Tensor:
    """Elementwise natural logarithm (non-Lax)."""
    return _unary("log", x)


def abs(x: Tensor) -> Tensor:  # noqa: A001
    """Elementwise absolute value (non-Lax)."""
    return _unary("abs", x)


def softplus(x: Tensor) -> Tensor:
    """Elementwise log(1 + e^x), computed without overflow (non-Lax)."""
    return _unary("softplus", x)


def mish(x: Tensor) -> Tensor:
    """Elementwise x * tanh(softplus(x)) (non-Lax)."""
    return _unary("mish", x)


def _number(opname: str, name: str, v: Any, x: Tensor) -> float:
    if not isinstance(v, numbers.Real) or isinstance(v, bool) or not math.isfinite(float(v)):
        raise ShapeError(f"{opname}: {name} must be a finite number, got {v!r} "
                         f"(input {_fmt(x.shape)})")
    return float(v)


def leaky_relu(x: Tensor, negative_slope: float = 0.01) -> Tensor:
    """Elementwise x for x >= 0, ``negative_slope * x`` below (non-Lax)."""
    x = _check_tensor(x, "leaky_relu")
    slope = _number("leaky_relu", "negative_slope", negative_slope, x)
    return Tensor("leaky_relu", (x,), {"negative_slope": slope}, x.shape, x.dtype)


def clamp(x: Tensor, min: float | None = None, max: float | None = None) -> Tensor:  # noqa: A002
    """Elementwise ``min(max(x, min), max)``; either bound may be None (non-Lax)."""
    x = _check_tensor(x, "clamp")
    attrs = {}
    if min is not None:
        attrs["lo"] = _number("clamp", "min", min, x)
    if max is not None:
        attrs["hi"] = _number("clamp", "max", max, x)
    if not attrs:
        raise ShapeError(f"clamp: give min, max or both (input {_fmt(x.shape)})")
    if "lo" in attrs and "hi" in attrs and attrs["lo"] > attrs["hi"]:
        raise ShapeError(f"clamp: min {min!r} is greater than max {max!r} (input "
                         f"{_fmt(x.shape)})")
    return Tensor("clamp", (x,), attrs, x.shape, x.dtype)


def hardtanh(x: Tensor, min_val: float = -1.0, max_val: float = 1.0) -> Tensor:
    """``clamp(x, min_val, max_val)`` (recorded as clamp)."""
    return clamp(x, min_val, max_val)


def pow(x: Tensor, exponent: float) -> Tensor:  # noqa: A001
    """Elementwise ``x ** exponent`` for a constant exponent. Integer exponents up to
    ``EXACT_POW`` in magnitude are Lax (products, or a division for negative ones); other
    exponents are uninterpreted."""
    x = _check_tensor(x, "pow")
    if isinstance(exponent, Tensor):
        raise ShapeError(f"pow: the exponent must be a constant number, got a tensor "
                         f"{_fmt(exponent.shape)} (base {_fmt(x.shape)})")
    e = _number("pow", "exponent", exponent, x)
    if e == 1.0:
        return x
    return Tensor("pow", (x,), {"exponent": e}, x.shape, x.dtype)


def cast(x: Tensor, dtype: str) -> Tensor:
    """The same values stored as ``dtype`` (a rounding in GPU precision; the identity in the
    float64 reference and for the verifier)."""
    x = _check_tensor(x, "cast")
    if not isinstance(dtype, str) or dtype not in FLOAT_DTYPES:
        raise DTypeError(f"cast: dtype {dtype!r} is not supported (choose one of "
                         f"{', '.join(FLOAT_DTYPES)}; input {_fmt(x.shape)} {x.dtype})")
    if dtype == x.dtype:
        return x
    return Tensor("cast", (x,), {"dtype": dtype}, x.shape, dtype)


def take(table: Any, ids: Any) -> Tensor:
    """Embedding lookup: the rows of ``table`` (``(V, D)``, or any rank >= 1: rows along its
    first dim) picked by the integer index tensor ``ids`` (an int32 / int64 program input of any
    shape), giving ``ids.shape + table.shape[1:]`` in the table's dtype -- ``table[ids]`` in
    NumPy, ``torch.nn.functional.embedding(ids, table)``. An index outside ``[0, V)`` raises
    :class:`~mirage_py.errors.IndexRangeError` when the program runs."""
    table = _check_tensor(table, "take")
    ids = _check_tensor(ids, "take")
    if table.dtype in INDEX_DTYPES:
        raise DTypeError(f"take: the table {_fmt(table.shape)} is an index tensor "
                         f"({table.dtype}); it must hold floats (indices {_fmt(ids.shape)} "
                         f"{ids.dtype})")
    if ids.dtype not in INDEX_DTYPES:
        raise DTypeError(f"take: the indices {_fmt(ids.shape)} are {ids.dtype}; they must be an "
                         f"index tensor (a program input of dtype int32 or int64) to pick rows "
                         f"of the table {_fmt(table.shape)} {table.dtype}")
    if table.ndim < 1:
        raise ShapeError(f"take: the table must have at least one dim (its rows), got "
                         f"{_fmt(table.shape)} (indices {_fmt(ids.shape)})")
    if table.op in ("const", "mask"):
        raise ShapeError(f"take: the table {_fmt(table.shape)} is a {table.op}; gather rows of "
                         "a tensor")
    return Tensor("take", (table, ids), {}, tuple(ids.shape) + tuple(table.shape[1:]),
                  table.dtype)


def maximum(a: Any, b: Any) -> Tensor:
    """Elementwise maximum with NumPy broadcasting (non-Lax: an order-based selection)."""
    return _binary("maximum", a, b)


def minimum(a: Any, b: Any) -> Tensor:
    """Elementwise minimum with NumPy broadcasting (non-Lax: an order-based selection)."""
    return _binary("minimum", a, b)


# ---- masks ------------------------------------------------------------------------------------

def _expr(opname: str, name: str, v: Any, where: str) -> int | Affine:
    """An int, or an :class:`Affine` expression of dims with at least one dim."""
    if isinstance(v, numbers.Integral) and not isinstance(v, bool):
        return int(v)
    if isinstance(v, (Dim, Affine)):
        a = Affine.of(v)
        return a if a.terms else a.const
    raise ShapeError(f"{opname}: {name} must be an int or an expression of dims, got {v!r} "
                     f"({where})")


def _mask(opname: str, rows: Any, cols: Any, offset: Any, window: Any) -> Tensor:
    for name, v in (("rows", rows), ("cols", cols)):
        if not is_size(v):
            raise ShapeError(f"{opname}: {name} must be a positive int or a dim, got {v!r}")
    where = f"mask ({rows}, {cols})"
    if offset is None:
        offset = Affine.of(cols) - rows
    offset = _expr(opname, "offset", offset, where)
    window = _expr(opname, "window", window, where)
    return Tensor("mask", (), {"offset": offset, "window": window}, (rows, cols), "float16")


def causal_mask(rows: Any, cols: Any, offset: Any = None) -> Tensor:
    """A (rows, cols) 0/1 mask: row i (a query) sees column j (a key) when
    ``j <= i + offset``. ``offset`` defaults to ``cols - rows``: the queries are the last
    ``rows`` positions of a sequence of ``cols`` (a prefill has rows == cols and offset 0).
    Sizes may be dims and the offset an expression of them (``offset=S - T``). Masks are known
    data: the verifier evaluates them exactly."""
    return _mask("causal_mask", rows, cols, offset, 0)


def sliding_window_mask(rows: Any, cols: Any, window: Any, offset: Any = None) -> Tensor:
    """A causal mask that also hides keys more than ``window - 1`` positions back: row i sees
    column j when ``i + offset - window < j <= i + offset``."""
    if (isinstance(window, numbers.Integral) and not isinstance(window, bool) and window < 1) \
            or not isinstance(window, (numbers.Integral, Dim, Affine)) or isinstance(window, bool):
        raise ShapeError(f"sliding_window_mask: window must be a positive int, got {window!r} "
                         f"(mask ({rows}, {cols}))")
    return _mask("sliding_window_mask", rows, cols, offset, window)


def valid_mask(rows: Any, cols: Any, rows_valid: Any, cols_valid: Any) -> Tensor:
    """A (rows, cols) 0/1 mask that is 1 on the first ``rows_valid`` rows and ``cols_valid``
    columns: the valid part of values padded to a bucket's size (lax/family.py); the valid
    sizes are usually expressions of dims, known when the program runs."""
    m = _mask("valid_mask", rows, cols, cols, 0)  # no causal limit: j - i - cols <= 0 always
    valid = (_expr("valid_mask", "rows_valid", rows_valid, f"mask ({rows}, {cols})"),
             _expr("valid_mask", "cols_valid", cols_valid, f"mask ({rows}, {cols})"))
    return Tensor("mask", (), {**m.attr_dict, "valid": valid}, m.shape, m.dtype)


def mask_from_attrs(shape: Sequence[int], attrs: dict[str, Any]) -> Tensor:
    """Rebuild a mask leaf (deserialization, binding dims)."""
    shape = tuple(shape)
    if len(shape) != 2:
        raise ShapeError(f"mask: shape {shape!r} must be (rows, cols)")
    window = attrs.get("window", 0)
    if window:
        m = sliding_window_mask(shape[0], shape[1], window, attrs["offset"])
    else:
        m = causal_mask(shape[0], shape[1], attrs["offset"])
    if attrs.get("valid") is not None:
        where = f"mask {_fmt(shape)}"
        valid = tuple(_expr("mask", "valid", v, where) for v in attrs["valid"])
        return Tensor("mask", (), {**m.attr_dict, "valid": valid}, m.shape, m.dtype)
    return m


def where(mask: Any, a: Any, b: Any) -> Tensor:
    """``a`` where ``mask`` is 1, ``b`` where it is 0 (NumPy broadcasting of all three). The
    mask must be a position mask (:func:`causal_mask`, :func:`sliding_window_mask`); ``a`` and
    ``b`` may be Python numbers. Use a finite fill such as -1e9 to hide scores before a softmax
    (the field verifier has no -inf), or multiply ``exp(s) * mask`` after the exp."""
    if not isinstance(mask, Tensor) or mask.op != "mask":
        what = f"a tensor made by {mask.op} {_fmt(mask.shape)}" if isinstance(mask, Tensor) \
            else type(mask).__name__
        raise ShapeError(f"where: the condition must be a mask (mp.causal_mask, "
                         f"mp.sliding_window_mask), got {what}")
    if not isinstance(a, Tensor) and not isinstance(b, Tensor):
        raise ShapeError(f"where: at least one of the values must be a Tensor (mask "
                         f"{_fmt(mask.shape)})")
    like = a if isinstance(a, Tensor) else b
    a = _as_tensor(a, like, "where")
    b = _as_tensor(b, like, "where")
    dtype = _result_dtype("where", a, b)
    try:
        shape = broadcast_shapes("where", mask.shape, a.shape, b.shape)
    except ShapeError:
        raise ShapeError(f"where: mask {_fmt(mask.shape)} and values {_fmt(a.shape)}, "
                         f"{_fmt(b.shape)} do not broadcast") from None
    if shape[-2:] != mask.shape:
        raise ShapeError(f"where: mask {_fmt(mask.shape)} must cover the last two dims of the "
                         f"values {_fmt(a.shape)}, {_fmt(b.shape)} (result {_fmt(shape)})")
    return Tensor("where", (mask, a, b), {}, shape, dtype)


def matmul(a: Any, b: Any, precision: Any = None) -> Tensor:
    """NumPy ``matmul``: contracts a's last dim with b's second-to-last; batch dims broadcast.

    1-D operands follow NumPy (a vector is promoted to a matrix and the added dim removed again);
    the program records that with explicit reshapes, so the core ``matmul`` is always >= 2-D.

    ``precision`` (float32 matmuls only; PyTorch's names): ``"highest"`` (the default: float32
    products), ``"high"`` (TF32 tensor cores) or ``"medium"`` (bfloat16 tensor cores); see
    :mod:`mirage_py.lax.precision`. A 16-bit matmul always multiplies in its own type, so there
    the argument changes nothing and is not recorded.
    """
    a = _check_tensor(a, "matmul")
    b = _check_tensor(b, "matmul")
    if a.ndim == 0 or b.ndim == 0:
        raise ShapeError(f"matmul: operands must not be scalars: {_fmt(a.shape)} @ "
                         f"{_fmt(b.shape)}")
    if a.shape[-1] != b.shape[-2 if b.ndim > 1 else 0]:
        raise ShapeError(f"matmul: inner dimensions differ: {_fmt(a.shape)} @ {_fmt(b.shape)} "
                         f"({a.shape[-1]} != {b.shape[-2 if b.ndim > 1 else 0]})")
    if a.ndim == 1 or b.ndim == 1:
        a2 = reshape(a, (1, a.shape[0])) if a.ndim == 1 else a
        b2 = reshape(b, (b.shape[0], 1)) if b.ndim == 1 else b
        out = matmul(a2, b2, precision)
        shape = list(out.shape)
        if b.ndim == 1:
            shape.pop(-1)
        if a.ndim == 1:
            shape.pop(-2 if b.ndim != 1 else -1)
        return reshape(out, tuple(shape))  # () for vector @ vector, as in NumPy
    if a.shape[-1] != b.shape[-2]:
        raise ShapeError(f"matmul: inner dimensions differ: {_fmt(a.shape)} @ {_fmt(b.shape)} "
                         f"({a.shape[-1]} != {b.shape[-2]})")
    if a.dtype != b.dtype and "float32" not in (a.dtype, b.dtype):
        raise DTypeError(f"matmul: cannot combine {a.dtype} {_fmt(a.shape)} with {b.dtype} "
                         f"{_fmt(b.shape)}")
    dtype = a.dtype if a.dtype == b.dtype else "float32"
    try:
        batch = broadcast_shapes("matmul", a.shape[:-2], b.shape[:-2])
    except ShapeError:
        raise ShapeError(f"matmul: batch dimensions of {_fmt(a.shape)} and {_fmt(b.shape)} do "
                         "not broadcast") from None
    attrs = {}
    if precision is not None:
        p = Float32Matmul.parse(precision, "matmul: precision")
        if dtype == "float32" and p is not Float32Matmul.HIGHEST:
            attrs["precision"] = p.value
    return Tensor("matmul", (a, b), attrs, batch + (a.shape[-2], b.shape[-1]), dtype)


def normalize_axes(opname: str, shape: tuple[int, ...], axis: Any) -> tuple[int, ...]:
    nd = len(shape)
    if axis is None:
        return tuple(range(nd))
    try:
        axes = (axis,) if isinstance(axis, numbers.Integral) else tuple(axis)
    except TypeError:
        raise ShapeError(f"{opname}: axis {axis!r} is not an int, a tuple of ints or None "
                         f"(shape {_fmt(shape)})") from None
    out = []
    for ax in axes:
        if not isinstance(ax, numbers.Integral) or isinstance(ax, bool) or not -nd <= ax < nd:
            raise ShapeError(f"{opname}: axis {ax!r} is out of range for shape {_fmt(shape)}")
        out.append(int(ax) % nd)
    if len(set(out)) != len(out):
        raise ShapeError(f"{opname}: repeated axis in {axis!r} for shape {_fmt(shape)}")
    return tuple(sorted(out))


def _reduce_shape(shape: tuple[int, ...], axes: tuple[int, ...], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def sum(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (int, tuple or None for all), like ``numpy.sum``. A sum over axes of
    size 1 only is recorded as what it is, a reshape (or nothing)."""
    x = _check_tensor(x, "sum")
    axes = normalize_axes("sum", x.shape, axis)
    shape = _reduce_shape(x.shape, axes, keepdims)
    if axes and all(x.shape[a] == 1 for a in axes):
        return reshape(x, shape)
    return Tensor("sum", (x,), {"axes": axes, "keepdims": bool(keepdims)}, shape, x.dtype)


def _select_reduce(op: str, x: Tensor, axis: Any, keepdims: bool) -> Tensor:
    x = _check_tensor(x, op)
    axes = normalize_axes(op, x.shape, axis)
    shape = _reduce_shape(x.shape, axes, keepdims)
    if all(x.shape[a] == 1 for a in axes):
        return reshape(x, shape)  # the max of one element is that element
    return Tensor(op, (x,), {"axes": axes, "keepdims": bool(keepdims)}, shape, x.dtype)


def amax(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Maximum over ``axis``, like ``numpy.max`` (exported as ``mp.max``; non-Lax: the verifier
    models it as a random function of the multiset of values, docs/verifier.md)."""
    return _select_reduce("max", x, axis, keepdims)


def amin(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Minimum over ``axis``, like ``numpy.min`` (exported as ``mp.min``)."""
    return _select_reduce("min", x, axis, keepdims)


def reshape(x: Tensor, shape: Iterable[Any]) -> Tensor:
    """Reshape keeping element order (row-major); one dim may be -1. A symbolic dim of ``x``
    must reappear whole in the target (``(B, S, 64)`` -> ``(B, S, 4, 16)``); merging it with
    another dim is not expressible."""
    x = _check_tensor(x, "reshape")
    try:
        dims = [shape] if isinstance(shape, (numbers.Integral, Dim)) else list(shape)
    except TypeError:
        raise ShapeError(f"reshape: target shape {shape!r} for {_fmt(x.shape)} is not a "
                         "sequence of ints") from None
    if any(not isinstance(d, Dim) and (not isinstance(d, numbers.Integral) or
                                       isinstance(d, bool) or (d <= 0 and d != -1))
           for d in dims) or dims.count(-1) > 1:
        raise ShapeError(f"reshape: bad target shape {tuple(dims)} for {_fmt(x.shape)}")
    key = lambda d: (d.name, d.lo, d.hi)  # noqa: E731
    if sorted((d for d in x.shape if isinstance(d, Dim)), key=key) != \
            sorted((d for d in dims if isinstance(d, Dim)), key=key):
        raise ShapeError(f"reshape: cannot reshape {_fmt(x.shape)} into {_fmt(tuple(dims))}: "
                         "each symbolic dim must reappear whole")
    size = math.prod(d for d in x.shape if not isinstance(d, Dim))
    known = math.prod(d for d in dims if not isinstance(d, Dim) and d != -1)
    dims = [d if isinstance(d, Dim) else int(d) for d in dims]
    if -1 in dims:
        if size % known:
            raise ShapeError(f"reshape: cannot reshape {_fmt(x.shape)} into {tuple(dims)}")
        dims[dims.index(-1)] = size // known
    elif known != size:
        raise ShapeError(f"reshape: cannot reshape {_fmt(x.shape)} ({size} elements per "
                         f"symbolic element) into {_fmt(tuple(dims))} ({known})"
                         if x.symbolic else
                         f"reshape: cannot reshape {_fmt(x.shape)} ({size} elements) into "
                         f"{_fmt(tuple(dims))} ({known} elements)")
    if tuple(dims) == x.shape:
        return x
    return Tensor("reshape", (x,), {"shape": tuple(dims)}, tuple(dims), x.dtype)


def transpose(x: Tensor, axes: Sequence[int] | None = None) -> Tensor:
    """Permute dims (reverse them when ``axes`` is None), like ``numpy.transpose``."""
    x = _check_tensor(x, "transpose")
    try:
        perm = tuple(reversed(range(x.ndim))) if axes is None else tuple(axes)
    except TypeError:
        perm = (None,)  # not a sequence: reported below
    if sorted(int(p) % max(x.ndim, 1)
              if isinstance(p, numbers.Integral) and not isinstance(p, bool) and
              -x.ndim <= p < x.ndim else -1 for p in perm) != list(range(x.ndim)):
        raise ShapeError(f"transpose: axes {axes!r} are not a permutation of the dims of "
                         f"{_fmt(x.shape)}")
    perm = tuple(int(p) % x.ndim for p in perm)
    if perm == tuple(range(x.ndim)):
        return x
    return Tensor("transpose", (x,), {"perm": perm}, tuple(x.shape[p] for p in perm), x.dtype)


def _axis(opname: str, shape: tuple[int, ...], axis: Any) -> int:
    nd = len(shape)
    if not isinstance(axis, numbers.Integral) or isinstance(axis, bool) or not -nd <= axis < nd:
        raise ShapeError(f"{opname}: axis {axis!r} is out of range for shape {_fmt(shape)}")
    return int(axis) % nd


def slice_axis(x: Tensor, axis: int, start: int, stop: int) -> Tensor:
    """Elements ``start:stop`` (step 1, no negative or out-of-range bounds) along ``axis``
    (exported as ``mp.slice``; ``x[..., a:b]`` records the same)."""
    x = _check_tensor(x, "slice")
    ax = _axis("slice", x.shape, axis)
    n = x.shape[ax]
    if isinstance(n, Dim):
        raise ShapeError(f"slice: axis {ax} of {_fmt(x.shape)} is the symbolic dim {n}; slicing "
                         "it is not expressible")
    for name, v in (("start", start), ("stop", stop)):
        if not isinstance(v, numbers.Integral) or isinstance(v, bool):
            raise ShapeError(f"slice: {name} must be an int, got {v!r} (shape {_fmt(x.shape)})")
    if not 0 <= start < stop <= n:
        raise ShapeError(f"slice: {start}:{stop} along axis {ax} is out of range for shape "
                         f"{_fmt(x.shape)} (need 0 <= start < stop <= {n})")
    if start == 0 and stop == n:
        return x
    shape = x.shape[:ax] + (int(stop) - int(start),) + x.shape[ax + 1:]
    return Tensor("slice", (x,), {"axis": ax, "start": int(start), "stop": int(stop)}, shape,
                  x.dtype)


def split(x: Tensor, sections: Any, axis: int = -1) -> tuple[Tensor, ...]:
    """``x`` cut along ``axis`` into ``sections`` equal parts (an int) or parts of the given
    sizes (a sequence of ints), as slices."""
    x = _check_tensor(x, "split")
    ax = _axis("split", x.shape, axis)
    n = x.shape[ax]
    if isinstance(n, Dim):
        raise ShapeError(f"split: axis {ax} of {_fmt(x.shape)} is the symbolic dim {n}; "
                         "splitting it is not expressible")
    if isinstance(sections, numbers.Integral) and not isinstance(sections, bool):
        if sections < 1 or n % sections:
            raise ShapeError(f"split: {n} elements along axis {ax} of {_fmt(x.shape)} do not "
                             f"split into {sections} equal parts")
        sizes = [n // int(sections)] * int(sections)
    else:
        try:
            sizes = [int(v) for v in sections]
        except (TypeError, ValueError):
            raise ShapeError(f"split: sections {sections!r} is neither an int nor a sequence of "
                             f"ints (shape {_fmt(x.shape)})") from None
        if any(v < 1 for v in sizes) or builtins.sum(sizes) != n:
            raise ShapeError(f"split: sizes {sizes} do not add up to the {n} elements along "
                             f"axis {ax} of {_fmt(x.shape)}")
    out, lo = [], 0
    for v in sizes:
        out.append(slice_axis(x, ax, lo, lo + v))
        lo += v
    return tuple(out)


def concat(tensors: Sequence[Tensor], axis: int = 0) -> Tensor:
    """Join tensors of one rank and dtype along ``axis``; other dims must be equal."""
    try:
        ts = list(tensors)
    except TypeError:
        raise ShapeError(f"concat: expected a sequence of Tensors, got "
                         f"{type(tensors).__name__}") from None
    if not ts:
        raise ShapeError("concat: needs at least one tensor")
    ts = [_check_tensor(t, "concat") for t in ts]
    shapes = ", ".join(_fmt(t.shape) for t in ts)
    if len({t.ndim for t in ts}) != 1 or ts[0].ndim == 0:
        raise ShapeError(f"concat: tensors {shapes} must have one rank of at least 1")
    ax = _axis("concat", ts[0].shape, axis)
    rest = {t.shape[:ax] + t.shape[ax + 1:] for t in ts}
    if len(rest) != 1:
        raise ShapeError(f"concat: tensors {shapes} differ outside axis {ax}")
    dtypes = {t.dtype for t in ts}
    if len(dtypes) != 1:
        raise DTypeError(f"concat: tensors {shapes} have dtypes {sorted(dtypes)}; cast them to "
                         "one")
    if len(ts) == 1:
        return ts[0]
    if any(isinstance(t.shape[ax], Dim) for t in ts):
        raise ShapeError(f"concat: tensors {shapes} are joined along a symbolic dim (axis "
                         f"{ax}); that is not expressible")
    n = builtins.sum(t.shape[ax] for t in ts)
    shape = ts[0].shape[:ax] + (n,) + ts[0].shape[ax + 1:]
    return Tensor("concat", tuple(ts), {"axis": ax}, shape, ts[0].dtype)


def getitem(x: Tensor, key: Any) -> Tensor:
    """``x[key]`` for basic indexing: ints, slices with step 1 and one Ellipsis, recorded as
    slices (and a reshape that drops int-indexed dims)."""
    keys = key if isinstance(key, tuple) else (key,)
    if builtins.sum(k is Ellipsis for k in keys) > 1:
        raise ShapeError(f"indexing: at most one Ellipsis (shape {_fmt(x.shape)})")
    if Ellipsis in keys:
        i = keys.index(Ellipsis)
        keys = keys[:i] + (builtins.slice(None),) * (x.ndim - len(keys) + 1) + keys[i + 1:]
    if len(keys) > x.ndim:
        raise ShapeError(f"indexing: {len(keys)} indices for shape {_fmt(x.shape)}")
    out, drop = x, []
    for ax, k in enumerate(keys):
        n = x.shape[ax]
        if isinstance(n, Dim):
            if k == builtins.slice(None):
                continue  # the whole symbolic dim
            raise ShapeError(f"indexing: axis {ax} of {_fmt(x.shape)} is the symbolic dim {n}; "
                             "only ':' takes it")
        if isinstance(k, numbers.Integral) and not isinstance(k, bool):
            if not -n <= k < n:
                raise ShapeError(f"indexing: index {k} is out of range for axis {ax} of "
                                 f"{_fmt(x.shape)}")
            k = int(k) % n
            out = slice_axis(out, ax, k, k + 1)
            drop.append(ax)
        elif isinstance(k, builtins.slice):
            if k.step not in (None, 1):
                raise ShapeError(f"indexing: step {k.step} along axis {ax} of {_fmt(x.shape)}; "
                                 "only step 1 is supported")
            start, stop, _ = k.indices(n)
            if start >= stop:
                raise ShapeError(f"indexing: {k} selects nothing along axis {ax} of "
                                 f"{_fmt(x.shape)}")
            out = slice_axis(out, ax, start, stop)
        else:
            raise ShapeError(f"indexing: {k!r} is not an int or a slice (shape {_fmt(x.shape)})")
    if drop:
        out = reshape(out, tuple(d for i, d in enumerate(out.shape) if i not in drop))
    return out


# how apply() rebuilds each operator from operands and attributes: through the checking
# operator functions, so a deserialized node passes the same checks as one built by hand
_BUILD: dict[str, Any] = {
    "matmul": lambda a, at: matmul(a[0], a[1], at.get("precision")),
    "sum": lambda a, at: sum(a[0], at["axes"], at["keepdims"]),
    "max": lambda a, at: amax(a[0], at["axes"], at["keepdims"]),
    "min": lambda a, at: amin(a[0], at["axes"], at["keepdims"]),
    "reshape": lambda a, at: reshape(a[0], at["shape"]),
    "transpose": lambda a, at: transpose(a[0], at["perm"]),
    "slice": lambda a, at: slice_axis(a[0], at["axis"], at["start"], at["stop"]),
    "concat": lambda a, at: concat(a, at["axis"]),
    "gelu": lambda a, at: gelu(a[0], at.get("approximate", "none")),
    "leaky_relu": lambda a, at: leaky_relu(a[0], at["negative_slope"]),
    "clamp": lambda a, at: clamp(a[0], at.get("lo"), at.get("hi")),
    "pow": lambda a, at: pow(a[0], at["exponent"]),
    "cast": lambda a, at: cast(a[0], at["dtype"]),
    "where": lambda a, at: where(a[0], a[1], a[2]),
    "take": lambda a, at: take(a[0], a[1]),
}


def apply(op: str, args: Sequence[Tensor], attrs: dict[str, Any],
          exact: bool = True) -> Tensor:
    """Apply core operator ``op`` (a name from the op table) to ``args`` with ``attrs``, checking
    shapes and dtypes like the operator functions do; used to rebuild deserialized programs.
    ``exact=False`` accepts what the operator function makes of it at these shapes (a max over
    one element is that element: a program bound to sizes of 1)."""
    spec = OPS.get(op)
    if spec is None or spec.category == "leaf":
        raise ShapeError(f"{op}: not an operator that takes operands")
    arity = spec.arity
    if (arity is not None and len(args) != arity) or (arity is None and not args):
        raise ShapeError(f"{op}: takes {arity if arity is not None else 'one or more'} "
                         f"operand(s), got {len(args)}")
    extra = set(attrs) - set(spec.attrs)
    if extra:
        raise ShapeError(f"{op}: unexpected attribute(s) {', '.join(sorted(extra))}")
    missing = set(spec.attrs) - set(spec.optional) - set(attrs)
    if missing:
        raise ShapeError(f"{op}: missing attribute(s) {', '.join(sorted(missing))}")
    build = _BUILD.get(op)
    if build is not None:
        t = build(list(args), dict(attrs))
    elif spec.category == "unary":
        t = _unary(op, args[0])
    else:
        t = _binary(op, args[0], args[1])
    if t.op != op and exact:  # the function simplified it (a one-element max, pow(x, 1), ...)
        raise ShapeError(f"{op}: attributes {dict(attrs)} make it a no-op that is never recorded")
    return t


def topo_order(outputs: Iterable[Tensor]) -> list[Tensor]:
    """Nodes reachable from ``outputs``, operands before users; deterministic, no recursion."""
    order: list[Tensor] = []
    seen: set[int] = set()
    for root in outputs:
        stack: list[tuple[Tensor, int]] = [(root, 0)]
        while stack:
            node, i = stack.pop()
            if id(node) in seen and i == 0:
                continue
            if i < len(node.inputs):
                stack.append((node, i + 1))
                child = node.inputs[i]
                if id(child) not in seen:
                    stack.append((child, 0))
            else:
                seen.add(id(node))
                order.append(node)
    # structurally equal nodes built twice collapse to one
    unique: dict[str, Tensor] = {}
    for n in order:
        unique.setdefault(n.digest, n)
    return list(unique.values())
