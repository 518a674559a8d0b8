"""Device tensor layouts of a kernel graph (:mod:`.device` plans them and the workspace).

Graph inputs and outputs are row-major with the innermost dim contiguous. Intermediates (tensors
that are neither graph inputs nor graph outputs) nest their dims in the order
:mod:`.innermost` chooses for the tiles that move them (row-major unless another dim
innermost moves fewer sectors), live in one workspace buffer and get *padded rows*:
the row (the innermost dim of size > 1, when a dim above it exists) starts on a 16-byte boundary,
so that kernels may load rows with 16-byte vector accesses. Graph inputs and outputs are the
caller's dense arrays (rows there are 16-byte aligned whenever the row length allows).

The workspace (:func:`.device.plan_device_memory`) places each intermediate at a 256-byte
aligned offset; an intermediate whose last reader has run gives its space to tensors produced
later (launches on one stream run in order).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..lax.ops import DTYPES
from .intervals import align_up

ROW_ALIGN = 16  # bytes
WORKSPACE_ALIGN = 256  # bytes


@dataclass(frozen=True)
class TensorLayout:
    """Where the elements of a device tensor sit: ``offset(c) = sum(c[d] * strides[d])``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    strides: tuple[int, ...]  # in elements

    @property
    def itemsize(self) -> int:
        return DTYPES[self.dtype]

    @property
    def extent(self) -> int:
        """Elements spanned, padding included."""
        return 1 + sum((n - 1) * s for n, s in zip(self.shape, self.strides))

    @property
    def nbytes(self) -> int:
        return self.extent * self.itemsize

    @property
    def dense(self) -> bool:
        return self.strides == row_major(self.shape)


def row_major(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides = []
    s = 1
    for n in reversed(shape):
        strides.append(s)
        s *= n
    return tuple(reversed(strides))


def dense_layout(name: str, shape: tuple[int, ...], dtype: str) -> TensorLayout:
    return TensorLayout(name, tuple(shape), dtype, row_major(tuple(shape)))


def padded_layout(name: str, shape: tuple[int, ...], dtype: str,
                  order: tuple[int, ...] | None = None) -> TensorLayout:
    """Dims nested in ``order`` (outermost first; default row-major) with 16-byte aligned rows:
    the innermost dim of size > 1 is padded to a multiple of 16 bytes when a dim of size > 1
    lies above it (a single row needs no padding)."""
    shape = tuple(shape)
    order = tuple(range(len(shape))) if order is None else tuple(order)
    if sorted(order) != list(range(len(shape))):
        raise ValueError(f"layout of {name!r}: {order} is not an order of the dims of {shape}")
    big = [d for d in order if shape[d] > 1]
    if len(big) < 2 and order == tuple(range(len(shape))):
        return dense_layout(name, shape, dtype)
    row = big[-1] if len(big) >= 2 else None
    per = ROW_ALIGN // DTYPES[dtype]
    strides = [0] * len(shape)
    s = 1
    for d in reversed(order):
        strides[d] = s
        s *= align_up(shape[d], per) if d == row else shape[d]
    return TensorLayout(name, shape, dtype, tuple(strides))


@dataclass(frozen=True)
class DevicePlan:
    """Layouts of every device tensor of a graph and the workspace offsets of intermediates."""

    layouts: dict[str, TensorLayout]
    workspace: dict[str, int]  # intermediate name -> byte offset
    workspace_bytes: int

    def is_intermediate(self, name: str) -> bool:
        return name in self.workspace
