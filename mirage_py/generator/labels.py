"""Dimension labels: which dims of which tensors index the same thing (einsum-style).

Walking the target program, every dim of every node gets a label; operators unify labels:
matmul ties A's last dim to B's second-to-last (a *contracted* label) and batch dims to each other,
elementwise operators tie broadcast-aligned dims of equal size, transpose permutes, sum / max /
min drop the reduced dims (their labels become *reduced*), a slice gives its dim a label of its
own (recorded in ``slices``), and a concatenation gives its dim a fresh label and ties the
others. Masks are leaves like inputs. Labels of the target outputs' dims are *parallel*.

A reshape that splits one dim into several (group norm's (N, C) -> (N, G, C/G), a pooling's
(N, C) -> (N, C/k, k)) or merges several into one makes the one dim's label a *compound* of the
others, outer first; labels with the same components are the same label, and a label tied to a
compound one takes its components (a congruence closure). A dim whose label is compound is
written as its components: ``((lg, G), (lk, C/G))``, so grid and loop splits cut whole groups
(the outer component) and the block search can reshape tiles the way the program does
(``reshapes``). Reshapes that regroup several dims into several others get fresh labels.

The search uses them to derive grid and loop choices from the algebra instead of from names: a
grid axis or the for-loop is assigned a label and a part count, and each input iterator splits
whichever of its dims carries that label (or replicates, when it has none).

A dim of a device tensor is a tuple of components ``((label, size), ...)``, outermost first: the
partial results of a split reduction are concatenated along a dim ``((split_label, parts),
(inner_label, size))``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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
    # (label of the sliced dim, start, stop) -> label of the slice's dim
    slices: dict = None  # type: ignore[assignment]
    # (labels of the concatenated dims, in order) -> label of the result's dim
    concats: dict = None  # type: ignore[assignment]
    # node digest -> its dims as components ((label, size), ...), compound labels expanded
    node_components: dict = None  # type: ignore[assignment]
    # component label tuples the program splits a dim into or merges dims from
    reshapes: frozenset = frozenset()
    # output name -> the atomic labels of its dims (``parallel`` is their union)
    output_atoms: dict = None  # type: ignore[assignment]
    # every label some operator reduces, parallel for an output or not
    reduced_any: frozenset = frozenset()
    # the target's views that move no data between labels, as (outer labels of the operand's
    # dims, outer labels of the result's dims, the permutation of a transpose or None) with
    # None for size-1 dims: its transposes and the reshapes that only add or drop size-1 dims
    # (a head dim of 1 before a broadcast matmul); the block search applies them to tiles
    # (``block_search._views``)
    views: frozenset = frozenset()

    def classes(self, outputs) -> tuple[frozenset, frozenset]:
        """(parallel, reduced) labels as seen by the given outputs alone -- what a kernel that
        is left to finish just those may treat as a grid dim and loop over: a label parallel
        for an output already finished (a residual stream ``h``) and reduced for one still to
        come (``rms_norm(h) @ W``) is reduced from then on."""
        if self.output_atoms is None or set(outputs) >= set(self.output_atoms):
            return self.parallel, self.reduced
        par = frozenset(a for o in outputs for a in self.output_atoms[o])
        return par, self.reduced_any - par


@dataclass(frozen=True)
class LabelMap:
    """How the labels of one program name the dims of another of the same outline (a shape
    family's two buckets): ``rename`` each label of the first that names a dim -> the second's
    label of that dim; ``fresh`` the second's labels of dims that have none in the first (size
    1 there)."""

    rename: dict
    fresh: tuple[str, ...] = ()


#: the most output orders :func:`label_correspondences` walks (regions have a few outputs)
MAX_OUTPUT_ORDERS = 24


def label_correspondences(old_program, old: Labels, new_program, new: Labels) -> list[LabelMap]:
    """The ways the labels of ``old_program`` (labels ``old``) name the dims of ``new_program``
    (labels ``new``), two programs of one outline (a shape family's buckets: the same
    operators, other sizes). A region's canonical program orders its inputs, nodes and outputs
    by a hash that sees sizes, so nothing is paired by position: for each order of the
    outputs (at most ``MAX_OUTPUT_ORDERS``) both programs are walked from their outputs in step,
    operator by operator and operand by operand, each pair of nodes pairing the labels of their
    dims (compound dims component by component); an order that pairs another operator, rank or
    number of operands, or one label with two, is no correspondence. A dim of size 1 has no
    label, and labels are numbered in order of appearance, so the names shift between buckets.
    Distinct maps, in the order found; empty when there is none. What a map is used for (a
    schedule replayed at the other bucket) is verified there, so a map that pairs two twin
    outputs the wrong way round costs a rejected candidate, not a wrong answer."""
    from itertools import islice, permutations
    outs_a = [o.tensor for o in old_program.outputs]
    outs_b = [o.tensor for o in new_program.outputs]
    if len(outs_a) != len(outs_b):
        return []
    found: list[LabelMap] = []
    for order in islice(permutations(outs_b), MAX_OUTPUT_ORDERS):
        m = _walk_pairs(old, new, list(zip(outs_a, order)))
        if m is not None and m not in found:
            found.append(m)
    return found


def _walk_pairs(old: Labels, new: Labels, todo: list) -> LabelMap | None:
    pairs: dict[str, Any] = {}  # old node digest -> new node
    while todo:
        a, b = todo.pop()
        if a.digest in pairs:
            if pairs[a.digest].digest != b.digest:
                return None
            continue
        if a.op != b.op or len(a.shape) != len(b.shape) or len(a.inputs) != len(b.inputs):
            return None
        pairs[a.digest] = b
        todo += list(zip(a.inputs, b.inputs))
    out: dict[str, str] = {}
    named: set[str] = set()  # the new labels of paired dims

    def pair(x: str | None, y: str | None) -> bool:
        if y is not None:
            named.add(y)
        if x is None:
            return True
        return y is not None and out.setdefault(x, y) == y

    for d, b in pairs.items():
        la, lb = old.node_dims.get(d), new.node_dims.get(b.digest)
        if la is None or lb is None or len(la) != len(lb):
            return None
        if not all(pair(x, y) for x, y in zip(la, lb)):
            return None
        for xs, ys in zip(old.node_components.get(d) or (), new.node_components.get(b.digest)
                          or ()):
            xs, ys = [c for c, _ in xs if c], [c for c, _ in ys if c]
            if len(xs) == len(ys) and not all(pair(x, y) for x, y in zip(xs, ys)):
                return None
    if len(set(out.values())) != len(out):
        return None
    fresh = tuple(sorted(named - set(out.values()), key=lambda lbl: (-new.sizes[lbl], lbl)))
    return LabelMap(out, fresh)


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

    slice_ids: list[tuple[int | None, int, int, int | None]] = []
    concat_ids: list[tuple[tuple[int | None, ...], int | None]] = []
    compound: dict[int, tuple[int, ...]] = {}  # label id -> component ids (outer first)
    for t in program.nodes():
        if t.op in ("input", "const", "mask"):
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
        elif t.op in ("sum", "max", "min"):
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
            dims[t.digest] = _reshape_labels(t.inputs[0].shape, ins[0], t.shape, fresh, tie,
                                             compound)
        elif t.op == "slice":
            ax = t.attr("axis")
            new = fresh(t.shape[ax])
            slice_ids.append((ins[0][ax], t.attr("start"), t.attr("stop"), new))
            dims[t.digest] = [new if j == ax else d for j, d in enumerate(ins[0])]
        elif t.op == "take":  # ids dims, then the table's row dims (its row dim is its own)
            dims[t.digest] = list(ins[1]) + list(ins[0][1:])
        elif t.op == "concat":
            ax = t.attr("axis")
            for j in range(len(t.shape)):
                if j != ax:
                    for a in ins[1:]:
                        tie(ins[0][j], a[j])
            new = fresh(t.shape[ax])
            concat_ids.append((tuple(a[ax] for a in ins), new))
            dims[t.digest] = [new if j == ax else d for j, d in enumerate(ins[0])]
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

    comp = _close_compounds(uf, compound, sizes)

    names: dict[int, str] = {}

    def name(k: int | None) -> str | None:
        if k is None:
            return None
        r = uf.find(k)
        if r not in names:
            names[r] = f"l{len(names)}"
        return names[r]

    def atoms(k: int) -> list[int]:
        """The atomic labels a label is made of, outer first."""
        parts = comp.get(uf.find(k))
        return [uf.find(k)] if parts is None else [a for c in parts for a in atoms(c)]

    def components(k: int | None, size: int) -> tuple:
        if k is None:
            return ()
        return tuple((name(a), sizes[a]) for a in atoms(k))

    inputs = {}
    for t in program.inputs:
        inputs[t.name] = tuple(components(k, d) for k, d in zip(dims[t.digest], t.shape))
    # an output dim is named by its outer component (what a saved tile's dim shows first)
    outputs = {o.name: tuple(name(atoms(k)[0]) if k is not None else None
                             for k in dims[o.tensor.digest]) for o in program.outputs}
    label_sizes = {name(k): sizes[k] for k in sizes}
    parallel = frozenset(name(a) for o in program.outputs for k in dims[o.tensor.digest]
                         if k is not None for a in atoms(k))
    reduced_any = frozenset(name(a) for k in reduced_ids for a in atoms(k))
    reduced = reduced_any - parallel
    output_atoms = {o.name: frozenset(name(a) for k in dims[o.tensor.digest] if k is not None
                                      for a in atoms(k)) for o in program.outputs}
    node_dims = {d: tuple(name(k) for k in ks) for d, ks in dims.items()}
    node_components = {t.digest: tuple(components(k, n) for k, n in zip(dims[t.digest], t.shape))
                       for t in program.nodes()}
    slices = {(name(a), lo, hi): name(b) for a, lo, hi, b in slice_ids}
    concats = {tuple(name(k) for k in parts): name(b) for parts, b in concat_ids}
    reshapes = frozenset(tuple(name(a) for a in atoms(k)) for k in comp)

    def outer(k: int | None) -> str | None:
        return None if k is None else name(atoms(k)[0])
    views = set()
    for t in program.nodes():
        if t.op == "transpose" or (t.op == "reshape" and unit_reshape(t.inputs[0].shape,
                                                                        t.shape)):
            views.add((tuple(outer(k) for k in dims[t.inputs[0].digest]),
                       tuple(outer(k) for k in dims[t.digest]),
                       tuple(t.attr("perm")) if t.op == "transpose" else None))
    return Labels(inputs, outputs, label_sizes, parallel, reduced, node_dims, slices, concats,
                  node_components, reshapes, output_atoms, reduced_any, frozenset(views))


def unit_reshape(a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Does a reshape of ``a`` into ``b`` only add or drop dims of size 1?"""
    return a != b and [d for d in a if d != 1] == [d for d in b if d != 1]


