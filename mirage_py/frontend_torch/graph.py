"""From a captured aten graph to programs: constant folding, classification, regions.

1. **Folding.** A node whose tensor inputs are all constants (``torch.ones(s, s).tril()``,
   ``arange``, ``full``) -- or whose value depends only on shapes (``full_like``) -- is evaluated
   once at capture time. Random operators are never folded.
2. **Classification.** Every other node is translated through :data:`.aten.TABLE` with the values
   of its inputs (program tensors, constants, or :class:`~.aten.Boundary` values known only at run
   time). A node that translates is *supported*; one that does not runs in eager PyTorch
   (*eager*), with the reason kept for reports and errors.
3. **Regions.** Supported nodes are grouped by the number of eager nodes below them: ``d(n)`` is the
   largest, over the paths from the inputs, number of eager nodes on the path. Nodes with the same
   ``d`` form region ``d``; region ``d`` runs, then the eager nodes of depth ``d``, then region
   ``d + 1``. This order is always valid (a path leaving a region through an eager node comes back
   only at a larger depth), and each region is as large as it can be without a cycle. Supported
   nodes are then moved as late as their users allow (a weight transpose joins the matmul that
   reads it rather than the region before).
4. **Programs.** Each region is translated again with its boundary values as program inputs and its
   values read outside as outputs. At the boundary, a reshape of an input (and a transpose of a
   parameter, buffer or constant) becomes an input computed by a torch view at call time, and a
   reshape or expand of an output is applied to the output by torch: views cost nothing there,
   while inside a program each would be a kernel.
"""

from __future__ import annotations

import math
import operator
import re
from dataclasses import dataclass, field
from typing import Any

from ..errors import MirageError, TorchCaptureError, UnsupportedOperatorError
from ..lax import tensor as _lt
from ..lax.program import Program
from ..lax.tensor import Tensor, make_input, topo_order
from .aten import (RANDOM, SHAPE_ONLY, TABLE, Boundary, Context, Sym, Unsupported, materialize,
                   mirage_dtype, op_label, packet_name, ranked)
from .capture import Captured

#: largest constant (elements) folded at capture time; bigger ones are computed eagerly
FOLD_LIMIT = 1 << 22


def _torch() -> Any:
    import torch
    return torch


# ---- metadata ---------------------------------------------------------------------------------

def node_meta(node: Any) -> Any:
    """The node's example value: a tensor-like (shape, dtype), a tuple of them, or a Python value."""
    if "val" in node.meta:
        return node.meta["val"]
    tm = node.meta.get("tensor_meta")
    if tm is not None:
        return tm
    return node.meta.get("example_value")


def _is_tensor_meta(m: Any) -> bool:
    return hasattr(m, "shape") and hasattr(m, "dtype")


def _static_shape(m: Any) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in m.shape)
    except (TypeError, ValueError):
        raise Unsupported(f"its shape {tuple(m.shape)} is symbolic (compile with static shapes)") \
            from None


def describe(node: Any) -> tuple[str, str, str]:
    """(aten operator, module path, source location) of a node, for messages."""
    stack = node.meta.get("nn_module_stack") or {}
    module = ""
    if stack:
        path = list(stack.values())[-1]
        path = path[0] if isinstance(path, tuple) else str(path)
        module = re.sub(r"^L\['self'\]\.?|^L__self__\.?", "", str(path))
        module = re.sub(r"\._modules\['([^']+)'\]", r".\1", module)
    trace = (node.meta.get("stack_trace") or "").strip().splitlines()
    location = ""
    for i in range(len(trace) - 1, -1, -1):
        line = trace[i].strip()
        if line.startswith("File ") and "frontend_torch" not in line:  # not our wrapper's
            code = trace[i + 1].strip() if i + 1 < len(trace) else ""
            location = line + (f": {code}" if code else "")
            break
    return op_label(node.target), module, location


def identifier(name: str) -> str:
    s = re.sub(r"\W", "_", str(name))
    if not s or s[0].isdigit():
        s = "_" + s
    return s


