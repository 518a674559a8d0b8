"""Kernel-level search: sequences of graph-defined kernels (and pre-defined operators) that
compute the target outputs from the program inputs.

State: the device tensors available (inputs, then kernel outputs). A move adds one kernel: for
every *structure* -- which dimension labels the grid axes split and which label the for-loop runs
over -- the part counts come from the shapes and the target (tiles of at most 64 along parallel
labels, one entry per block along batch-only labels, split reductions sized to fill the SMs,
loop chunks of 64), the block-level search saturates, and the kernel it yields either finishes
target outputs or saves partial results.
Depth is bounded (``max_kernels``); states already seen are skipped.
"""

from __future__ import annotations


import functools
import itertools
import math
import time
from dataclasses import dataclass

from ..cost_model import estimate_us
from ..lax.ops import DTYPES, is_index
from ..lax.precision import is_statistic, math_attrs, program_matmul_math
from ..targets import Target
from ..ugraph.graph import DTensor, GraphKernel, KernelGraph
from . import absexpr as ae
from .block_search import Avail, Context, Plan, dim_size, kernels_for_plan
from .labels import LabelMap, infer_labels
from .templates import templates_of


class SearchInterrupted(Exception):
    pass


@dataclass
class SearchStats:
    states: int = 0
    pruned: int = 0
    plans: int = 0
    kernels: int = 0
    candidates: int = 0
    seconds: float = 0.0
    timed_out: bool = False
    interrupted: bool = False
    gave_up: bool = False  # ``patience`` states visited and no candidate yet

    def __iadd__(self, other: "SearchStats") -> "SearchStats":
        """Count ``other``'s work into this one (a program's forms, a part's regions)."""
        for f in ("states", "pruned", "plans", "kernels", "candidates", "seconds"):
            setattr(self, f, getattr(self, f) + getattr(other, f))
        self.timed_out |= other.timed_out
        self.interrupted |= other.interrupted
        self.gave_up |= other.gave_up
        return self


@functools.lru_cache(maxsize=1 << 12)
def _divisors(n: int) -> tuple[int, ...]:
    """The divisors of ``n``, ascending: pairs ``(d, n // d)`` up to ``sqrt(n)`` (a scan of
    every ``d <= n`` took 0.14 s a call at KernelBench's 393,216-wide rows, half of a 20 s
    search)."""
    small, large = [], []
    for d in range(1, math.isqrt(n) + 1):
        if n % d == 0:
            small.append(d)
            if d != n // d:
                large.append(n // d)
    return tuple(small + large[::-1])


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in _divisors(n) if d <= cap)


def label_sizes(avail: list[Avail]) -> dict[str, int]:
    """The size of each label that is the outer component of some available tensor's dim."""
    sizes: dict[str, int] = {}
    for a in avail:
        for d in a.dims:
            if d:
                lbl, n = d[0]
                sizes[lbl] = max(sizes.get(lbl, 0), n)
    return sizes


def batch_labels(avail: list[Avail]) -> frozenset:
    """Labels only ever found in leading (batch) dims -- never in a tensor's last two dims, the
    ones its matmuls and rows run along -- such as the heads of a batched matmul."""
    seen, inner = set(), set()
    for a in avail:
        for i, d in enumerate(a.dims):
            for lbl, _ in d or ():
                seen.add(lbl)
                if i >= len(a.dims) - 2:
                    inner.add(lbl)
    return frozenset(seen - inner)


ROW_BYTES = 16  # one 16-byte vector (cp.async, ldmatrix row, 128-bit load) per tile row


