"""From a captured aten graph to classified nodes: constant folding, classification, placement.

1. **Folding.** A node whose tensor inputs are all constants (``torch.ones(s, s).tril()``,
   ``arange``, ``full``) -- or whose value depends only on shapes (``full_like``) -- is evaluated
   once at capture time. Random operators are never folded.
2. **Classification.** Every other node is translated through :data:`.aten.TABLE` with the values
   of its inputs (program tensors, constants, or :class:`~.aten.Boundary` values known only at run
   time). A node that translates is *supported*; one that does not runs in eager PyTorch
   (*eager*), with the reason kept for reports and errors.
3. **Placement.** Supported nodes are grouped by the number of eager nodes below them: ``d(n)`` is
   the largest, over the paths from the inputs, number of eager nodes on the path. Nodes with the
   same ``d`` form region ``d``; region ``d`` runs, then the eager nodes of depth ``d``, then
   region ``d + 1``. This order is always valid (a path leaving a region through an eager node
   comes back only at a larger depth), and each region is as large as it can be without a cycle.
   Supported nodes are then moved as late as their users allow (a weight transpose joins the
   matmul that reads it rather than the region before).

What comes next: each region as a program (:mod:`.region_programs`, ``mp.compile``), or the
whole graph as one program (:mod:`.whole_program`, ``mp.from_torch``).
"""

from __future__ import annotations

import operator
import re
from typing import Any

from ..errors import MirageError
from ..lax.tensor import Tensor, make_input
from .aten import (RANDOM, SHAPE_ONLY, TABLE, Boundary, NodeContext, Sym, Unsupported,
                   input_dtype, mirage_dtype, op_label, packet_name)
from .capture import Captured

#: largest constant (elements) folded at capture time; bigger ones are computed eagerly
FOLD_LIMIT = 1 << 22


def _torch() -> Any:
    import torch
    return torch


# ---- metadata ---------------------------------------------------------------------------------

def node_meta(node: Any) -> Any:
    """The node's example value: a tensor-like (shape, dtype), a tuple of them, or a Python
    value."""
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


class UniqueNames:
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
                        raise RegionFailure(i.name)
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
                empty = _empty_result(node)
                if empty is not None:  # no elements: nothing to compute (Phi-3's `16:` slices)
                    self.consts[node.name] = empty
                    self.kind[node.name] = "const"
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
            return make_input(f"b{counter[0]}", b.shape, input_dtype(b.dtype))

        def const_in(v: Any, where: str, dtype: str | None = None) -> Tensor:
            counter[0] += 1
            return make_input(f"c{counter[0]}", tuple(int(d) for d in v.shape),
                              dtype or mirage_dtype(v.dtype) or "float32")

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
        return [n for n in self.nodes
                if self.kind.get(n.name) == "region" and self.pos[n.name] == k]


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


def _empty_result(node: Any) -> Any:
    """An empty tensor of the node's shape and dtype when its result has no elements (a slice
    past the end, say): such a value is the same whatever the inputs, a constant."""
    m = node_meta(node)
    if not _is_tensor_meta(m):
        return None
    try:
        shape = _static_shape(m)
    except Unsupported:
        return None
    if 0 not in shape:
        return None
    return _torch().empty(shape, dtype=m.dtype)


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
    ctx = NodeContext(node, node_meta(node), make_in, const_in)
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
    if isinstance(value, Boundary):  # a view of a runtime index tensor
        if not _is_tensor_meta(m) or value.shape != _static_shape(m) or value.dtype != m.dtype:
            raise Unsupported(f"internal: an index view {value.shape} {value.dtype}, torch "
                              f"says {getattr(m, 'shape', None)} {getattr(m, 'dtype', None)}")
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


class RegionFailure(Exception):
    """A node its region could not translate after all (the analysis is repeated with it
    forced eager)."""

    def __init__(self, node: str):
        super().__init__(node)
        self.node = node


__all__ = ["Analysis", "RegionFailure", "translate", "describe", "node_meta", "identifier",
           "UniqueNames", "FOLD_LIMIT"]
