"""aten operators -> mirage_py operators: the mapping table of the torch frontend.

Each entry of :data:`TABLE` translates one FX node of an aten graph into operators of
:mod:`mirage_py.lax`. A translator receives a :class:`NodeContext` and the node's arguments with
every FX node replaced by its value, and returns the node's value: a :class:`Sym` (a symbolic
program tensor), a tuple of values (multi-output operators such as ``split`` or
``native_layer_norm``), or a plain Python value. It raises :class:`Unsupported` with a reason
when the node cannot be expressed -- the caller then runs that node in eager PyTorch
(``mp.compile``) or reports it (``mp.from_torch``).

Values a translator may meet as arguments:

* :class:`Sym` -- a program tensor, with the torch shape it stands for. Its mirage tensor's shape is
  *broadcast-compatible* with the torch shape (right-aligned, size 1 where torch has n): an
  ``expand`` is recorded lazily, and operators that broadcast (element-wise ones, matmul batch
  dims) use the small tensor as it is. Operators that need the full data (a concatenation, a
  reshape that merges an expanded dim) materialise it by concatenating copies.
* :class:`Boundary` -- a tensor known only when the program runs (a module input, a parameter, the
  output of an operator run eagerly): :meth:`NodeContext.sym` turns it into a program input.
* ``torch.Tensor`` -- a constant folded at capture time (``torch.ones(...).tril()``, ``arange``):
  a scalar becomes a ``const``, a 0/1 position pattern a causal / sliding-window ``mask``, anything
  else a program input fed from the constant.
* numbers, lists, ``None``, dtypes, devices: as in the aten schema.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from .. import lax
from ..errors import MirageError
from ..lax.ops import INDEX_DTYPES, mask_values
from ..lax.tensor import Tensor, make_input

#: what an infinite constant (``masked_fill(-inf)``, an additive ``-inf`` mask) becomes: the
#: program's constants are finite (the verifier's field has no infinity); after a softmax the
#: difference vanishes, and float16 storage rounds it back to infinity anyway
BIG = 1e9

MIRAGE_DTYPES = ("float16", "bfloat16", "float32")


class Unsupported(Exception):
    """A node that cannot be expressed; ``reason`` says why (internal signal)."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


@dataclass(frozen=True)
class Sym:
    """A program tensor ``t`` standing for a torch tensor of ``shape`` (``t.shape`` broadcasts to
    it, right-aligned)."""

    t: Tensor
    shape: tuple[int, ...]

    @property
    def dtype(self) -> str:
        return self.t.dtype

    @property
    def lazy(self) -> bool:
        """True when ``t`` is smaller than the torch tensor (a recorded expand or a scalar)."""
        return self.t.shape != self.shape


@dataclass(frozen=True)
class Boundary:
    """A runtime tensor: ``key`` identifies it (the FX node name), ``shape`` / ``dtype`` (a torch
    dtype) come from the capture's metadata; ``static`` marks parameters, buffers and constants."""

    key: str
    shape: tuple[int, ...]
    dtype: Any
    static: bool = False
    #: torch view ops (``("reshape", shape)``, ``("narrow", dim, start, length)``) applied to the
    #: runtime tensor at call time: views of index tensors, which programs read only through
    #: ``take`` (GPT-2's ``input_ids.view(-1, T)``)
    ops: tuple = ()

    @property
    def ref(self) -> str:
        """What identifies the value with its view ops (one program input per view)."""
        return self.key + "".join(f"|{op!r}" for op in self.ops)

    def viewed(self, op: tuple, shape: tuple[int, ...]) -> "Boundary":
        return Boundary(self.key, tuple(shape), self.dtype, self.static, self.ops + (op,))


class _NotComputed:
    """An output of a multi-output operator that the program does not compute (the indices of a
    max, the saved statistics of a dropout); any use of it makes the producer unsupported."""

    def __init__(self, what: str):
        self.what = what

    def __repr__(self) -> str:
        return f"<not computed: {self.what}>"


def mirage_dtype(dtype: Any) -> str | None:
    """The program dtype of a torch dtype (None for float64, integers, bool, ...)."""
    name = str(dtype).replace("torch.", "")
    return name if name in MIRAGE_DTYPES else None


def index_dtype(dtype: Any) -> str | None:
    """The index dtype of a torch integer dtype that can hold indices (int32, int64), else
    None."""
    name = str(dtype).replace("torch.", "")
    return name if name in INDEX_DTYPES else None


def input_dtype(dtype: Any) -> str | None:
    """The dtype of the program input a runtime tensor of torch ``dtype`` becomes: a float
    dtype, or an index dtype (token ids, positions: only ``take`` reads them, as
    :meth:`NodeContext.indices` asks); None for the others."""
    return mirage_dtype(dtype) or index_dtype(dtype)


class NodeContext:
    """What a translator may ask: the node's output metadata and program inputs for boundaries.

    ``make_input(boundary) -> Tensor`` creates (or reuses) the program input of a boundary value;
    ``const_input(tensor, node_name) -> Tensor`` the input fed from a folded constant."""

    def __init__(self, node: Any, out_meta: Any, make_input: Callable[[Boundary], Tensor],
                 const_input: Callable[[Any, str], Tensor]):
        self.node = node
        self.meta = out_meta
        self._make_input = make_input
        self._const_input = const_input

    # -- output metadata ------------------------------------------------------------------------
    def out(self, i: int | None = None) -> Any:
        m = self.meta
        if i is not None:
            m = m[i]
        elif isinstance(m, (tuple, list)):
            m = m[0]
        return m

    def out_shape(self, i: int | None = None) -> tuple[int, ...]:
        return tuple(int(d) for d in self.out(i).shape)

    def out_dtype(self, i: int | None = None) -> str:
        m = self.out(i)
        dt = mirage_dtype(m.dtype)
        if dt is None:
            raise Unsupported(f"its result is {str(m.dtype).replace('torch.', '')} "
                              f"{tuple(m.shape)}; programs hold float16, bfloat16 and float32")
        return dt

    def users_of_output(self, i: int) -> bool:
        """Does any user read output ``i`` of this (multi-output) node?"""
        import operator
        for u in self.node.users:
            if u.op == "call_function" and u.target is operator.getitem:
                if u.args[1] == i and u.users:  # an element nobody reads is no use
                    return True
            else:
                return True
        return False

    # -- operands -------------------------------------------------------------------------------
    def sym(self, v: Any, what: str = "operand") -> Sym:
        """``v`` as a program tensor (a Sym)."""
        if isinstance(v, Sym):
            return v
        if isinstance(v, Boundary):
            return Sym(self._input_of(v, what, mirage_dtype, "is",
                                      "programs hold float16, bfloat16 and float32"), v.shape)
        if _is_torch_tensor(v):
            shape = tuple(int(d) for d in v.shape)
            c = uniform_value(v)
            # one element is uniform by its size alone (positions at a length of 1): a number
            # there would make the capture at that size differ from the others (docs/torch.md)
            if c is not None and (v.numel() > 1 or v.dim() == 0):
                return Sym(lax.const(_finite(c), self._float_dtype(v)), shape)
            if v.is_complex():
                raise Unsupported(f"its {what} is a constant of dtype {v.dtype}")
            # other dtypes (float64, integers, bool) are fed as float32 (exact for the values
            # a constant of a float computation holds: positions, 0/1 flags)
            if any(d == 0 for d in shape):
                raise Unsupported(f"its {what} {shape} is empty")
            return Sym(self._const_input(v, self.node.name), shape)
        if isinstance(v, numbers.Real) and not isinstance(v, bool):
            return Sym(lax.const(_finite(float(v)), "float32"), ())
        raise Unsupported(f"its {what} is {type(v).__name__}, not a tensor")

    def _input_of(self, v: Boundary, what: str, dtype_of: Callable[[Any], Any], verb: str,
                  holds: str) -> Tensor:
        """The program input of the runtime tensor ``v``: its dtype one ``dtype_of`` knows
        (else Unsupported, saying what ``holds``), and no empty dim."""
        if dtype_of(v.dtype) is None:
            raise Unsupported(f"its {what} {verb} a {str(v.dtype).replace('torch.', '')} "
                              f"tensor {v.shape}; {holds}")
        if any(d == 0 for d in v.shape):
            raise Unsupported(f"its {what} {v.shape} {verb} empty")
        return self._make_input(v)

    def indices(self, v: Any, what: str = "indices") -> Tensor | tuple[int, int]:
        """``v`` as indices: an index program input (a runtime int32 / int64 tensor), or --
        for a constant holding a contiguous range ``a, a+1, ..., b-1`` in row-major order, of
        any shape (positions from ``arange``, ``(1, T)`` ones too) -- that range ``(a, b)``,
        which the caller turns into a slice (and a reshape to its result's shape)."""
        if isinstance(v, Sym):
            if v.t.dtype in INDEX_DTYPES and not v.lazy:
                return v.t
            raise Unsupported(f"its {what} {v.shape} are computed ({v.dtype}); indices must be "
                              "a runtime integer tensor or a constant range")
        if isinstance(v, Boundary):
            return self._input_of(v, what, index_dtype, "are", "indices are int32 or int64")
        if _is_torch_tensor(v):
            flat = v.detach().to("cpu").reshape(-1)
            if v.is_floating_point() or v.is_complex() or v.dtype == _torch().bool or \
                    flat.numel() == 0:
                raise Unsupported(f"its {what} are a constant of dtype {v.dtype}")
            first = int(flat[0].item())
            want = _torch().arange(first, first + flat.numel(), dtype=flat.dtype)
            if bool((flat == want).all()):  # of any shape: the result is reshaped after
                return first, first + flat.numel()
            if int(flat.min().item()) < 0:
                raise Unsupported(f"its {what} are a constant {tuple(v.shape)} with negative "
                                  "entries")
            # other constant indices (BERT's token types, folded from their buffer): an index
            # input fed from the constant
            return self._const_input(v, self.node.name, index_dtype(v.dtype) or "int64")
        raise Unsupported(f"its {what} are {type(v).__name__}, not a tensor")

    def _float_dtype(self, v: Any) -> str:
        return mirage_dtype(v.dtype) or "float32"

    def operand(self, v: Any, dtype: str, what: str = "operand") -> Tensor | float:
        """An element-wise operand: a Python number stays one (a const of the other side's
        dtype), a tensor is cast to ``dtype``."""
        if isinstance(v, bool):
            v = float(v)
        if isinstance(v, numbers.Real):
            return _finite(float(v))
        if _is_torch_tensor(v):
            c = uniform_value(v)
            if c is not None and v.dim() == 0:
                return _finite(c)
        s = self.sym(v, what)
        return cast(s.t, dtype)


