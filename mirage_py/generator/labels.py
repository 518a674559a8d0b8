"""Dimension labels: which dims of which tensors index the same thing (einsum-style).

Walking the target program, every dim of every node gets a label; operators unify labels:
matmul ties A's last dim to B's second-to-last (a *contracted* label) and batch dims to each other,
elementwise operators tie broadcast-aligned dims of equal size, transpose permutes, sum drops the
summed dims (their labels become *reduced*). Labels of the target outputs' dims are *parallel*.

The search uses them to derive grid and loop choices from the algebra instead of from names: a
grid axis or the for-loop is assigned a label and a part count, and each input iterator splits
whichever of its dims carries that label (or replicates, when it has none).

A dim of a device tensor is a tuple of components ``((label, size), ...)``, outermost first: the
partial results of a split reduction are concatenated along a dim ``((split_label, parts),
(inner_label, size))``.
"""

from __future__ import annotations

from dataclasses import dataclass


class _UnionFind:
    def __init__(self) -> None:
        self.parent: dict[int, int] = {}

    def make(self) -> int:
        k = len(self.parent)
        self.parent[k] = k
        return k

    def find(self, k: int) -> int:
        while self.parent[k] != k:
            self.parent[k] = self.parent[self.parent[k]]
            k = self.parent[k]
        return k

    def union(self, a: int, b: int) -> None:
        a, b = self.find(a), self.find(b)
        if a != b:
            self.parent[max(a, b)] = min(a, b)


@dataclass(frozen=True)
class Labels:
    """Per input: a tuple of dims, each ``((label, size),)``; plus label sizes and classes."""

    inputs: dict[str, tuple[tuple[tuple[str, int], ...], ...]]
    outputs: dict[str, tuple[str, ...]]
    sizes: dict[str, int]
    parallel: frozenset[str]
    reduced: frozenset[str]
    node_dims: dict  # node digest -> tuple of labels (None for size-1 dims)


def infer_labels(program) -> Labels:
    uf = _UnionFind()
    dims: dict[str, list[int | None]] = {}  # node digest -> label id per dim (None: size-1)
    sizes: dict[int, int] = {}
    reduced_ids: set[int] = set()

    def fresh(size: int) -> int | None:
        if size == 1:
            return None
        k = uf.make()
        sizes[k] = size
        return k

    def tie(a: int | None, b: int | None) -> None:
        if a is not None and b is not None:
            uf.union(a, b)

    for t in program.nodes():
        if t.op in ("input", "const"):
            dims[t.digest] = [fresh(d) for d in t.shape]
            continue
        ins = [dims[i.digest] for i in t.inputs]
        if t.op == "matmul":
            a, b = ins
            tie(a[-1], b[-2])
            if a[-1] is not None:
                reduced_ids.add(a[-1])
            batch = []
            nb = len(t.shape) - 2
            for j in range(nb):
                ja, jb = j - nb + len(a) - 2, j - nb + len(b) - 2
                la = a[ja] if ja >= 0 else None
                lb = b[jb] if jb >= 0 else None
                tie(la, lb)
                batch.append(la if la is not None else lb)
            dims[t.digest] = batch + [a[-2], b[-1]]
        elif t.op == "sum":
            axes = t.attr("axes")
            for ax in axes:
                if ins[0][ax] is not None:
                    reduced_ids.add(ins[0][ax])
            if t.attr("keepdims"):
                dims[t.digest] = [None if j in axes else d for j, d in enumerate(ins[0])]
            else:
                dims[t.digest] = [d for j, d in enumerate(ins[0]) if j not in axes]
        elif t.op == "transpose":
            dims[t.digest] = [ins[0][p] for p in t.attr("perm")]
        elif t.op == "reshape":
            dims[t.digest] = [fresh(d) for d in t.shape]
        else:  # elementwise, numpy broadcasting
            out: list[int | None] = []
            nd = len(t.shape)
            for j in range(nd):
                cur = None
                for a in ins:
                    k = j - nd + len(a)
                    if k >= 0 and a[k] is not None:
                        if cur is None:
                            cur = a[k]
                        else:
                            tie(cur, a[k])
                out.append(cur)
            dims[t.digest] = out

    names: dict[int, str] = {}

    def name(k: int | None) -> str | None:
        if k is None:
            return None
        r = uf.find(k)
        if r not in names:
            names[r] = f"l{len(names)}"
        return names[r]

    inputs = {}
    for t in program.inputs:
        inputs[t.name] = tuple(((name(k), d),) if k is not None else ()
                               for k, d in zip(dims[t.digest], t.shape))
    outputs = {o.name: tuple(name(k) for k in dims[o.tensor.digest]) for o in program.outputs}
    label_sizes = {name(k): sizes[k] for k in sizes}
    parallel = frozenset(x for o in outputs.values() for x in o if x is not None)
    reduced = frozenset(name(k) for k in reduced_ids) - parallel
    node_dims = {d: tuple(name(k) for k in ks) for d, ks in dims.items()}
    return Labels(inputs, outputs, label_sizes, parallel, reduced, node_dims)
