"""The whole captured graph as one program: what ``mp.from_torch`` returns, or a typed error
naming the first operator that cannot be expressed."""

from __future__ import annotations

from typing import Any

from ..errors import UnsupportedOperatorError
from ..lax.program import Program
from ..lax.tensor import Tensor, make_input, topo_order
from .aten import Boundary, Sym, Unsupported, input_dtype, materialize, mirage_dtype, op_label
from .capture import Captured
from .classify import Analysis, UniqueNames, describe, identifier, translate


def whole_program(cap: Captured, name: str) -> tuple[Program, dict[str, str], dict[str, Any]]:
    """One program for the captured graph, or :class:`UnsupportedOperatorError` naming the first
    operator that cannot be expressed. Returns the program, its input names -> the torch names
    (qualified parameter names, argument names, ``<constant>``) and the values of the inputs
    that hold constant tensors."""
    if cap.mutations:
        pos, kind, target = cap.mutations[0]
        raise UnsupportedOperatorError(
            f"from_torch: the module mutates {target!r} ({kind.lower().replace('_', ' ')}); a "
            "program has no side effects (mp.compile runs the mutation in PyTorch)",
            op="copy_", node=target)
    an = Analysis(cap)
    eager = an.eager_nodes()
    if eager:
        n = eager[0]
        op, module, location = describe(n)
        where = (f" in {module}" if module else "") + (f" at {location}" if location else "")
        more = f" ({len(eager) - 1} more unsupported: " \
               f"{', '.join(sorted({op_label(e.target) for e in eager[1:]}))})" \
            if len(eager) > 1 else ""
        raise UnsupportedOperatorError(
            f"from_torch: {op} (node {n.name}){where} cannot be expressed: "
            f"{an.reason.get(n.name, 'unsupported')}{more}. mp.compile runs such operators in "
            "eager PyTorch between optimised regions.", op=op, node=n.name, module=module,
            location=location)
    names = UniqueNames()
    by_key: dict[str, Tensor] = {}
    sources: dict[str, str] = {}

    def make_in(b: Boundary) -> Tensor:
        if b.ops:  # a program's inputs are the module's arguments and state as they are
            raise Unsupported(f"it reads a view {b.ops} of the index tensor {b.key} {b.shape}; "
                              "a whole program takes its index inputs unviewed")
        if b.key not in by_key:
            role = an.roles.get(b.key)
            nm = names(role.name if role is not None else b.key)
            sources[nm] = role.name if role is not None else b.key
            by_key[b.key] = make_input(nm, b.shape, input_dtype(b.dtype))
        return by_key[b.key]

    constants: dict[str, Any] = {}

    def const_in(v: Any, where: str, dtype: str | None = None) -> Tensor:
        # a constant that is no scalar or position mask (rotary positions from arange, say): an
        # input whose value the TorchProgram keeps (``constants``; ``bind`` supplies it)
        dt = dtype or mirage_dtype(v.dtype) or "float32"
        for nm, c in constants.items():
            if c is v and by_key[f"#{nm}"].dtype == dt:
                return by_key[f"#{nm}"]
        nm = names(f"const_{where}")
        constants[nm] = v
        sources[nm] = "<constant>"
        by_key[f"#{nm}"] = make_input(nm, tuple(int(d) for d in v.shape), dt)
        return by_key[f"#{nm}"]

    values: dict[str, Any] = {}
    for n in an.nodes:
        k = an.kind.get(n.name)
        if k == "const":
            values[n.name] = an.consts[n.name]
        elif k == "input":
            values[n.name] = an._boundary(n)
    for n in an.nodes:
        if an.kind.get(n.name) != "region":
            continue
        try:
            values[n.name] = translate(n, values, make_in, const_in)
        except Unsupported as e:
            op, module, location = describe(n)
            raise UnsupportedOperatorError(
                f"from_torch: {op} (node {n.name}){' in ' + module if module else ''} cannot be "
                f"expressed: {e.reason}", op=op, node=n.name, module=module,
                location=location) from None
    out_node = next(n for n in an.nodes if n.op == "output")
    results = out_node.args[0]
    results = list(results) if isinstance(results, (list, tuple)) else [results]
    outs = []
    for j, pos in enumerate(cap.outputs):
        r = results[pos]
        v = values.get(r.name) if hasattr(r, "name") else None
        if isinstance(v, Sym):
            t = materialize(v)
            if t.op in ("const", "mask"):
                raise UnsupportedOperatorError(f"from_torch: output {j} ({r.name}) is a constant; "
                                               "a program computes its outputs from its inputs",
                                               op=op_label(r.target), node=r.name)
            outs.append(t)
        elif isinstance(v, Boundary) or (hasattr(r, "name") and an.kind.get(r.name) == "input"):
            outs.append(make_in(an._boundary(r)))
        else:
            raise UnsupportedOperatorError(
                f"from_torch: output {j} is {type(v).__name__ if v is not None else r!r}, not a "
                "tensor the program computes", node=getattr(r, "name", ""))
    p = Program(identifier(name))
    order = {nd.name: i for i, nd in enumerate(an.nodes)}
    ins = sorted(by_key.items(), key=lambda kv: order.get(kv[0], 0))
    used = {t.name for t in topo_order(outs) if t.op == "input"}
    for _, t in ins:
        if t.name in used:
            p.input(t.name, t.shape, t.dtype)
    for j, t in enumerate(outs):
        p.output(t, f"out{j}")
    return p, {k: v for k, v in sources.items() if k in used}, \
        {k: v for k, v in constants.items() if k in used}


__all__ = ["whole_program"]
