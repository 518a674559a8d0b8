"""Which regions of a part to consider: rule-based floor groups, and regions to search.

*Basic regions.* Each anchor (matmul, reduction) with its elementwise neighbourhood: the
elementwise operators that feed it through elementwise operators only (its prologue: a norm's
division before a matmul, the exp before a row sum) and those it feeds the same way (its
epilogue: a scale, silu, a residual add). Elementwise operators that no anchor reaches form
regions of their own (one per connected elementwise component). Basic regions overlap where an
elementwise operator sits between two anchors -- the norm between its sum of squares and the
next matmul -- and that overlap is what joins them. A chain of data movement (reshapes,
transposes, slices, concatenations: a KV cache's ``cat(past, new)`` viewed and transposed for the
scores) is one piece of glue, taken whole or not at all.

*Search regions* are unions of up to ``max_anchors`` basic regions that are connected (they share
an operator, an edge, or a value they both read, as the gate and up projections share X), made
convex, and free of operators no graph-defined kernel computes (transpose). The whole
part is one more when it has at most ``whole_anchors`` anchors: that is the search the nine
benchmarks always had. A row max that only shifts exps (softmax made safe) counts toward
neither limit: a region is as large as its unshifted form. Products of one operand with
weights (q / k / v of one normalised token, gate and up) count as one anchor: one loop over
the operand computes them all. A piece of glue beside many anchors, or a value many anchors
read, makes each of them connected to the ``GLUE_WINDOW`` nearest of them in part order on
either side only (all of them where there are at most ``2 * GLUE_WINDOW + 1``): the stack of
every step's output of an unrolled 256-step RNN and the weight every step multiplies by
otherwise made every set of up to ``max_anchors`` of the steps' products a region grown, joined
by nothing else (over 300 s of enumeration; 1.7 s for 128 steps now, regions of up to 4 steps
unchanged). Closures are taken on bit sets (``_AtomBits``).

*Floor groups* are a disjoint, rule-based grouping (what a fusing compiler does without search):
every anchor starts a group, an elementwise operator joins the group of its latest-produced
operand when that keeps the groups convex (a matmul or reduction with its elementwise epilogue,
elementwise chains), and an elementwise group whose values feed exactly one anchor's group is
pulled into it (the reduction's prologue). Every group is lowered to one kernel quickly; the
searched regions compete with them under the cost model.
"""

from __future__ import annotations

import itertools
from collections import Counter
from dataclasses import dataclass

from .region import PartDag, is_anchor, is_barrier, is_elementwise, is_movement

MAX_ANCHORS = 3  # search regions: at most this many matmuls / reductions
WHOLE_ANCHORS = 5  # the whole part is searched as one region up to this many
MAX_OPS = 24  # and at most this many operators
#: a piece of glue beside more anchors than this joins each with the GLUE_WINDOW nearest in part
#: order on either side only (``search_regions``)
GLUE_WINDOW = 2


@dataclass(frozen=True)
class Atom:
    """Operators that always go together: an anchor with the elementwise prologue only its
    reduction reads (square(x) of sum(square(x))), or a piece of elementwise glue."""

    ops: frozenset
    anchor: str | None  # the anchor's digest; None for glue
    barrier: bool = False


def atoms(dag: PartDag) -> list[Atom]:
    """The part's operators grouped into atoms (see the module docstring), in part order."""
    nodes = dag.by_digest
    ew = {d for d, t in nodes.items() if is_elementwise(t)}
    owner: dict[str, str] = {}  # exclusive prologue node -> its reduction
    for t in reversed(dag.nodes):
        d = t.digest
        users = dag.consumers[d]
        if d not in ew or d in dag.output_names or not users:
            continue
        owners = {u if nodes[u].op == "sum" or _ops_reduce(nodes[u]) else owner.get(u)
                  for u in users}
        if len(owners) == 1 and None not in owners:
            owner[d] = owners.pop()
    # where each glue node's value goes: the anchors (and barriers, and the part's outputs) it
    # reaches through elementwise nodes only
    down: dict[str, frozenset] = {}
    for t in reversed(dag.nodes):
        d = t.digest
        if d not in ew:
            continue
        reach = {"<out>"} if d in dag.output_names else set()
        for u in dag.consumers[d]:
            if u in owner:
                reach.add(owner[u])
            elif u in ew:
                reach |= down[u]
            else:
                reach.add(u)
        down[d] = frozenset(reach)
    out: list[Atom] = []
    seen: set[str] = set()
    for t in dag.nodes:
        d = t.digest
        if d in seen or d in owner:
            continue
        if d not in ew and is_movement(t) and not is_barrier(t):
            # a chain of data movement (a KV cache's cat(past, new), viewed, then transposed
            # for the scores' product) is one piece of glue: a region takes all of it or none
            comp = _component(dag, d, lambda y: y in nodes and is_movement(nodes[y]) and
                              not is_barrier(nodes[y]) and y not in seen)
            seen |= comp
            out.append(Atom(frozenset(comp), None))
            continue
        if d not in ew:
            ops = {d} | {p for p, a in owner.items() if a == d}
            out.append(Atom(frozenset(ops), d if is_anchor(t) else None, is_barrier(t)))
            seen |= ops
            continue
        # connected glue with the same destinations
        comp = _component(dag, d, lambda y: y in ew and y not in owner and down[y] == down[d])
        seen |= comp
        out.append(Atom(frozenset(comp), None))
    return out


