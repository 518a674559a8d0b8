"""Algebraic forms of a program that the search works on: max-shifted exps, one-pass statistics.

**Max-shifted exps.** A normalised exponential ``exp(x) / sum(exp(x))`` overflows float16 once
``x`` passes ~11; the form ``exp(x - m) / sum(exp(x - m))``, ``m = max(x)`` along the
normalised axis, never does, and it is the *same* function: every value computed from
``E = exp(x)`` that is homogeneous of degree 0 in a factor ``c`` constant along that axis
(``E -> c E``) is unchanged when ``c = exp(-m)``. :func:`max_shifted` finds each exp whose
every use reaches the outputs that way (an analysis of degrees: products add them, quotients
subtract them, sums along the axis and matmuls contracting it keep them, sums of equal degrees
keep them, anything else of nonzero degree disqualifies) and subtracts the row max. The program
is then searched in that form *only* -- safe by default -- and the verifier proves candidates
equal to the original (docs/verifier.md, "max, min and shift invariance"); the search may go on
to FlashAttention's online form (running maximum, rescaled sums) for rows longer than a tile.

**One-pass statistics.** A LayerNorm before a matmul, ``((x - m) / r) @ W`` with
``m = mean(x)`` and ``r = sqrt(mean((x - m)^2) + eps)``, needs the whole row of ``x`` twice before the matmul can
start: once for ``m``, once more for the variance. A kernel that walks the contracted dim in
chunks cannot do that. Two identities remove the dependency:

* **one-pass variance**: ``sum((x - m)^2) = sum(x^2) - 2 m sum(x) + n m^2`` for any ``m``
  constant along the summed axes (``n`` the number of elements summed);
* **centred matmul**: ``(x - m) @ W = x @ W - m * sum(W, -2)`` for ``m`` constant along the
  contracted dim, and more generally a matmul is pushed through the linear structure of its left
  operand -- sums, differences, negation, and scaling by values constant along the contracted
  dim (``(a / r) @ W = (a @ W) / r``), and through an element-wise product of two values that
  both vary along it, whose first factor's scales commute with the second
  (``((x / r) * g) @ W = ((x * g) @ W) / r``: a norm's weight) -- down to leaves ``a @ W`` and,
  for a term that is constant along the contracted dim, ``s * sum(W, -2)``.

The rewritten program reads ``x`` once: ``x @ W``, ``sum(x)``, ``sum(x^2)`` and the column sums
of ``W`` all accumulate in the same loop over the contracted dim, and an epilogue combines them,
as a root-mean-square norm's statistics always did. Both identities hold exactly in any
commutative ring, so candidates found for the rewritten program verify against the original one (the verifier only
ever compares with the original). They are not numerically equal: the one-pass variance loses
precision when the mean is large against the deviation (float32 statistics keep about
``eps32 * (m / sigma)^2`` relative error). The one-pass form is offered to the search next to
the (max-shifted) program, never instead of it.

:func:`forms` applies the rewrite only where it removes a dependency (a centring term reaches a
matmul, a centred square is summed, or a row's scale reaches a matmul only through a product
with a weight -- ``rms_norm(x, g) @ W``, whose division must follow the contraction for one
kernel to loop over the contracted dim); otherwise it returns the program alone.
"""

from __future__ import annotations

from typing import Any

from ..lax import tensor as T
from ..lax.ops import lax_class
from ..lax.program import Program
from ..lax.tensor import Tensor


def _const_along_last(s: Tensor) -> bool:
    return len(s.shape) == 0 or s.shape[-1] == 1


def _const_along(s: Tensor, shape: tuple, axes: tuple) -> bool:
    """``s`` broadcast to ``shape`` does not vary along ``axes``."""
    off = len(shape) - len(s.shape)
    return all(ax - off < 0 or s.shape[ax - off] == 1 for ax in axes)


