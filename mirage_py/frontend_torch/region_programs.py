"""Each region of an analysed graph (:mod:`.classify`) as a program: what ``mp.compile`` runs.

Each region is translated again with its boundary values as program inputs and its values read
outside as outputs. At the boundary, a reshape of an input (and a transpose of a parameter, buffer
or constant) becomes an input computed by a torch view at call time, and a reshape or expand of
an output is applied to the output by torch: views cost nothing there, while inside a program
each would be a kernel. Data movement next to static weights moves into the weights (a fused QKV
projection's column slices, attention's head split and merge), where torch caches it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..errors import TorchCaptureError
from ..lax import tensor as _lt
from ..lax.ops import OPS
from ..lax.program import Program
from ..lax.tensor import Tensor, make_input, topo_order
from .aten import Boundary, Sym, Unsupported, input_dtype, mirage_dtype, ranked
from .capture import Captured
from .classify import Analysis, RegionFailure, UniqueNames, _Opaque, _torch, node_meta, translate


@dataclass(frozen=True)
class Source:
    """Where a program input comes from at call time: ``ref`` (a value in the run's environment:
    an FX node name, or a constant key) with torch view / dtype ``ops`` applied."""

    ref: str
    ops: tuple = ()
    static: bool = False


@dataclass
class RegionOutput:
    """How FX node ``node`` gets its value from a region: ``kind`` "program" (output ``key`` of
    the program), "input" (program input ``key``, passed through), or "const" (constant ``key``),
    then torch ``post`` ops (reshape / expand)."""

    node: str
    kind: str
    key: str
    post: tuple = ()


@dataclass
class RegionSpec:
    index: int
    nodes: list[str]
    program: Program | None
    inputs: dict[str, Source]
    outputs: list[RegionOutput]
    consts: dict[str, Any] = field(default_factory=dict)


# ---- building region programs -----------------------------------------------------------------

def analyse(cap: Captured, forced: dict[str, str] | None = None
            ) -> tuple[Analysis, list[RegionSpec]]:
    """Analysis and region programs. ``forced``: nodes to run eagerly whatever they are, with
    the reason. A node that fails its region's translation (a safety net, not expected) is
    forced eager and the analysis repeated."""
    forced = dict(forced or {})
    for _ in range(len(list(cap.gm.graph.nodes)) + 1):
        an = Analysis(cap, forced)
        try:
            regions = [build_region(an, k, i) for i, k in enumerate(
                sorted({an.pos[n.name] for n in an.nodes if an.kind.get(n.name) == "region"}))]
            return an, regions
        except RegionFailure as e:
            forced[e.node] = "internal: its region could not translate it, or an eager " \
                "operator reads its results whole"
    raise TorchCaptureError("internal: the region analysis did not settle")


def build_region(an: Analysis, level: int, index: int, name: str = "region") -> RegionSpec:
    nodes = an.region_nodes(level)
    inside = {n.name for n in nodes}
    names = UniqueNames()
    inputs: dict[str, Source] = {}
    by_key: dict[str, Tensor] = {}
    consts: dict[str, Any] = {}

    def input_name(key: str) -> str:
        role = an.roles.get(key)
        return names(role.name if role is not None else key)

    def make_in(b: Boundary) -> Tensor:
        if b.ref not in by_key:
            nm = input_name(b.key) if not b.ops else names(f"{input_name(b.key)}_view")
            ref, _, idx = b.key.partition("[")
            ops = (("item", int(idx[:-1])),) if idx else ()
            inputs[nm] = Source(ref, ops + b.ops, b.static)
            by_key[b.ref] = make_input(nm, b.shape, input_dtype(b.dtype))
        return by_key[b.ref]

    def const_in(v: Any, where: str, dtype: str | None = None) -> Tensor:
        dt = dtype or mirage_dtype(v.dtype) or "float32"
        for key, c in consts.items():
            if c is v and by_key[key].dtype == dt:
                return by_key[key]
        key = f"#const{len(consts)}_{where}"
        consts[key] = v
        nm = names(f"const_{where}")
        same = str(v.dtype).replace("torch.", "") == dt
        inputs[nm] = Source(key, () if same else (("to", dt),), True)
        by_key[key] = make_input(nm, tuple(int(d) for d in v.shape), dt)
        return by_key[key]

    values: dict[str, Any] = {}
    for n in an.nodes:
        if n.name in inside:
            continue
        k = an.kind.get(n.name)
        if k == "const":
            values[n.name] = an.consts[n.name]
        elif k in ("input", "eager"):
            values[n.name] = an._boundary(n)
        elif k == "region":  # another region's value: a boundary here
            values[n.name] = _region_boundary(an, n)
    for n in nodes:
        try:
            values[n.name] = translate(n, values, make_in, const_in)
        except Unsupported:
            raise RegionFailure(n.name) from None

    # values read outside the region
    reads: list[tuple[str, Sym]] = []
    for n in nodes:
        v = values[n.name]
        if isinstance(v, Boundary):  # a view of a runtime index tensor: passed through
            v = Sym(make_in(v), v.shape)
        if not isinstance(v, Sym):
            continue
        if any(u.name not in inside for u in n.users):
            reads.append((n.name, v))
    outputs, program = _assemble(an, reads, inputs, names, consts, f"{name}{index}")
    return RegionSpec(index, [n.name for n in nodes], program, inputs, outputs, consts)


def _region_boundary(an: Analysis, n: Any) -> Any:
    v = an.values.get(n.name)
    if isinstance(v, (Sym, Boundary)):
        m = node_meta(n)
        return Boundary(n.name, v.shape, m.dtype, False)
    if isinstance(v, tuple):  # read through its getitem nodes, never whole
        return tuple(_Opaque(f"{n.name}[{i}]") for i in range(len(v)))
    return _Opaque(n.name)


def _assemble(an: Analysis, reads: list[tuple[str, Sym]], inputs: dict[str, Source],
              names: UniqueNames, consts: dict[str, Any], pname: str, fold_heads: bool = True
              ) -> tuple[list[RegionOutput], Program | None]:
    torch = _torch()
    outs: list[RegionOutput] = []
    bases: dict[str, Tensor] = {}  # program output name -> tensor
    by_digest: dict[str, str] = {}
    plan: list[tuple[str, Tensor, tuple]] = []
    for node, sym in reads:
        t = ranked(sym)
        post: tuple = (("expand", sym.shape),) if t.shape != sym.shape else ()
        while t.op == "reshape" and t.inputs[0].op not in ("const", "mask"):
            post = (("reshape", t.shape),) + post
            t = t.inputs[0]
        plan.append((node, t, post))
    # inputs computed by torch views: reshape of any input, transpose of a static one
    tensors = _fold_input_views([t for _, t, _ in plan], inputs, names)
    if fold_heads:
        tensors = _fold_input_views(_fold_head_layouts(tensors, inputs, names), inputs, names)
    for (node, _, post), t in zip(plan, tensors):
        if t.op == "input":
            outs.append(RegionOutput(node, "input", t.name, post))
        elif t.op in ("const", "mask"):
            key = f"#out_{node}"
            if t.op == "const":
                consts[key] = torch.full(t.shape, float(t.attr("value")),
                                         dtype=getattr(torch, t.dtype))
            else:
                from ..lax.ops import mask_values
                consts[key] = torch.from_numpy(
                    mask_values(t.shape, **t.attr_dict).copy()).to(getattr(torch, t.dtype))
            outs.append(RegionOutput(node, "const", key, post))
        else:
            if t.digest not in by_digest:
                nm = names(node)
                by_digest[t.digest] = nm
                bases[nm] = t
            outs.append(RegionOutput(node, "program", by_digest[t.digest], post))
    if not bases:
        for nm in list(inputs):
            if not any(o.kind == "input" and o.key == nm for o in outs):
                del inputs[nm]
        return outs, None
    p = Program(pname)
    used = [t for t in topo_order(bases.values()) if t.op == "input"]
    order = {nm: i for i, nm in enumerate(inputs)}
    for t in sorted(used, key=lambda t: order.get(t.name, 0)):
        p.input(t.name, t.shape, t.dtype)
    keep = {t.name for t in used} | {o.key for o in outs if o.kind == "input"}
    for nm in list(inputs):
        if nm not in keep:
            del inputs[nm]
    for nm, t in bases.items():
        p.output(t, nm)
    return outs, p


def _fold_input_views(roots: list[Tensor], inputs: dict[str, Source], names: UniqueNames
                      ) -> list[Tensor]:
    for _ in range(8):
        subst: dict[str, Tensor] = {}
        for t in topo_order(roots):
            if t.op not in ("reshape", "transpose") or t.inputs[0].op != "input":
                continue
            src = inputs[t.inputs[0].name]
            if t.op == "transpose" and not src.static:
                continue
            suffix = "view" if t.op == "reshape" else "t"
            nm = names(f"{t.inputs[0].name}_{suffix}")
            op = ("reshape", t.shape) if t.op == "reshape" else ("permute", t.attr("perm"))
            inputs[nm] = Source(src.ref, src.ops + (op,), src.static)
            subst[t.digest] = make_input(nm, t.shape, t.dtype)
        if not subst:
            return roots
        roots = rebuild(roots, subst)
    return roots


def _fold_head_layouts(roots: list[Tensor], inputs: dict[str, Source], names: UniqueNames
                       ) -> list[Tensor]:
    """Weight layouts: first column slices of products with static weights (a fused QKV
    projection split in three), then attention's head split and merge (see
    :func:`_fold_weights`)."""
    roots = _sink_transposes(_fold_weights(roots, inputs, names, "slices"))
    return _fold_weights(roots, inputs, names, "heads")


def _sink_transposes(roots: list[Tensor]) -> list[Tensor]:
    """``transpose(f(v))`` as ``f(transpose(v))`` where ``f`` works along the last axis, which the
    transpose keeps: element-wise operators and keep-dims reductions over axes the transpose
    fixes, whose other operands are ``v``, values of ``f`` read by nothing else, or tensors of
    lower rank that broadcast the same way after the transpose (a norm's weight). A per-head
    norm between attention's head split and its transpose (Qwen3's q / k RMSNorm) so leaves the
    split next to the projection, where :func:`_fold_weights` moves it into the weight."""
    order = topo_order(roots)
    readers: dict[int, list[Tensor]] = {}
    for t in order:
        for i in t.inputs:
            readers.setdefault(id(i), []).append(t)
    for t in roots:
        readers.setdefault(id(t), []).append(t)

    def chain(t: Tensor) -> tuple[Tensor, list[Tensor]] | None:
        """(v, the nodes of f in dependency order) for ``t = transpose(f(v))``, or None."""
        perm = t.attr("perm")
        n = len(perm)
        fixed = {a for a in range(n) if perm[a] == a}
        if n - 1 not in fixed:
            return None
        nodes: dict[int, Tensor] = {}
        sources: dict[int, Tensor] = {}
        stack = [t.inputs[0]]
        while stack:
            y = stack.pop()
            if id(y) in nodes or id(y) in sources:
                continue
            spec = OPS[y.op]
            if y.ndim == n and (spec.elementwise or (
                    spec.category == "reduce" and y.attr("keepdims") and
                    set(y.attr("axes")) <= fixed)) and y.op not in ("const", "mask"):
                nodes[id(y)] = y
                for i in y.inputs:
                    if i.ndim == n:
                        stack.append(i)
                    elif any(perm[a] != a for a in range(n - i.ndim, n)):
                        return None  # it would broadcast against other dims
            else:
                sources[id(y)] = y
        if len(sources) != 1 or not nodes:
            return None
        inside = set(nodes) | {id(t)}
        if any(id(r) not in inside for y in nodes.values() for r in readers.get(id(y), [])):
            return None  # f's values are read elsewhere too: both layouts would be computed
        (v,) = sources.values()
        return v, [y for y in order if id(y) in nodes]

    new: dict[int, Tensor] = {}
    for t in order:
        ins = [new[id(i)] for i in t.inputs]
        if t.op == "transpose" and t.inputs[0].ndim == len(t.attr("perm")):
            found = chain(t)
            if found is not None:
                v, f = found
                sub = {id(v): _lt.transpose(new[id(v)], t.attr("perm"))}
                for y in f:
                    sub[id(y)] = _lt.apply(y.op, [sub.get(id(i), new[id(i)]) for i in y.inputs],
                                           y.attr_dict)
                new[id(t)] = sub[id(t.inputs[0])]
                continue
        new[id(t)] = t if all(a is b for a, b in zip(ins, t.inputs)) else \
            _lt.apply(t.op, ins, t.attr_dict)
    return [new[id(t)] for t in roots]


def _fold_weights(roots: list[Tensor], inputs: dict[str, Source], names: UniqueNames, rules: str
                  ) -> list[Tensor]:
    """Move data movement next to static weights into the weights, where torch caches it.

    ``rules="slices"``: ``(X @ Wt [+ b])[..., a:b]``, where every reader of the product takes
    last-axis slices, is ``X @ Wt[:, a:b] [+ b[a:b]]``.

    ``rules="heads"``: attention's head split and merge.

    ``transpose(reshape(X @ Wt [+ b]))`` splitting the last dim into (H, D) and moving H before
    the rows is ``X' @ Wh [+ bh]`` with ``Wh = Wt.reshape(K, H, D).permute(1, 0, 2)`` (and ``X'``
    X with a dim of size 1 before its rows); ``reshape(transpose(A)) @ Wt`` merging (H, D) back is
    ``sum(A @ Wt.reshape(H, D, N), heads)``. ``Wt`` (and ``b``) must be static inputs (a
    parameter's transpose, computed by torch once per weight version); each value in the chain
    must have one user. Inside a program each transpose would be a kernel of its own."""
    users: dict[str, int] = {}
    readers: dict[str, list[Tensor]] = {}
    order = topo_order(roots)
    for t in order:
        for i in t.inputs:
            users[i.digest] = users.get(i.digest, 0) + 1
            readers.setdefault(i.digest, []).append(t)
    for t in roots:
        users[t.digest] = users.get(t.digest, 0) + 1
    root_digests = {t.digest for t in roots}

    def product(y: Tensor) -> tuple[Tensor | None, Tensor | None]:
        """``y`` as (``X @ Wt``, bias or None) with a static bias over the last axis (a vector,
        or per head ``(H, 1, D)`` once the head split is in the weights)."""
        if y.op == "matmul":
            return y, None
        if y.op == "add" and y.inputs[0].op == "matmul" and static(y.inputs[1]):
            b = y.inputs[1]
            if b.ndim == 1 or (rules == "slices" and b.ndim <= y.ndim and
                               b.shape[-1] == y.shape[-1] and
                               all(d == 1 for d in b.shape[-2:-1])):
                return y.inputs[0], b
        return None, None

    def static(t: Tensor) -> bool:
        return t.op == "input" and inputs[t.name].static

    def derived(t: Tensor, op: tuple, suffix: str, shape: tuple[int, ...]) -> Tensor:
        src = inputs[t.name]
        nm = names(f"{t.name}_{suffix}")
        inputs[nm] = Source(src.ref, src.ops + op, True)
        return make_input(nm, shape, t.dtype)

    def below_reshapes(t: Tensor) -> Tensor | None:
        """The value under a chain of reshapes each read once (None if one is read twice)."""
        while t.op == "reshape":
            if users[t.digest] != 1:
                return None
            t = t.inputs[0]
        return t

    def sliced_columns(t: Tensor) -> Tensor | None:
        y = t.inputs[0]
        last = y.ndim - 1
        if t.attr("axis") != last or y.digest in root_digests or \
                not all(u.op == "slice" and u.attr("axis") == last for u in readers[y.digest]):
            return None
        # under reshapes that keep the columns (a 2-D addmm viewed as (B, S, N), as GPT-2's
        # fused QKV projection is), each read once
        base = y
        while base.op == "reshape" and base.inputs[0].shape[-1:] == y.shape[-1:] and \
                (base is y or users[base.digest] == 1):
            base = base.inputs[0]
        if base is not y and users[base.digest] != 1:
            return None
        mm, bias = product(base)
        if mm is None or (bias is not None and users[mm.digest] != 1):
            return None
        x, wt = mm.inputs
        if not static(wt) or wt.ndim < 2:
            return None
        a, b = t.attr("start"), t.attr("stop")
        out = _lt.matmul(new[x.digest], derived(wt, (("narrow", wt.ndim - 1, a, b - a),),
                                                f"cols{a}", wt.shape[:-1] + (b - a,)))
        if bias is not None:
            out = out + derived(bias, (("narrow", bias.ndim - 1, a, b - a),), f"cols{a}",
                                bias.shape[:-1] + (b - a,))
        if out.shape != t.shape and math.prod(out.shape) == math.prod(t.shape):
            out = _lt.reshape(out, t.shape)
        return out if out.shape == t.shape else None

    def heads_in(t: Tensor) -> Tensor | None:
        r = t.inputs[0]  # (..., S, H, D), from (M, N) or (..., S, N) by reshapes
        y = below_reshapes(r)
        if y is None:
            return None
        mm, bias = product(y)
        if mm is None or users[y.digest] != 1 or \
                (bias is not None and users[mm.digest] != 1):
            return None
        x, wt = mm.inputs
        n = r.ndim
        if not static(wt) or wt.ndim != 2 or x.ndim < 2 or n < 3 or \
                math.prod(r.shape[:-2]) != math.prod(y.shape[:-1]) or \
                r.shape[-2] * r.shape[-1] != y.shape[-1] or \
                t.attr("perm") != tuple(range(n - 3)) + (n - 2, n - 3, n - 1):
            return None
        k, _ = wt.shape
        h, d = r.shape[-2:]
        x = new[x.digest]
        while x.op == "reshape":  # a reshape of a reshape is one reshape
            x = x.inputs[0]
        xr = _lt.reshape(x, r.shape[:-3] + (1, r.shape[-3], k))
        out = _lt.matmul(xr, derived(wt, (("reshape", (k, h, d)), ("permute", (1, 0, 2))),
                                     "heads", (h, k, d)))
        if bias is not None:
            out = out + derived(bias, (("reshape", (h, 1, d)),), "heads", (h, 1, d))
        return out if out.shape == t.shape else None

    def heads_out(t: Tensor) -> Tensor | None:
        r, wt = t.inputs  # r: (..., S, H * D) or (M, H * D), from a transpose by reshapes
        tr = below_reshapes(r)
        if tr is None or tr.op != "transpose" or users[tr.digest] != 1:
            return None
        a = tr.inputs[0]
        n = a.ndim
        if n < 3 or tr.attr("perm") != tuple(range(n - 3)) + (n - 2, n - 3, n - 1) or \
                r.shape[-1] != tr.shape[-2] * tr.shape[-1] or \
                math.prod(r.shape[:-1]) != math.prod(tr.shape[:-2]):
            return None
        h, d, cols = a.shape[-3], a.shape[-1], wt.shape[1]
        w3 = derived(wt, (("reshape", (h, d, cols)),), "heads", (h, d, cols))
        out = _lt.sum(_lt.matmul(new[a.digest], w3), axis=n - 3)
        if out.shape != t.shape:
            out = _lt.reshape(out, t.shape)
        return out

    # one pass in dependency order, each rewrite built on the rewritten operands
    new: dict[str, Tensor] = {}
    for t in order:
        if t.op in ("input", "const", "mask"):
            new[t.digest] = t
            continue
        rep = None
        if rules == "slices":
            if t.op == "slice":
                rep = sliced_columns(t)
        elif t.op == "transpose" and t.inputs[0].op == "reshape":
            rep = heads_in(t)
        elif t.op == "matmul" and t.inputs[0].op == "reshape" and static(t.inputs[1]) and \
                t.inputs[1].ndim == 2:
            rep = heads_out(t)
        if rep is not None:
            new[t.digest] = rep
            continue
        ins = [new[i.digest] for i in t.inputs]
        new[t.digest] = t if all(a is b for a, b in zip(ins, t.inputs)) else \
            _lt.apply(t.op, ins, t.attr_dict)
    return [new[t.digest] for t in roots]


def rebuild(roots: list[Tensor], subst: dict[str, Tensor]) -> list[Tensor]:
    """``roots`` with the nodes of ``subst`` (by digest) replaced, everything above rebuilt."""
    new: dict[str, Tensor] = {}
    for t in topo_order(roots):
        if t.digest in subst:
            new[t.digest] = subst[t.digest]
        elif t.op in ("input", "const", "mask"):
            new[t.digest] = t
        else:
            ins = [new[i.digest] for i in t.inputs]
            if all(a is b for a, b in zip(ins, t.inputs)):
                new[t.digest] = t
            else:
                new[t.digest] = _lt.apply(t.op, ins, t.attr_dict)
    return [new[t.digest] for t in roots]


__all__ = ["RegionSpec", "RegionOutput", "Source", "analyse", "build_region", "rebuild"]
