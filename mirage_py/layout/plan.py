"""The whole layout plan of a kernel graph: device layouts, workspace, and per graph-defined
kernel its stage schedule and shared-memory plan. Code generation reads only this."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

from ..errors import MirageError
from ..targets import Target, get_target
from ..ugraph.graph import GraphKernel, KernelGraph
from ..ugraph.phase import Phase
from ..ugraph.validate import BlockInfo, validate
from .mma import register_operand_pairs, wgmma_operands
from .schedule import LOAD, BlockSchedule, schedule_block
from .smem import SmemPlan, plan_shared_memory
from .swizzle import Swizzle
from .tile_swizzle import plan_swizzles
from .device import plan_device_memory
from .tensors import DevicePlan
from .tma import TmaCopy, plan_tma, plan_tma_once, tma_alignment


class LayoutError(MirageError, ValueError):
    """A μGraph that is valid but cannot be laid out for the target (shared memory)."""


@dataclass(frozen=True)
class KernelPlan:
    index: int  # position in graph.ops
    info: BlockInfo
    schedule: BlockSchedule
    smem: SmemPlan
    swizzles: dict[str, Swizzle] = field(default_factory=dict)  # tile -> XOR swizzle
    pipeline: int = 1  # cp.async stages in flight over the for-loop (1: no software pipeline)
    pipelined: tuple[str, ...] = ()  # the body tiles with `pipeline` buffers each
    # tiles fetched by TMA: pipelined ones, and ones loaded once per block (the others)
    tma: dict[str, TmaCopy] = field(default_factory=dict)
    # byte offset of the TMA copies' mbarriers (-1: none): first the one of the tiles loaded
    # once, if any, then one per pipeline stage, if any pipelined tile is a TMA copy
    barriers: int = -1


@dataclass(frozen=True)
class GraphPlan:
    graph: KernelGraph
    target: Target
    device: DevicePlan
    kernels: dict[int, KernelPlan]  # graph-defined kernels by position in graph.ops


DEFAULT_PIPELINE = 2  # cp.async stages of a loop when no annotation says otherwise


def pipeline_tiles(sched: BlockSchedule) -> tuple[str, ...]:
    """Body tiles loaded with 16-byte cp.async copies: the software pipeline prefetches them."""
    return tuple(st.writes for st in sched.steps
                 if st.kind == LOAD and st.segment is Phase.BODY and st.vector > 1 and not st.into)


def plan_graph(graph: KernelGraph, target: Any = "h100",
               stages: Sequence[int] | None = None, tensor_cores: bool = True) -> GraphPlan:
    """Validate ``graph`` and plan its memory; raises ValidationError / LayoutError.

    ``stages``: cp.async pipeline depth per graph-defined kernel, in order (the tuner's
    ``stages`` annotation; default 2, i.e. double buffering). A depth is capped by the loop's
    iterations and lowered until the buffers fit the target's shared memory."""
    tgt = get_target(target)
    infos = validate(graph, tgt)
    device = plan_device_memory(graph, infos)
    kernels = {}
    for k, m in _memory_plans(graph, tgt, infos, device, stages, tensor_cores, True).items():
        kernels[k] = KernelPlan(k, infos[k], m.schedule, m.smem, m.swizzles, m.depth, m.tiles,
                                m.tma, m.barriers)
    plan = GraphPlan(graph, tgt, device, kernels)
    check_fits(plan, tgt)
    return plan


def _requested_depth(stages: Sequence[int] | None, ordinal: int, op: GraphKernel) -> int:
    """The pipeline depth asked for graph-defined kernel number ``ordinal`` (default 2), capped
    by its loop."""
    depth = DEFAULT_PIPELINE if stages is None or ordinal >= len(stages) else stages[ordinal]
    return min(max(1, int(depth)), op.block.forloop)


@dataclass(frozen=True)
class _MemoryPlan:
    op: GraphKernel
    schedule: BlockSchedule
    smem: SmemPlan
    depth: int
    tiles: tuple[str, ...]
    swizzles: dict[str, Swizzle] | None
    tma: dict[str, TmaCopy]
    barriers: int