def _torch() -> Any:
    import torch
    return torch


def _is_torch_tensor(v: Any) -> bool:
    return type(v).__module__.startswith("torch") and hasattr(v, "dtype") and hasattr(v, "shape") \
        and not isinstance(v, (Sym, Boundary))


def uniform_value(v: Any) -> float | None:
    """The one value of a constant tensor whose elements are all equal (None otherwise)."""
    if v.numel() == 0:
        return None
    flat = v.detach().reshape(-1)
    first = flat[0]
    if v.numel() > 1 and not bool((flat == first).all()):
        return None
    return float(first.item())


def _finite(c: float) -> float:
    if math.isnan(c):
        raise Unsupported("it uses a NaN constant")
    if math.isinf(c):
        return BIG if c > 0 else -BIG
    return c


def cast(t: Tensor, dtype: str) -> Tensor:
    if t.dtype == dtype or t.op == "const" or t.op == "mask":
        return t
    return lax.cast(t, dtype)


def ranked(s: Sym) -> Tensor:
    """``s.t`` with the torch rank (leading dims of size 1 added)."""
    t = s.t
    if t.ndim == len(s.shape) or t.op == "const":
        return t
    return lax.reshape(t, (1,) * (len(s.shape) - t.ndim) + t.shape) if t.shape else \
        lax.reshape(t, (1,) * len(s.shape))


def materialize(s: Sym, dims: Any = None) -> Tensor:
    """``s`` with the full data along ``dims`` (default: all): an expanded dim becomes copies
    concatenated along it."""
    if s.t.op == "const" and not s.shape:
        return s.t
    t = ranked(s)
    if t.op == "const":
        raise Unsupported(f"a constant broadcast to {s.shape} would have to be materialised")
    n = len(s.shape)
    for d in range(n) if dims is None else [d % n for d in dims]:
        if t.shape[d] != s.shape[d]:
            t = lax.concat([t] * s.shape[d], axis=d)
    return t


def full(s: Sym) -> Tensor:
    return materialize(s)


def _dim(d: int, n: int) -> int:
    if not -max(n, 1) <= d < max(n, 1):
        raise Unsupported(f"dim {d} is out of range for rank {n}")
    return d % max(n, 1)


# ---- masks ------------------------------------------------------------------------------------

def match_mask(cond: Any, shape: tuple[int, ...]) -> tuple[Tensor | None, bool] | None:
    """A constant 0/1 (or bool) tensor broadcast to ``shape`` as a position mask: ``(mask,
    False)`` when it equals a causal / sliding-window mask over the last two dims (the same for
    every leading index), ``(mask, True)`` when it equals the complement of one, ``(None, v)``
    when it is all ``v``; None when it is no such pattern."""
    torch = _torch()
    c = cond.detach().to("cpu")
    try:
        c = torch.broadcast_to(c != 0, shape)
    except RuntimeError:
        return None
    if c.numel() == 0:
        return None
    if bool(c.all()):
        return None, True
    if not bool(c.any()):
        return None, False
    if len(shape) < 2:
        return None
    rows, cols = shape[-2], shape[-1]
    m = c.reshape(-1, rows, cols)
    if not bool((m == m[0]).all()):
        return None
    pat = m[0].numpy()
    # the simplest description first: a causal mask (or its complement), then a window
    for windows in (False, True):
        for p, inverted in ((pat, False), (~pat, True)):
            found = _find_mask(p, windows)
            if found is not None:
                offset, window = found
                mask = lax.sliding_window_mask(rows, cols, window, offset) if window else \
                    lax.causal_mask(rows, cols, offset)
                return mask, inverted
    return None


def _find_mask(pat: np.ndarray, windows: bool) -> tuple[int, int] | None:
    rows, cols = pat.shape
    offsets, sizes = set(), set()
    for i in range(rows):
        kept = np.flatnonzero(pat[i])
        if kept.size:
            offsets.add(int(kept[-1]) - i)
            if kept[0] > 0:
                sizes.add(int(kept[-1] - kept[0] + 1))
    for offset in sorted(offsets):
        for window in sorted(sizes) if windows else [0]:
            if np.array_equal(mask_values((rows, cols), offset=offset, window=window) != 0, pat):
                return offset, window
    return None


# ---- translators ------------------------------------------------------------------------------

TABLE: dict[str, Callable[..., Any]] = {}


def op(*names: str) -> Callable:
    def deco(fn: Callable) -> Callable:
        for n in names:
            TABLE[n] = fn
        return fn
    return deco


def _result(ctx: NodeContext, t: Tensor | float, i: int | None = None) -> Sym:
    if not isinstance(t, Tensor):
        t = lax.const(_finite(float(t)), ctx.out_dtype(i))
    return Sym(cast(t, ctx.out_dtype(i)), ctx.out_shape(i))


# element-wise ---------------------------------------------------------------------------------

def _binary_fn(fn: Callable[[Any, Any], Tensor]) -> Callable:
    def tr(ctx: NodeContext, a: Any, b: Any, *, alpha: Any = None) -> Sym:
        dt = ctx.out_dtype()
        x, y = ctx.operand(a, dt), ctx.operand(b, dt)
        if alpha is not None and alpha != 1:
            y = y * float(alpha)
        # two numbers (a 0-d constant with a number): their value, as a constant
        return _result(ctx, fn(x, y))
    return tr


def _masked_add(ctx: NodeContext, a: Any, b: Any) -> Sym | None:
    """``x + M`` with a constant M of values {0, c} in a position pattern (an additive attention
    mask): ``where(mask, x, x + c)`` (``-inf`` becomes a finite fill)."""
    for x, m in ((a, b), (b, a)):
        if not _is_torch_tensor(m) or m.dim() < 2 or uniform_value(m) is not None:
            continue
        vals = _torch().unique(m.detach().to("cpu").float())
        if len(vals) != 2 or 0.0 not in vals.tolist():
            continue
        c = [v for v in vals.tolist() if v != 0.0][0]
        shape = ctx.out_shape()
        found = match_mask(m == 0, shape)
        if found is None or found[0] is None:
            continue
        mask, inverted = found
        dt = ctx.out_dtype()
        xt = ctx.operand(x, dt)
        if not isinstance(xt, Tensor):
            continue
        fill = -BIG if c <= -BIG else BIG if c >= BIG else xt + c
        t = lax.where(mask, fill, xt) if inverted else lax.where(mask, xt, fill)
        return _result(ctx, t)
    return None


def _masked_mul(ctx: NodeContext, a: Any, b: Any) -> Sym | None:
    """``x * M`` with a constant 0/1 M in a position pattern: ``where(mask, x, 0)``."""
    for x, m in ((a, b), (b, a)):
        if not _is_torch_tensor(m) or m.dim() < 2 or uniform_value(m) is not None:
            continue
        vals = _torch().unique(m.detach().to("cpu").float()).tolist()
        if sorted(vals) != [0.0, 1.0]:
            continue
        found = match_mask(m, ctx.out_shape())
        if found is None or found[0] is None:
            continue
        mask, inverted = found
        xt = ctx.operand(x, ctx.out_dtype())
        if not isinstance(xt, Tensor):
            continue
        return _result(ctx, lax.where(mask, 0.0, xt) if inverted else lax.where(mask, xt, 0.0))
    return None


@op("add")
def _add(ctx: NodeContext, a: Any, b: Any, *, alpha: Any = None) -> Sym:
    if alpha in (None, 1):
        r = _masked_add(ctx, a, b)
        if r is not None:
            return r
    return _binary_fn(lambda x, y: x + y)(ctx, a, b, alpha=alpha)


@op("sub")
def _sub(ctx: NodeContext, a: Any, b: Any, *, alpha: Any = None) -> Sym:
    return _binary_fn(lambda x, y: x - y)(ctx, a, b, alpha=alpha)


@op("rsub")
def _rsub(ctx: NodeContext, a: Any, b: Any, *, alpha: Any = None) -> Sym:
    return _binary_fn(lambda x, y: y - x)(ctx, a, b, alpha=alpha) if alpha in (None, 1) else \
        _binary_fn(lambda x, y: y - x * float(alpha))(ctx, a, b)


def _times_one(x: Any, y: Any) -> Tensor | None:
    """``x`` when ``x * y`` or ``x / y`` is ``x`` itself (``y`` the number 1: rotary tables
    scaled by an ``attention_scaling`` of 1), else None."""
    if isinstance(x, Tensor) and not isinstance(y, Tensor) and float(y) == 1.0:
        return x
    return None


