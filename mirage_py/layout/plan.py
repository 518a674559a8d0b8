"""The whole layout plan of a kernel graph: device layouts, workspace, and per graph-defined
kernel its stage schedule and shared-memory plan. Code generation reads only this."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..errors import MirageError
from ..targets import Target, get_target
from ..ugraph.graph import GraphKernel, KernelGraph
from ..ugraph.validate import BlockInfo, validate
from .schedule import BlockSchedule, schedule_block
from .smem import SmemPlan, plan_shared_memory
from .swizzle import Swizzle
from .tile_swizzle import plan_swizzles
from .tensors import DevicePlan, plan_device_memory


class LayoutError(MirageError, ValueError):
    """A μGraph that is valid but cannot be laid out for the target (shared memory)."""


@dataclass(frozen=True)
class KernelPlan:
    index: int  # position in graph.ops
    info: BlockInfo
    schedule: BlockSchedule
    smem: SmemPlan
    swizzles: dict[str, Swizzle] = field(default_factory=dict)  # tile -> XOR swizzle


@dataclass(frozen=True)
class GraphPlan:
    graph: KernelGraph
    target: Target
    device: DevicePlan
    kernels: dict[int, KernelPlan]  # graph-defined kernels by position in graph.ops


def plan_graph(graph: KernelGraph, target: Any = "h100") -> GraphPlan:
    """Validate ``graph`` and plan its memory; raises ValidationError / LayoutError."""
    tgt = get_target(target)
    infos = validate(graph, tgt)
    device = plan_device_memory(graph)
    kernels = {}
    for k, op in enumerate(graph.ops):
        if not isinstance(op, GraphKernel):
            continue
        info = infos[k]
        layouts = [device.layouts[n] for n in op.inputs]
        outs = [device.layouts[t.name] for t in op.outputs]
        sched = schedule_block(op.block, info, layouts, output_layouts=outs)
        smem = plan_shared_memory(sched, info)
        if smem.total_bytes > info.smem_bytes:
            # fewest barriers needs more space than validation assumed: serialise if that helps
            lean = schedule_block(op.block, info, layouts, lean=True, output_layouts=outs)
            lean_smem = plan_shared_memory(lean, info)
            if lean_smem.total_bytes < smem.total_bytes:
                sched, smem = lean, lean_smem
        kernels[k] = KernelPlan(k, info, sched, smem, plan_swizzles(op.block, info, sched))
    plan = GraphPlan(graph, tgt, device, kernels)
    check_fits(plan, tgt)
    return plan


def check_fits(plan: GraphPlan, target: Any) -> None:
    """Raise LayoutError when a kernel's shared-memory plan exceeds ``target``'s limit."""
    tgt = get_target(target)
    for k, kp in plan.kernels.items():
        if kp.smem.total_bytes > tgt.smem_per_block:
            raise LayoutError(f"graph kernel #{k}: the shared-memory plan needs "
                              f"{kp.smem.total_bytes} bytes, {tgt.name} allows "
                              f"{tgt.smem_per_block} per block")