def _component(dag: PartDag, start: str, joins) -> set[str]:
    """The nodes connected to ``start`` through operands and consumers that ``joins``."""
    comp, stack = set(), [start]
    while stack:
        x = stack.pop()
        if x in comp:
            continue
        comp.add(x)
        stack.extend(y for y in dag.operands(x) + dag.consumers[x] if joins(y))
    return comp


def _ops_reduce(t) -> bool:
    return is_anchor(t) and t.op != "matmul"


def _shifts_only(dag: PartDag, d: str) -> bool:
    """Is ``d`` a max / min read only as the ``m`` of ``exp(x - m)``?"""
    t = dag.by_digest[d]
    if t.op not in ("max", "min"):
        return False
    users = [dag.by_digest[u] for u in dag.consumers[d]]
    return bool(users) and all(
        u.op == "sub" and u.inputs[1].digest == d and dag.consumers[u.digest] and
        all(dag.by_digest[c].op == "exp" for c in dag.consumers[u.digest]) for u in users)


def _product_of(dag: PartDag, d: str) -> str | None:
    """For a matmul of an operator's value by a part input (a weight), that operand's digest
    (its sibling products read the same one); None otherwise."""
    t = dag.by_digest[d]
    if t.op != "matmul" or t.inputs[1].op != "input" or t.inputs[0].digest not in dag.by_digest:
        return None
    return "product:" + t.inputs[0].digest


@dataclass(frozen=True)
class _Explored:
    """What growing anchor sets from some seeds found (:func:`search_regions`): the regions,
    and the atoms the growing looked at."""

    regions: list
    core: frozenset  # the closed sets' atoms and their variants' (their neighbours looked at)
    rim: frozenset  # the other atoms looked at (what and where they are only)


class _AtomMoves:
    """The atoms of a repeating part (:class:`~.region.Repeat`) one period later: ``image[k]``
    is the atom made of ``k``'s operators translated (None where they do not translate or make
    no atom); ``k`` is *alike* one period later when its image is the same kind of atom -- the
    same anchor translated, counted alike, a sibling product where it had one --, and *moves*
    when its neighbours and near anchors are also the images of its own."""

    def __init__(self, dag: PartDag, repeat, ats: list[Atom], where: dict, nbrs: dict,
                 near: dict, counts: dict, sibling: dict):
        self.dag, self.repeat, self.ats, self.where = dag, repeat, ats, where
        self.image: list[int | None] = []
        for a in ats:
            pos = [dag.pos[d] for d in a.ops]
            k = None
            if repeat.all_valid(pos):
                moved = frozenset(repeat.shifted(dag, d) for d in a.ops)
                j = where.get(next(iter(moved)))
                k = j if j is not None and ats[j].ops == moved else None
            self.image.append(k)

        def alike(k: int) -> bool:
            j, a = self.image[k], ats[k]
            if j is None or ats[j].barrier != a.barrier or \
                    (a.anchor is None) != (ats[j].anchor is None):
                return False
            return a.anchor is None or (
                ats[j].anchor == repeat.shifted(dag, a.anchor) and counts.get(j) == counts.get(k)
                and sibling.get(j) == _moved_sibling(dag, repeat, sibling[k]))

        def moves(k: int) -> bool:
            return self.alike[k] and all(
                k not in rel or (all(self.image[x] is not None for x in rel[k]) and
                                 rel.get(self.image[k], set()) == {self.image[x] for x in rel[k]})
                for rel in (nbrs, near))
        self.alike = [alike(k) for k in range(len(ats))]
        self.moves = [moves(k) for k in range(len(ats))]

    def translated(self, seeds: list[int], got: _Explored, next_seeds: list[int]
                   ) -> _Explored | None:
        """What growing from ``next_seeds`` finds, as ``got`` (grown from ``seeds``) one period
        later -- where ``next_seeds`` are the images of ``seeds`` and everything the growing
        looked at translates: the atoms whose neighbours it looked at move with them, the
        others it looked at are alike one period later, and so is every operator and atom
        between the first and the last of their operators (what a hull may hold). None
        otherwise: grow them."""
        dag, image, where = self.dag, self.image, self.where
        if any(image[k] is None for k in seeds) or \
                {image[k] for k in seeds} != set(next_seeds):
            return None
        if not got.core or not all(self.moves[k] for k in got.core) or \
                not all(self.alike[k] for k in got.rim):
            return None
        span = [dag.pos[d] for k in got.core | got.rim for d in self.ats[k].ops]
        lo, hi = min(span), max(span)
        if not self.repeat.all_valid(range(lo, hi + 1)) or not all(
                self.alike[where[dag.nodes[i].digest]] for i in range(lo, hi + 1)):
            return None
        shifted = self.repeat.shifted
        return _Explored([frozenset(shifted(dag, d) for d in r) for r in got.regions],
                         frozenset(image[k] for k in got.core),
                         frozenset(image[k] for k in got.rim))