class _Rewriter:
    def __init__(self) -> None:
        self.memo: dict[str, Tensor] = {}
        self.changed = False
        self._moved = False  # a scale moved out of an element-wise product (``_linear``)

    def __call__(self, t: Tensor) -> Tensor:
        hit = self.memo.get(t.digest)
        if hit is not None:
            return hit
        if t.op in ("input", "const", "mask"):
            out = t
        elif t.op == "matmul":
            out = self._matmul(t)
        elif t.op == "sum":
            out = self._sum(t)
        else:
            out = T.apply(t.op, [self(i) for i in t.inputs], t.attr_dict)
        self.memo[t.digest] = out
        return out

    # sum((x - m)^2) = sum(x^2) - 2 m sum(x) + n m^2, m constant along the axes
    def _sum(self, t: Tensor) -> Tensor:
        (q,) = t.inputs
        axes, keep = t.attr("axes"), t.attr("keepdims")
        d = q.inputs[0] if q.op == "square" else \
            q.inputs[0] if q.op == "mul" and q.inputs[0] == q.inputs[1] else None
        if d is None or d.op != "sub" or not keep:
            return T.sum(self(q), axes, keep)
        x, m = d.inputs
        if x.shape != d.shape or not _const_along(m, d.shape, axes) or \
                T.broadcast_shapes("sum", m.shape, t.shape) != t.shape:
            return T.sum(self(q), axes, keep)
        self.changed = True
        x, m = self(x), self(m)
        n = 1
        for ax in axes:
            n *= x.shape[ax]
        s1 = T.sum(x, axes, True)
        s2 = T.sum(T.square(x), axes, True)
        if m.op == "const":  # fold: no operator on constants alone
            c = float(m.attr("value"))
            return T.add(T.sub(s2, T.mul(s1, 2.0 * c)), n * c * c)
        return T.add(T.sub(s2, T.mul(T.mul(m, 2.0), s1)), T.mul(T.square(m), float(n)))

    # a @ W pushed through a's linear structure
    def _matmul(self, t: Tensor) -> Tensor:
        a, w = t.inputs
        self._moved = False
        terms = self._linear(a)
        if not self._moved and not any(base is None for _, base in terms):
            return T.matmul(self(a), self(w))
        self.changed = True
        w2 = self(w)
        out = None
        for scale, base in terms:
            if base is None:  # constant along the contracted dim: s * (column sums of W)
                term = T.mul(scale, T.sum(w2, (len(w2.shape) - 2,), True))
            else:
                term = T.matmul(base, w2)
                if scale is not None:
                    term = T.mul(term, scale)
            out = term if out is None else T.add(out, term)
        if out.shape != t.shape:  # broadcasting of the terms gave another shape: keep a @ W
            return T.matmul(self(a), w2)
        return out

    def _linear(self, a: Tensor) -> list[tuple[Tensor | None, Tensor | None]]:
        """``a`` as a sum of terms ``scale * base`` (``scale`` constant along the last dim or
        None for 1; ``base`` None for a term constant along the last dim)."""
        if _const_along_last(a) and a.op != "const" and a.shape:
            return [(self(a), None)]
        if a.op in ("add", "sub"):
            left, right = self._linear(a.inputs[0]), self._linear(a.inputs[1])
            if a.op == "sub":
                right = [(_neg(s), b) for s, b in right]
            return left + right
        if a.op == "neg":
            return [(_neg(s), b) for s, b in self._linear(a.inputs[0])]
        if a.op in ("mul", "div"):
            x, s = a.inputs
            if a.op == "mul" and _const_along_last(x) and not _const_along_last(s):
                x, s = s, x
            if _const_along_last(s) and x.shape == a.shape:
                s2 = self(s)
                out = []
                for sc, b in self._linear(x):
                    if a.op == "mul":
                        sc = s2 if sc is None else T.mul(sc, s2)
                    else:
                        sc = T.div(1.0, s2) if sc is None else T.div(sc, s2)
                    out.append((sc, b))
                return out
            # an element-wise product of two values that both vary along the contracted dim
            # (a norm's weight, ``(x / r) * g``): the scales of the first factor's terms commute
            # with it, ``(s * b) * g = s * (b * g)``, so they leave the matmul as well; only
            # worth a form when some scale really moves (``_moved``)
            if a.op == "mul" and x.shape == a.shape and s.shape[-1:] == a.shape[-1:]:
                inner = self._linear(x)
                if any(sc is not None for sc, _ in inner):
                    s2 = self(s)
                    self._moved = True
                    return [(sc, s2 if b is None else T.mul(b, s2)) for sc, b in inner]
        return [(None, self(a))]


