"""Algebraic forms of a program that let the search fuse more: one-pass statistics.

A LayerNorm before a matmul, ``((x - m) / r) @ W`` with ``m = mean(x)`` and
``r = sqrt(mean((x - m)^2) + eps)``, needs the whole row of ``x`` twice before the matmul can
start: once for ``m``, once more for the variance. A kernel that walks the contracted dim in
chunks cannot do that. Two identities remove the dependency:

* **one-pass variance**: ``sum((x - m)^2) = sum(x^2) - 2 m sum(x) + n m^2`` for any ``m``
  constant along the summed axes (``n`` the number of elements summed);
* **centred matmul**: ``(x - m) @ W = x @ W - m * sum(W, -2)`` for ``m`` constant along the
  contracted dim, and more generally a matmul is pushed through the linear structure of its left
  operand -- sums, differences, negation, and scaling by values constant along the contracted
  dim (``(a / r) @ W = (a @ W) / r``) -- down to leaves ``a @ W`` and, for a term that is
  constant along the contracted dim, ``s * sum(W, -2)``.

The rewritten program reads ``x`` once: ``x @ W``, ``sum(x)``, ``sum(x^2)`` and the column sums
of ``W`` all accumulate in the same loop over the contracted dim, and an epilogue combines them,
as a root-mean-square norm's statistics always did. Both identities hold exactly in any commutative ring, so
candidates found for the rewritten program verify against the original one (the verifier only
ever compares with the original). They are not numerically equal: the one-pass variance loses
precision when the mean is large against the deviation (float32 statistics keep about
``eps32 * (m / sigma)^2`` relative error). The forms are offered to the search next to the
original program, never instead of it.

:func:`forms` applies the rewrite only where it removes a dependency (a centring term reaches a
matmul, or a centred square is summed); otherwise it returns the program alone.
"""

from __future__ import annotations

from ..lax import tensor as T
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
        terms = self._linear(a)
        if not any(base is None for _, base in terms):
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
        return [(None, self(a))]


def _neg(s: Tensor | None) -> Tensor:
    return T.mul(s, -1.0) if s is not None else T.const(-1.0)


def forms(program: Program) -> list[Program]:
    """``program`` and, where the rewrite removes a dependency, its one-pass form (same inputs
    and outputs, exactly equal as polynomials)."""
    rw = _Rewriter()
    outs = {name: rw(t) for name, t in program.output_tensors.items()}
    if not rw.changed:
        return [program]
    p = Program(program.name + ".one_pass")
    for t in program.inputs:
        p.input(t.name, t.shape, t.dtype)
    for name, t in outs.items():
        p.output(t, name)
    return [program, p]