class Names:
    """Unique identifiers for program inputs and outputs."""

    def __init__(self) -> None:
        self.used: set[str] = set()

    def __call__(self, want: str) -> str:
        base = identifier(want)
        name, i = base, 1
        while name in self.used:
            name, i = f"{base}_{i}", i + 1
        self.used.add(name)
        return name


# ---- values at run time -----------------------------------------------------------------------

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


# ---- analysis ---------------------------------------------------------------------------------

class Analysis:
    """Folding, classification and regions of one captured graph (see the module docstring)."""

    def __init__(self, cap: Captured, forced_eager: dict[str, str] | None = None):
        self.cap = cap
        self.graph = cap.gm.graph
        self.nodes = list(self.graph.nodes)
        self.by_name = {n.name: n for n in self.nodes}
        self.roles = {r.node: r for r in cap.roles}
        self.forced = dict(forced_eager or {})  # node -> why it must run eagerly
        self.consts: dict[str, Any] = {}
        self.kind: dict[str, str] = {}
        self.reason: dict[str, str] = {}
        self.values: dict[str, Any] = {}
        self._fold()
        self._classify()
        for node in self.nodes:  # an eager node must never need a region's tuple whole
            if self.kind.get(node.name) == "eager":
                for i in node.all_input_nodes:
                    if self.kind.get(i.name) == "region" and isinstance(self.values[i.name], tuple):
                        raise _RegionFailure(i.name)
        self._place()

    # -- folding --------------------------------------------------------------------------------
    def _fold(self) -> None:
        torch = _torch()
        for node in self.nodes:
            if node.op == "placeholder":
                role = self.roles.get(node.name)
                if role is not None and role.kind == "constant":
                    self.consts[node.name] = self.cap.constants[node.name]
                    self.kind[node.name] = "const"
                elif node.name in self.cap.masks:  # a mask buffer: checked at every call
                    self.consts[node.name] = self.cap.masks[node.name]
                    self.kind[node.name] = "const"
                else:
                    self.kind[node.name] = "input"
            elif node.op == "get_attr":
                self.consts[node.name] = _get_attr(self.cap.gm, node.target)
                self.kind[node.name] = "const"
            elif node.op == "output":
                self.kind[node.name] = "output"
            elif node.op == "call_function":
                pk = packet_name(node.target)
                ins = node.all_input_nodes
                if pk in RANDOM or node.name in self.forced:
                    continue
                if not all(i.name in self.consts for i in ins) and pk not in SHAPE_ONLY:
                    continue
                try:
                    with torch.no_grad():
                        args, kwargs = _map_args(node, lambda n: self.consts[n.name]
                                                 if n.name in self.consts else _dummy(n))
                        value = node.target(*args, **kwargs)
                except Exception:  # noqa: BLE001 -- not foldable: computed at run time
                    continue
                if _too_big(value):
                    continue
                self.consts[node.name] = value
                self.kind[node.name] = "const"
            else:  # call_module / call_method: Dynamo graphs traced by make_fx have none
                self.kind[node.name] = "eager"
                self.reason[node.name] = f"{node.op} nodes are run by PyTorch"

    # -- classification -------------------------------------------------------------------------
    def _classify(self) -> None:
        counter = [0]

        def fresh(b: Boundary) -> Tensor:
            counter[0] += 1
            return make_input(f"b{counter[0]}", b.shape, mirage_dtype(b.dtype))

        def const_in(v: Any, where: str) -> Tensor:
            counter[0] += 1
            return make_input(f"c{counter[0]}", tuple(int(d) for d in v.shape),
                              mirage_dtype(v.dtype) or "float32")

        for node in self.nodes:
            name = node.name
            k = self.kind.get(name)
            if k == "const":
                self.values[name] = self.consts[name]
                continue
            if k == "input":
                self.values[name] = self._boundary(node)
                continue
            if k == "output":
                continue
            if k == "eager":
                self.values[name] = self._boundary(node)
                continue
            if name in self.forced:
                self._eager(node, self.forced[name])
                continue
            if node.target is operator.getitem and \
                    self.kind.get(node.args[0].name) in ("eager", "input"):
                self._eager(node, "an element of an eager result")
                continue
            try:
                value = translate(node, self.values, fresh, const_in)
            except Unsupported as e:
                self._eager(node, e.reason)
                continue
            self.kind[name] = "region"
            self.values[name] = value

    def _eager(self, node: Any, reason: str) -> None:
        self.kind[node.name] = "eager"
        self.reason[node.name] = reason
        self.values[node.name] = self._boundary(node)

    def _boundary(self, node: Any) -> Any:
        m = node_meta(node)
        role = self.roles.get(node.name)
        static = role is not None and role.static

        def one(x: Any, key: str) -> Any:
            if _is_tensor_meta(x):
                try:
                    shape = _static_shape(x)
                except Unsupported:
                    return _Opaque(key)
                return Boundary(key, shape, x.dtype, static)
            return _Opaque(key)
        if isinstance(m, (tuple, list)):
            return tuple(one(x, f"{node.name}[{i}]") for i, x in enumerate(m))
        return one(m, node.name)

    # -- placement ------------------------------------------------------------------------------
    def _place(self) -> None:
        depth: dict[str, int] = {}
        for node in self.nodes:
            k = self.kind.get(node.name)
            if k not in ("region", "eager"):
                depth[node.name] = 0
                continue
            d = 0
            for i in node.all_input_nodes:
                ki = self.kind.get(i.name)
                if ki == "region":
                    d = max(d, depth[i.name])
                elif ki == "eager":
                    d = max(d, depth[i.name] + (1 if k == "region" else 0))
            depth[node.name] = d
        pos = dict(depth)
        for node in reversed(self.nodes):
            if self.kind.get(node.name) != "region":
                continue
            bound = None
            for u in node.users:
                ku = self.kind.get(u.name)
                if ku == "region":
                    b = pos[u.name]
                elif ku == "eager":
                    b = depth[u.name]
                else:
                    continue
                bound = b if bound is None else min(bound, b)
            if bound is not None:
                pos[node.name] = max(depth[node.name], bound)
        # elements of a multi-output operator stay with it
        for node in self.nodes:
            if self.kind.get(node.name) == "region" and node.target is operator.getitem:
                src = node.args[0].name
                if self.kind.get(src) == "region":
                    pos[node.name] = pos[src]
        self.depth, self.pos = depth, pos

    # -- reports --------------------------------------------------------------------------------
    def eager_nodes(self) -> list[Any]:
        """Eager nodes that compute something (elements of eager results left out)."""
        return [n for n in self.nodes if self.kind.get(n.name) == "eager"
                and not (n.target is operator.getitem
                         and self.kind.get(n.args[0].name) == "eager")]

    def schedule(self) -> list[tuple[str, Any]]:
        """Steps in run order: ``("region", k)`` and ``("eager", node)``."""
        steps: list[tuple[str, Any]] = []
        levels = sorted({self.pos[n.name] for n in self.nodes if self.kind.get(n.name) == "region"}
                        | {self.depth[n.name] for n in self.nodes
                           if self.kind.get(n.name) == "eager"})
        for k in levels:
            if any(self.kind.get(n.name) == "region" and self.pos[n.name] == k
                   for n in self.nodes):
                steps.append(("region", k))
            for n in self.nodes:
                if self.kind.get(n.name) == "eager" and self.depth[n.name] == k:
                    steps.append(("eager", n))
        return steps

    def region_nodes(self, k: int) -> list[Any]:
        return [n for n in self.nodes if self.kind.get(n.name) == "region" and self.pos[n.name] == k]


