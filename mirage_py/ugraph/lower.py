"""Naive lowering: a program -> a kernel graph with one pre-defined kernel per operator.

Constants become scalar operands of the elementwise kernel that uses them; a mask becomes a kernel
that writes its 0/1 values (float16, exact). Intermediate tensors
are named ``t<k>`` after the program node they hold (``t<k>_`` ... where that is an input or
output name); outputs keep the program's output names.
Intermediates are stored in their program dtype, except the statistics of a 16-bit program
(sums, squares, values computed from them), which are float32 as PyTorch's norms keep them
(lax/precision.py). A float32 matmul's kernel carries its math (float32 FMA by default; TF32 or bfloat16 tensor cores
where the program's ``precision`` allows, lax/precision.py).
This is the baseline every fusion is measured against.
"""

from __future__ import annotations

from ..errors import ProgramError
from ..lax.precision import math_attrs, matmul_math, storage_dtype
from ..lax.program import Program

from .graph import DTensor, KernelGraph, KernelOp, attrs_of


def naive_lowering(program: Program) -> KernelGraph:
    ids = program.node_ids()
    out_name: dict[str, str] = {}
    for name, t in program.output_tensors.items():
        if t.op == "input":
            raise ProgramError(f"Program {program.name!r}: output {name!r} is the input "
                               f"{t.name!r} itself; nothing to compute")
        out_name.setdefault(t.digest, name)
    taken = {t.name for t in program.inputs} | set(program.output_tensors)
    names: dict[str, str] = {}
    ops = []
    memo: dict[str, bool] = {}
    for t in program.nodes():
        if t.op == "input":
            names[t.digest] = t.name
            continue
        if t.op == "const":
            continue
        operands = tuple(names[i.digest] if i.op != "const" else float(i.attr("value"))
                         for i in t.inputs)
        name = out_name.get(t.digest)
        dtype = t.dtype
        if name is None:
            name = f"t{ids[t.digest]}"
            while name in taken:
                name += "_"
            dtype = storage_dtype(t, memo)  # statistics of 16-bit programs in float32
        names[t.digest] = name
        attrs = attrs_of(t.attr_dict)
        if t.op == "matmul":  # the program's precision becomes how the kernel multiplies
            attrs = math_attrs(matmul_math(t.dtype, t.attr("precision"))
                               if t.dtype == "float32" else None)
        ops.append(KernelOp(t.op, operands, DTensor(name, t.shape, dtype), attrs))
    extra = []  # an output that is another output's tensor under a second name
    for name, t in program.output_tensors.items():
        if names[t.digest] != name:
            extra.append(KernelOp("mul", (names[t.digest], 1.0), DTensor(name, t.shape, t.dtype)))
    inputs = tuple(DTensor(t.name, t.shape, t.dtype) for t in program.inputs)
    return KernelGraph(program.name, inputs, tuple(ops + extra), tuple(program.output_tensors))


