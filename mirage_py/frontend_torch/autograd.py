"""Gradients through compiled modules (issue #33, item 1).

The inference path runs its regions under ``torch.no_grad()``: its outputs carry no autograd
history. A call that autograd needs (grad mode on and any tensor input or parameter requiring
grad) therefore never takes that path: it goes through AOTAutograd (:mod:`.training`), or, where
that was refused (``training="eager"``, a module AOTAutograd cannot trace), runs the whole module
eagerly, so the caller gets differentiable outputs. :class:`EagerGradFallback` records the eager
calls, warns once per compiled object and gives the line that ``report()`` shows."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Iterable

import torch


def needs_autograd(tensors: Iterable[Any]) -> bool:
    """True when grad mode is on and any of ``tensors`` (other values are skipped) requires
    grad: the outputs must then carry autograd history."""
    if not torch.is_grad_enabled():
        return False
    return any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors)


@dataclass
class EagerGradFallback:
    """The calls run eagerly because autograd needed their outputs (one per compiled object)."""
    name: str
    calls: int = 0
    why: str = "the superoptimised path is inference-only"  # the latest eager call's reason

    def note_call(self) -> None:
        """Count one eager call; the first one warns (:class:`GradFallbackWarning`)."""
        self.calls += 1
        if self.calls == 1:
            warnings.warn(f"mirage_py {self.name}: autograd needs this call's outputs (grad "
                          f"mode on, an input or parameter requires grad); {self.why}, so the "
                          "whole module runs eagerly",
                          GradFallbackWarning, stacklevel=3)

    def report_line(self) -> str:
        """The ``report()`` line, empty when no call fell back."""
        if not self.calls:
            return ""
        return (f"autograd: {self.calls} call(s) ran eagerly (whole module) because gradients "
                f"were needed; {self.why}")


class GradFallbackWarning(UserWarning):
    """A compiled module ran eagerly because autograd needed its outputs."""


__all__ = ["needs_autograd", "EagerGradFallback", "GradFallbackWarning"]