def _moved_sibling(dag: PartDag, repeat, key: str) -> str:
    """A sibling key (:func:`_product_of`: ``product:`` and an operand, or an anchor) one
    period later."""
    if key.startswith("product:"):
        return "product:" + repeat.shifted(dag, key[len("product:"):])
    return repeat.shifted(dag, key)


def search_regions(dag: PartDag, max_anchors: int = MAX_ANCHORS,
                   whole_anchors: int = WHOLE_ANCHORS, max_ops: int = MAX_OPS,
                   max_variants: int = 8, glue_window: int = GLUE_WINDOW) -> list[frozenset]:
    """The op sets of the regions worth searching (see the module docstring), smallest first."""
    ats = atoms(dag)
    where = {d: k for k, a in enumerate(ats) for d in a.ops}
    nbrs: dict[int, set[int]] = {k: set() for k in range(len(ats))}
    for d, k in where.items():
        for c in dag.consumers[d]:
            if c in where and where[c] != k:
                nbrs[k].add(where[c])
                nbrs[where[c]].add(k)
    reads = {k: {t.digest for d in a.ops for t in dag.reads(d)} - a.ops
             for k, a in enumerate(ats)}
    anchors = [k for k, a in enumerate(ats) if a.anchor is not None]
    # anchors are neighbours when glue alone joins them, or they read a common value
    near: dict[int, set[int]] = {k: set() for k in anchors}
    readers: dict[str, set[int]] = {}  # value -> the anchors' atoms that read it
    for k in anchors:
        for v in reads[k]:
            readers.setdefault(v, set()).add(k)
    # glue alone: the anchors next to k, and those next to each connected piece of glue next
    # to k (its pieces found once, not walked again from every anchor: the residual stream is
    # one piece of glue across all the layers)
    piece: dict[int, int] = {}  # glue atom -> its piece
    beside: list[set[int]] = []  # piece -> the anchors next to it
    for g, a in enumerate(ats):
        if a.anchor is not None or a.barrier or g in piece:
            continue
        stack, piece[g], found = [g], len(beside), set()
        while stack:
            for j in nbrs[stack.pop()]:
                if ats[j].anchor is not None:
                    found.add(j)
                elif not ats[j].barrier and j not in piece:
                    piece[j] = len(beside)
                    stack.append(j)
        beside.append(found)
    # a piece beside many anchors, or a value many read (the stack of every step's output of
    # an unrolled RNN, the weight every step multiplies by; the residual stream of stacked
    # layers) joins each with the glue_window nearest of them in part order on either side:
    # otherwise every set of up to max_anchors of them was grown (cubic in the steps of a
    # 256-step RNN, whose outputs no path joins and whose products no hull closes past the
    # limit)
    def windows(groups: list[set[int]]) -> list[dict[int, list[int]]]:
        out = []
        for g in groups:
            o = sorted(g, key=lambda k: dag.pos[ats[k].anchor])
            out.append({k: o if len(o) <= 2 * glue_window + 1 else
                        o[max(0, r - glue_window):r + glue_window + 1]
                        for r, k in enumerate(o)})
        return out

    by_piece = windows(beside)
    values = list(readers)
    by_value = dict(zip(values, windows([readers[v] for v in values])))
    for k in anchors:
        near[k] = {j for j in nbrs[k] if ats[j].anchor is not None}
        for i in {piece[j] for j in nbrs[k] if j in piece}:
            near[k].update(by_piece[i][k])
        for v in reads[k]:
            near[k].update(by_value[v][k])
        near[k].discard(k)
    # a row max that only shifts exps (the max-shifted form of a softmax) does not count toward
    # the limits: a region is as large as its unshifted form, which is what the search sees;
    # products of one operand with weights count once (the k and v projections of a normalised
    # token with the down projection and norm before them; gate and up with the norm and the
    # sum before them): one loop over the operand computes them all
    counts = {k: 0 if _shifts_only(dag, ats[k].anchor) else 1 for k in anchors}
    sibling = {k: _product_of(dag, ats[k].anchor) or ats[k].anchor for k in anchors}
    siblings = max(Counter(sibling.values()).values(), default=1)

    def size(s: frozenset) -> int:
        return len({sibling[k] for k in s if counts[k]})

    # each atom's positions, descendants and ancestors as bit sets: a set's hull is then a few
    # ORs, and a hull past the anchor limit is known by counting its bits (32 stacked decoder
    # layers: 12 s taken op by op, 0.65 s so; the same regions)
    atom_bits = [dag.reach_bits(a.ops) for a in ats]
    bits = _AtomBits(dag, ats, where, atom_bits)
    anchor_at = {dag.pos[ats[k].anchor]: k for k in anchors}
    anchor_bit = {k: 1 << dag.pos[ats[k].anchor] for k in anchors}
    anchor_mask = sum(anchor_bit.values())
    counted_mask = sum(anchor_bit[k] for k in anchors if counts[k])

    def closed(s: frozenset) -> frozenset | None:
        """``s`` with every anchor its hull holds (any region with the anchors ``s`` holds
        those too); None past ``max_anchors``. Far-apart anchors -- joined by the residual
        stream's glue across layers -- stop here at once instead of being grown further."""
        while size(s) <= max_anchors:
            own = below = above = 0
            for k in s:
                o, b, a = atom_bits[k]
                own, below, above = own | o, below | b, above | a
            inside = dag.hull_of_bits(own, below, above) & anchor_mask
            for k in s:
                inside |= anchor_bit[k]
            if inside.bit_count() == len(s):
                return s
            if (inside & counted_mask).bit_count() > max_anchors * siblings:
                return None  # before spelling out the anchors of a hull across many layers
            more = set(s)
            while inside:
                low = inside & -inside
                more.add(anchor_at[low.bit_length() - 1])
                inside ^= low
            if len(more) == len(s):
                return s
            s = frozenset(more)
        return None

    # anchors whose pair closes past the limit are never grown together: a closure only grows
    # with its set, so closed(s | {j}) is None for every s holding k when closed({k, j}) is.
    # The residual stream's glue makes every layer's anchors near each other: growing those
    # pairs was most of the enumeration of stacked layers (quadratic in the depth), and kept
    # what one layer grows from being the layer before's, translated
    pairs: dict[frozenset, bool] = {}
    for k in anchors:
        for j in near[k]:
            pair = frozenset((k, j))
            if pair not in pairs:
                pairs[pair] = closed(pair) is not None
        near[k] = {j for j in near[k] if pairs[frozenset((k, j))]}

    def explore(seeds: list[int]) -> _Explored:
        """The regions of the closed anchor sets grown from ``seeds`` (one neighbour at a
        time), and the atoms that growing them looked at."""
        found: dict[frozenset, None] = {}
        core: set[int] = set()  # closed sets' atoms and their variants': whose neighbours count
        rim: set[int] = set()  # atoms only looked at: what they are, where they are
        seen_sets: set[frozenset] = set()
        frontier = [frozenset([k]) for k in seeds]
        while frontier:
            nxt = []
            for s in frontier:
                if s in seen_sets:
                    continue
                seen_sets.add(s)
                c = closed(s)
                if c != s:  # None, or grown by the anchors of its hull (processed next)
                    rim.update(s)
                    if c is not None:
                        nxt.append(c)
                    continue
                core.update(s)
                for ops in _variants(dag, ats, nbrs, s, max_variants, bits):
                    for d in ops:  # the atoms in it, and the glue around them it may take
                        if where[d] not in core:
                            core.add(where[d])
                            rim.update(nbrs[where[d]])
                    if len(ops) <= max_ops:
                        found.setdefault(ops)
                for k in s:
                    rim.update(near[k])
                held = {sibling[k] for k in s if counts[k]}
                if len(held) < max_anchors or any(
                        not counts[j] or sibling[j] in held for k in s for j in near[k]
                        if j not in s):  # size(s | {j}) <= max_anchors, without the unions
                    nxt.extend(s | {j} for k in s for j in near[k] if j not in s)
            frontier = nxt
        return _Explored(list(found), frozenset(core), frozenset(rim - core))

    found: dict[frozenset, None] = {}
    repeat = dag.repeat
    if repeat is None:
        found.update(dict.fromkeys(explore(anchors).regions))
    else:  # identical layers: a period's anchors grow what the period before grew, translated
        moves = _AtomMoves(dag, repeat, ats, where, nbrs, near, counts, sibling)
        blocks: dict[int, list[int]] = {}
        for k in anchors:
            blocks.setdefault(dag.pos[ats[k].anchor] // repeat.period, []).append(k)
        last: tuple[int, list[int], _Explored] | None = None
        for b in sorted(blocks):
            seeds = blocks[b]
            got = None
            if last is not None and last[0] == b - 1:
                got = moves.translated(last[1], last[2], seeds)
            if got is None:
                got = explore(seeds)
            found.update(dict.fromkeys(got.regions))
            last = (b, seeds, got)
    for ops in _anchorless(dag, max_ops):
        found.setdefault(ops)
    every = frozenset(dag.by_digest)
    if every and size(frozenset(anchors)) <= whole_anchors and len(every) <= max_ops:
        found.setdefault(every)
    # a total order, whatever order the regions were found in
    return sorted(found, key=lambda r: (sum(is_anchor(dag.by_digest[d]) for d in r), len(r),
                                        sorted(dag.pos[d] for d in r)))


def _anchorless(dag: PartDag, max_ops: int) -> list[frozenset]:
    """Connected pieces of the operators that no matmul or reduction precedes (tables computed
    from inputs alone: rotary embeddings' cos and sin of positions, concatenated and viewed),
    two operators or more: one kernel can compute each, and no anchor's region holds them.
    Such a set is convex: a path between two of its operators through an anchor would put the
    anchor before the second."""
    free: dict[str, None] = {}  # in part order
    for t in dag.nodes:
        d = t.digest
        if not is_anchor(t) and all(p in free for p in dag.operands(d)):
            free[d] = None
    out, seen = [], set()
    for d in free:
        if d in seen:
            continue
        comp = _component(dag, d, lambda y: y in free)
        seen |= comp
        if 2 <= len(comp) <= max_ops:
            out.append(frozenset(comp))
    return out


class _AtomBits:
    """The bit sets (:meth:`~.region.PartDag.reach_bits`) region enumeration closes unions of
    atoms with: each atom's, and the positions of every anchor and barrier. A candidate's hull
    and its anchors are then a few ORs and ANDs of integers, not walks over its operators (an
    unrolled 256-step RNN: a step's anchors and the ``stack`` of every step's output are
    neighbours, and each closure of a set with that glue spanned the whole part)."""

    def __init__(self, dag: PartDag, ats: list[Atom], where: dict, atom_bits: list):
        self.dag, self.ats, self.where, self.atom_bits = dag, ats, where, atom_bits
        self.anchors = sum(1 << i for i, t in enumerate(dag.nodes) if is_anchor(t))
        self.barriers = sum(1 << i for i, t in enumerate(dag.nodes) if is_barrier(t))

    def hull(self, atom_ids) -> int:
        """The hull of the atoms' operators, as a bit set of positions."""
        own = below = above = 0
        for k in atom_ids:
            o, b, a = self.atom_bits[k]
            own, below, above = own | o, below | b, above | a
        return self.dag.hull_of_bits(own, below, above)

    def ops(self, hull: int) -> frozenset:
        """The operators at the positions of ``hull``."""
        out = []
        while hull:
            low = hull & -hull
            out.append(self.dag.nodes[low.bit_length() - 1].digest)
            hull ^= low
        return frozenset(out)

    def inside(self, hull: int) -> set[int]:
        """The atoms all of whose operators are in ``hull``."""
        found = {self.where[d] for d in self.ops(hull) if d in self.where}
        return {k for k in found if self.atom_bits[k][0] & ~hull == 0}


def _variants(dag: PartDag, ats: list[Atom], nbrs: dict, s: frozenset,
              max_variants: int, bits: _AtomBits | None = None) -> list[frozenset]:
    """Regions with exactly the anchors ``s``: the anchors and the glue between them, plus each
    choice of the glue around them (an elementwise epilogue or prologue on one side of a
    boundary or the other). ``bits``: the part's :class:`_AtomBits` (made here without)."""
    if bits is None:
        bits = _AtomBits(dag, ats, {d: k for k, a in enumerate(ats) for d in a.ops},
                         [dag.reach_bits(a.ops) for a in ats])
    want = {ats[k].anchor for k in s}
    want_bits = None if None in want else sum(1 << dag.pos[d] for d in want)

    def hull(atom_ids: set[int]) -> int | None:
        """The hull's bits, or None where it holds a barrier or other anchors than ``s``'s."""
        h = bits.hull(atom_ids)
        if want_bits is None or h & bits.barriers or h & bits.anchors != want_bits:
            return None
        return h

    def close(atom_ids: set[int]) -> frozenset | None:
        h = hull(atom_ids)
        return None if h is None else bits.ops(h)

    core = hull(set(s))
    if core is None:
        return []
    inside = bits.inside(core)
    out: list[frozenset] = []
    grown = _epilogues(dag, ats, nbrs, inside, hull)
    for base in (inside, grown):
        if base is not inside and base == inside:
            continue
        optional = sorted({j for k in base for j in nbrs[k]
                           if j not in base and ats[j].anchor is None and not ats[j].barrier})
        optional = [j for j in optional if hull(base | {j}) is not None]
        if 2 ** len(optional) <= max_variants:
            choices = [set(c) for r in range(len(optional) + 1)
                       for c in itertools.combinations(optional, r)]
        else:  # none, all, each one alone, all but each one
            choices = [set(), set(optional)] + [{j} for j in optional] + \
                [set(optional) - {j} for j in optional]
        for c in choices:
            ops = close(base | c)
            if ops is not None and ops not in out:
                out.append(ops)
        if base is grown:
            ops = close(_trimmed(dag, ats, base | set(optional), base - inside))
            if ops is not None and ops not in out:
                out.append(ops)
    return out


def _trimmed(dag: PartDag, ats: list[Atom], ids: set[int], taken: set[int]) -> set[int]:
    """``ids`` without the atoms of ``taken`` (glue the epilogue core took in) that no other
    atom of ``ids`` reads. The core grows through every piece of glue that reads nothing
    computed outside it, and one that leads nowhere inside the region is a choice, not a need:
    a bias added to the v projection takes the KV cache's ``cat(past, v + b)`` and its view into
    the core, and without this variant (offered for the largest choice around the core only)
    every region holding q, k and v with their rotary embeddings also wrote the cache's
    concatenation -- none held them as the bias-free projections' regions do, and Qwen2's v
    projection went with the attention's value product, one kernel a layer more than Llama."""
    ops = set().union(*(ats[k].ops for k in ids))
    return ids - {k for k in taken & ids
                  if not any(set(dag.consumers[d]) & ops - ats[k].ops for d in ats[k].ops)}


def _epilogues(dag: PartDag, ats: list[Atom], nbrs: dict, inside: set[int], close) -> set[int]:
    """``inside`` with the glue that reads nothing computed outside it, taken in until none is
    left: a bias added to a product, then the slices, negation and concatenation of a rotary
    embedding's ``rotate_half`` of that sum. The variants around this larger core reach the
    glue that is one step further (the multiplications by ``cos`` and ``sin``), which the
    variants around the anchors alone cannot when a bias add sits in between."""
    grown = set(inside)
    changed = True
    while changed:
        changed = False
        ops = set().union(*(ats[k].ops for k in grown))
        for j in sorted({j for k in grown for j in nbrs[k]} - grown):
            a = ats[j]
            if a.anchor is not None or a.barrier:
                continue
            if all(p in ops or p in a.ops for d in a.ops for p in dag.operands(d)) and \
                    close(grown | {j}) is not None:
                grown.add(j)
                ops |= a.ops
                changed = True
    return grown


def floor_groups(dag: PartDag) -> list[frozenset]:
    """The rule-based fusion (see the module docstring): disjoint groups in part order."""
    group: dict[str, int] = {}
    members: dict[int, list[str]] = {}
    anchored: dict[int, bool] = {}

    def quotient_acyclic(merge: dict[int, int]) -> bool:
        # groups as nodes, data edges between them; ``merge`` renames groups
        def g(d: str) -> int:
            k = group[d]
            return merge.get(k, k)
        succ: dict[int, set[int]] = {}
        for d in group:
            for c in dag.consumers[d]:
                if c in group and g(c) != g(d):
                    succ.setdefault(g(d), set()).add(g(c))
        state: dict[int, int] = {}
        for start in set(g(d) for d in group):
            if start in state:
                continue
            stack = [(start, iter(succ.get(start, ())))]
            state[start] = 1
            while stack:
                node, it = stack[-1]
                nxt = next(it, None)
                if nxt is None:
                    state[node] = 2
                    stack.pop()
                elif state.get(nxt) == 1:
                    return False
                elif nxt not in state:
                    state[nxt] = 1
                    stack.append((nxt, iter(succ.get(nxt, ()))))
        return True

    def new_group(d: str, anchor: bool) -> None:
        k = len(members)
        members[k] = [d]
        anchored[k] = anchor
        group[d] = k

    # an elementwise node read only by one anchor (and no part output) is that anchor's
    # prologue: square(x) goes with sum(square(x)), not with whatever produced x
    pro: dict[str, str] = {}
    for t in reversed(dag.nodes):
        d = t.digest
        users = dag.consumers[d]
        if not is_elementwise(t) or d in dag.output_names or not users:
            continue
        owners = {u if is_anchor(dag.by_digest[u]) else pro.get(u) for u in users}
        if len(owners) == 1 and None not in owners:
            pro[d] = owners.pop()
    prologues: dict[str, list[str]] = {}
    for p, a in pro.items():
        prologues.setdefault(a, []).append(p)
    # the groups' graph so far: while nodes are placed in part order, a node's users are not
    # placed yet, so its edges all come from its operands' groups into its own, and placing it
    # in group k makes a cycle exactly when k reaches one of its other operands' groups (the
    # graph was acyclic before). Checked so instead of walking every group each time (80
    # stacked layers: 1.2 s, quadratic in the depth)
    succ: dict[int, set[int]] = {}

    def link(ds: list[str]) -> None:
        for d in ds:
            for p in dag.operands(d):
                if p in group and group[p] != group[d]:
                    succ.setdefault(group[p], set()).add(group[d])

    def reaches(k: int, targets: set[int]) -> bool:
        stack, seen = [k], {k}
        while stack:
            for j in succ.get(stack.pop(), ()):
                if j in targets:
                    return True
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        return False

    for t in dag.nodes:
        d = t.digest
        if d in pro:
            continue
        if is_barrier(t) or is_anchor(t) or not is_elementwise(t):
            new_group(d, is_anchor(t))
            for p in prologues.get(d, ()):
                group[p] = group[d]
                members[group[d]].append(p)
            link([d] + prologues.get(d, []))
            continue
        operands = {group[p] for p in dag.operands(d)}
        options = sorted({group[p] for p in dag.operands(d)
                          if not is_barrier(dag.by_digest[p])}, reverse=True)
        for k in options:  # the latest-produced operand's group first
            if not reaches(k, operands - {k}):
                group[d] = k
                members[k].append(d)
                break
        else:
            new_group(d, False)
        link([d])
    # prologues: an elementwise group whose values all feed one anchored group joins it
    changed = True
    while changed:
        changed = False
        for k in sorted(members):
            if anchored[k] or k not in members:
                continue
            if any(d in dag.output_names for d in members[k]):
                continue
            users = {group[c] for d in members[k] for c in dag.consumers[d]} - {k}
            if len(users) != 1:
                continue
            (u,) = users
            if not anchored[u] or not quotient_acyclic({k: u}):
                continue
            for d in members.pop(k):
                group[d] = u
                members[u].append(d)
            changed = True
    return [frozenset(m) for _, m in sorted(members.items(), key=lambda kv: min(
        dag.pos[d] for d in kv[1]))]
