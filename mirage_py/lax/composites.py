"""Composite operators, recorded decomposed into primitives of the op table.

``mean``, ``rms_norm``, ``softmax``, ``log_softmax``, ``logsumexp``, ``layer_norm``,
``group_norm`` and ``batch_norm`` are not operators of their own: each builds the primitive
nodes that compute it, so every later stage sees the algebra. The verifier then needs no rule per
composite (only the ``sqrt`` of a norm and the ``log`` of a logsumexp are uninterpreted), and the
generator may regroup the pieces -- fuse a norm's statistics into the loop of the next matmul, or
a softmax's max, exp and sum into an attention kernel.

Softmax-like composites subtract the row maximum before the exp (the "safe" form every library
uses): with float16 logits of 30 or more, ``exp`` of the raw scores overflows. Their ``max`` is a
real ``max`` node; the verifier proves the result does not depend on its value
(docs/verifier.md, "max, min and shift invariance").
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from ..errors import ShapeError
from .shapes import Dim
from .tensor import (Tensor, _check_tensor, _fmt, amax, div, exp, log, normalize_axes, reshape,
                     sqrt, square, sum)


def _eps(opname: str, eps: Any, x: Tensor) -> float:
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not float(eps) > 0 or \
            not math.isfinite(float(eps)):
        raise ShapeError(f"{opname}: eps must be a positive finite number, got {eps!r} "
                         f"(input {_fmt(x.shape)})")
    return float(eps)


def _count(shape: tuple[int, ...], axes: tuple[int, ...], opname: str = "mean") -> int:
    n = 1
    for a in axes:
        if isinstance(shape[a], Dim):
            raise ShapeError(f"{opname}: averaging over the symbolic dim {shape[a]} of "
                             f"{_fmt(shape)}: its count is not a constant (sum, then divide by a "
                             "size you know)")
        n *= shape[a]
    return n


def mean(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """Mean over ``axis``: recorded as ``sum(x, axis) / n``."""
    x = _check_tensor(x, "mean")
    axes = normalize_axes("mean", x.shape, axis)
    n = _count(x.shape, axes)
    return div(sum(x, axes, keepdims), float(n)) if n > 1 else sum(x, axes, keepdims)


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
    r = sqrt(mean(square(x), axis=-1, keepdims=True) + _eps("rms_norm", eps, x))
    y = x / r
    return y * weight if weight is not None else y


def softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``exp(x - m) / sum(exp(x - m))`` along ``axis`` with ``m`` the maximum along it."""
    x = _check_tensor(x, "softmax")
    axes = normalize_axes("softmax", x.shape, axis)
    e = exp(x - amax(x, axes, keepdims=True))
    return e / sum(e, axes, keepdims=True)


def log_softmax(x: Tensor, axis: int = -1) -> Tensor:
    """``s - log(sum(exp(s)))`` along ``axis``, with ``s = x - max(x)``."""
    x = _check_tensor(x, "log_softmax")
    axes = normalize_axes("log_softmax", x.shape, axis)
    s = x - amax(x, axes, keepdims=True)
    return s - log(sum(exp(s), axes, keepdims=True))


def logsumexp(x: Tensor, axis: Any = None, keepdims: bool = False) -> Tensor:
    """``log(sum(exp(x)))`` over ``axis``, computed as ``m + log(sum(exp(x - m)))`` with ``m``
    the maximum (no overflow). Over axes of size 1 it is the identity, and recorded so."""
    x = _check_tensor(x, "logsumexp")
    axes = normalize_axes("logsumexp", x.shape, axis)
    if all(x.shape[a] == 1 for a in axes):
        return reshape(x, tuple(d for i, d in enumerate(x.shape) if i not in axes)
                       if not keepdims else x.shape)
    # the shift keeps the reduced dims; the added max has the result's shape (a second max node
    # of the same values rather than a reshape, which a fused kernel could not do)
    shifted = exp(x - amax(x, axes, keepdims=True))
    return log(sum(shifted, axes, keepdims)) + amax(x, axes, keepdims)


