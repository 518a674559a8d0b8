"""Small helpers that write C++ text: identifiers, float literals, index arithmetic, and the
element-wise operators of the op vocabulary as CUDA expressions."""

from __future__ import annotations

import math
import re
from typing import Any

import numpy as np

from ..lax.ops import EXACT_POW, OPS
from .errors import CodegenError
from .launch import DIM_PARAM

# storage type of each device dtype in the emitted code (see prelude.cuh)
CTYPES = {"float16": "fp16_t", "bfloat16": "bf16_t", "float32": "float", "int32": "int",
          "int64": "long long"}

# element-wise operators as CUDA expressions of float operands ({0}, {1}, {2}); every operand is
# a variable or a literal, so repeating one ({0} * {0}) costs nothing
UNARY = {
    "neg": "-{0}",
    "square": "{0} * {0}",
    "exp": "expf({0})",
    "sqrt": "sqrtf({0})",
    "silu": "silu({0})",
    "gelu": "gelu({0})",
    "relu": "relu({0})",
    "sigmoid": "sigmoid({0})",
    "tanh": "tanhf({0})",
    "sin": "sinf({0})",
    "cos": "cosf({0})",
    "log": "logf({0})",
    "abs": "fabsf({0})",
    "softplus": "softplus({0})",
    "mish": "mish({0})",
}
BINARY = {"add": "{0} + {1}", "sub": "{0} - {1}", "mul": "{0} * {1}", "div": "fdiv({0}, {1})",
          "maximum": "maxf({0}, {1})", "minimum": "minf({0}, {1})"}
TERNARY = {"where": "{0} != 0.0f ? {1} : {2}"}


def _with_attrs(op: str, args: list[str], attrs: dict) -> str | None:
    """Operators whose expression depends on their attributes."""
    x = args[0]
    if op == "gelu":
        return f"gelu_tanh({x})" if attrs.get("approximate") == "tanh" else f"gelu({x})"
    if op == "leaky_relu":
        return f"leaky_relu({x}, {flit(attrs['negative_slope'])})"
    if op == "clamp":
        if "lo" in attrs:
            x = f"maxf({x}, {flit(attrs['lo'])})"
        return f"minf({x}, {flit(attrs['hi'])})" if "hi" in attrs else x
    if op == "pow":
        e = float(attrs["exponent"])
        if not e.is_integer() or abs(e) > EXACT_POW:
            return f"powf({x}, {flit(e)})"
        k = abs(int(e))
        p = {0: "1.0f", 1: x, 2: f"{x} * {x}", 3: f"{x} * {x} * {x}"}.get(k, f"powi({x}, {k})")
        return p if e >= 0 else f"fdiv(1.0f, {p})"
    if op == "cast":
        return f"round_to<{CTYPES[attrs['dtype']]}>({x})"
    return None


_KEYWORDS = set("""alignas alignof asm auto bool break case catch char class const constexpr
const_cast continue decltype default delete do double dynamic_cast else enum explicit export extern
false float for friend goto if inline int long mutable namespace new noexcept nullptr operator
private protected public register reinterpret_cast return short signed sizeof static static_assert
static_cast struct switch template this throw true try typedef typeid typename union unsigned
using virtual void volatile wchar_t while""".split())


def elementwise(op: str, args: list[str], consts: tuple = (), attrs: dict | tuple = ()) -> str:
    """The CUDA expression of element-wise ``op`` applied to float expressions ``args``.
    ``consts`` holds the Python value of each argument that is a constant (None otherwise):
    division by a power of two becomes the (exactly equal) multiplication by its reciprocal,
    which spares the IEEE division's slow-path call. ``attrs``: the operator's attributes."""
    spec = OPS[op]
    if op == "div" and len(consts) == 2 and consts[1] is not None and _pow2(consts[1]):
        return f"{args[0]} * {flit(1.0 / float(np.float32(consts[1])))}"
    special = _with_attrs(op, args, dict(attrs))
    if special is not None:
        return special
    table = {"unary": UNARY, "binary": BINARY, "ternary": TERNARY}.get(spec.category, {})
    if op not in table:
        raise KeyError(f"no CUDA expression for element-wise operator {op!r}")
    return table[op].format(*args)