def _neg(s: Tensor | None) -> Tensor:
    return T.mul(s, -1.0) if s is not None else T.const(-1.0)


def _with_outputs(program: Program, name: str, outs: dict[str, Tensor]) -> Program:
    p = Program(name)
    for t in program.inputs:
        p.input(t.name, t.shape, t.dtype)
    for n, t in outs.items():
        p.output(t, n)
    return p


def forms(program: Program) -> list[Program]:
    """The forms to search for ``program`` (same inputs and outputs, equal functions): the
    program itself, or its max-shifted form (:func:`max_shifted`) instead where it has one;
    and, where the one-pass rewrite removes a dependency, that one's one-pass form too."""
    base = max_shifted(program) or program
    rw = _Rewriter()
    outs = {name: rw(t) for name, t in base.output_tensors.items()}
    if not rw.changed:
        return [base]
    return [base, _with_outputs(base, base.name + ".one_pass", outs)]


# ---- max-shifted exps ------------------------------------------------------------------------

_BAD = object()  # a value that depends on the factor in a way that does not cancel


def _factor_degrees(program: Program, e: Tensor, axis: int) -> dict[str, Any]:
    """For every node: None when it does not depend on ``c`` (``e -> c * e``, ``c`` of ``e``'s
    shape with size 1 at ``axis``), else ``(degree, cshape)`` -- the node equals ``c^degree``
    (``c`` seen with shape ``cshape``, broadcast to the node's) times a value free of ``c`` --
    or ``_BAD``. A node of degree 0 is free of ``c`` altogether (None)."""
    deg: dict[str, Any] = {}
    cs = tuple(1 if i == axis else n for i, n in enumerate(e.shape))

    def fits(cshape: tuple, shape: tuple) -> bool:
        try:
            return T.broadcast_shapes("rewrite", cshape, shape) == tuple(shape)
        except Exception:  # noqa: BLE001 - shapes that do not broadcast: not this pattern
            return False

    def same(a: tuple, b: tuple) -> bool:
        n = max(len(a), len(b))
        return (1,) * (n - len(a)) + tuple(a) == (1,) * (n - len(b)) + tuple(b)

    for t in program.nodes():
        if t.digest == e.digest:
            deg[t.digest] = (1, cs)
            continue
        ins = [deg.get(i.digest) for i in t.inputs]
        if all(d is None for d in ins):
            deg[t.digest] = None
            continue
        if any(d is _BAD for d in ins):
            deg[t.digest] = _BAD
            continue
        out: Any = _BAD
        dep = [(k, d) for k, d in enumerate(ins) if d is not None]
        if t.op in ("neg", "cast"):
            out = ins[0]
        elif t.op in ("mul", "div"):
            d0 = ins[0] or (0, None)
            d1 = ins[1] or (0, None)
            shapes = {d[1] for d in (d0, d1) if d[1] is not None}
            if len(shapes) == 1 or (len(shapes) == 2 and same(*shapes)):
                c = next(iter(shapes))
                k = d0[0] + (d1[0] if t.op == "mul" else -d1[0])
                out = None if k == 0 else (k, c) if fits(c, t.shape) else _BAD
        elif t.op in ("add", "sub"):
            if len(dep) == 2 and ins[0][0] == ins[1][0] and same(ins[0][1], ins[1][1]):
                out = ins[0]
        elif t.op == "where":
            if ins[0] is None and ins[1] is not None and ins[2] is not None and \
                    ins[1][0] == ins[2][0] and same(ins[1][1], ins[2][1]):
                out = ins[1]
        elif t.op == "pow" and lax_class(t.op, t.attr_dict) != "uf":
            k = int(t.attr("exponent")) * ins[0][0]
            out = None if k == 0 else (k, ins[0][1])
        elif t.op == "sum":
            k, c = ins[0]
            x = t.inputs[0]
            axes = t.attr("axes")
            off = len(x.shape) - len(c)
            if all(ax - off >= 0 and c[ax - off] == 1 for ax in axes):  # c constant along them
                c2 = c if t.attr("keepdims") else \
                    tuple(n for i, n in enumerate(c) if i + off not in axes)
                out = (k, c2)
        elif t.op == "matmul" and len(dep) == 1:
            (j, (k, c)), = dep
            x = t.inputs[j]
            cc = (1,) * (len(x.shape) - len(c)) + tuple(c)
            contracted = len(cc) - 1 if j == 0 else len(cc) - 2
            if cc[contracted] == 1:  # c is constant along the contracted dim
                out = (k, cc)
        deg[t.digest] = out
    return deg