def _with_barriers(smem: SmemPlan, n: int) -> tuple[SmemPlan, int]:
    """``smem`` with ``n`` 8-byte mbarriers after its tiles, and their offset (-1 if n == 0)."""
    if n == 0:
        return smem, -1
    at = -(-smem.total_bytes // 8) * 8
    return SmemPlan(smem.offsets, smem.buffers, at + 8 * n), at


def _memory_plans(graph: KernelGraph, tgt: Target, infos: dict, device: DevicePlan,
                  stages: Sequence[int] | None, tensor_cores: bool,
                  exact: bool) -> dict[int, _MemoryPlan]:
    """Per graph-defined kernel: its schedule, shared-memory plan, pipeline and TMA copies.
    ``exact``: choose the swizzles too (which TMA copies depend on); without, the quick plan
    for cost models assumes every TMA-shaped tile gets a swizzle TMA can write."""
    out = {}
    ordinal = -1
    for k, op in enumerate(graph.ops):
        if not isinstance(op, GraphKernel):
            continue
        ordinal += 1
        info = infos[k]
        layouts = [device.layouts[n] for n in op.inputs]
        outs = [device.layouts[t.name] for t in op.outputs]
        sched = schedule_block(op.block, info, layouts, output_layouts=outs,
                               tensor_cores=tensor_cores)
        # warpgroup-MMA operands sit on their swizzle atom (8 rows): the hardware swizzles
        # absolute addresses
        aligns = {t: 8 * row for t, row in wgmma_operands(op.block, info).items()} \
            if tensor_cores else {}
        smem = plan_shared_memory(sched, info, aligns=aligns)
        if smem.total_bytes > info.smem_bytes:
            # fewest barriers needs more space than validation assumed: serialise if that helps
            lean = schedule_block(op.block, info, layouts, lean=True, output_layouts=outs,
                                  tensor_cores=tensor_cores)
            lean_smem = plan_shared_memory(lean, info, aligns=aligns)
            if lean_smem.total_bytes < smem.total_bytes:
                sched, smem = lean, lean_smem
        # swizzles serve the tensor-core reads (ldmatrix, fragments, wgmma); the FMA tile
        # matmul reads its operands row-major
        swz = (plan_swizzles(op.block, info, sched) if tensor_cores else {}) if exact else None
        depth = _requested_depth(stages, ordinal, op)
        tiles = pipeline_tiles(sched) if depth > 1 else ()
        # TMA: tiles loaded once per block (one mbarrier), pipelined tiles (one per stage)
        once = plan_tma_once(op, info, sched, device, tiles, tgt, swz)
        tma = plan_tma(op, info, sched, device, tiles, tgt, swz)
        base_aligns = _tma_aligns(aligns, once, info)
        if once:
            smem = plan_shared_memory(sched, info, aligns=base_aligns)
        smem, bars = _with_barriers(smem, 1 if once else 0)
        piped_aligns = _tma_aligns(base_aligns, tma, info)
        while tiles and depth > 1:
            piped, at = _with_barriers(
                plan_shared_memory(sched, info, {t: depth for t in tiles}, piped_aligns),
                (depth if tma else 0) + (1 if once else 0))
            if piped.total_bytes <= tgt.smem_per_block:
                smem, bars = piped, at
                break
            depth -= 1
        if depth == 1:
            tiles, tma = (), {}
        out[k] = _MemoryPlan(op, sched, smem, depth if tiles else 1, tiles, swz,
                             {**once, **tma}, bars)
    return out


def _tma_aligns(aligns: dict[str, int], copies: dict[str, TmaCopy],
                info: BlockInfo) -> dict[str, int]:
    """``aligns`` with the shared-memory alignment every TMA destination tile needs."""
    out = dict(aligns)
    for t in copies:
        out[t] = max(out.get(t, 1), tma_alignment(info.shapes[t], info.dtypes[t]))
    return out


def planned_shared_memory(graph: KernelGraph, target: Any = "h100",
                          stages: Sequence[int] | None = None,
                          infos: dict | None = None) -> dict[int, tuple[int, int, int]]:
    """(bytes of shared memory, loads in flight, register-tile floats per thread) of each
    graph-defined kernel as code generation will lay it out -- buffers reused across stages,
    register accumulators left out, pipeline buffers and TMA mbarriers included -- without
    choosing swizzles (which do not change the bytes, except that a tile whose swizzle TMA
    cannot write is fetched by cp.async and may need a few bytes less alignment). For cost
    models that want the real footprint rather than validation's bound. ``infos``: the graph's ``validate`` result, when the caller has it.

    Loads in flight: the cp.async pipeline's depth (lowered until the buffers fit). A loop with
    no cp.async tiles -- its loads go straight into accumulators -- keeps the requested depth
    (capped by the loop): its iterations are independent loads into registers, which ptxas
    overlaps by unrolling (the combine kernels' SASS issues four LDG.128 back to back)."""
    tgt = get_target(target)
    infos = infos if infos is not None else validate(graph, tgt)
    device = plan_device_memory(graph, infos)
    out = {}
    for ordinal, (k, m) in enumerate(
            _memory_plans(graph, tgt, infos, device, stages, True, False).items()):
        depth = m.depth if m.tiles else _requested_depth(stages, ordinal, m.op)
        # probabilities kept in registers replace their score fragments one for one (the
        # scores die as exp reads them): count one of the two
        values = {p.value for p in register_operand_pairs(m.op.block, infos[k])}
        floats = sum(r.cfg.register_floats(r.batch, r.m, r.n)
                     for t, r in m.schedule.registers.items() if t not in values)
        out[k] = (m.smem.total_bytes, depth, floats)
    return out


def check_fits(plan: GraphPlan, target: Any) -> None:
    """Raise LayoutError when a kernel's shared-memory plan exceeds ``target``'s limit."""
    tgt = get_target(target)
    for k, kp in plan.kernels.items():
        if kp.smem.total_bytes > tgt.smem_per_block:
            raise LayoutError(f"graph kernel #{k}: the shared-memory plan needs "
                              f"{kp.smem.total_bytes} bytes, {tgt.name} allows "
                              f"{tgt.smem_per_block} per block")