class _Opaque:
    """A run-time value that is not a tensor of static shape (a SymInt, a list)."""

    def __init__(self, key: str):
        self.key = key

    def __repr__(self) -> str:
        return f"<run-time value {self.key}>"


def _get_attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _dummy(node: Any) -> Any:
    m = node_meta(node)
    if _is_tensor_meta(m):
        return _torch().zeros(_static_shape(m), dtype=m.dtype)
    raise ValueError("not a tensor")


def _too_big(v: Any) -> bool:
    if isinstance(v, (tuple, list)):
        return any(_too_big(x) for x in v)
    return hasattr(v, "numel") and v.numel() > FOLD_LIMIT


def _map_args(node: Any, fn: Any) -> tuple[tuple, dict]:
    from torch.fx.node import map_arg
    return map_arg(node.args, fn), map_arg(node.kwargs, fn)


def translate(node: Any, values: dict[str, Any], make_in: Any, const_in: Any) -> Any:
    """The value of ``node`` from its inputs' ``values`` (raises :class:`Unsupported`)."""
    pk = packet_name(node.target)
    if pk in RANDOM:
        raise Unsupported("it draws random numbers")
    fn = TABLE.get(pk)
    if fn is None:
        raise Unsupported("no mirage_py operator expresses it")
    for i in node.all_input_nodes:
        if isinstance(values.get(i.name), _Opaque):
            raise Unsupported(f"its input {i.name} is not a tensor of static shape")
    args, kwargs = _map_args(node, lambda n: values[n.name])
    ctx = Context(node, node_meta(node), make_in, const_in)
    try:
        value = fn(ctx, *args, **kwargs)
    except Unsupported:
        raise
    except MirageError as e:
        raise Unsupported(str(e)) from None
    except (TypeError, ValueError, IndexError, KeyError, AttributeError, RuntimeError) as e:
        raise Unsupported(f"its arguments are not understood ({type(e).__name__}: {e})") from None
    _check(node, value)
    return value


