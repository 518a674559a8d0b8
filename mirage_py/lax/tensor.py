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

import math

import hashlib
import json
import numbers
from typing import Any, Iterable, Sequence

from ..errors import DTypeError, ProgramError, ShapeError
from .ops import DTYPES, OPS


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
        self.op = op
        self.inputs = tuple(inputs)
        self.attrs = tuple(sorted((k, _attr_value(v)) for k, v in attrs.items()))
        self.shape = tuple(int(d) for d in shape)
        self.dtype = dtype
        key = json.dumps([op, [[k, _json_attr(v)] for k, v in self.attrs], self.shape, dtype,
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
        return math.prod(self.shape)

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

    def __pos__(self) -> "Tensor":
        return self

    def __bool__(self) -> bool:
        raise TypeError("a symbolic Tensor has no truth value")

    @property
    def T(self) -> "Tensor":
        return transpose(self)


def _json_attr(v: Any) -> Any:
    if isinstance(v, float):
        return {"f": repr(v)}  # exact, and distinguishes 1.0 from 1
    if isinstance(v, tuple):
        return [_json_attr(x) for x in v]
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
    if not all(isinstance(d, numbers.Integral) and not isinstance(d, bool) and d > 0
               for d in dims):
        raise ShapeError(f"input {name!r}: shape {shape!r} must be a tuple of positive ints")
    return Tensor("input", (), {"name": name}, tuple(int(d) for d in dims), dtype)


def const(value: float, dtype: str = "float32") -> Tensor:
    """A scalar constant (shape ``()``); Python numbers in expressions become these."""
    if not isinstance(value, numbers.Real) or isinstance(value, bool):
        raise ShapeError(f"const: value {value!r} is not a real number")
    if dtype not in DTYPES:
        raise DTypeError(f"const: dtype {dtype!r} is not supported "
                         f"(choose one of {', '.join(DTYPES)})")
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


def _result_dtype(opname: str, a: Tensor, b: Tensor) -> str:
    if a.op == "const":
        return b.dtype
    if b.op == "const" or a.dtype == b.dtype:
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


def gelu(x: Tensor) -> Tensor:
    """Elementwise exact (erf) GELU (non-Lax)."""
    return _unary("gelu", x)


def relu(x: Tensor) -> Tensor:
    """Elementwise max(x, 0) (non-Lax)."""
    return _unary("relu", x)


def matmul(a: Any, b: Any) -> Tensor:
    """NumPy ``matmul``: contracts a's last dim with b's second-to-last; batch dims broadcast.

    1-D operands follow NumPy (a vector is promoted to a matrix and the added dim removed again);
    the program records that with explicit reshapes, so the core ``matmul`` is always >= 2-D.
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
        out = matmul(a2, b2)
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
    return Tensor("matmul", (a, b), {}, batch + (a.shape[-2], b.shape[-1]), dtype)


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


def sum(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:  # noqa: A001
    """Sum over ``axis`` (int, tuple or None for all), like ``numpy.sum``."""
    x = _check_tensor(x, "sum")
    axes = normalize_axes("sum", x.shape, axis)
    if keepdims:
        shape = tuple(1 if i in axes else d for i, d in enumerate(x.shape))
    else:
        shape = tuple(d for i, d in enumerate(x.shape) if i not in axes)
    if not shape:
        shape = ()
    return Tensor("sum", (x,), {"axes": axes, "keepdims": bool(keepdims)}, shape, x.dtype)


def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis``: recorded as ``sum(x, axis) / n``."""
    x = _check_tensor(x, "mean")
    axes = normalize_axes("mean", x.shape, axis)
    n = 1
    for a in axes:
        n *= x.shape[a]
    return div(sum(x, axes, keepdims), float(n))


def rms_norm(x: Tensor, weight: Tensor | None = None, eps: float = 1e-6) -> Tensor:
    """RMS normalisation over the last axis: ``x / sqrt(mean(x**2, -1) + eps) * weight``.

    Recorded decomposed into primitive operators (square, sum, div, add, sqrt, div, mul), so that
    every later stage sees the algebra: the verifier treats only the ``sqrt`` as non-Lax and the
    generator can fuse the sum of squares with a following matmul.
    """
    x = _check_tensor(x, "rms_norm")
    if x.ndim == 0:
        raise ShapeError(f"rms_norm: input must have at least one dim, got shape {_fmt(x.shape)}")
    if weight is not None:
        weight = _check_tensor(weight, "rms_norm")
        if weight.shape != (x.shape[-1],):
            raise ShapeError(f"rms_norm: weight shape {_fmt(weight.shape)} must be "
                             f"({x.shape[-1]},) for input {_fmt(x.shape)}")
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not float(eps) > 0 or \
            float(eps) == float("inf"):
        raise ShapeError(f"rms_norm: eps must be a positive finite number, got {eps!r} "
                         f"(input {_fmt(x.shape)})")
    r = sqrt(mean(square(x), axis=-1, keepdims=True) + float(eps))
    y = x / r
    return y * weight if weight is not None else y


def reshape(x: Tensor, shape: Iterable[int]) -> Tensor:
    """Reshape keeping element order (row-major); one dim may be -1."""
    x = _check_tensor(x, "reshape")
    try:
        dims = [shape] if isinstance(shape, numbers.Integral) else list(shape)
    except TypeError:
        raise ShapeError(f"reshape: target shape {shape!r} for {_fmt(x.shape)} is not a "
                         "sequence of ints") from None
    if any(not isinstance(d, numbers.Integral) or isinstance(d, bool) or (d <= 0 and d != -1)
           for d in dims) or dims.count(-1) > 1:
        raise ShapeError(f"reshape: bad target shape {tuple(dims)} for {_fmt(x.shape)}")
    known = 1
    for d in dims:
        if d != -1:
            known *= d
    dims = [int(d) for d in dims]
    if -1 in dims:
        if x.size % known:
            raise ShapeError(f"reshape: cannot reshape {_fmt(x.shape)} into {tuple(dims)}")
        dims[dims.index(-1)] = x.size // known
    elif known != x.size:
        raise ShapeError(f"reshape: cannot reshape {_fmt(x.shape)} ({x.size} elements) into "
                         f"{_fmt(tuple(dims))} ({known} elements)")
    if tuple(dims) == x.shape:
        return x
    return Tensor("reshape", (x,), {"shape": tuple(int(d) for d in dims)}, tuple(dims), x.dtype)


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


def apply(op: str, args: Sequence[Tensor], attrs: dict[str, Any]) -> Tensor:
    """Apply core operator ``op`` (a name from the op table) to ``args`` with ``attrs``, checking
    shapes and dtypes like the operator functions do; used to rebuild deserialized programs."""
    if op not in OPS or op in ("input", "const"):
        raise ShapeError(f"{op}: not an operator that takes operands")
    cat = OPS[op].category
    arity = {"unary": 1, "binary": 2, "matmul": 2, "sum": 1, "reshape": 1, "transpose": 1}.get(
        cat if cat in ("unary", "binary") else op)
    if arity is None:
        raise ShapeError(f"{op}: cannot be rebuilt from its attributes (category {cat})")
    if len(args) != arity:
        raise ShapeError(f"{op}: takes {arity} operand(s), got {len(args)}")
    allowed = {"sum": {"axes", "keepdims"}, "reshape": {"shape"}, "transpose": {"perm"}}.get(op,
                                                                                        set())
    if set(attrs) - allowed:
        raise ShapeError(f"{op}: unexpected attribute(s) {', '.join(sorted(set(attrs) - allowed))}")
    if cat == "unary":
        return _unary(op, args[0])
    if cat == "binary":
        return _binary(op, args[0], args[1])
    if op == "matmul":
        return matmul(args[0], args[1])
    if op == "sum":
        return sum(args[0], attrs["axes"], attrs["keepdims"])
    if op == "reshape":
        return reshape(args[0], attrs["shape"])
    return transpose(args[0], attrs["perm"])


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