@op("mul")
def _mul(ctx: NodeContext, a: Any, b: Any) -> Sym:
    r = _masked_mul(ctx, a, b)
    if r is not None:
        return r

    def mul(x: Any, y: Any) -> Any:
        one = _times_one(x, y)
        if one is None:
            one = _times_one(y, x)
        return one if one is not None else x * y
    return _binary_fn(mul)(ctx, a, b)


@op("div", "true_divide")
def _div(ctx: NodeContext, a: Any, b: Any, *, rounding_mode: Any = None) -> Sym:
    if rounding_mode is not None:
        raise Unsupported(f"division with rounding_mode={rounding_mode!r}")
    return _binary_fn(lambda x, y: _times_one(x, y) if _times_one(x, y) is not None
                      else x / y)(ctx, a, b)


@op("maximum")
def _maximum(ctx: NodeContext, a: Any, b: Any) -> Sym:
    return _binary_fn(lax.maximum)(ctx, a, b)


@op("minimum")
def _minimum(ctx: NodeContext, a: Any, b: Any) -> Sym:
    return _binary_fn(lax.minimum)(ctx, a, b)


def _unary(fn: Callable[[Tensor], Any]) -> Callable:
    def tr(ctx: NodeContext, x: Any, *args: Any, **kw: Any) -> Sym:
        t = ctx.operand(x, ctx.out_dtype())
        if not isinstance(t, Tensor):
            raise Unsupported("its operand is a number")
        return _result(ctx, fn(t, *args, **kw))
    return tr


TABLE["neg"] = _unary(lambda x: -x)
TABLE["exp"] = _unary(lax.exp)
TABLE["exp2"] = _unary(lambda x: lax.exp(x * math.log(2.0)))
TABLE["expm1"] = _unary(lambda x: lax.exp(x) - 1.0)
TABLE["log"] = _unary(lax.log)
TABLE["log2"] = _unary(lambda x: lax.log(x) / math.log(2.0))
TABLE["log10"] = _unary(lambda x: lax.log(x) / math.log(10.0))
TABLE["log1p"] = _unary(lambda x: lax.log(x + 1.0))
TABLE["sqrt"] = _unary(lax.sqrt)
TABLE["rsqrt"] = _unary(lambda x: 1.0 / lax.sqrt(x))
TABLE["reciprocal"] = _unary(lambda x: 1.0 / x)
TABLE["square"] = _unary(lax.square)
TABLE["abs"] = _unary(lax.abs)
TABLE["relu"] = _unary(lax.relu)
TABLE["sigmoid"] = _unary(lax.sigmoid)
TABLE["tanh"] = _unary(lax.tanh)
TABLE["sin"] = _unary(lax.sin)
TABLE["cos"] = _unary(lax.cos)
TABLE["silu"] = _unary(lax.silu)
TABLE["mish"] = _unary(lax.mish)
TABLE["relu6"] = _unary(lambda x: lax.clamp(x, 0.0, 6.0))
TABLE["hardsigmoid"] = _unary(lambda x: lax.clamp(x / 6.0 + 0.5, 0.0, 1.0))
TABLE["hardswish"] = _unary(lambda x: x * lax.clamp(x / 6.0 + 0.5, 0.0, 1.0))
for _name in ("alias", "clone", "contiguous", "detach", "lift_fresh_copy", "alias_copy",
              "detach_copy", "positive"):
    TABLE[_name] = _unary(lambda x, *a, **k: x)


@op("gelu")
def _gelu(ctx: NodeContext, x: Any, *, approximate: str = "none") -> Sym:
    return _unary(lambda t: lax.gelu(t, approximate))(ctx, x)


@op("leaky_relu")
def _leaky_relu(ctx: NodeContext, x: Any, negative_slope: float = 0.01) -> Sym:
    return _unary(lambda t: lax.leaky_relu(t, float(negative_slope)))(ctx, x)


@op("hardtanh")
def _hardtanh(ctx: NodeContext, x: Any, min_val: float = -1.0, max_val: float = 1.0) -> Sym:
    return _unary(lambda t: lax.clamp(t, float(min_val), float(max_val)))(ctx, x)


@op("elu")
def _elu(ctx: NodeContext, x: Any, alpha: float = 1.0, scale: float = 1.0,
         input_scale: float = 1.0) -> Sym:
    def f(t: Tensor) -> Tensor:
        u = t * float(input_scale) if input_scale != 1 else t
        # x > 0: x; else alpha * (exp(x) - 1), written with the clamps at 0
        pos = lax.relu(t)
        neg = (lax.exp(lax.clamp(u, max=0.0)) - 1.0) * float(alpha)
        y = pos + neg
        return y * float(scale) if scale != 1 else y
    return _unary(f)(ctx, x)


@op("softplus")
def _softplus(ctx: NodeContext, x: Any, beta: float = 1.0, threshold: float = 20.0) -> Sym:
    # above ``threshold`` torch returns x itself; log(1 + e^x) differs from x there by < 2e-9
    b = float(beta)
    return _unary(lambda t: lax.softplus(t) if b == 1 else lax.softplus(t * b) / b)(ctx, x)


def _bound(ctx: NodeContext, v: Any) -> float | None | Tensor:
    if v is None:
        return None
    if isinstance(v, numbers.Real):
        return float(v)
    if _is_torch_tensor(v):
        c = uniform_value(v)
        if c is not None:
            return None if math.isinf(c) else c
    return ctx.operand(v, ctx.out_dtype(), "bound")


@op("clamp", "clip")
def _clamp(ctx: NodeContext, x: Any, min: Any = None, max: Any = None) -> Sym:  # noqa: A002
    lo, hi = _bound(ctx, min), _bound(ctx, max)
    t = ctx.operand(x, ctx.out_dtype())
    if not isinstance(t, Tensor):
        raise Unsupported("its operand is a number")
    if isinstance(lo, Tensor):
        t = lax.maximum(t, lo)
        lo = None
    if isinstance(hi, Tensor):
        t = lax.minimum(t, hi)
        hi = None
    if isinstance(lo, float) and isinstance(hi, float) and lo > hi:
        return _result(ctx, t * 0.0 + hi)
    if lo is not None or hi is not None:
        t = lax.clamp(t, lo, hi)
    return _result(ctx, t)


@op("clamp_min")
def _clamp_min(ctx: NodeContext, x: Any, m: Any) -> Sym:
    return _clamp(ctx, x, m, None)


@op("clamp_max")
def _clamp_max(ctx: NodeContext, x: Any, m: Any) -> Sym:
    return _clamp(ctx, x, None, m)


@op("pow")
def _pow(ctx: NodeContext, a: Any, b: Any) -> Sym:
    dt = ctx.out_dtype()
    if _is_torch_tensor(b):
        c = uniform_value(b)
        if c is None or b.dim() > 0:
            raise Unsupported("pow with a tensor exponent")
        b = c
    if isinstance(b, numbers.Real):
        x = ctx.operand(a, dt)
        if not isinstance(x, Tensor):
            raise Unsupported("pow of two numbers")
        e = float(b)
        if e == 0.5:
            return _result(ctx, lax.sqrt(x))
        if e == -0.5:
            return _result(ctx, 1.0 / lax.sqrt(x))
        if e == 2.0:
            return _result(ctx, lax.square(x))
        if e == 0.0:
            return _result(ctx, x * 0.0 + 1.0)
        return _result(ctx, lax.pow(x, e))
    if isinstance(a, numbers.Real) or (_is_torch_tensor(a) and uniform_value(a) is not None
                                       and a.dim() == 0):
        base = float(a) if isinstance(a, numbers.Real) else uniform_value(a)
        if base <= 0:
            raise Unsupported(f"pow with base {base} and a tensor exponent")
        y = ctx.operand(b, dt)
        return _result(ctx, lax.exp(y * math.log(base)))
    raise Unsupported("pow with a tensor exponent")


# where / masks --------------------------------------------------------------------------------

def _select(ctx: NodeContext, cond: Any, a: Any, b: Any) -> Sym:
    if isinstance(cond, (Sym, Boundary)):
        raise Unsupported("its condition is computed at run time (only constant causal / "
                          "sliding-window patterns are expressible)")
    if not _is_torch_tensor(cond):
        cond = _torch().tensor(bool(cond))
    shape = ctx.out_shape()
    found = match_mask(cond, shape)
    if found is None:
        raise Unsupported(f"its constant condition {tuple(cond.shape)} is not a causal or "
                          "sliding-window pattern over the last two dims")
    dt = ctx.out_dtype()
    mask, inverted = found
    if mask is None:
        keep = a if inverted else b
        v = ctx.operand(keep, dt)
        if not isinstance(v, Tensor):
            v = lax.const(v, dt)
        return Sym(cast(v, dt), shape)
    x, y = ctx.operand(a, dt), ctx.operand(b, dt)
    if not isinstance(x, Tensor) and not isinstance(y, Tensor):
        x = lax.const(x, dt)
    return _result(ctx, lax.where(mask, y, x) if inverted else lax.where(mask, x, y))


@op("where")
def _where(ctx: NodeContext, cond: Any, a: Any = None, b: Any = None) -> Sym:
    if a is None:
        raise Unsupported("where(cond) with one argument (nonzero indices)")
    return _select(ctx, cond, a, b)


@op("masked_fill")
def _masked_fill(ctx: NodeContext, x: Any, mask: Any, value: Any) -> Sym:
    return _select(ctx, mask, value, x)