# reductions and loop accumulators: the starting value, and one step acc <- op(acc, x)
REDUCE_INIT = {"sum": "0.0f", "max": "__int_as_float(0xff800000)",
               "min": "__int_as_float(0x7f800000)"}


def reduce_step(op: str, acc: str, x: str) -> str:
    """The C statement folding ``x`` into ``acc`` for reduction ``op`` (sum, max, min)."""
    if op == "sum":
        return f"{acc} += {x}"
    return f"{acc} = {'maxf' if op == 'max' else 'minf'}({acc}, {x})"


def size_expr(v: Any, dim_value: Any = None) -> str:
    """A size that is an int or an expression of dims (``lax.shapes.Affine``) as C: a dim is
    read from its kernel parameter (``DIM_PARAM``), so one compiled graph serves every binding
    of the sizes its masks name; ``dim_value(name)`` gives a dim's C value instead (the host
    launcher's ``tensors->...``)."""
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    terms = getattr(v, "terms", None)
    if terms is None:
        raise CodegenError(f"mask attribute {v!r} is neither an int nor an expression of dims")
    val = dim_value or (lambda n: f"{DIM_PARAM}{n}")
    parts = [(val(n) if c == 1 else f"{c} * {val(n)}") for n, c in terms]
    if v.const or not parts:
        parts.append(str(v.const))
    return "(" + " + ".join(parts) + ")"


def mask_value(row: str, col: str, offset: Any, window: Any,
               valid: tuple | None = None) -> str:
    """The 0/1 value of a position mask at (row, col) as a float expression (the rule of
    :func:`mirage_py.lax.ops.mask_values`): 1 where ``d = col - row - offset <= 0`` and, with a
    window, ``d > -window``, and, with ``valid``, ``row < rows_valid`` and ``col <
    cols_valid``. Attributes that are expressions of dims read them from the kernel's size
    parameters (:func:`size_expr`)."""
    # signed: blockIdx is unsigned, and a negative difference must not wrap
    d = f"static_cast<int>({col}) - static_cast<int>({row})" + \
        (f" - {size_expr(offset)}" if offset != 0 else "")
    cond = f"{d} <= 0" + (f" && {d} > -{size_expr(window)}" if window != 0 else "")
    if valid is not None:
        cond += (f" && static_cast<int>({row}) < {size_expr(valid[0])} && "
                 f"static_cast<int>({col}) < {size_expr(valid[1])}")
    return f"(({cond}) ? 1.0f : 0.0f)"


def _pow2(v: float) -> bool:
    f = float(np.float32(v))
    if not math.isfinite(f) or f == 0.0:
        return False
    m, e = math.frexp(abs(f))
    return m == 0.5 and -125 <= e - 1 <= 126  # reciprocal is a normal float32 too


def ident(name: str) -> str:
    """A C identifier made from a tensor or tile name."""
    s = re.sub(r"\W", "_", name, flags=re.ASCII)
    if not s or s[0].isdigit():
        s = "_" + s
    if s in _KEYWORDS:
        s += "_"
    return s


class Names:
    """Hands out unique C identifiers for names (``prefix`` + sanitised name)."""

    def __init__(self, prefix: str = "", taken: set[str] | None = None):
        self.prefix = prefix
        self.taken = set(taken or ())
        self.map: dict[str, str] = {}

    def __call__(self, name: str) -> str:
        if name not in self.map:
            base = self.prefix + ident(name)
            s, k = base, 1
            while s in self.taken:
                k += 1
                s = f"{base}_{k}"
            self.taken.add(s)
            self.map[name] = s
        return self.map[name]


