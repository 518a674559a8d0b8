"""Kernel-level search: sequences of graph-defined kernels (and pre-defined operators) that
compute the target outputs from the program inputs.

State: the device tensors available (inputs, then kernel outputs). A move adds one kernel: for
every *structure* -- which dimension labels the grid axes split and which label the for-loop runs
over -- the part counts come from the shapes and the target (tiles of at most 64 along parallel
labels, split reductions sized to fill the SMs, loop chunks of 64), the block-level search
saturates, and the kernel it yields either finishes target outputs or saves partial results.
Depth is bounded (``max_kernels``); states already seen are skipped.
"""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass, field

from ..lax.tensor import Tensor
from ..targets import Target
from ..ugraph.graph import DTensor, GraphKernel, KernelGraph
from . import absexpr as ae
from .block_search import Avail, Context, KernelCandidate, Plan, dim_size, kernels_for_plan
from .labels import infer_labels
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


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _largest_divisor_at_most(n: int, cap: int) -> int:
    return max(d for d in _divisors(n) if d <= cap)


def plans_for(avail: list[Avail], reduced: frozenset, parallel: frozenset, target: Target,
              max_grid_labels: int = 3) -> list[Plan]:
    """Grid/loop plans from the labels present in the available tensors (see module doc)."""
    sizes: dict[str, int] = {}
    for a in avail:
        for d in a.dims:
            if d:
                lbl, s = d[0]
                sizes[lbl] = max(sizes.get(lbl, 0), s)
    labels = sorted(sizes)
    loop_labels = [None] + [l for l in labels if l in reduced or l not in parallel]
    want = 2 * target.sm_count
    plans: list[Plan] = []
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
                    parts = n if n <= 64 else n // _largest_divisor_at_most(n, 64)
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
                grid.sort(key=lambda g: -g[1])  # the largest part count on x (limit 2^31-1)
                while len(grid) < 3:
                    grid.append((None, 1))
                plans.append(Plan(tuple(grid), lp))
    return plans


@dataclass
class Target_:
    exprs: dict
    labels: dict
    shapes: dict
    dtypes: dict


def search(program, target: Target, *, max_kernels: int = 3, deadline: float | None = None,
           stats: SearchStats | None = None, on_candidate=None,
           share: tuple[int, int] = (0, 1)) -> list[KernelGraph]:
    """All complete kernel graphs found for ``program`` (a verifiable subprogram), in the order
    found. ``on_candidate(graph)`` is called as each is found, so an interrupted or timed-out
    search keeps what it had. ``share=(i, n)`` explores only the first-level plans whose index
    is i modulo n (one worker's share)."""
    stats = stats or SearchStats()
    t0 = time.perf_counter()
    labels = infer_labels(program)
    exprs = ae.of_program(program, labels.node_dims)
    outs = program.output_tensors
    ctx = Context(
        oracle=ae.Oracle([exprs[t.digest] for t in outs.values()]),
        templates=templates_of(program, exprs),
        target_exprs={n: exprs[t.digest] for n, t in outs.items()},
        target_labels=labels.outputs,
        target_shapes={n: t.shape for n, t in outs.items()},
        target_dtypes={n: t.dtype for n, t in outs.items()},
        reduced=labels.reduced, deadline=deadline)
    avail0 = [Avail(t.name, t.shape, t.dtype, exprs[t.digest], labels.inputs[t.name])
              for t in program.inputs]
    found: list[KernelGraph] = []
    seen_states: set = set()
    counter = [0]

    def rec(avail: list[Avail], kernels: list[GraphKernel], done: set[str]) -> None:
        if deadline is not None and time.perf_counter() > deadline:
            stats.timed_out = True
            return
        if done >= set(outs):
            g = _assemble(program, kernels)
            found.append(g)
            stats.candidates += 1
            if on_candidate:
                on_candidate(g)
            return
        if len(kernels) >= max_kernels:
            return
        key = frozenset((a.expr, a.dims) for a in avail)
        if key in seen_states:
            return
        seen_states.add(key)
        plans = plans_for(avail, labels.reduced | _split_labels(avail), labels.parallel, target)
        for idx, plan in enumerate(plans):
            if not kernels and idx % share[1] != share[0]:
                continue
            if deadline is not None and time.perf_counter() > deadline:
                stats.timed_out = True
                return
            stats.plans += 1
            for kc in kernels_for_plan(plan, avail, ctx, target, counter):
                stats.kernels += 1
                rec(avail + kc.outputs, kernels + [kc.kernel], done | set(kc.finals))

    try:
        rec(avail0, [], set())
    except KeyboardInterrupt:
        stats.interrupted = True
    stats.states = ctx.stats["states"]
    stats.pruned = ctx.stats["pruned"]
    stats.seconds = time.perf_counter() - t0
    return found


def _split_labels(avail: list[Avail]) -> frozenset:
    """Labels of split reductions saved as partial results (outer component of a compound dim)."""
    out = set()
    for a in avail:
        for d in a.dims:
            if len(d) > 1:
                out.add(d[0][0])
    return frozenset(out)


def _assemble(program, kernels: list[GraphKernel]) -> KernelGraph:
    """Kernel graph from the kernel sequence, dropping outputs nobody uses (and their savers)."""
    from .dce import eliminate_dead
    g = KernelGraph(program.name, tuple(DTensor(t.name, t.shape, t.dtype) for t in program.inputs),
                    tuple(kernels), tuple(program.output_tensors))
    return eliminate_dead(g)