def _shift_choices(program: Program) -> dict[str, tuple[int, dict]]:
    """The exps to shift: exp digest -> (normalised axis, its degree map)."""
    chosen: dict[str, tuple[int, dict]] = {}
    for e in program.nodes():
        if e.op != "exp":
            continue
        x = e.inputs[0]
        if x.op == "sub" and x.inputs[1].op == "max":  # already shifted by a max
            continue
        for u in program.nodes():
            if u.op != "sum" or u.inputs[0].digest != e.digest or len(u.attr("axes")) != 1:
                continue
            axis = u.attr("axes")[0]
            if e.shape[axis] == 1:
                continue
            deg = _factor_degrees(program, e, axis)
            if all(deg.get(t.digest) is None for t in program.output_tensors.values()):
                chosen[e.digest] = (axis, deg)
                break
    return chosen


def shift_clusters(program: Program) -> list[frozenset]:
    """For each exp :func:`max_shifted` shifts, the operators its factor reaches: the exp, every
    node of nonzero degree in it, and the nodes where the degree returns to 0 (the values the
    rest of the program reads). Shifting the exp changes nothing outside, so the program and
    its shifted form are equal if each cluster, as a program of its own (what it reads as
    inputs), equals its shifted form -- a check that never meets a nested exp."""
    out = []
    for d, (_, deg) in _shift_choices(program).items():
        dep = {k for k, v in deg.items() if isinstance(v, tuple)} | {d}
        frontier = {t.digest for t in program.nodes()
                    if t.digest not in dep and any(i.digest in dep for i in t.inputs)}
        out.append(frozenset(dep | frontier))
    return out


def max_shifted(program: Program) -> Program | None:
    """``program`` with the row max subtracted inside every exp whose factor cancels from the
    outputs (see the module docstring), or None when there is no such exp."""
    chosen = {d: axis for d, (axis, _) in _shift_choices(program).items()}
    if not chosen:
        return None
    memo: dict[str, Tensor] = {}
    for t in program.nodes():  # dependency order: no recursion, however deep the program
        if t.op in ("input", "const", "mask"):
            out = t
        else:
            args = [memo[i.digest] for i in t.inputs]
            if t.digest in chosen:
                x = args[0]
                out = T.exp(T.sub(x, T.amax(x, chosen[t.digest], keepdims=True)))
            else:
                out = T.apply(t.op, args, t.attr_dict)
        memo[t.digest] = out
    return _with_outputs(program, program.name + ".safe",
                         {n: memo[t.digest] for n, t in program.output_tensors.items()})