def flit(v: float) -> str:
    """A float32 literal for ``v`` (rounded to float32 first, as the interpreter does)."""
    f = np.float32(v)
    if math.isnan(f):
        return "__int_as_float(0x7fc00000)"
    if math.isinf(f):
        return "__int_as_float(0x7f800000)" if f > 0 else "__int_as_float(0xff800000)"
    s = str(f)  # shortest text that reads back as this float32
    if "e" not in s and "." not in s:
        s += ".0"
    return f"{s}f" if not s.startswith("-") else f"({s}f)"


def prod(xs) -> int:
    n = 1
    for x in xs:
        n *= x
    return n


def coords(var: str, shape: tuple[int, ...]) -> list[str]:
    """C expressions for the coordinates of flat row-major index ``var`` in ``shape`` ("0" for
    dims of size 1)."""
    out = []
    outer = 1
    for d, n in enumerate(shape):
        if n == 1:
            out.append("0")
            continue
        inner = prod(shape[d + 1:])
        e = var if inner == 1 else f"{var} / {inner}"
        if outer > 1:
            e = f"{var} % {n}" if inner == 1 else f"({e}) % {n}"
        out.append(e)
        outer *= n
    return out


def linear(terms: list[tuple[str, int]]) -> str:
    """``sum(expr * stride)`` as C text, skipping zero terms; "0" when nothing is left."""
    parts = []
    for e, s in terms:
        if e == "0" or s == 0:
            continue
        if s == 1:
            parts.append(e)
        else:
            parts.append(f"{_paren(e)} * {s}")
    return " + ".join(parts) if parts else "0"


def _paren(e: str) -> str:
    return e if re.fullmatch(r"[\w.]+", e) else f"({e})"


def broadcast_coords(out_coords: list[str], shape: tuple[int, ...]) -> list[str]:
    """Coordinates in an operand of ``shape`` broadcast (NumPy rules, right-aligned) against an
    output whose coordinates are ``out_coords``."""
    lead = len(out_coords) - len(shape)
    return ["0" if n == 1 else out_coords[lead + j] for j, n in enumerate(shape)]


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, s = [], 1
    for n in reversed(shape):
        strides.append(s)
        s *= n
    return tuple(reversed(strides))


_DECL = re.compile(r"^(\s*)const (int|long long) (.*);$")


def _declarators(text: str) -> list[str]:
    """``a = f(x, y), b = 2`` -> ["a = f(x, y)", "b = 2"]: split at commas outside parentheses."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch in "([") - (ch in ")]")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return out + [cur.strip()]


def prune_unused(lines: list[str]) -> list[str]:
    """Drop declarators of ``const int a = ..., b = ...;`` lines whose name is not used later in
    the same scope (unused index variables make nvcc warn)."""
    def code(s: str) -> str:
        return s.split("//", 1)[0]

    out = []
    for i, line in enumerate(lines):
        m = _DECL.match(line)
        if not m:
            out.append(line)
            continue
        depth, later = 0, []
        for nxt in lines[i + 1:]:
            c = code(nxt)
            later.append(c)
            depth += c.count("{") - c.count("}")
            if depth < 0:
                break
        text = " ".join(later)
        keep = [d for d in _declarators(m.group(3))
                if re.search(rf"\b{re.escape(d.split(' = ')[0])}\b", text)]
        if keep:
            out.append(f"{m.group(1)}const {m.group(2)} {', '.join(keep)};")
    return out


def declare_coords(var: str, shape: tuple[int, ...], prefix: str = "c") -> tuple[list[str], list[str]]:
    """Declarations ``c1 = ...`` for the coordinates of linear index ``var`` in ``shape``;
    returns (declarations without a type, coordinate names or "0" / ``var`` itself)."""
    decls, names = [], []
    for d, e in enumerate(coords(var, shape)):
        if e in ("0", var):
            names.append(e)
        else:
            decls.append(f"{prefix}{d} = {e}")
            names.append(f"{prefix}{d}")
    return decls, names
