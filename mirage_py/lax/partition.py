"""Cut a program into maximal Lax subprograms and the non-Lax remainder.

Grouping rule: every operator starts in a group of its own; two groups joined by a data edge are
merged while (a) both are Lax-compatible, (b) the graph of groups stays acyclic, so the parts can
run one after another, and (c) no exp ends up nested under another exp inside one group.
Merging repeats until nothing more can merge, so each Lax part is maximal in that sense.
Constants and masks are copied into every part that uses them. The parts come back in dependency order.
With ``horizontal=True`` groups that read a common program input merge too (same rules).

``split_nested_exp=False`` (what ``superopt`` uses) leaves out rule (c): a part is then only a
scope for the region layer, which verifies every region on its own and never forms a region with
a nested exp.

``uninterpreted=True`` lets the non-Lax operators (sqrt, silu, gelu, relu, sigmoid, ..., and the
max / min family) join Lax groups: the verifier treats them as uninterpreted functions (max and
min as random functions of the multiset they select from), which is what lets a search fuse, say,
``rms_norm(X) @ W``, ``silu(X@W1) * (X@W2)`` or a softmax with its max into one kernel. Such parts
have ``is_lax`` False but ``verifiable`` True.
"""

from __future__ import annotations

from typing import Any, Mapping

import networkx as nx
import numpy as np

from . import ops as _ops
from .program import Program
from .tensor import Tensor


class Partition(list):
    """The subprograms of a program in dependency order (a list), plus how to chain them.

    ``sources[name]`` says, for each output of the original program, which value (an original
    input name or a subprogram output name) holds it.
    """

    def __init__(self, program: Program, parts: list[Program], sources: dict[str, str],
                 uninterpreted: bool = False):
        super().__init__(parts)
        self.program = program
        self.sources = sources
        self.uninterpreted = uninterpreted

    def evaluate(self, inputs: Mapping[str, Any], dtype: Any = np.float64) -> dict[str, np.ndarray]:
        """Evaluate the parts in order; equals ``program.evaluate`` exactly."""
        env = dict(self.program.check_inputs(inputs))
        env = {k: v.astype(dtype, copy=False) for k, v in env.items()}
        for part in self:
            env.update(part.evaluate({t.name: env[t.name] for t in part.inputs}, dtype=dtype))
        # like Program.evaluate, never hand back the caller's own input array
        outs = self.program.output_tensors
        return {n: env[src].copy() if outs[n].op == "input" else env[src]
                for n, src in self.sources.items()}

    def __str__(self) -> str:
        lines = [f"partition of {self.program.name}: {len(self)} part(s)"]
        for part in self:
            ufs = ",".join(sorted(part.uninterpreted_ops))
            if part.is_lax:
                kind = "Lax"
            elif self.uninterpreted and part.verifiable:
                kind = "Lax + uninterpreted " + ufs
            else:
                kind = "non-Lax " + ufs if ufs else "non-Lax"
            lines.append(f"[{kind}] " + str(part).replace("\n", "\n  "))
        return "\n".join(lines)


def _compatible(t: Tensor, uninterpreted: bool) -> bool:
    return _ops.lax_class(t.op, t.attrs) not in ("uf", "select") or uninterpreted


