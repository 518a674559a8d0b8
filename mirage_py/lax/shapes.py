"""Sizes of tensor dims: an int, or a symbolic :class:`Dim` that takes any size in a range.

A program whose inputs have symbolic dims describes a *family* of programs, one for each
binding of its dims to sizes::

    S = mp.dim("S", 1, 32768)              # a sequence length, 1 .. 32768
    K = p.input("K", (8, 64, S))           # the keys of 8 heads over S positions

Shape inference treats a dim as a value: two uses of ``S`` are the same size, ``S`` and ``T``
are not (a matmul contracting ``S`` with ``T`` is a typed error, as is one contracting ``S``
with 64), and ``S`` broadcasts only against ``S`` or 1. Masks may place their diagonal by an
:class:`Affine` expression of dims (``causal_mask(T, S, offset=S - T)``: the last ``T`` of ``S``
positions attend causally). :meth:`mirage_py.lax.Program.at` binds every dim to a size and gives
the ordinary (static) program; ``evaluate`` binds them from the inputs' shapes and checks each
size against its dim's range.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass
from typing import Any, Mapping, Sequence, Union

from ..errors import ShapeError


@dataclass(frozen=True)
class Dim:
    """A symbolic dim: a name and the sizes it may take, ``lo .. hi`` inclusive."""

    name: str
    lo: int = 1
    hi: int = 2**31 - 1

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.isidentifier():
            raise ShapeError(f"dim: name {self.name!r} must be a Python identifier")
        if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool)
                   for v in (self.lo, self.hi)) or not 1 <= self.lo <= self.hi:
            raise ShapeError(f"dim {self.name!r}: range {self.lo!r} .. {self.hi!r} must be ints "
                             "with 1 <= lo <= hi")

    def __repr__(self) -> str:
        return self.name

    def check(self, size: int, where: str = "") -> int:
        """``size`` if it lies in the dim's range, else a ShapeError naming ``where``."""
        if not self.lo <= size <= self.hi:
            raise ShapeError(f"{where + ': ' if where else ''}size {size} of dim {self.name} is "
                             f"outside its range {self.lo} .. {self.hi}")
        return size

    # affine expressions (a mask's offset): S - T, S - 1, ...
    def _affine(self) -> "Affine":
        return Affine(0, ((self.name, 1),))

    def __add__(self, other: Any) -> "Affine":
        return self._affine() + other

    __radd__ = __add__

    def __sub__(self, other: Any) -> "Affine":
        return self._affine() - other

    def __rsub__(self, other: Any) -> "Affine":
        return -self._affine() + other

    def __neg__(self) -> "Affine":
        return -self._affine()


@dataclass(frozen=True)
class Affine:
    """``const + sum(coeff * dim)``: a mask offset or window in terms of the program's dims."""

    const: int = 0
    terms: tuple[tuple[str, int], ...] = ()  # (dim name, coefficient), sorted, no zeros

    @staticmethod
    def of(x: Any) -> "Affine":
        if isinstance(x, Affine):
            return x
        if isinstance(x, Dim):
            return x._affine()
        if isinstance(x, numbers.Integral) and not isinstance(x, bool):
            return Affine(int(x))
        raise ShapeError(f"{x!r} is neither an int nor an expression of dims")

    def _combine(self, other: Any, sign: int) -> "Affine":
        o = Affine.of(other)
        coeffs = dict(self.terms)
        for n, c in o.terms:
            coeffs[n] = coeffs.get(n, 0) + sign * c
        return Affine(self.const + sign * o.const,
                      tuple(sorted((n, c) for n, c in coeffs.items() if c)))

    def __add__(self, other: Any) -> "Affine":
        return self._combine(other, 1)

    __radd__ = __add__

    def __sub__(self, other: Any) -> "Affine":
        return self._combine(other, -1)

    def __rsub__(self, other: Any) -> "Affine":
        return (-self)._combine(other, 1)

    def __neg__(self) -> "Affine":
        return Affine(-self.const, tuple((n, -c) for n, c in self.terms))

    def resolve(self, sizes: Mapping[str, int]) -> int:
        try:
            return self.const + sum(c * int(sizes[n]) for n, c in self.terms)
        except KeyError as e:
            raise ShapeError(f"expression {self!r} needs the size of dim {e.args[0]}") from None

    def __repr__(self) -> str:
        parts = []
        for n, c in self.terms:
            sign = "-" if c < 0 else "+"
            mag = "" if abs(c) == 1 else f"{abs(c)}*"
            parts.append(f"{sign} {mag}{n}")
        if self.const or not parts:
            parts.append(f"{'-' if self.const < 0 else '+'} {abs(self.const)}")
        text = " ".join(parts)
        return text[2:] if text.startswith("+ ") else "-" + text[2:]


Size = Union[int, Dim]


def dim(name: str, lo: int = 1, hi: int = 2**31 - 1) -> Dim:
    """A symbolic dim named ``name`` taking the sizes ``lo .. hi`` (``mp.dim``)."""
    return Dim(name, lo, hi)


def is_size(d: Any) -> bool:
    return isinstance(d, Dim) or (isinstance(d, numbers.Integral) and not isinstance(d, bool)
                                  and d > 0)


def symbolic(shape: Sequence[Any]) -> bool:
    return any(isinstance(d, Dim) for d in shape)


def dims_of(shape: Sequence[Any]) -> list[Dim]:
    return [d for d in shape if isinstance(d, Dim)]


def resolve(value: Any, sizes: Mapping[str, int]) -> Any:
    """``value`` with every dim and expression replaced by its size: ints, dims, affine
    expressions and (nested) tuples of them."""
    if isinstance(value, Dim):
        try:
            return int(sizes[value.name])
        except KeyError:
            raise ShapeError(f"no size given for dim {value.name}") from None
    if isinstance(value, Affine):
        return value.resolve(sizes)
    if isinstance(value, tuple):
        return tuple(resolve(v, sizes) for v in value)
    return value


def json_size(v: Any) -> Any:
    """JSON form of a size or an attribute holding dims."""
    if isinstance(v, Dim):
        return {"dim": [v.name, v.lo, v.hi]}
    if isinstance(v, Affine):
        return {"affine": [v.const, [list(t) for t in v.terms]]}
    return v


def size_from_json(v: Any) -> Any:
    if isinstance(v, dict) and "dim" in v:
        name, lo, hi = v["dim"]
        return Dim(str(name), int(lo), int(hi))
    if isinstance(v, dict) and "affine" in v:
        const, terms = v["affine"]
        return Affine(int(const), tuple((str(n), int(c)) for n, c in terms))
    return v


__all__ = ["Dim", "Affine", "Size", "dim", "is_size", "symbolic", "dims_of", "resolve",
           "json_size", "size_from_json"]