def narrow_split(label: str, parts: int, avail: list[Avail]) -> bool:
    """Would cutting ``label`` into ``parts`` leave some tensor's tiles with rows (innermost,
    contiguous dim) shorter than 16 bytes where the tensor's rows are not? Such tiles cannot be
    moved in 16-byte vectors and waste most of every 32-byte sector they touch."""
    for a in avail:
        if not a.dims or not a.dims[-1] or a.dims[-1][0][0] != label:
            continue
        eb = DTYPES[a.dtype]
        n = a.shape[-1]
        if n * eb >= ROW_BYTES and (n // parts) * eb < ROW_BYTES:
            return True
    return False


def plans_for(avail: list[Avail], reduced: frozenset, parallel: frozenset, target: Target,
              max_grid_labels: int = 3, rows: frozenset = frozenset(),
              one_block: bool = False) -> list[Plan]:
    """Grid/loop plans from the labels present in the available tensors (see module doc).
    ``rows``: the parallel labels that something also reduces -- the row of a normalisation,
    which one block must hold whole to finish its statistic and its outputs. When every label
    is one, no label is one the outputs are split along, or a row is kept by one output and
    reduced for another and every available tensor fits one block (``_footprint``), plans with
    nothing on the grid come too (one block computes everything: a layer norm of one row); a
    loop-less plan holding a row whole, or of labels none of which is reduced, whose tiles are
    too large for a block comes in a finer version as well (``_finer``)."""
    sizes = label_sizes(avail)
    labels = sorted(sizes)
    batch = batch_labels(avail)
    loop_labels = [None] + [l for l in labels if l in reduced or l not in parallel]
    want = 2 * target.sm_count
    plans: list[Plan] = []
    # one block: nothing but rows (one row of a norm); no label an output is split along (a
    # concatenation's output axis is a label of its own, which no available tensor carries: a
    # rotary table ``cat(f, f)`` of one position); or when the caller says so (``one_block``)
    if labels and (set(labels) <= rows or not parallel & set(labels) or one_block):
        for loop in loop_labels:
            n = sizes.get(loop, 1)
            f = n if n <= 64 else n // _largest_divisor_at_most(n, 64)
            if loop is None or f > 1:
                plans.append(Plan(((None, 1),) * 3, (loop, f if loop is not None else 1)))
    for k in range(1, max_grid_labels + 1):
        for combo in itertools.combinations(labels, k):
            for loop in loop_labels:
                grid = []
                blocks = 1
                par = [l for l in combo if l in parallel]
                red = [l for l in combo if l not in parallel]
                ok = True
                for l in par:
                    n = sizes[l]
                    # one batch entry per block (nothing is reused across a batch dim);
                    # other dims in tiles of up to 64
                    parts = n if n <= 64 or l in batch else \
                        n // _largest_divisor_at_most(n, 64)
                    while parts > 1 and narrow_split(l, parts, avail):
                        parts = _largest_divisor_at_most(n, parts - 1)
                    grid.append((l, parts))
                    blocks *= parts
                for l in red:
                    n = sizes[l]
                    if l == loop:
                        # split the reduction over blocks, keep >= 64 per block for the loop
                        opts = [g for g in _divisors(n) if g > 1 and n // g >= 64 and
                                blocks * g <= want]
                    else:
                        opts = [g for g in _divisors(n) if g > 1 and blocks * g <= want]
                    opts = [g for g in opts if not narrow_split(l, g, avail)]
                    if not opts:
                        ok = False
                        break
                    g = max(opts)
                    grid.append((l, g))
                    blocks *= g
                if not ok or any(p == 1 for _, p in grid):
                    continue
                if loop is not None:
                    rest = sizes[loop] // dict(grid).get(loop, 1)
                    # chunks of up to 64 per iteration; a short range (the parts of a split
                    # reduction) is walked one element at a time
                    f = rest if rest <= 64 else rest // _largest_divisor_at_most(rest, 64)
                    if f <= 1:
                        continue
                    lp = (loop, f)
                else:
                    lp = (None, 1)
                # a block's tiles too large for its shared memory: a finer version too, where
                # a norm's row is held whole or nothing is reduced (KernelBench's 64 x 64 x 512
                # x 512 BatchNorm cut 64 x 512 tiles of five tensors and found no candidate)
                held = {l for l in rows if l in sizes} - {l for l, _ in grid} - {lp[0]}
                finer = _finer(grid, lp, par, batch, avail, sizes, target) \
                    if held or not reduced & set(labels) else None
                for g in (grid, finer):
                    if g is None:
                        continue
                    g = sorted(g, key=lambda x: -x[1])  # the largest part count on x (2^31-1)
                    while len(g) < 3:
                        g.append((None, 1))
                    plans.append(Plan(tuple(g), lp))
    return plans


# the float32 bytes one block's tiles of the available tensors may take before a plan also comes
# in a finer version: the inputs' tiles and as many float32 intermediates of that size must fit
# the shared memory of a block
TILE_FOOTPRINT_SHARE = 4


def _footprint(avail: list[Avail], parts: dict, loop: tuple) -> int:
    """float32 bytes of one block's tiles of every available tensor under a plan's grid
    ``parts`` (outer label -> part count) and ``loop`` (label, iterations)."""
    total = 0
    for a in avail:
        n = 1
        for d in a.dims:
            size = dim_size(d) if d else 1
            lbl = d[0][0] if d else None
            size //= parts.get(lbl, 1)
            if lbl is not None and lbl == loop[0]:
                size //= max(loop[1], 1)
            n *= max(size, 1)
        total += 4 * n
    return total


def _finer(grid: list, loop: tuple, par: list, batch: frozenset, avail: list[Avail],
           sizes: dict, target: Target) -> list | None:
    """A finer version of ``grid`` when one block's tiles would not leave room in shared memory
    (footprint above 1 / ``TILE_FOOTPRINT_SHARE`` of it): the parallel labels cut into more
    parts, the largest tile first, until they fit or are one element per block. Tiles of 64 rows
    of a norm over 512 features in float32 are too large for one block; 8 or
    16 rows are not. None when the grid fits (or nothing can be cut)."""
    budget = target.smem_per_block // TILE_FOOTPRINT_SHARE
    parts = dict(grid)
    if loop[0] is not None or _footprint(avail, parts, loop) <= budget:
        return None
    changed = False
    while _footprint(avail, parts, loop) > budget:
        cands = [l for l in par if l not in batch and parts[l] < sizes[l]]
        if not cands:
            break
        lbl = max(cands, key=lambda l: (sizes[l] // parts[l], l))
        n = sizes[lbl]
        more = [d for d in _divisors(n) if d > parts[lbl] and n // d <= max(n // parts[lbl] // 2, 1)
                and not narrow_split(lbl, d, avail)]
        if not more:
            break
        parts[lbl] = min(more)
        changed = True
    return [(l, parts[l]) for l, _ in grid] if changed else None


@dataclass(frozen=True)
class Candidate:
    """A complete kernel graph and the trace of decisions that rebuilds it: one (plan, group)
    per kernel, where group picks among the kernels a plan yields."""

    graph: KernelGraph
    trace: tuple

    def trace_json(self) -> list:
        return [[[list(g) for g in plan.grid], list(plan.loop), grp] for plan, grp in self.trace]


def trace_from_json(doc: list) -> tuple:
    return tuple((Plan(tuple((g[0], g[1]) for g in grid), (loop[0], loop[1])), grp)
                 for grid, loop, grp in doc)


#: the growths a shape family's replay tries (``rescale_trace``): from keeping every tile
#: (part counts grow with the sizes) to keeping every part count (tiles grow)
GROWTHS = (1.0, 0.75, 0.5, 0.25, 0.0)


def _divisor_near(n: int, target: float) -> int:
    """The divisor of ``n`` nearest ``target`` on a log scale (the smaller on a tie)."""
    target = max(1.0, target)
    best, gap = 1, math.inf
    for d in range(1, int(math.isqrt(n)) + 1):
        if n % d:
            continue
        for c in (d, n // d):
            g = abs(math.log(c / target))
            if g < gap - 1e-12 or (abs(g - gap) <= 1e-12 and c < best):
                best, gap = c, g
    return best


def _rescaled_parts(old: int, new: int, parts: int, growth: float = 1.0) -> int:
    """Parts of a label of ``new`` elements for ``parts`` parts of ``old``: the size change
    ``new / old`` goes ``growth`` to the part count and the rest to the tiles (1: the same tiles,
    0: the same part count), rounded to a divisor of ``new``."""
    if old == new:
        return parts
    return _divisor_near(new, parts * (new / old) ** growth)


def rescale_trace(trace: tuple, old: dict[str, int], new: dict[str, int],
                  growth: float = 1.0, labels: LabelMap | None = None) -> tuple | None:
    """``trace`` for the same program at other label sizes (``old`` -> ``new``, a shape family's
    buckets): the same plans, with every grid split's part count and every loop's trip count
    rescaled -- ``growth`` of the size change to the counts, the rest to the tiles and chunks
    (1.0: tiles and chunks kept; 0.0: counts kept) -- also those of a split reduction's parts
    ("l2/16": l2 split in 16 on an earlier kernel's grid, finished by a later one; "l2/4" where
    the same tiles make 4 parts).

    ``labels`` says which label of ``new`` each label of ``old`` is
    (:func:`~mirage_py.generator.labels.label_correspondences`; default: the same names, where
    both have the same labels). A dim of size 1 has no label, so a bucket of size 1 lacks the
    labels its dims of size 1 get elsewhere: such a *fresh* label grows from 1 like any other --
    ``growth`` of it to a grid split on a kernel's first free grid axis, the rest to its tiles
    (whole in the block at 0.0) -- and the plan is checked when it is replayed. None when a
    label of the trace has no counterpart."""
    if labels is None:  # the same names: only where both have the same labels
        if set(old) != set(new):
            return None
        labels = LabelMap({lbl: lbl for lbl in old})
    rename, fresh = labels.rename, labels.fresh
    if not set(rename.values()) <= set(new) or not set(fresh) <= set(new):
        return None

    def relabel(lbl: str) -> tuple[str, int, int] | None:
        """A label's name at the new sizes, its old and its new size."""
        if lbl in rename:
            return rename[lbl], old[lbl], new[rename[lbl]]
        base, _, k = lbl.rpartition("/")
        if base not in rename or not k.isdigit():
            return None
        k2 = _rescaled_parts(old[base], new[rename[base]], int(k), growth)
        return f"{rename[base]}/{k2}", int(k), k2

    out = []
    for plan, grp in trace:
        grid, parts = [], {}
        for lbl, n in plan.grid:
            if lbl is None:
                grid.append((None, 1))
                continue
            got = relabel(lbl)
            if got is None:
                return None
            name, o, w = got
            parts[lbl] = _rescaled_parts(o, w, n, growth)
            grid.append((name, parts[lbl]))
        for lbl in fresh:  # grown from size 1: on a free grid axis as far as ``growth`` says
            k = _rescaled_parts(1, new[lbl], 1, growth)
            free = next((a for a, (g, _) in enumerate(grid) if g is None), None)
            if k > 1 and free is not None:
                grid[free] = (lbl, k)
        lbl, iters = plan.loop
        if lbl is not None:
            got = relabel(lbl)
            if got is None:
                return None
            name, o, w = got
            rest_old = max(1, o // dict(plan.grid).get(lbl, 1))
            rest = max(1, w // parts.get(lbl, 1))
            iters = _rescaled_parts(rest_old, rest, iters, growth)
            lbl = name
        out.append((Plan(tuple(grid), (lbl, iters)), grp))
    return tuple(out)


class Searcher:
    """The search space of one program on one target: its oracle, labels and templates."""

    # the last kernel of a sequence only tries plans whose grid can place the outputs it must
    # finish (``search``); False tries every plan there too (the same candidates, slower: the
    # tests compare the two)
    last_plans_fit_outputs = True

    def __init__(self, program, target: Target, deadline: float | None = None,
                 bound_slack: float = 1.5):
        self.program = program
        self.bound_slack = bound_slack
        self.target = target
        self.deadline = deadline
        # what any further graph-defined kernel costs at least under the analytic model: its
        # launch and one memory round trip (every wave waits for its loads)
        self.next_kernel_us = target.launch_us + target.mem_latency_us
        self.labels = infer_labels(program)
        exprs = ae.of_program(program, self.labels)
        memo: dict[str, bool] = {}
        # the abstract values of the program's statistics (sums, squares, what is computed from
        # them: lax/precision.py), which an intermediate keeps in float32
        self._statistics = frozenset(exprs[t.digest] for t in program.nodes()
                                     if t.inputs and is_statistic(t, memo))
        outs = program.output_tensors
        self._output_nodes = outs
        self.outputs = set(outs)
        # per output, the labels a grid may split in the kernel that finishes it (``search``)
        self._placing = {n: frozenset(lbls) for n, lbls in self.labels.outputs.items()}
        self.ctx = Context(
            oracle=ae.Oracle([exprs[t.digest] for t in outs.values()]),
            templates=templates_of(program, exprs),
            target_exprs={n: exprs[t.digest] for n, t in outs.items()},
            target_labels=self.labels.outputs,
            target_shapes={n: t.shape for n, t in outs.items()},
            target_dtypes={n: t.dtype for n, t in outs.items()},
            reduced=self.labels.reduced, deadline=deadline,
            reductions=tuple(sorted({("sum", True)} | {
                (t.op, bool(t.attr("keepdims"))) for t in program.nodes()
                if t.op in ("sum", "max", "min") and (t.op != "sum" or not t.attr("keepdims"))})),
            label_sizes=self.labels.sizes, slices=self.labels.slices,
            concats=self.labels.concats, reshapes=self.labels.reshapes,
            views=self.labels.views,
            matmul_attrs=math_attrs(program_matmul_math(program)))
        # index inputs are no data a kernel computes on: they pick rows (gathers, below)
        self.avail0 = [Avail(t.name, t.shape, t.dtype, exprs[t.digest],
                             self.labels.inputs[t.name]) for t in program.inputs
                       if not is_index(t.dtype)]
        # gathers: the rows of a program input picked by an index input, which an iterator
        # loads through the indices (a take fused into the kernel that reads it)
        takes = [t for t in program.nodes() if t.op == "take" and
                 all(i.op == "input" for i in t.inputs)]
        for k, t in enumerate(takes):
            self.avail0.append(Avail(f"gather{k}", t.shape, t.dtype, exprs[t.digest],
                                     self.labels.node_components[t.digest],
                                     gather=tuple(DTensor(i.name, i.shape, i.dtype)
                                                  for i in t.inputs)))
        # masks: known data every kernel can compute from indices
        masks = [t for t in program.nodes() if t.op == "mask"]
        for k, t in enumerate(masks):
            dims = self.labels.node_components[t.digest]
            self.avail0.append(Avail(f"mask{k}", t.shape, t.dtype, exprs[t.digest], dims,
                                     (t.attr("offset"), t.attr("window"), t.attr("valid"))))
        # what a kernel output holds, when it is one of the program's values: the same abstract
        # expression over the same dim labels (the algebra alone is index-free)
        self._node_of = {}
        for t in program.nodes():
            if t.op not in ("input", "const", "mask"):
                self._node_of.setdefault((exprs[t.digest], self.labels.node_components[t.digest]),
                                         t)
        self._inputs = {t.name for t in program.inputs}

    def is_statistic(self, expr) -> bool:
        """Is a value of abstract expression ``expr`` one of the program's statistics?"""
        return expr in self._statistics

    def usable(self, avail: list[Avail], done) -> list[Avail]:
        """``avail`` without the program inputs that the outputs still to compute reach only
        through values an earlier kernel saved (a finished residual stream ``h`` stands for the
        down projection's weight when only ``rms_norm(h) @ W`` is left): the next kernel loads
        ``h`` instead of recomputing it, and its block search does not grow values from
        inputs it no longer needs."""
        cut = {self._node_of[a.expr, a.dims].digest for a in avail
               if a.name not in self._inputs and a.mask is None and a.shift is None and
               a.gather is None and
               (a.expr, a.dims) in self._node_of}
        if not cut:
            return avail
        need: set = set()
        seen: set = set()
        stack = [t for n, t in self._output_nodes.items() if n not in done]
        while stack:
            t = stack.pop()
            if t.digest in seen or t.digest in cut:
                continue
            seen.add(t.digest)
            if t.op == "input":
                need.add(t.name)
            stack.extend(t.inputs)
        return [a for a in avail if a.name not in self._inputs or a.name in need]

    def plans(self, avail: list[Avail], done: frozenset = frozenset()) -> list[Plan]:
        """Grid / loop plans for the next kernel, with ``done`` outputs finished already: the
        labels are classed by the outputs still to compute (``Labels.classes``)."""
        todo = self.outputs - done
        parallel, reduced = self.labels.classes(todo)
        rows = parallel & self.labels.reduced_any
        return plans_for(avail, reduced | _split_labels(avail), parallel, self.target,
                         rows=rows, one_block=self._one_block(avail, todo, rows))

    def _one_block(self, avail: list[Avail], todo, rows: frozenset) -> bool:
        """Does one block computing everything make sense for the next kernel? When every
        available tensor fits one block (``_footprint``) and no grid can split the outputs
        still to compute without some block writing another's values: a row one output keeps
        and another reduces (a normalised token written beside its projection), or no label
        every output has (q, k and v projections of one token, with heads of their own)."""
        if _footprint(avail, {}, (None, 1)) > self.target.smem_per_block // TILE_FOOTPRINT_SHARE:
            return False
        common = None
        for n in todo:
            lbls = {l for l in self.labels.outputs[n] if l is not None}
            common = lbls if common is None else common & lbls
        return bool(rows) or not common

    def _expired(self) -> bool:
        return self.deadline is not None and time.perf_counter() > self.deadline

    def search(self, *, max_kernels: int = 3, stats: SearchStats | None = None,
               on_candidate=None, share: tuple[int, int] = (0, 1),
               patience: int | None = None, cap: float | None = None) -> list[Candidate]:
        """Branch and bound over kernel sequences (module docstring). ``patience``: give up
        (``stats.gave_up``) once that many block-level states were visited without a single
        complete candidate -- a deterministic bound on hopeless searches. ``cap``: a sequence
        predicted above it is not extended (a region whose answer must beat what already
        covers its operators)."""
        stats = stats or SearchStats()
        t0 = time.perf_counter()
        found: list[Candidate] = []
        seen_states: set = set()
        counter = [0]

        best = [float("inf")]
        limit = float("inf") if cap is None else cap

        def rec(avail, kernels, done, trace, cost_so_far) -> None:
            if self._expired():
                stats.timed_out = True
                return
            if patience is not None and not found and self.ctx.stats["states"] > patience:
                stats.gave_up = True
                return
            if done >= self.outputs:
                g = assemble(self.program, kernels)
                c = Candidate(g, tuple(trace))
                found.append(c)
                stats.candidates += 1
                stats.states = self.ctx.stats["states"]  # a live view for progress reports
                stats.pruned = self.ctx.stats["pruned"]
                best[0] = min(best[0], estimate_us(g, self.target))
                if on_candidate:
                    on_candidate(c)
                return
            if len(kernels) >= max_kernels:
                return
            avail = self.usable(avail, done)
            # partials relative to their split's maximum differ from plain ones (``shift``)
            key = frozenset((a.expr, a.dims, a.shift) for a in avail)
            if key in seen_states:
                return
            seen_states.add(key)
            children = []
            # the last kernel must finish every output left, and a final output's tiles are
            # placed by the grid: each label the grid splits must be the outer label of one of
            # its dims (``block_search.save_layout``), so other plans cannot end the sequence
            fits = None
            if len(kernels) == max_kernels - 1 and self.last_plans_fit_outputs:
                fits = frozenset.intersection(*(self._placing[o] for o in self.outputs - done))
            for idx, plan in enumerate(self.plans(avail, frozenset(done))):
                if not kernels and idx % share[1] != share[0]:
                    continue
                if fits is not None and any(lbl not in fits for lbl, n in plan.grid
                                            if lbl is not None and n > 1):
                    continue
                if self._expired():
                    stats.timed_out = True
                    return
                if patience is not None and not found and self.ctx.stats["states"] > patience:
                    stats.gave_up = True
                    return
                stats.plans += 1
                for grp, kc in enumerate(kernels_for_plan(plan, avail, self.ctx, self.target,
                                                          counter)):
                    stats.kernels += 1
                    kcost = _kernel_cost(kc.kernel, avail, self.target)
                    children.append((not kc.finals, cost_so_far + kcost, idx, grp, plan, kc))
            # kernels that finish outputs first, then the cheapest; branch and bound: a partial
            # sequence already slower than the best complete one (with some slack, so that
            # alternatives remain should verification reject the best) is not extended
            children.sort(key=lambda c: c[:4])
            for _, c_cost, _, grp, plan, kc in children:
                # a sequence that leaves outputs unfinished needs one more kernel at least
                finished = (done | set(kc.finals)) >= self.outputs
                floor = c_cost + (0.0 if finished else self.next_kernel_us)
                if floor > best[0] * self.bound_slack or floor > limit:
                    continue
                rec(avail + kc.outputs, kernels + [kc.kernel], done | set(kc.finals),
                    trace + [(plan, grp)], c_cost)

        try:
            rec(self.avail0, [], set(), [], 0.0)
        except KeyboardInterrupt:
            stats.interrupted = True
        stats.states = self.ctx.stats["states"]
        stats.pruned = self.ctx.stats["pruned"]
        stats.seconds = time.perf_counter() - t0
        return found

    def step(self, avail: list[Avail], done, plan: Plan, grp: int, counter: list[int]):
        """One decision of a trace at the state (``avail``, ``done``), as the search took it:
        (the tensors available after it, the kernel it adds), or None if it no longer applies."""
        avail = self.usable(avail, done)
        kcs = kernels_for_plan(plan, avail, self.ctx, self.target, counter)
        if grp >= len(kcs):
            return None
        return avail + kcs[grp].outputs, kcs[grp]

    def _run(self, trace: tuple) -> tuple[list[Avail], list[GraphKernel], set[str]] | None:
        """Apply the steps of ``trace``: the tensors then available (to the next step), the
        kernels, the outputs finished (None if a step no longer applies)."""
        avail = list(self.avail0)
        kernels: list[GraphKernel] = []
        done: set[str] = set()
        counter = [0]
        for plan, grp in trace:
            got = self.step(avail, done, plan, grp, counter)
            if got is None:
                return None
            avail, kc = got
            kernels.append(kc.kernel)
            done |= set(kc.finals)
        return self.usable(avail, done), kernels, done

    def replay(self, trace: tuple) -> KernelGraph | None:
        """Rebuild the kernel graph a trace describes (None if a step no longer applies)."""
        run = self._run(trace)
        if run is None or not run[2] >= self.outputs:
            return None
        return assemble(self.program, run[1])

    def alternatives(self, plan: Plan, avail: list[Avail]) -> list[Plan]:
        """The same structure with other part counts: each grid axis and the loop count moved
        to neighbouring divisors (x1/4 .. x4)."""
        sizes = label_sizes(avail)
        out = []
        for a, (label, parts) in enumerate(plan.grid):
            if label is None:
                continue
            for g in _divisors(sizes.get(label, parts)):
                if g != parts and 2 <= g and parts / 4 <= g <= parts * 4 and \
                        not narrow_split(label, g, avail):
                    grid = list(plan.grid)
                    grid[a] = (label, g)
                    out.append(Plan(tuple(grid), plan.loop))
        label, f = plan.loop
        if label is not None:
            rest = sizes.get(label, f) // dict(plan.grid).get(label, 1)
            for g in _divisors(max(rest, 1)):
                if g != f and g >= 2 and f / 4 <= g <= f * 4:
                    out.append(Plan(plan.grid, (label, g)))
        return out

    def tune(self, cand: Candidate, cost, max_rounds: int = 3) -> Candidate:
        """Coordinate descent over the part counts of each step of ``cand``'s trace, keeping a
        change when the cost model says it is faster (the annotation tuner's simple form)."""
        best, best_cost = cand, cost(cand.graph)
        for _ in range(max_rounds):
            improved = False
            for step in range(len(best.trace)):
                run = self._run(best.trace[:step])
                if run is None:
                    break
                avail = run[0]
                plan, grp = best.trace[step]
                for alt in self.alternatives(plan, avail):
                    if self._expired():
                        return best
                    trace = best.trace[:step] + ((alt, grp),) + best.trace[step + 1:]
                    g = self.replay(trace)
                    if g is None:
                        continue
                    c = cost(g)
                    if c < best_cost:
                        best, best_cost, improved = Candidate(g, trace), c, True
                        break
            if not improved:
                break
        return best


def search(program, target: Target, *, max_kernels: int = 3, deadline: float | None = None,
           stats: SearchStats | None = None, on_candidate=None,
           share: tuple[int, int] = (0, 1), patience: int | None = None,
           cap: float | None = None) -> list[Candidate]:
    """All complete candidates found for ``program`` (a verifiable subprogram), in the order
    found. ``on_candidate(candidate)`` is called as each is found, so an interrupted or timed-out
    search keeps what it had. ``share=(i, n)`` explores only the first-level plans whose index
    is i modulo n (one worker's share); ``patience`` and ``cap``: see :meth:`Searcher.search`."""
    return Searcher(program, target, deadline).search(
        max_kernels=max_kernels, stats=stats, on_candidate=on_candidate, share=share,
        patience=patience, cap=cap)


def _kernel_cost(kernel: GraphKernel, avail: list[Avail], target: Target) -> float:
    from .block_search import _dt
    g = KernelGraph("k", tuple(_dt(avail, n) for n in kernel.inputs), (kernel,), ())
    return estimate_us(g, target)


def _split_labels(avail: list[Avail]) -> frozenset:
    """Labels of the parts of split reductions saved as partial results ("l3/32")."""
    return frozenset(d[0][0] for a in avail for d in a.dims if d and "/" in d[0][0])


def assemble(program, kernels: list[GraphKernel]) -> KernelGraph:
    """Kernel graph from the kernel sequence, dropping outputs nobody uses (and their savers)."""
    from ..ugraph.dce import eliminate_dead
    g = KernelGraph(program.name, tuple(DTensor(t.name, t.shape, t.dtype) for t in program.inputs),
                    tuple(kernels), tuple(program.output_tensors))
    return eliminate_dead(g)