def _affine(opname: str, y: Tensor, x: Tensor, weight: Tensor | None, bias: Tensor | None,
            shape: tuple[int, ...], channel_dim: int | None = None) -> Tensor:
    """``y * weight + bias`` with parameters of ``shape``; ``channel_dim``: the parameters are
    per channel (dim 1 of ``x``) and broadcast over the dims after it."""
    for name, p in (("weight", weight), ("bias", bias)):
        if p is None:
            continue
        p = _check_tensor(p, opname)
        if p.shape != shape:
            raise ShapeError(f"{opname}: {name} shape {_fmt(p.shape)} must be {_fmt(shape)} for "
                             f"input {_fmt(x.shape)}")
        if channel_dim is not None and x.ndim > 2:
            p = reshape(p, shape + (1,) * (x.ndim - 2))
        y = y * p if name == "weight" else y + p
    return y


def _normalize(x: Tensor, axes: tuple[int, ...], eps: float) -> Tensor:
    d = x - mean(x, axes, keepdims=True)
    return d / sqrt(mean(square(d), axes, keepdims=True) + eps)


def layer_norm(x: Tensor, weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5, normalized_ndim: int = 1) -> Tensor:
    """``(x - mean) / sqrt(var + eps) * weight + bias`` over the last ``normalized_ndim`` dims
    (the biased variance, as ``torch.nn.functional.layer_norm``)."""
    x = _check_tensor(x, "layer_norm")
    if not isinstance(normalized_ndim, numbers.Integral) or not 1 <= normalized_ndim <= x.ndim:
        raise ShapeError(f"layer_norm: normalized_ndim {normalized_ndim!r} must be between 1 and "
                         f"the rank of the input {_fmt(x.shape)}")
    axes = tuple(range(x.ndim - normalized_ndim, x.ndim))
    y = _normalize(x, axes, _eps("layer_norm", eps, x))
    return _affine("layer_norm", y, x, weight, bias, x.shape[x.ndim - normalized_ndim:])


def group_norm(x: Tensor, num_groups: int, weight: Tensor | None = None,
               bias: Tensor | None = None, eps: float = 1e-5) -> Tensor:
    """Group normalisation of ``x`` (N, C, *spatial): the C channels in ``num_groups`` groups,
    each group (with its spatial extent) normalised on its own, then a per-channel affine, as
    ``torch.nn.functional.group_norm``. Recorded as reshapes around a normalisation."""
    x = _check_tensor(x, "group_norm")
    if x.ndim < 2:
        raise ShapeError(f"group_norm: input {_fmt(x.shape)} must be (N, C, ...)")
    c = x.shape[1]
    if not isinstance(num_groups, numbers.Integral) or isinstance(num_groups, bool) or \
            num_groups < 1 or c % num_groups:
        raise ShapeError(f"group_norm: {num_groups!r} groups do not divide the {c} channels of "
                         f"{_fmt(x.shape)}")
    eps = _eps("group_norm", eps, x)
    g = reshape(x, (x.shape[0], int(num_groups), -1))
    y = reshape(_normalize(g, (2,), eps), x.shape)
    return _affine("group_norm", y, x, weight, bias, (c,), channel_dim=1)


def batch_norm(x: Tensor, running_mean: Tensor, running_var: Tensor,
               weight: Tensor | None = None, bias: Tensor | None = None,
               eps: float = 1e-5) -> Tensor:
    """Batch normalisation in inference form: ``(x - running_mean) / sqrt(running_var + eps) *
    weight + bias`` per channel (dim 1 of ``x`` (N, C, ...)), the statistics given as tensors."""
    x = _check_tensor(x, "batch_norm")
    if x.ndim < 2:
        raise ShapeError(f"batch_norm: input {_fmt(x.shape)} must be (N, C, ...)")
    c = (x.shape[1],)
    eps = _eps("batch_norm", eps, x)
    stats = []
    for name, t in (("running_mean", running_mean), ("running_var", running_var)):
        t = _check_tensor(t, "batch_norm")
        if t.shape != c:
            raise ShapeError(f"batch_norm: {name} shape {_fmt(t.shape)} must be {_fmt(c)} for "
                             f"input {_fmt(x.shape)}")
        stats.append(reshape(t, c + (1,) * (x.ndim - 2)) if x.ndim > 2 else t)
    y = (x - stats[0]) / sqrt(stats[1] + eps)
    return _affine("batch_norm", y, x, weight, bias, c, channel_dim=1)


__all__ = ["mean", "rms_norm", "softmax", "log_softmax", "logsumexp", "layer_norm",
           "group_norm", "batch_norm"]