@op("tril", "triu")
def _tri(ctx: NodeContext, x: Any, diagonal: int = 0) -> Sym:
    s = ctx.sym(x)
    if len(s.shape) < 2:
        raise Unsupported(f"{ctx.node.target} of a tensor of rank {len(s.shape)}")
    rows, cols = s.shape[-2:]
    t = materialize(s, (-2, -1)) if s.t.op != "const" else s.t
    if str(ctx.node.target).split(".")[1] == "tril":  # keep j <= i + diagonal
        return _result(ctx, lax.where(lax.causal_mask(rows, cols, int(diagonal)), t, 0.0))
    # triu keeps j >= i + diagonal, the complement of j <= i + diagonal - 1
    return _result(ctx, lax.where(lax.causal_mask(rows, cols, int(diagonal) - 1), 0.0, t))


# matmuls --------------------------------------------------------------------------------------

def _mat(s: Sym) -> Tensor:
    """A matmul operand: the contracted and row/col dims materialised, batch dims may broadcast."""
    if len(s.shape) == 0:
        raise Unsupported("matmul of a scalar")
    return materialize(s, (-1,) if len(s.shape) == 1 else (-2, -1))


def _matmul_syms(ctx: NodeContext, a: Any, b: Any) -> Tensor:
    dt = ctx.out_dtype()
    x, y = ctx.sym(a), ctx.sym(b)
    return lax.matmul(cast(_mat(x), dt), cast(_mat(y), dt))


@op("mm", "bmm", "matmul", "mv", "dot")
def _mm(ctx: NodeContext, a: Any, b: Any) -> Sym:
    return _result(ctx, _matmul_syms(ctx, a, b))


@op("addmm", "baddbmm", "addmv")
def _addmm(ctx: NodeContext, bias: Any, a: Any, b: Any, *, beta: Any = 1, alpha: Any = 1) -> Sym:
    prod = _matmul_syms(ctx, a, b)
    if alpha != 1:
        prod = prod * float(alpha)
    if beta == 0:
        return _result(ctx, prod)
    c = ctx.operand(bias, ctx.out_dtype(), "bias")
    if beta != 1:
        c = c * float(beta)
    return _result(ctx, prod + c)


@op("linear")
def _linear(ctx: NodeContext, x: Any, w: Any, bias: Any = None) -> Sym:
    dt = ctx.out_dtype()
    ws = ctx.sym(w, "weight")
    wt = _mat(ws)
    wt = lax.transpose(wt) if wt.ndim == 2 else wt
    y = lax.matmul(cast(_mat(ctx.sym(x)), dt), cast(wt, dt))
    if bias is not None:
        y = y + ctx.operand(bias, dt, "bias")
    return _result(ctx, y)