def partition(program: Program, *, uninterpreted: bool = False,
              split_nested_exp: bool = True, horizontal: bool = False) -> Partition:
    """Split ``program`` into subprograms (see module docstring); evaluating them in order
    gives exactly ``program.evaluate``. ``split_nested_exp=False`` drops rule (c): the region
    layer verifies each region on its own, so a part may nest exps as long as no region does.
    ``horizontal=True`` (what ``superopt`` uses) also merges groups that read a common program
    input, under the same rules: independent computations on shared data -- the query's and the
    key's rotary embedding with their ``cos`` and ``sin`` -- become one part, so one kernel may
    compute both."""
    nodes = [t for t in program.nodes() if _ops.OPS[t.op].category != "leaf"]
    pos = {t.digest: i for i, t in enumerate(nodes)}
    group = {t.digest: i for i, t in enumerate(nodes)}  # union-find-free: relabel on merge
    members: dict[int, list[Tensor]] = {i: [t] for i, t in enumerate(nodes)}
    ok = {t.digest: _compatible(t, uninterpreted) for t in nodes}
    edges = [(i.digest, t.digest) for t in nodes for i in t.inputs if i.digest in pos]

    # the quotient graph (groups and the edges between them), kept as the groups merge: it is
    # a DAG, and merging two groups keeps it one unless a path of two or more edges joins them
    # (through a third group). Searching for such a path reaches only what lies between; the
    # graph rebuilt and checked whole per merge tried took 5 s on 32 stacked decoder layers.
    succ: dict[int, set[int]] = {i: set() for i in members}
    pred: dict[int, set[int]] = {i: set() for i in members}
    for u, v in edges:
        succ[group[u]].add(group[v])
        pred[group[v]].add(group[u])

    def joined_around(a: int, b: int) -> bool:
        """Whether a path from group ``a`` to group ``b`` passes through another group."""
        seen, todo = set(), [s for s in succ[a] if s != b]
        while todo:
            x = todo.pop()
            if x == b:
                return True
            if x not in seen:
                seen.add(x)
                todo.extend(succ[x])
        return False

    def quotient_acyclic(a: int, b: int) -> bool:
        return not joined_around(a, b) and not joined_around(b, a)

    def merge_into(a: int, b: int) -> None:
        for s in succ.pop(b):
            pred[s].discard(b)
            if s != a:
                pred[s].add(a)
                succ[a].add(s)
        for p in pred.pop(b):
            succ[p].discard(b)
            if p != a:
                succ[p].add(a)
                pred[a].add(p)
        succ[a].discard(b)
        pred[a].discard(b)

    def nested_exp(ts: list[Tensor]) -> bool:
        inside = {t.digest for t in ts}
        below: dict[str, bool] = {}
        for t in sorted(ts, key=lambda t: pos[t.digest]):
            b = any((below[i.digest] or i.op == "exp") for i in t.inputs
                    if i.digest in inside and not _ops.OPS[i.op].opaque)
            below[t.digest] = b
            if t.op == "exp" and b:
                return True
        return False

    pairs = list(edges)
    if horizontal:  # readers of one program input, first reader with each later one
        readers: dict[str, list[str]] = {}
        for t in nodes:
            for i in t.inputs:
                if i.op == "input":
                    readers.setdefault(i.digest, []).append(t.digest)
        pairs += [(rs[0], r) for rs in readers.values() for r in rs[1:]]
    changed = True
    while changed:
        changed = False
        for u, v in pairs:
            a, b = group[u], group[v]
            if a == b or not (ok[u] and ok[v]):
                continue
            merged = members[a] + members[b]
            if (split_nested_exp and nested_exp(merged)) or not quotient_acyclic(a, b):
                continue
            for t in members[b]:
                group[t.digest] = a
            members[a] = sorted(merged, key=lambda t: pos[t.digest])
            del members[b]
            merge_into(a, b)
            changed = True

    # order groups by dependencies, ties by first member position
    g = nx.DiGraph()
    g.add_nodes_from(members)
    for u, v in edges:
        if group[u] != group[v]:
            g.add_edge(group[u], group[v])
    order = list(nx.lexicographical_topological_sort(g, key=lambda k: pos[members[k][0].digest]))

    # names for values that cross part boundaries
    ids = program.node_ids()
    out_of: dict[str, str] = {}
    for name, t in program.output_tensors.items():
        out_of.setdefault(t.digest, name)

    # intermediate values get fresh names that clash with no input or output name
    taken = {t.name for t in program.inputs} | set(program.output_tensors)
    fresh: dict[str, str] = {}

    def value_name(t: Tensor) -> str:
        if t.op == "input":
            return t.name
        if t.digest in out_of:
            return out_of[t.digest]
        if t.digest not in fresh:
            n = f"t{ids[t.digest]}"
            while n in taken:
                n += "_"
            taken.add(n)
            fresh[t.digest] = n
        return fresh[t.digest]

    users: dict[str, set[int]] = {}
    for t in nodes:
        for i in t.inputs:
            users.setdefault(i.digest, set()).add(group[t.digest])

    parts: list[Program] = []
    for k, gid in enumerate(order):
        inside = {t.digest for t in members[gid]}
        sub = Program(f"{program.name}.{k}")
        built: dict[str, Tensor] = {}
        for t in members[gid]:
            args = []
            for i in t.inputs:
                if i.digest in inside:
                    args.append(built[i.digest])
                elif i.op in ("const", "mask"):  # known data: copied into every part
                    args.append(i)
                else:
                    vn = value_name(i)
                    if i.digest not in built:
                        built[i.digest] = sub.input(vn, i.shape, i.dtype)
                    args.append(built[i.digest])
            built[t.digest] = Tensor(t.op, tuple(args), t.attr_dict, t.shape, t.dtype)
        for t in members[gid]:
            if t.digest in out_of or users.get(t.digest, set()) - {gid}:
                sub.output(built[t.digest], value_name(t))
        parts.append(sub)

    sources = {name: value_name(t) for name, t in program.output_tensors.items()}
    return Partition(program, parts, sources, uninterpreted)


__all__ = ["partition", "Partition"]
