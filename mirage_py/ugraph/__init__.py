"""μGraphs: the shared language of every stage (kernel, block and thread graphs)."""

from .graph import (AXES, Accum, BlockGraph, BlockOp, DTensor, Fused, GraphKernel, InputIter,
                    KernelGraph, KernelOp, MaskIter, OutputSaver, ThreadGraph, ThreadOp, attrs_of)
from .interp import run
from .lower import naive_lowering
from .phase import Phase
from .serialize import canonicalize, loads
from .validate import BlockInfo, validate

__all__ = ["AXES", "Accum", "BlockGraph", "BlockOp", "DTensor", "Fused", "GraphKernel",
           "InputIter", "KernelGraph", "KernelOp", "MaskIter", "OutputSaver", "ThreadGraph",
           "ThreadOp", "attrs_of", "run", "naive_lowering", "Phase", "canonicalize", "loads", "BlockInfo",
           "validate"]