@op("convolution")
def _convolution(ctx: NodeContext, x: Any, w: Any, bias: Any, stride: Any, padding: Any,
                 dilation: Any, transposed: bool, output_padding: Any, groups: int) -> Sym:
    """A patch projection -- stride equal to the kernel, no padding, dilation 1, one group, the
    spatial sizes multiples of the kernel (ViT's patch embedding) -- is a reshape and transpose
    of the input into patches and a matmul with the weight viewed as ``(O, C * k1 * ...)``:
    ``out[n, o, p...] = sum_{c, i...} x[n, c, p * k + i ...] w[o, c, i...]``. Other convolutions
    are not expressed (a window that overlaps or skips needs a gather of its own)."""
    xs, ws = ctx.sym(x), ctx.sym(w, "weight")
    n = len(ws.shape) - 2
    kernel = ws.shape[2:]

    def ints(v: Any) -> tuple[int, ...]:
        return tuple(int(a) for a in (v if isinstance(v, (list, tuple)) else [v] * n))
    stride, padding, dilation = ints(stride), ints(padding), ints(dilation)
    spatial = xs.shape[2:]
    why = []
    if transposed:
        why.append("transposed")
    if int(groups) != 1:
        why.append(f"groups={groups}")
    if any(p != 0 for p in padding):
        why.append(f"padding {padding}")
    if any(d != 1 for d in dilation):
        why.append(f"dilation {dilation}")
    if stride != kernel:
        why.append(f"stride {stride} != kernel {kernel}")
    if len(spatial) != n or any(sz % k for sz, k in zip(spatial, kernel)):
        why.append(f"input {xs.shape} not whole patches of {kernel}")
    if why:
        raise Unsupported("only a patch projection (stride = kernel, no padding, dilation 1, "
                          f"one group) is expressed; this convolution of {xs.shape} by "
                          f"{ws.shape} has " + ", ".join(why))
    dt = ctx.out_dtype()
    batch, chans, out_ch = xs.shape[0], xs.shape[1], ws.shape[0]
    patches = tuple(sz // k for sz, k in zip(spatial, kernel))
    ck = chans * math.prod(kernel)
    split = (batch, chans) + tuple(a for pk in zip(patches, kernel) for a in pk)
    t = lax.reshape(materialize(xs), split)
    # (N, C, P1, k1, ..., Pn, kn) -> (N, P1, ..., Pn, C, k1, ..., kn)
    perm = (0,) + tuple(2 + 2 * i for i in range(n)) + (1,) + tuple(3 + 2 * i for i in range(n))
    t = lax.reshape(lax.transpose(t, perm), (batch, math.prod(patches), ck))
    wm = lax.transpose(lax.reshape(materialize(ws), (out_ch, ck)))
    y = lax.matmul(cast(t, dt), cast(wm, dt))
    if bias is not None:
        y = y + ctx.operand(bias, dt, "bias")
    y = lax.reshape(y, (batch,) + patches + (out_ch,))
    return _result(ctx, lax.transpose(y, (0, n + 1) + tuple(range(1, n + 1))))


# reductions -----------------------------------------------------------------------------------

def _axes(dims: Any, n: int) -> tuple[int, ...]:
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return tuple(range(n))
    if isinstance(dims, numbers.Integral):
        dims = [dims]
    return tuple(sorted({_dim(int(d), n) for d in dims}))


def _reduce(ctx: NodeContext, kind: str, x: Any, dims: Any, keepdim: bool, dtype: Any = None,
            i: int | None = None) -> Sym:
    s = ctx.sym(x)
    dt = mirage_dtype(dtype) if dtype is not None else ctx.out_dtype(i)
    if dt is None:
        raise Unsupported(f"reduction to dtype {dtype}")
    n = len(s.shape)
    axes = _axes(dims, n)
    out_shape = ctx.out_shape(i)
    if s.t.op == "const":
        v = float(s.t.attr("value"))
        if kind == "sum":
            v *= math.prod(s.shape[a] for a in axes)
        return Sym(lax.const(v, dt), out_shape)
    if n == 0:
        return _result(ctx, cast(s.t, dt), i)
    t = cast(ranked(s), dt)
    real = tuple(a for a in axes if t.shape[a] == s.shape[a] and s.shape[a] > 1)
    fake = tuple(a for a in axes if t.shape[a] != s.shape[a])
    simple = not fake and all(t.shape[a] == s.shape[a] for a in range(n))
    keep = bool(keepdim) if simple else True
    if real:
        fn = {"sum": lax.sum, "mean": lax.mean, "max": lax.max, "min": lax.min,
              "logsumexp": lax.logsumexp}[kind]
        r = fn(t, real, keepdims=keep)
    else:
        r = t
    if kind == "sum" and fake:
        r = r * float(math.prod(s.shape[a] for a in fake))
    if kind == "logsumexp" and fake:
        r = r + math.log(math.prod(s.shape[a] for a in fake))
    if not keepdim and not simple:
        shape = tuple(d for a, d in enumerate(r.shape) if a not in axes)
        r = lax.reshape(r, shape)
    if not keepdim and simple and not real:
        r = lax.reshape(r, tuple(d for a, d in enumerate(r.shape) if a not in axes))
    return Sym(cast(r, ctx.out_dtype(i)), out_shape)


@op("sum")
def _sum(ctx: NodeContext, x: Any, dim: Any = None, keepdim: bool = False, *,
         dtype: Any = None) -> Sym:
    if _is_dtype(dim):  # sum.default(x, dtype)
        dim, dtype = None, dim
    return _reduce(ctx, "sum", x, dim, keepdim, dtype)


@op("mean")
def _mean(ctx: NodeContext, x: Any, dim: Any = None, keepdim: bool = False, *,
          dtype: Any = None) -> Sym:
    if _is_dtype(dim):
        dim, dtype = None, dim
    return _reduce(ctx, "mean", x, dim, keepdim, dtype)


@op("amax")
def _amax(ctx: NodeContext, x: Any, dim: Any = (), keepdim: bool = False) -> Sym:
    return _reduce(ctx, "max", x, dim, keepdim)


@op("amin")
def _amin(ctx: NodeContext, x: Any, dim: Any = (), keepdim: bool = False) -> Sym:
    return _reduce(ctx, "min", x, dim, keepdim)


def _max_min(kind: str) -> Callable:
    def tr(ctx: NodeContext, x: Any, dim: Any = None, keepdim: bool = False) -> Any:
        if dim is None:  # max.default: the maximum of everything
            return _reduce(ctx, kind, x, None, False)
        if isinstance(dim, (Sym, Boundary)) or _is_torch_tensor(dim):  # max.other
            return (_maximum if kind == "max" else _minimum)(ctx, x, dim)
        if ctx.users_of_output(1):
            raise Unsupported(f"its indices (arg{kind}) are used")
        return (_reduce(ctx, kind, x, dim, keepdim, i=0), _NotComputed(f"arg{kind}"))
    return tr


TABLE["max"] = _max_min("max")
TABLE["min"] = _max_min("min")


@op("logsumexp")
def _logsumexp(ctx: NodeContext, x: Any, dim: Any = None, keepdim: bool = False) -> Sym:
    return _reduce(ctx, "logsumexp", x, dim, keepdim)


def _variance(ctx: NodeContext, s: Sym, axes: tuple[int, ...], correction: float, dt: str
              ) -> tuple[Tensor, Tensor]:
    t = cast(materialize(s, axes), dt)
    n = math.prod(s.shape[a] for a in axes)
    m = lax.mean(t, axes, keepdims=True)
    d = t - m
    ss = lax.sum(lax.square(d), axes, keepdims=True)
    if n - correction <= 0:
        raise Unsupported(f"variance of {n} elements with correction {correction}")
    return m, ss / float(n - correction)


def _correction(correction: Any, unbiased: Any = None) -> float:
    if correction is not None:
        return float(correction)
    return 1.0 if unbiased in (None, True) else 0.0


def _squeeze_axes(t: Tensor, axes: tuple[int, ...], keepdim: bool) -> Tensor:
    if keepdim:
        return t
    return lax.reshape(t, tuple(d for a, d in enumerate(t.shape) if a not in axes))


@op("var", "std")
def _var(ctx: NodeContext, x: Any, dim: Any = None, *, correction: Any = None,
         keepdim: bool = False, unbiased: Any = None) -> Sym:
    s = ctx.sym(x)
    axes = _axes(dim, len(s.shape))
    _, v = _variance(ctx, s, axes, _correction(correction, unbiased), ctx.out_dtype())
    if str(ctx.node.target).split(".")[1] == "std":
        v = lax.sqrt(v)
    return _result(ctx, _squeeze_axes(v, axes, keepdim))


@op("var_mean", "std_mean")
def _var_mean(ctx: NodeContext, x: Any, dim: Any = None, *, correction: Any = None,
              keepdim: bool = False, unbiased: Any = None) -> tuple:
    s = ctx.sym(x)
    axes = _axes(dim, len(s.shape))
    m, v = _variance(ctx, s, axes, _correction(correction, unbiased), ctx.out_dtype(0))
    if str(ctx.node.target).split(".")[1] == "std_mean":
        v = lax.sqrt(v)
    return (_result(ctx, _squeeze_axes(v, axes, keepdim), 0),
            _result(ctx, _squeeze_axes(m, axes, keepdim), 1))


def _is_dtype(v: Any) -> bool:
    return type(v).__name__ == "dtype" and type(v).__module__ == "torch"


# softmax and norms ----------------------------------------------------------------------------

def _softmax_like(fn: Callable) -> Callable:
    def tr(ctx: NodeContext, x: Any, dim: int, half_to_float: Any = False, *,
           dtype: Any = None) -> Sym:
        # softmax.int(x, dim, dtype) / _softmax(x, dim, half_to_float): the result dtype is the
        # node's, read from its metadata
        s = ctx.sym(x)
        d = _dim(int(dim), len(s.shape))
        dt = ctx.out_dtype()
        if s.t.op == "const":
            raise Unsupported("softmax of a constant")
        t = cast(materialize(s, (d,)), dt)
        return _result(ctx, fn(t, d))
    return tr


TABLE["_softmax"] = TABLE["softmax"] = TABLE["_safe_softmax"] = _softmax_like(lax.softmax)
TABLE["_log_softmax"] = TABLE["log_softmax"] = _softmax_like(lax.log_softmax)


def _param(ctx: NodeContext, v: Any, shape: tuple[int, ...], dt: str, what: str) -> Tensor | None:
    if v is None:
        return None
    s = ctx.sym(v, what)
    if s.shape != shape:
        raise Unsupported(f"its {what} has shape {s.shape}, expected {shape}")
    return cast(materialize(s), dt)


def _layer_norm_core(ctx: NodeContext, x: Any, normalized_shape: Any, weight: Any, bias: Any,
                     eps: float, dt: str) -> tuple[Sym, Tensor, Tensor]:
    s = ctx.sym(x)
    k = len(tuple(normalized_shape))
    n = len(s.shape)
    if not 1 <= k <= n or tuple(s.shape[n - k:]) != tuple(int(d) for d in normalized_shape):
        raise Unsupported(f"layer_norm over {tuple(normalized_shape)} of {s.shape}")
    axes = tuple(range(n - k, n))
    t = cast(materialize(s, axes), dt)
    nshape = tuple(s.shape[n - k:])
    w = _param(ctx, weight, nshape, dt, "weight")
    b = _param(ctx, bias, nshape, dt, "bias")
    y = lax.layer_norm(t, w, b, float(eps), normalized_ndim=k)
    m = lax.mean(t, axes, keepdims=True)
    rstd = 1.0 / lax.sqrt(lax.mean(lax.square(t - m), axes, keepdims=True) + float(eps))
    return Sym(y, s.shape), m, rstd


@op("layer_norm")
def _layer_norm(ctx: NodeContext, x: Any, normalized_shape: Any, weight: Any = None,
                bias: Any = None, eps: float = 1e-5, cudnn_enable: Any = True) -> Sym:
    y, _, _ = _layer_norm_core(ctx, x, normalized_shape, weight, bias, eps, ctx.out_dtype())
    return _result(ctx, y.t)


@op("native_layer_norm")
def _native_layer_norm(ctx: NodeContext, x: Any, normalized_shape: Any, weight: Any, bias: Any,
                       eps: float) -> tuple:
    y, m, rstd = _layer_norm_core(ctx, x, normalized_shape, weight, bias, eps, ctx.out_dtype(0))
    return (_result(ctx, y.t, 0), _result(ctx, m, 1), _result(ctx, rstd, 2))


@op("rms_norm")
def _rms_norm(ctx: NodeContext, x: Any, normalized_shape: Any, weight: Any = None,
              eps: Any = None) -> Sym:
    s = ctx.sym(x)
    k = len(tuple(normalized_shape))
    n = len(s.shape)
    if not 1 <= k <= n or tuple(s.shape[n - k:]) != tuple(int(d) for d in normalized_shape):
        raise Unsupported(f"rms_norm over {tuple(normalized_shape)} of {s.shape}")
    dt = ctx.out_dtype()
    if eps is None:
        eps = float(_torch().finfo(_torch_dtype(s.dtype)).eps)
    axes = tuple(range(n - k, n))
    t = cast(materialize(s, axes), dt)
    nshape = tuple(s.shape[n - k:])
    w = _param(ctx, weight, nshape, dt, "weight")
    if k == 1:
        return _result(ctx, lax.rms_norm(t, w, float(eps)))
    y = t / lax.sqrt(lax.mean(lax.square(t), axes, keepdims=True) + float(eps))
    return _result(ctx, y * w if w is not None else y)


def _torch_dtype(name: str) -> Any:
    return getattr(_torch(), name)


@op("group_norm")
def _group_norm(ctx: NodeContext, x: Any, num_groups: int, weight: Any = None, bias: Any = None,
                eps: float = 1e-5, cudnn_enabled: Any = True) -> Sym:
    s = ctx.sym(x)
    dt = ctx.out_dtype()
    if len(s.shape) < 2:
        raise Unsupported(f"group_norm of {s.shape}")
    c = (s.shape[1],)
    t = cast(materialize(s), dt)
    return _result(ctx, lax.group_norm(t, int(num_groups), _param(ctx, weight, c, dt, "weight"),
                                       _param(ctx, bias, c, dt, "bias"), float(eps)))


@op("native_group_norm")
def _native_group_norm(ctx: NodeContext, x: Any, weight: Any, bias: Any, n: int, c: int, hw: int,
                       group: int, eps: float) -> tuple:
    if ctx.users_of_output(1) or ctx.users_of_output(2):
        raise Unsupported("its saved mean / rstd are used")
    return (_group_norm(ctx, x, group, weight, bias, eps), _NotComputed("mean"),
            _NotComputed("rstd"))


def _batch_norm_core(ctx: NodeContext, x: Any, weight: Any, bias: Any, mean: Any, var: Any,
                     eps: float, dt: str) -> Tensor:
    s = ctx.sym(x)
    if len(s.shape) < 2:
        raise Unsupported(f"batch_norm of {s.shape}")
    c = (s.shape[1],)
    if mean is None or var is None:
        raise Unsupported("batch_norm without running statistics")
    return lax.batch_norm(cast(materialize(s), dt), _param(ctx, mean, c, dt, "running_mean"),
                          _param(ctx, var, c, dt, "running_var"),
                          _param(ctx, weight, c, dt, "weight"), _param(ctx, bias, c, dt, "bias"),
                          float(eps))


@op("_native_batch_norm_legit_no_training")
def _bn_no_training(ctx: NodeContext, x: Any, weight: Any, bias: Any, mean: Any, var: Any,
                    momentum: float, eps: float) -> tuple:
    if ctx.users_of_output(1) or ctx.users_of_output(2):
        raise Unsupported("its saved statistics are used")
    return (_result(ctx, _batch_norm_core(ctx, x, weight, bias, mean, var, eps,
                                          ctx.out_dtype(0)), 0),
            _NotComputed("save_mean"), _NotComputed("save_rstd"))


@op("batch_norm")
def _batch_norm(ctx: NodeContext, x: Any, weight: Any, bias: Any, mean: Any, var: Any,
                training: bool, momentum: float, eps: float, cudnn_enabled: Any = True) -> Sym:
    if training:
        raise Unsupported("batch_norm in training mode (put the module in eval())")
    return _result(ctx, _batch_norm_core(ctx, x, weight, bias, mean, var, eps, ctx.out_dtype()))


@op("_native_batch_norm_legit")
def _bn_legit(ctx: NodeContext, x: Any, weight: Any, bias: Any, *args: Any) -> tuple:
    """Batch norm from the batch's own statistics (``no_stats``: instance norm, or a batch norm
    without running statistics), biased variance over every dim but the channels (dim 1). With
    running statistics and ``training`` the module updates them: not a program."""
    if len(args) == 3:  # no_stats: (training, momentum, eps)
        training, _, eps = args
    else:  # (running_mean, running_var, training, momentum, eps)
        mean, var, training, _, eps = args
        if not training:
            return _bn_no_training(ctx, x, weight, bias, mean, var, 0.0, eps)
        raise Unsupported("batch_norm in training mode updates its running statistics")
    if ctx.users_of_output(1) or ctx.users_of_output(2):
        raise Unsupported("its saved statistics are used")
    s = ctx.sym(x)
    if len(s.shape) < 2:
        raise Unsupported(f"batch_norm of {s.shape}")
    dt = ctx.out_dtype(0)
    t = cast(materialize(s), dt)
    axes = tuple(a for a in range(len(s.shape)) if a != 1)
    m, v = _variance(ctx, Sym(t, s.shape), axes, 0.0, dt)
    y = (t - m) / lax.sqrt(v + float(eps))
    c = (s.shape[1],)
    for name, p in (("weight", weight), ("bias", bias)):
        pt = _param(ctx, p, c, dt, name)
        if pt is not None:
            pt = lax.reshape(pt, c + (1,) * (len(s.shape) - 2)) if len(s.shape) > 2 else pt
            y = y * pt if name == "weight" else y + pt
    return (_result(ctx, y, 0), _NotComputed("save_mean"), _NotComputed("save_rstd"))


@op("linalg_vector_norm", "norm")
def _vector_norm(ctx: NodeContext, x: Any, ord: Any = 2,  # noqa: A002
                 dim: Any = None, keepdim: bool = False, *, dtype: Any = None) -> Sym:
    """2-norm ``sqrt(sum(x^2))``, 1-norm ``sum(|x|)``, inf-norm ``max(|x|)``, p-norm
    ``sum(|x|^p)^(1/p)`` over ``dim``."""
    s = ctx.sym(x)
    p = 2.0 if ord is None else float(ord)
    dt = ctx.out_dtype()
    n = len(s.shape)
    axes = _axes(dim, n)
    t = cast(materialize(s, axes), dt)
    if p == 2.0:
        r = lax.sqrt(lax.sum(lax.square(t), axes, keepdims=bool(keepdim)))
    elif p == 1.0:
        r = lax.sum(lax.abs(t), axes, keepdims=bool(keepdim))
    elif p == math.inf:
        r = lax.max(lax.abs(t), axes, keepdims=bool(keepdim))
    elif p > 0 and math.isfinite(p):
        r = lax.pow(lax.sum(lax.pow(lax.abs(t), p), axes, keepdims=bool(keepdim)), 1.0 / p)
    else:
        raise Unsupported(f"vector norm of order {p}")
    return _result(ctx, r)


def _pool(kind: str, dims: int) -> Callable:
    """Average / max pooling whose windows tile the input (stride = kernel, no padding, no
    dilation): a reshape of each spatial dim into (windows, kernel) and a mean / max over the
    kernel dims. Rows past the last whole window are dropped, as torch does."""
    def tr(ctx: NodeContext, x: Any, kernel_size: Any, stride: Any = (), padding: Any = 0,
           *rest: Any, **kw: Any) -> Any:
        s = ctx.sym(x)
        k = _tuple(kernel_size, dims)
        st = _tuple(stride, dims) if stride not in (None, [], ()) else k
        pad = _tuple(padding, dims)
        if kind == "max":
            dilation = _tuple(rest[0], dims) if rest else _tuple(kw.get("dilation", 1), dims)
            ceil = rest[1] if len(rest) > 1 else kw.get("ceil_mode", False)
        else:
            dilation = (1,) * dims
            ceil = rest[0] if rest else kw.get("ceil_mode", False)
            if (rest[2] if len(rest) > 2 else kw.get("divisor_override")) is not None:
                raise Unsupported("pooling with a divisor_override")
        if st != k or any(pad) or any(d != 1 for d in dilation):
            raise Unsupported(f"pooling with stride {st}, padding {pad}, dilation {dilation} "
                              f"(windows must tile the input: stride = kernel {k})")
        spatial = s.shape[-dims:]
        if ceil and any(n % w for n, w in zip(spatial, k)):
            raise Unsupported("pooling with ceil_mode over a partial window")
        if kind == "max" and ctx.users_of_output(1):
            raise Unsupported("its indices are used")
        dt = ctx.out_dtype(0 if kind == "max" else None)
        t = cast(materialize(s), dt)
        lead = len(s.shape) - dims
        for i, (n, w) in enumerate(zip(spatial, k)):
            if n % w:
                t = lax.slice(t, lead + i, 0, n - n % w)
        split = s.shape[:lead] + tuple(v for n, w in zip(spatial, k) for v in (n // w, w))
        t = lax.reshape(t, split)
        axes = tuple(lead + 2 * i + 1 for i in range(dims))
        r = lax.max(t, axes) if kind == "max" else lax.mean(t, axes)
        if kind == "max":
            return (_result(ctx, r, 0), _NotComputed("max_pool indices"))
        return _result(ctx, r)
    return tr


def _tuple(v: Any, n: int) -> tuple[int, ...]:
    if isinstance(v, numbers.Integral):
        return (int(v),) * n
    v = tuple(int(a) for a in v)
    return v * n if len(v) == 1 else v


TABLE["avg_pool1d"] = _pool("avg", 1)
TABLE["avg_pool2d"] = _pool("avg", 2)
TABLE["avg_pool3d"] = _pool("avg", 3)
TABLE["max_pool2d_with_indices"] = _pool("max", 2)
TABLE["max_pool3d_with_indices"] = _pool("max", 3)


@op("dropout", "feature_dropout", "alpha_dropout")
def _dropout(ctx: NodeContext, x: Any, p: float, train: bool) -> Sym:
    if train and p > 0:
        raise Unsupported(f"dropout with p={p} in training mode (put the module in eval())")
    return _unary(lambda t: t)(ctx, x)


@op("native_dropout")
def _native_dropout(ctx: NodeContext, x: Any, p: float, train: Any) -> tuple:
    if train and p > 0:
        raise Unsupported(f"dropout with p={p} in training mode (put the module in eval())")
    if ctx.users_of_output(1):
        raise Unsupported("its dropout mask is used")
    return (_unary(lambda t: t)(ctx, x), _NotComputed("dropout mask"))


# attention ------------------------------------------------------------------------------------

def attention(ctx: NodeContext, q: Any, k: Any, v: Any, attn_mask: Any, dropout_p: float,
              is_causal: bool, scale: Any, enable_gqa: bool, i: int | None = None) -> Sym:
    """``softmax(q @ k^T * scale + mask) @ v`` as ``torch.nn.functional.scaled_dot_product_
    attention`` defines it: ``is_causal`` keeps key j for query i when ``j <= i`` (top-left
    aligned), a boolean mask keeps where True, a float mask is added; ``enable_gqa``: query head h
    reads key/value head ``h // (Hq / Hkv)``."""
    if dropout_p:
        raise Unsupported(f"attention dropout p={dropout_p}")
    dt = ctx.out_dtype(i)
    qs, ks, vs = ctx.sym(q, "query"), ctx.sym(k, "key"), ctx.sym(v, "value")
    if len(qs.shape) < 2 or len(ks.shape) < 2:
        raise Unsupported("attention of tensors of rank < 2")
    L, E = qs.shape[-2:]
    S = ks.shape[-2]
    sc = float(scale) if scale is not None else 1.0 / math.sqrt(E)
    Q, K, V = (cast(_mat(x), dt) for x in (qs, ks, vs))
    group = 1
    # key / value heads repeated per query head by the caller (transformers' ``repeat_kv``:
    # expand, then a reshape that merges the copies): read the heads before the copies instead
    rk, rv = _repeated_heads(K), _repeated_heads(V)
    repeated = rk is not None and rv is not None and rk[1] == rv[1] > 1 and \
        len(qs.shape) >= 3 and qs.shape[-3] == ks.shape[-3]
    if repeated:
        ks = Sym(K, ks.shape[:-3] + (ks.shape[-3] // rk[1],) + ks.shape[-2:])
        vs = Sym(V, vs.shape[:-3] + (vs.shape[-3] // rv[1],) + vs.shape[-2:])
        enable_gqa = True
    if len(qs.shape) >= 3 and len(ks.shape) >= 3 and qs.shape[-3] != ks.shape[-3]:
        hq, hk = qs.shape[-3], ks.shape[-3]
        if not enable_gqa or hk == 0 or hq % hk:
            raise Unsupported(f"attention with {hq} query heads and {hk} key heads")
        group = hq // hk
    if group > 1:
        # query heads h = g * group + r read key head g: (.., Hk, group, L, E) against
        # (.., Hk, 1, E, S) keys -- a broadcast matmul, no copies
        Q = lax.reshape(ranked(Sym(Q, qs.shape)), qs.shape[:-3] + (hk, group, L, E))
        if repeated:  # (.., Hk, 1, S, E) before the copies
            K, V = rk[0], rv[0]
        else:
            K = lax.reshape(ranked(Sym(K, ks.shape)), ks.shape[:-3] + (hk, 1, S, E))
            V = lax.reshape(ranked(Sym(V, vs.shape)), vs.shape[:-3] + (hk, 1, S, vs.shape[-1]))
    kt = lax.transpose(K, tuple(range(K.ndim - 2)) + (K.ndim - 1, K.ndim - 2))
    scores = lax.matmul(Q, kt) * sc
    if is_causal:
        if attn_mask is not None:
            raise Unsupported("attention with both is_causal and attn_mask")
        scores = lax.where(lax.causal_mask(L, S, 0), scores, -BIG)
    elif attn_mask is not None:
        scores = _apply_attn_mask(ctx, scores, attn_mask, L, S, group, dt)
    out = lax.matmul(lax.softmax(scores, -1), V)
    if group > 1:
        out = lax.reshape(out, out.shape[:-4] + (out.shape[-4] * group,) + out.shape[-2:])
    return _result(ctx, out, i)


def _repeated_heads(t: Tensor) -> tuple[Tensor, int] | None:
    """``t`` = ``reshape(concat([x] * g, axis=j))`` of ``x`` (.., Hk, 1, S, E), merging dims
    ``j - 1`` and ``j`` into the heads dim (third from last): ``(x, g)``, else None."""
    if t.op != "reshape" or t.inputs[0].op != "concat":
        return None
    c = t.inputs[0]
    j = c.attr("axis")
    x = c.inputs[0]
    g = len(c.inputs)
    n = c.ndim
    if any(y != x for y in c.inputs) or x.shape[j] != 1 or j != n - 3 or j < 1 or \
            t.shape != c.shape[:j - 1] + (c.shape[j - 1] * g,) + c.shape[j + 1:]:
        return None
    return x, g


def _apply_attn_mask(ctx: NodeContext, scores: Tensor, m: Any, L: int, S: int, group: int,
                     dt: str) -> Tensor:
    torch = _torch()
    if _is_torch_tensor(m):
        if m.dtype == torch.bool:
            found = match_mask(m, tuple(m.shape[:-2]) + (L, S) if m.dim() >= 2 else (L, S))
            if found is None:
                raise Unsupported(f"its boolean attn_mask {tuple(m.shape)} is not a causal or "
                                  "sliding-window pattern")
            mask, inverted = found
            if mask is None:
                return scores if inverted else scores * 0.0 - BIG
            return lax.where(mask, -BIG, scores) if inverted else lax.where(mask, scores, -BIG)
        vals = torch.unique(m.detach().to("cpu").float())
        if len(vals) == 2 and 0.0 in vals.tolist():
            c = [x for x in vals.tolist() if x != 0.0][0]
            found = match_mask(m == 0, tuple(m.shape[:-2]) + (L, S) if m.dim() >= 2 else (L, S))
            if found is not None and found[0] is not None:
                mask, inverted = found
                fill = -BIG if c <= -BIG else BIG if c >= BIG else scores + c
                return lax.where(mask, fill, scores) if inverted else \
                    lax.where(mask, scores, fill)
    ms = ctx.sym(m, "attn_mask")
    if mirage_dtype(_torch_dtype(ms.dtype)) is None:
        raise Unsupported("its attn_mask is not a float tensor")
    mt = cast(ranked(ms), dt)
    if group > 1:
        if mt.ndim >= 3 and mt.shape[-3] != 1:
            hk = mt.shape[-3] // group
            mt = lax.reshape(mt, mt.shape[:-3] + (hk, group) + mt.shape[-2:])
        else:
            mt = lax.reshape(mt, mt.shape[:-2] + (1,) + mt.shape[-2:]) if mt.ndim >= 2 else mt
    return scores + mt


@op("scaled_dot_product_attention")
def _sdpa(ctx: NodeContext, q: Any, k: Any, v: Any, attn_mask: Any = None, dropout_p: float = 0.0,
          is_causal: bool = False, *, scale: Any = None, enable_gqa: bool = False) -> Sym:
    return attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, enable_gqa)


def _sdpa_variant(*, mask_arg: bool) -> Callable:
    """The backend-specific forms torch lowers SDPA to (CPU flash, CUDA flash / efficient /
    cuDNN): output 0 is the attention, the others (log-sum-exp, RNG state) are not computed."""
    def tr(ctx: NodeContext, q: Any, k: Any, v: Any, *args: Any, attn_mask: Any = None,
           scale: Any = None, **kw: Any) -> tuple:
        args = list(args)
        if mask_arg:  # (q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal, ...)
            attn_mask = args.pop(0) if args else attn_mask
            args = args[1:]
        dropout_p = args[0] if args else kw.get("dropout_p", 0.0)
        is_causal = args[1] if len(args) > 1 else kw.get("is_causal", False)
        for j in range(1, len(ctx.meta) if isinstance(ctx.meta, (tuple, list)) else 1):
            if ctx.users_of_output(j):
                raise Unsupported(f"its auxiliary output {j} (log-sum-exp / RNG state) is used")
        out = attention(ctx, q, k, v, attn_mask, dropout_p, is_causal, scale, True, i=0)
        n = len(ctx.meta) if isinstance(ctx.meta, (tuple, list)) else 1
        return (out,) + tuple(_NotComputed(f"attention output {j}") for j in range(1, n))
    return tr


TABLE["_scaled_dot_product_flash_attention_for_cpu"] = _sdpa_variant(mask_arg=False)
TABLE["_scaled_dot_product_flash_attention"] = _sdpa_variant(mask_arg=False)
TABLE["_scaled_dot_product_efficient_attention"] = _sdpa_variant(mask_arg=True)
TABLE["_scaled_dot_product_cudnn_attention"] = _sdpa_variant(mask_arg=True)


# dtypes ---------------------------------------------------------------------------------------

@op("_to_copy", "to", "_to_dtype", "type_as", "_autocast_to_reduced_precision",
    "_autocast_to_full_precision")
def _to_copy(ctx: NodeContext, x: Any, *args: Any, **kw: Any) -> Sym:
    s = ctx.sym(x)
    dt = ctx.out_dtype()
    return Sym(cast(s.t, dt), s.shape)


# shapes ---------------------------------------------------------------------------------------

def reshape_sym(s: Sym, new: tuple[int, ...]) -> Sym:
    """``s`` viewed as ``new`` (lazy dims kept where the reshape only adds or drops dims of
    size 1)."""
    if s.t.op == "const" or s.shape == new:
        return Sym(s.t, new)
    if not s.lazy:
        return Sym(lax.reshape(s.t, new), new)
    if [d for d in s.shape if d != 1] == [d for d in new if d != 1]:
        t = ranked(s)
        sizes = [t.shape[a] for a, d in enumerate(s.shape) if d != 1]
        it = iter(sizes)
        shape = tuple(next(it) if d != 1 else 1 for d in new)
        return Sym(lax.reshape(t, shape), new)
    return Sym(lax.reshape(materialize(s), new), new)


@op("view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias", "flatten", "unflatten",
    "squeeze", "squeeze_copy", "unsqueeze", "unsqueeze_copy", "expand_as", "view_as",
    "reshape_as", "_unsafe_view_copy", "numpy_T_copy")
def _view(ctx: NodeContext, x: Any, *args: Any, **kw: Any) -> Sym | Boundary:
    if _index_boundary(x):  # a view of token ids: taken by torch at call time
        if x.shape == ctx.out_shape():
            return x
        return x.viewed(("reshape", ctx.out_shape()), ctx.out_shape())
    return reshape_sym(ctx.sym(x), ctx.out_shape())


def _index_boundary(x: Any) -> bool:
    """Is ``x`` a runtime index tensor (int32 / int64), which programs read only through
    ``take``? Views of it stay runtime tensors (:meth:`Boundary.viewed`)."""
    return isinstance(x, Boundary) and index_dtype(x.dtype) is not None and \
        all(d > 0 for d in x.shape)


@op("expand", "expand_copy", "broadcast_to")
def _expand(ctx: NodeContext, x: Any, size: Any, *args: Any, **kw: Any) -> Sym:
    s = ctx.sym(x)
    new = ctx.out_shape()
    if s.t.op == "const":
        return Sym(s.t, new)
    t = ranked(s)
    # right-aligned: t keeps its dims; the added leading dims are lazy
    return Sym(t, new)


@op("permute", "permute_copy")
def _permute(ctx: NodeContext, x: Any, dims: Any) -> Sym:
    s = ctx.sym(x)
    n = len(s.shape)
    perm = tuple(_dim(int(d), n) for d in dims)
    new = ctx.out_shape()
    if s.t.op == "const":
        return Sym(s.t, new)
    return Sym(lax.transpose(ranked(s), perm), new)


@op("transpose", "transpose_copy", "swapaxes", "swapdims")
def _transpose(ctx: NodeContext, x: Any, d0: int, d1: int) -> Sym:
    s = ctx.sym(x)
    n = len(s.shape)
    perm = list(range(n))
    a, b = _dim(int(d0), n), _dim(int(d1), n)
    perm[a], perm[b] = perm[b], perm[a]
    return _permute(ctx, s, perm)


@op("t", "t_copy", "numpy_T", "mT", "adjoint")
def _t(ctx: NodeContext, x: Any) -> Sym:
    s = ctx.sym(x)
    n = len(s.shape)
    if n < 2:
        return Sym(s.t, ctx.out_shape())
    return _transpose(ctx, s, n - 2, n - 1)


def slice_sym(s: Sym, d: int, start: int, stop: int) -> Sym:
    new = s.shape[:d] + (stop - start,) + s.shape[d + 1:]
    if s.t.op == "const":
        return Sym(s.t, new)
    t = ranked(s)
    if t.shape[d] != s.shape[d]:  # an expanded dim: every slice is the same
        return Sym(t, new)
    return Sym(lax.slice(t, d, start, stop), new)


def _norm_range(start: Any, end: Any, n: int) -> tuple[int, int]:
    lo = 0 if start is None else int(start)
    hi = n if end is None else int(end)
    lo = lo + n if lo < 0 else lo
    hi = hi + n if hi < 0 else hi
    return max(0, min(lo, n)), max(0, min(hi, n))


@op("slice", "slice_copy")
def _slice(ctx: NodeContext, x: Any, dim: int = 0, start: Any = None, end: Any = None,
           step: int = 1) -> Sym | Boundary:
    s = x if _index_boundary(x) else ctx.sym(x)
    if step != 1:
        raise Unsupported(f"slice with step {step}")
    d = _dim(int(dim), len(s.shape))
    lo, hi = _norm_range(start, end, s.shape[d])
    if lo >= hi:
        raise Unsupported(f"an empty slice {start}:{end} of dim {d} of {s.shape}")
    if isinstance(s, Boundary):  # rows of token ids: taken by torch at call time
        return s.viewed(("narrow", d, lo, hi - lo), ctx.out_shape())
    return slice_sym(s, d, lo, hi)


@op("narrow", "narrow_copy")
def _narrow(ctx: NodeContext, x: Any, dim: int, start: Any, length: int) -> Sym:
    s = ctx.sym(x)
    d = _dim(int(dim), len(s.shape))
    lo = int(start) + (s.shape[d] if int(start) < 0 else 0)
    return slice_sym(s, d, lo, lo + int(length))


@op("select", "select_copy")
def _select_index(ctx: NodeContext, x: Any, dim: int, index: int) -> Sym:
    s = ctx.sym(x)
    d = _dim(int(dim), len(s.shape))
    i = int(index) % s.shape[d]
    return reshape_sym(slice_sym(s, d, i, i + 1), ctx.out_shape())


def _gather_rows(ctx: NodeContext, table: Any, indices: Any, what: str) -> Sym:
    """Rows of ``table`` (its first dim) picked by ``indices``: a take of an index input, or a
    slice for a constant contiguous range."""
    ids = ctx.indices(indices)
    s = ctx.sym(table, "table")
    t = materialize(s)
    if isinstance(ids, tuple):
        lo, hi = ids
        if lo < 0 or hi > s.shape[0]:
            raise Unsupported(f"its constant {what} {lo}..{hi - 1} leave the table {s.shape}")
        out = lax.slice_axis(t, 0, lo, hi) if (lo, hi) != (0, s.shape[0]) else t
        return reshape_sym(Sym(out, out.shape), ctx.out_shape())
    return _result(ctx, lax.take(t, ids))


@op("embedding")
def _embedding(ctx: NodeContext, weight: Any, indices: Any, padding_idx: int = -1,
               scale_grad_by_freq: bool = False, sparse: bool = False) -> Sym:
    # padding_idx, scale_grad_by_freq and sparse only change the gradient
    return _gather_rows(ctx, weight, indices, "indices")


@op("index_select")
def _index_select(ctx: NodeContext, x: Any, dim: int, index: Any) -> Sym:
    s = ctx.sym(x)
    d = _dim(int(dim), len(s.shape))
    if d == 0:
        return _gather_rows(ctx, x, index, "index")
    # another dim: brought to the front, gathered, and put back
    n = len(s.shape)
    perm = (d, *[a for a in range(n) if a != d])
    moved = lax.transpose(materialize(s), perm)
    ids = ctx.indices(index)
    if isinstance(ids, tuple):
        got = lax.slice_axis(moved, 0, *ids) if ids != (0, s.shape[d]) else moved
    else:
        got = lax.take(moved, ids)
    back = tuple(int(i) for i in np.argsort(perm))
    return _result(ctx, lax.transpose(got, back))


def _pieces(s: Sym, d: int, sizes: list[int]) -> tuple:
    out, lo = [], 0
    for n in sizes:
        out.append(slice_sym(s, d, lo, lo + n))
        lo += n
    return tuple(out)


@op("split", "split_copy", "unsafe_split")
def _split(ctx: NodeContext, x: Any, split_size: Any, dim: int = 0) -> tuple:
    s = ctx.sym(x)
    d = _dim(int(dim), len(s.shape))
    n = s.shape[d]
    if isinstance(split_size, (list, tuple)):
        sizes = [int(v) for v in split_size]
    else:
        k = int(split_size)
        sizes = [k] * (n // k) + ([n % k] if n % k else [])
    if any(v <= 0 for v in sizes):
        raise Unsupported(f"split of {s.shape} into empty pieces")
    return _pieces(s, d, sizes)


@op("split_with_sizes", "split_with_sizes_copy", "unsafe_split_with_sizes")
def _split_with_sizes(ctx: NodeContext, x: Any, sizes: Any, dim: int = 0) -> tuple:
    return _split(ctx, x, list(sizes), dim)


@op("chunk", "unsafe_chunk")
def _chunk(ctx: NodeContext, x: Any, chunks: int, dim: int = 0) -> tuple:
    s = ctx.sym(x)
    d = _dim(int(dim), len(s.shape))
    n = s.shape[d]
    k = -(-n // int(chunks))
    return _split(ctx, s, k, d)


@op("unbind", "unbind_copy")
def _unbind(ctx: NodeContext, x: Any, dim: int = 0) -> tuple:
    s = ctx.sym(x)
    d = _dim(int(dim), len(s.shape))
    new = s.shape[:d] + s.shape[d + 1:]
    return tuple(reshape_sym(p, new) for p in _pieces(s, d, [1] * s.shape[d]))


@op("cat", "concat", "concatenate")
def _cat(ctx: NodeContext, tensors: Any, dim: int = 0) -> Sym:
    # empty pieces add nothing (and torch skips 1-D empty tensors of any other shape)
    syms = [ctx.sym(t) for t in tensors if 0 not in _shape_of(t)]
    if not syms:
        raise Unsupported("a concatenation of empty tensors")
    dt = ctx.out_dtype()
    shape = ctx.out_shape()
    d = _dim(int(dim), len(shape))
    parts = [cast(materialize(s), dt) if s.t.op != "const" else None for s in syms]
    if any(p is None for p in parts):
        raise Unsupported("concatenation of a broadcast constant")
    return Sym(lax.concat(parts, d), shape)


def _shape_of(v: Any) -> tuple[int, ...]:
    if isinstance(v, (Sym, Boundary)):
        return v.shape
    return tuple(int(d) for d in getattr(v, "shape", ()))


@op("stack")
def _stack(ctx: NodeContext, tensors: Any, dim: int = 0) -> Sym:
    syms = [ctx.sym(t) for t in tensors]
    shape = ctx.out_shape()
    d = _dim(int(dim), len(shape))
    one = shape[:d] + (1,) + shape[d + 1:]
    dt = ctx.out_dtype()
    parts = [cast(lax.reshape(materialize(s), one), dt) for s in syms]
    return Sym(lax.concat(parts, d), shape)


@op("repeat")
def _repeat(ctx: NodeContext, x: Any, repeats: Any) -> Sym:
    s = ctx.sym(x)
    reps = [int(r) for r in repeats]
    t = ranked(Sym(materialize(s), s.shape))
    t = lax.reshape(t, (1,) * (len(reps) - t.ndim) + t.shape) if len(reps) > t.ndim else t
    for d, r in enumerate(reps):
        if r > 1:
            t = lax.concat([t] * r, d)
    return _result(ctx, t)


@op("getitem")
def _getitem(ctx: NodeContext, seq: Any, i: int) -> Any:
    v = seq[i]
    if isinstance(v, _NotComputed):
        raise Unsupported(f"it reads the {v.what}, which programs do not compute")
    return v


#: operators whose value depends only on their inputs' shapes and dtypes (folded at capture)
SHAPE_ONLY = {"full_like", "zeros_like", "ones_like", "empty_like", "new_full", "new_zeros",
              "new_ones", "new_empty", "scalar_tensor", "full", "zeros", "ones", "empty",
              "arange", "new_tensor", "empty_strided", "new_empty_strided"}

#: operators never folded (random numbers: a fresh draw every call)
RANDOM = {"rand", "randn", "rand_like", "randn_like", "randint", "randint_like", "bernoulli",
          "normal", "uniform", "randperm", "native_dropout", "dropout", "multinomial",
          "exponential", "poisson", "_fused_dropout", "seed", "_philox_rand"}

#: nodes without a value that only check metadata: dropped from the graph
ASSERTS = {"_assert_tensor_metadata", "_assert_scalar", "sym_constrain_range",
           "sym_constrain_range_for_size", "_assert_async", "_print", "_functional_assert_async",
           "_functional_sym_constrain_range", "_functional_sym_constrain_range_for_size"}


def packet_name(target: Any) -> str:
    """``aten.add.Tensor`` -> ``add``; ``operator.getitem`` -> ``getitem``."""
    name = getattr(target, "__name__", str(target))
    pk = getattr(target, "overloadpacket", None)
    if pk is not None:
        name = getattr(pk, "__name__", name)
    return name.split(".")[0]


def op_label(target: Any) -> str:
    """How an operator is named in messages: ``aten.add.Tensor``."""
    s = str(target)
    if s.startswith("<built-in function"):
        return s[len("<built-in function "):-1]
    return s


__all__ = ["TABLE", "NodeContext", "Sym", "Boundary", "Unsupported", "match_mask", "mirage_dtype",
           "index_dtype", "input_dtype",
           "packet_name", "op_label", "SHAPE_ONLY", "RANDOM", "ASSERTS", "MirageError", "BIG",
           "make_input"]
