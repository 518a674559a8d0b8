"""The device memory of a kernel graph: every tensor's layout (:mod:`.tensors`), intermediates
nested in the dim order :mod:`.innermost` chooses for the tiles that move them, and the
workspace that holds the intermediates (first fit over their live ranges)."""

from __future__ import annotations

from ..ugraph.graph import KernelGraph
from .innermost import choose_orders
from .intervals import Buffer, first_fit
from .tensors import WORKSPACE_ALIGN, DevicePlan, TensorLayout, dense_layout, padded_layout


def plan_device_memory(graph: KernelGraph, infos: dict | None = None) -> DevicePlan:
    """Layouts and workspace. With ``infos`` (validate()'s BlockInfo per graph kernel) each
    intermediate's dim order is chosen for the tiles its kernels move (:mod:`.innermost`);
    without, intermediates are row-major."""
    tensors = graph.tensors()
    inputs = {t.name for t in graph.inputs}
    outputs = set(graph.outputs)
    orders = choose_orders(graph, infos) if infos is not None else {}
    layouts: dict[str, TensorLayout] = {}
    for name, t in tensors.items():
        if name in inputs or name in outputs:
            layouts[name] = dense_layout(name, t.shape, t.dtype)
        else:
            layouts[name] = padded_layout(name, t.shape, t.dtype, orders.get(name))
    # live range of an intermediate: from the launch producing it to its last reader
    last: dict[str, int] = {}
    first: dict[str, int] = {}
    for k, op in enumerate(graph.ops):
        for n in op.inputs:
            last[n] = k
        for t in op.outputs:
            first[t.name] = k
    bufs = [Buffer(n, layouts[n].nbytes, first[n], max(first[n], last.get(n, first[n])))
            for n in first if n not in outputs]
    offsets, total = first_fit(bufs, WORKSPACE_ALIGN)
    return DevicePlan(layouts, offsets, total)