def _check(node: Any, value: Any) -> None:
    """A translated value must have the shape torch says (a safety net: a mismatch runs eager)."""
    m = node_meta(node)
    if isinstance(value, tuple):
        metas = m if isinstance(m, (tuple, list)) else (m,) * len(value)
        if not any(isinstance(v, Sym) for v in value):
            raise Unsupported("its result has no tensor")
        for v, mm in zip(value, metas):
            if isinstance(v, Sym):
                _check_one(v, mm)
        return
    if not isinstance(value, Sym):
        raise Unsupported(f"its result is {type(value).__name__}, not a tensor")
    _check_one(value, m)


def _check_one(v: Sym, m: Any) -> None:
    if not _is_tensor_meta(m):
        raise Unsupported("its result is not a tensor")
    shape = _static_shape(m)
    if v.shape != shape:
        raise Unsupported(f"internal: translated to shape {v.shape}, torch says {shape}")
    t = v.t.shape
    if len(t) > len(shape) or any(a not in (1, b) for a, b in zip(t[::-1], shape[::-1])):
        raise Unsupported(f"internal: program tensor {t} does not broadcast to {shape}")
    if mirage_dtype(m.dtype) != v.dtype:
        raise Unsupported(f"internal: translated to {v.dtype}, torch says {m.dtype}")


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
        except _RegionFailure as e:
            forced[e.node] = "internal: its region could not translate it, or an eager " \
                "operator reads its results whole"
    raise TorchCaptureError("internal: the region analysis did not settle")


class _RegionFailure(Exception):
    def __init__(self, node: str):
        super().__init__(node)
        self.node = node


def build_region(an: Analysis, level: int, index: int, name: str = "region") -> RegionSpec:
    nodes = an.region_nodes(level)
    inside = {n.name for n in nodes}
    names = Names()
    inputs: dict[str, Source] = {}
    by_key: dict[str, Tensor] = {}
    consts: dict[str, Any] = {}

    def input_name(key: str) -> str:
        role = an.roles.get(key)
        return names(role.name if role is not None else key)

    def make_in(b: Boundary) -> Tensor:
        if b.key not in by_key:
            nm = input_name(b.key)
            ref, _, idx = b.key.partition("[")
            ops = (("item", int(idx[:-1])),) if idx else ()
            inputs[nm] = Source(ref, ops, b.static)
            by_key[b.key] = make_input(nm, b.shape, mirage_dtype(b.dtype))
        return by_key[b.key]

    def const_in(v: Any, where: str) -> Tensor:
        for key, c in consts.items():
            if c is v:
                return by_key[key]
        key = f"#const{len(consts)}_{where}"
        consts[key] = v
        nm = names(f"const_{where}")
        dt = mirage_dtype(v.dtype) or "float32"
        inputs[nm] = Source(key, (("to", dt),) if mirage_dtype(v.dtype) is None else (), True)
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
            raise _RegionFailure(n.name) from None

    # values read outside the region
    reads: list[tuple[str, Sym]] = []
    for n in nodes:
        v = values[n.name]
        if not isinstance(v, Sym):
            continue
        if any(u.name not in inside for u in n.users):
            reads.append((n.name, v))
    outputs, program = _assemble(an, reads, inputs, names, consts, f"{name}{index}")
    return RegionSpec(index, [n.name for n in nodes], program, inputs, outputs, consts)


