"""Layout and memory planning (first version): device tensor layouts with 16-byte aligned rows,
a workspace for intermediates, block operators grouped into barrier stages, and a shared-memory
plan that reuses the space of tiles that are no longer live."""

from .intervals import Buffer, first_fit
from .plan import GraphPlan, KernelPlan, LayoutError, plan_graph, planned_shared_memory
from .schedule import BlockSchedule, Step, schedule_block, vector_width
from .smem import SmemPlan, plan_shared_memory
from .device import plan_device_memory
from .tensors import DevicePlan, TensorLayout, dense_layout, padded_layout

__all__ = ["Buffer", "first_fit", "GraphPlan", "KernelPlan", "LayoutError", "plan_graph",
           "planned_shared_memory",
           "BlockSchedule", "Step", "schedule_block", "vector_width", "SmemPlan",
           "plan_shared_memory", "DevicePlan", "TensorLayout", "dense_layout", "padded_layout",
           "plan_device_memory"]
