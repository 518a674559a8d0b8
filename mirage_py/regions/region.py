"""Regions: connected, convex sets of a part's operators, each a program of its own.

A *part* (a verifiable subprogram from :func:`mirage_py.lax.partition`) is a DAG of operators.
A region is a subset of its operator nodes that one search can handle. It reads the values its
operators consume from outside (part inputs or other operators' results) and writes the values
the rest of the part still needs (part outputs, and results that operators outside the region
consume). Those boundary values are device tensors.

Every region is turned into a *canonical* program: inputs named ``r0, r1, ...`` in the order a
depth-first walk from the outputs meets them, outputs named ``y0, y1, ...`` in an order that does
not depend on names. Two regions that compute the same thing on tensors of the same shapes and
dtypes -- the attention of layer 1 and of layer 2 -- get the same program and the same
structural hash, which is what the search results are keyed by (in memory and in the results
database), so identical layers are searched once.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any

from ..lax import ops as _ops
from ..lax.program import Program
from ..lax.tensor import Tensor


def is_anchor(t: Tensor) -> bool:
    """Matmuls and reductions: the operators a region is grown around."""
    return _ops.OPS[t.op].category in ("matmul", "reduce")


def is_barrier(t: Tensor) -> bool:
    """Operators no graph-defined kernel computes: never inside a searched region, left to a
    pre-defined kernel. None today: slices, concatenations, the reshapes the search can express
    (splitting or merging dims, adding or dropping size-1 dims) and transposes (of a tile, in
    shared memory) stay in."""
    return False


def is_elementwise(t: Tensor) -> bool:
    return _ops.OPS[t.op].elementwise


def is_movement(t: Tensor) -> bool:
    """Reshapes, transposes, slices and concatenations: they move values and compute nothing,
    so between anchors they are glue like the element-wise operators (a KV cache's
    ``cat(past, new)`` viewed and transposed before the scores' product)."""
    return _ops.OPS[t.op].category in ("shape", "concat")


class PartDag:
    """The operator DAG of one part: nodes in dependency order, producers and consumers."""

    def __init__(self, part: Program):
        self.part = part
        # operators; masks are known data, computed wherever they are used (like constants)
        self.nodes: list[Tensor] = [t for t in part.nodes()
                                    if _ops.OPS[t.op].category != "leaf"]
        self.masks: dict[str, Tensor] = {t.digest: t for t in part.nodes() if t.op == "mask"}
        self.by_digest: dict[str, Tensor] = {t.digest: t for t in self.nodes}
        self.pos: dict[str, int] = {t.digest: i for i, t in enumerate(self.nodes)}
        self.consumers: dict[str, list[str]] = {t.digest: [] for t in part.nodes()}
        for t in self.nodes:
            for i in dict.fromkeys(x.digest for x in t.inputs):  # each operand once per user
                self.consumers.setdefault(i, []).append(t.digest)
        self.output_names: dict[str, list[str]] = {}
        for name, t in part.output_tensors.items():
            self.output_names.setdefault(t.digest, []).append(name)
        self.input_names = {t.digest: t.name for t in part.inputs}
        # region extraction's memory (``extract``): structural node numbers, and the program
        # of each region structure met so far
        self.node_ids: dict[tuple, int] = {}
        self.programs: dict[tuple, tuple] = {}
        self._operands: dict[str, list[str]] = {
            t.digest: list(dict.fromkeys(x.digest for x in t.inputs if x.digest in self.by_digest))
            for t in self.nodes}
        # regions extracted so far, by their operators: a region one period after one of them
        # (identical layers, :attr:`repeat`) is that region translated, not extracted again
        self.extracted: dict[frozenset, Region] = {}

    @cached_property
    def repeat(self) -> "Repeat | None":
        """How the part repeats itself (identical layers), if it does (:func:`find_repeat`)."""
        return find_repeat(self)

    def operands(self, d: str) -> list[str]:
        """Digests of the operator nodes ``d`` reads (inputs and constants left out)."""
        return list(self._operands[d])

    def reads(self, d: str) -> list[Tensor]:
        """The non-constant values ``d`` reads (part inputs, masks and operator results)."""
        return list({x.digest: x for x in self.by_digest[d].inputs if x.op != "const"}.values())

    # -- closures ---------------------------------------------------------------------------
    def descendants(self, ds: set[str], upto: int | None = None) -> set[str]:
        """The operators reachable from ``ds`` (those at positions up to ``upto`` only)."""
        out, stack = set(), list(ds)
        pos = self.pos
        while stack:
            for c in self.consumers.get(stack.pop(), ()):
                if c not in out and (upto is None or pos[c] <= upto):
                    out.add(c)
                    stack.append(c)
        return out

    def ancestors(self, ds: set[str], downto: int | None = None) -> set[str]:
        """The operators ``ds`` depend on (those at positions from ``downto`` on only)."""
        out, stack = set(), list(ds)
        pos, operands = self.pos, self._operands
        while stack:
            for p in operands.get(stack.pop(), ()):
                if p not in out and (downto is None or pos[p] >= downto):
                    out.add(p)
                    stack.append(p)
        return out

    @cached_property
    def _reach(self) -> tuple[list[int], list[int]]:
        """Per operator position: the positions of its descendants and of its ancestors, as
        bit sets (Python ints), built once in one pass each way."""
        n = len(self.nodes)
        down, up = [0] * n, [0] * n
        for i in range(n - 1, -1, -1):
            for c in self.consumers.get(self.nodes[i].digest, ()):
                j = self.pos[c]
                down[i] |= down[j] | (1 << j)
        for i in range(n):
            for p in self._operands[self.nodes[i].digest]:
                j = self.pos[p]
                up[i] |= up[j] | (1 << j)
        return down, up

    def reach_bits(self, ops) -> tuple[int, int, int]:
        """``ops`` as bit sets of positions: (the ops themselves, their descendants, their
        ancestors). Bit sets of a union are the ORs of its members': a caller that forms many
        unions of a few groups (region enumeration) computes each group's once and takes
        :meth:`hull_of_bits` of the ORs."""
        down, up = self._reach
        own = below = above = 0
        for d in ops:
            i = self.pos[d]
            own |= 1 << i
            below |= down[i]
            above |= up[i]
        return own, below, above

    @staticmethod
    def hull_of_bits(own: int, below: int, above: int) -> int:
        """The hull (:meth:`hull`) as a bit set of positions, from :meth:`reach_bits`."""
        return own | (below & above)

    def hull(self, ops: set[str]) -> frozenset[str]:
        """The smallest convex superset: ``ops`` plus every node on a path between two of them
        (a region that leaves and re-enters could not run as one step): a descendant of one
        of them and an ancestor of one of them."""
        down, up = self._reach
        below = above = 0
        for d in ops:
            below |= down[self.pos[d]]
            above |= up[self.pos[d]]
        between = below & above
        out = set(ops)
        while between:
            low = between & -between
            out.add(self.nodes[low.bit_length() - 1].digest)
            between ^= low
        return frozenset(out)

    def is_convex(self, ops: set[str]) -> bool:
        return self.hull(ops) == ops


@dataclass(frozen=True, eq=False)
class Repeat:
    """A part that repeats itself -- identical layers -- as a translation of its operators by
    ``period`` positions in the part's order. ``valid[i]``: the operator at position ``i`` and
    the one at ``i + period`` are alike (:func:`_position_label`: operator, attributes, shape,
    dtype, users at the same offsets, a part output or not) and read alike -- operators at the
    same offsets, the same constants and masks, part inputs of the same shapes and dtypes that
    ``inputs`` pairs one to one (a layer's weights with the next layer's; an input every layer
    reads, with itself). Around valid positions the translation is an isomorphism of the part:
    what the region layer derives from them alone (the regions enumerated there, a region's
    program, inputs and outputs) is the earlier layer's, translated."""

    period: int
    valid: tuple[bool, ...]
    inputs: dict  # part input digest -> the input read in its place one period later

    def all_valid(self, positions) -> bool:
        """Do the operators at ``positions`` all translate?"""
        n = len(self.valid)
        return all(0 <= i < n and self.valid[i] for i in positions)

    def shifted(self, dag: PartDag, d: str) -> str:
        """The digest of what stands in ``d``'s place one period later: an operator by its
        position, a part input by ``inputs``, a constant or a mask is itself. Only for what
        operators at valid positions are and read."""
        if d in dag.pos:
            return dag.nodes[dag.pos[d] + self.period].digest
        return self.inputs.get(d, d)

    def earlier(self, dag: PartDag, ops: frozenset) -> frozenset | None:
        """``ops`` one period earlier, where each of those operators translates onto ``ops``;
        None otherwise."""
        p = self.period
        pos = [dag.pos[d] - p for d in ops]
        if not self.all_valid(pos):
            return None
        return frozenset(dag.nodes[i].digest for i in pos)


def _position_label(dag: PartDag, i: int) -> tuple:
    """What the operator at position ``i`` is, with every position relative to ``i``: alike
    labels at ``i`` and ``i + p`` make the translation by ``p`` an isomorphism there (inputs
    known by shape and dtype here, paired by :func:`find_repeat`)."""
    t = dag.nodes[i]
    operands = tuple(("op", dag.pos[x.digest] - i) if x.digest in dag.pos else
                     (x.op, x.digest) if x.op in ("const", "mask") else
                     ("in", x.shape, x.dtype) for x in t.inputs)
    users = tuple(sorted(dag.pos[c] - i for c in dag.consumers[t.digest]))
    return (t.op, t.attrs, t.shape, t.dtype, operands, users, t.digest in dag.output_names)


def find_repeat(dag: PartDag, candidates: int = 4) -> "Repeat | None":
    """The translation by which the part repeats itself the most (see :class:`Repeat`), or None
    where no period covers one whole period of valid positions. Periods tried: the
    ``candidates`` most frequent distances between consecutive operators with the same label;
    the one with the most valid positions wins (the shorter on a tie)."""
    n = len(dag.nodes)
    labels = [_position_label(dag, i) for i in range(n)]
    at: dict[tuple, int] = {}
    gaps: dict[int, int] = {}
    for i, lab in enumerate(labels):
        if lab in at:
            g = i - at[lab]
            gaps[g] = gaps.get(g, 0) + 1
        at[lab] = i
    best: tuple[int, int] | None = None
    for p in sorted(gaps, key=lambda g: (-gaps[g], g))[:candidates]:
        same = sum(labels[i] == labels[i + p] for i in range(n - p))
        if same >= p and (best is None or (same, -p) > (best[0], -best[1])):
            best = (same, p)
    if best is None:
        return None
    p = best[1]
    valid = [i + p < n and labels[i] == labels[i + p] for i in range(n)]
    # part inputs paired one to one by the valid positions that read them: an input read at a
    # position whose pairing conflicts with another's invalidates every valid position reading
    # it (one pass suffices: dropping positions only drops pairs)
    pairs: dict[str, set] = {}
    back: dict[str, set] = {}
    readers: dict[str, list[int]] = {}
    for i in range(n):
        if not valid[i]:
            continue
        for x, y in zip(dag.nodes[i].inputs, dag.nodes[i + p].inputs):
            if x.op == "input":
                pairs.setdefault(x.digest, set()).add(y.digest)
                back.setdefault(y.digest, set()).add(x.digest)
                readers.setdefault(x.digest, []).append(i)
    bad = {x for x, ys in pairs.items() if len(ys) > 1}
    bad |= {x for xs in back.values() if len(xs) > 1 for x in xs}
    for x in bad:
        for i in readers[x]:
            valid[i] = False
    inputs = {x: next(iter(ys)) for x, ys in pairs.items() if x not in bad}
    if sum(valid) < p:
        return None
    return Repeat(p, tuple(valid), inputs)


def _shape_digest(t: Tensor, inside: set[str], memo: dict[str, str]) -> str:
    """A digest of ``t``'s structure within a region with the region's inputs anonymous (known
    by shape and dtype only): the order of outputs must not depend on names."""
    if t.digest in memo:
        return memo[t.digest]
    if t.digest in inside:
        body = [t.op, [list(a) if isinstance(a, tuple) else a for a in t.attrs], t.shape, t.dtype,
                [_shape_digest(i, inside, memo) for i in t.inputs]]
    elif t.op == "const":
        body = ["const", float(t.attr("value")), t.dtype]
    elif t.op == "mask":
        body = ["mask", [list(a) if isinstance(a, tuple) else a for a in t.attrs], t.shape]
    else:
        body = ["in", t.shape, t.dtype]
    d = hashlib.sha256(json.dumps(body, separators=(",", ":"), default=str).encode()).hexdigest()
    memo[t.digest] = d
    return d


@dataclass(frozen=True, eq=False)
class Region:
    """A region of a part (see the module docstring).

    ``inputs`` / ``outputs`` are the digests of the values read / written, in the canonical
    order: the program's ``r<i>`` is ``inputs[i]``, its ``y<j>`` is ``outputs[j]``.
    """

    ops: frozenset
    inputs: tuple
    outputs: tuple
    program: Program
    anchors: int
    whole: bool = False  # the whole part
    tags: frozenset = field(default_factory=frozenset)  # "floor", "search", "op"
    # each of ``ops`` (part digests) -> its node's digest in ``program``: the same for the
    # operators of two regions with one program (identical layers), so what is known about a
    # region's operators can be compared across its places
    local: dict = field(default_factory=dict, repr=False)

    @cached_property
    def key(self) -> str:
        """The structural hash of the region's program (shapes and dtypes included)."""
        return self.program.structural_hash()

    @property
    def size(self) -> int:
        return len(self.ops)

    def input_name(self, i: int) -> str:
        return self.program.inputs[i].name

    def output_name(self, j: int) -> str:
        return self.program.outputs[j].name

    def __repr__(self) -> str:
        return (f"Region({len(self.ops)} ops, {self.anchors} anchors, "
                f"{len(self.inputs)} in, {len(self.outputs)} out)")


def extract(dag: PartDag, ops: frozenset, tags: frozenset = frozenset()) -> Region:
    """The region computing ``ops`` (a convex set of ``dag``'s operator digests). A region one
    period after one extracted before (identical layers, :attr:`PartDag.repeat`) is that one
    translated: the same program, its operators, inputs and outputs one period later."""
    ops = frozenset(ops)
    region = dag.extracted.get(ops)
    if region is None:
        rep = dag.repeat
        before = None if rep is None else rep.earlier(dag, ops)
        prev = None if before is None else dag.extracted.get(before)
        region = _extracted(dag, ops) if prev is None else _translated(dag, rep, prev)
        dag.extracted[ops] = region
    return region if not tags else replace(region, tags=tags)


def _translated(dag: PartDag, rep: Repeat, prev: Region) -> Region:
    """``prev`` one period later (its operators translate: :meth:`Repeat.earlier`)."""
    def move(d: str) -> str:
        return rep.shifted(dag, d)
    ops = frozenset(move(d) for d in prev.ops)
    return Region(ops, tuple(move(d) for d in prev.inputs), tuple(move(d) for d in prev.outputs),
                  prev.program, prev.anchors, len(ops) == len(dag.by_digest), frozenset(),
                  {move(d): v for d, v in prev.local.items()})


def _extracted(dag: PartDag, ops: frozenset) -> Region:
    """:func:`extract`, computed."""
    tags = frozenset()
    inside = set(ops)
    written = [d for d in ops if d in dag.output_names or
               any(c not in inside for c in dag.consumers.get(d, ()))]
    memo: dict[str, str] = {}
    written.sort(key=lambda d: (_shape_digest(dag.by_digest[d], inside, memo), dag.pos[d]))
    # canonical input order: first met by a depth-first walk from the outputs, operands in order
    inputs: list[Tensor] = []
    seen: set[str] = set()
    for d in written:
        stack = [dag.by_digest[d]]
        while stack:
            t = stack.pop()
            if t.digest in seen or t.op in ("const", "mask"):
                continue
            seen.add(t.digest)
            if t.digest in inside:
                stack.extend(reversed(t.inputs))
            else:
                inputs.append(t)
    # the program is the same for every region with the same structure (identical layers): a
    # node is known by its operator, attributes, shape, dtype and operands (an input by its
    # place), numbered once per part, and such regions share the program built for the first
    ids = dag.node_ids
    name: dict[str, Any] = {t.digest: ("r", i) for i, t in enumerate(inputs)}
    order = sorted(ops, key=dag.pos.get)
    for d in order:
        t = dag.by_digest[d]
        node = (t.op, t.attrs, t.shape, t.dtype,
                tuple(x.digest if x.op in ("const", "mask") else name[x.digest]
                      for x in t.inputs))
        name[d] = ids.setdefault(node, len(ids))
    sig = (tuple(name[d] for d in written), tuple((t.shape, t.dtype) for t in inputs))
    shared = dag.programs.get(sig)
    if shared is None:
        prog = Program("region")
        built: dict[str, Tensor] = {}
        for i, t in enumerate(inputs):
            built[t.digest] = prog.input(f"r{i}", t.shape, t.dtype)
        for d in order:
            t = dag.by_digest[d]
            args = tuple(i if i.op in ("const", "mask") else built[i.digest] for i in t.inputs)
            built[d] = Tensor(t.op, args, t.attr_dict, t.shape, t.dtype)
        for j, d in enumerate(written):
            prog.output(built[d], f"y{j}")
        shared = dag.programs[sig] = (prog, {name[d]: built[d].digest for d in ops})
    prog, digests = shared
    return Region(frozenset(ops), tuple(t.digest for t in inputs), tuple(written), prog,
                  sum(is_anchor(dag.by_digest[d]) for d in ops), inside == set(dag.by_digest),
                  tags, {d: digests[name[d]] for d in ops})


def canonical(program: Program) -> Program:
    """``program`` as the region layer searches and stores it: inputs ``r0, r1, ...`` and
    outputs ``y0, y1, ...`` in a name-independent order, one output per distinct value. Its
    structural hash is the results database's key for ``program``."""
    dag = PartDag(program)
    return extract(dag, frozenset(dag.by_digest)).program