def _region_boundary(an: Analysis, n: Any) -> Any:
    v = an.values.get(n.name)
    if isinstance(v, Sym):
        m = node_meta(n)
        return Boundary(n.name, v.shape, m.dtype, False)
    if isinstance(v, tuple):  # read through its getitem nodes, never whole
        return tuple(_Opaque(f"{n.name}[{i}]") for i in range(len(v)))
    return _Opaque(n.name)


def _assemble(an: Analysis, reads: list[tuple[str, Sym]], inputs: dict[str, Source],
              names: Names, consts: dict[str, Any], pname: str, fold_heads: bool = True
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


def _fold_input_views(roots: list[Tensor], inputs: dict[str, Source], names: Names
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


def _fold_head_layouts(roots: list[Tensor], inputs: dict[str, Source], names: Names
                       ) -> list[Tensor]:
    """Weight layouts: first column slices of products with static weights (a fused QKV
    projection split in three), then attention's head split and merge (see
    :func:`_fold_weights`)."""
    return _fold_weights(_fold_weights(roots, inputs, names, "slices"), inputs, names, "heads")


def _fold_weights(roots: list[Tensor], inputs: dict[str, Source], names: Names, rules: str
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
        """``y`` as (``X @ Wt``, bias or None) with a static bias over the last axis."""
        if y.op == "matmul":
            return y, None
        if y.op == "add" and y.inputs[0].op == "matmul" and static(y.inputs[1]) and \
                y.inputs[1].ndim == 1:
            return y.inputs[0], y.inputs[1]
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
        mm, bias = product(y)
        last = y.ndim - 1
        if mm is None or t.attr("axis") != last or y.digest in root_digests or \
                not all(u.op == "slice" and u.attr("axis") == last for u in readers[y.digest]) \
                or (bias is not None and users[mm.digest] != 1):
            return None
        x, wt = mm.inputs
        if not static(wt) or wt.ndim != 2:
            return None
        a, b = t.attr("start"), t.attr("stop")
        out = _lt.matmul(new[x.digest], derived(wt, (("narrow", 1, a, b - a),), f"cols{a}",
                                                (wt.shape[0], b - a)))
        if bias is not None:
            out = out + derived(bias, (("narrow", 0, a, b - a),), f"cols{a}", (b - a,))
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


# ---- one program for the whole graph (mp.from_torch) ------------------------------------------

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
    names = Names()
    by_key: dict[str, Tensor] = {}
    sources: dict[str, str] = {}

    def make_in(b: Boundary) -> Tensor:
        if b.key not in by_key:
            role = an.roles.get(b.key)
            nm = names(role.name if role is not None else b.key)
            sources[nm] = role.name if role is not None else b.key
            by_key[b.key] = make_input(nm, b.shape, mirage_dtype(b.dtype))
        return by_key[b.key]

    constants: dict[str, Any] = {}

    def const_in(v: Any, where: str) -> Tensor:
        # a constant that is no scalar or position mask (rotary positions from arange, say): an
        # input whose value the TorchProgram keeps (``constants``; ``bind`` supplies it)
        for nm, c in constants.items():
            if c is v:
                return by_key[f"#{nm}"]
        nm = names(f"const_{where}")
        constants[nm] = v
        sources[nm] = "<constant>"
        by_key[f"#{nm}"] = make_input(nm, tuple(int(d) for d in v.shape),
                                      mirage_dtype(v.dtype) or "float32")
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


__all__ = ["Analysis", "RegionSpec", "RegionOutput", "Source", "analyse", "build_region",
           "whole_program", "describe", "node_meta", "identifier", "Names", "translate"]