def _groups(a: tuple[int, ...], b: tuple[int, ...]) -> list[tuple[list[int], list[int]]] | None:
    """Consecutive runs of dims of ``a`` and ``b`` (size-1 dims left out) with equal products,
    in order: how a row-major reshape regroups them; None if the sizes do not line up."""
    ia = [i for i, d in enumerate(a) if d > 1]
    ib = [i for i, d in enumerate(b) if d > 1]
    out, i, j = [], 0, 0
    while i < len(ia) and j < len(ib):
        ga, gb = [ia[i]], [ib[j]]
        pa, pb = a[ia[i]], b[ib[j]]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb and i < len(ia):
                ga.append(ia[i])
                pa *= a[ia[i]]
                i += 1
            elif pb < pa and j < len(ib):
                gb.append(ib[j])
                pb *= b[ib[j]]
                j += 1
            else:
                return None
        out.append((ga, gb))
    return out if i == len(ia) and j == len(ib) else None


def _reshape_labels(shape_in, labels_in, shape_out, fresh, tie, compound) -> list:
    """Labels of a reshape's output: dims kept tie to their input dim; a dim split into several
    gets fresh labels of which the input's label is the compound; several merged into one get
    a fresh compound label; any other regrouping fresh labels."""
    out: list = [fresh(d) for d in shape_out]
    groups = _groups(tuple(shape_in), tuple(shape_out))
    if groups is None:
        return out
    for ga, gb in groups:
        if len(ga) == 1 and len(gb) == 1:
            out[gb[0]] = labels_in[ga[0]]
        elif len(ga) == 1:
            compound[labels_in[ga[0]]] = tuple(out[j] for j in gb)
        elif len(gb) == 1:
            compound[out[gb[0]]] = tuple(labels_in[i] for i in ga)
    return out


def _close_compounds(uf: _UnionFind, compound: dict[int, tuple[int, ...]],
                     sizes: dict[int, int]) -> dict[int, tuple[int, ...]]:
    """Compounds per union-find root, closed under congruence: labels in one class share one
    factorisation (their components tied pairwise), and two classes with the same components
    are one. A class with two factorisations that do not match keeps the first."""
    while True:
        by_root: dict[int, tuple[int, ...]] = {}
        changed = False
        for k, parts in compound.items():
            r = uf.find(k)
            mine = by_root.get(r)
            if mine is None:
                by_root[r] = parts
            elif len(mine) == len(parts) and \
                    all(sizes[a] == sizes[b] for a, b in zip(mine, parts)):
                for a, b in zip(mine, parts):
                    if uf.find(a) != uf.find(b):
                        uf.union(a, b)
                        changed = True
        seen: dict[tuple[int, ...], int] = {}
        for r, parts in by_root.items():
            key = tuple(uf.find(a) for a in parts)
            other = seen.setdefault(key, r)
            if uf.find(other) != uf.find(r):
                uf.union(other, r)
                changed = True
        if not changed:
            return {uf.find(r): tuple(uf.find(a) for a in parts) for r, parts in by_root.items()}
