"""The cheapest cover of a part by candidate kernels: a small exact 0/1 program.

A candidate is ``(reads, writes, cost)``: the values (operator results of the part) it reads and
writes, and its predicted time. Every operator of the naive lowering is one, every region
answer is one. A set of candidates is a *cover* when

* every output of the part is written by a chosen candidate,
* every value a chosen candidate reads is a part input or written by a chosen candidate that runs
  before it, so the chosen candidates can be put in an order (two regions that each read what
  the other writes cannot both run),

and its cost is the sum of the chosen costs: kernels run one after another, and the values that
cross between them are device tensors that every candidate's cost already charges (it writes what
it writes and reads what it reads).

The 0/1 program: a binary ``x_c`` per candidate; every output written (``sum_w x_w >= 1`` over
its writers); every value read by a chosen candidate written by another chosen one
(``sum_w x_w >= x_c``); every operator computed by some chosen candidate
(``sum_{c computes d} x_c >= 1``); minimise ``sum cost_c x_c`` (plus 1e-6 per candidate: among
equal costs, fewer kernels). The operator rows are implied by the others for every operator the
outputs depend on (an output's writer computes its operator, and everything that operator reads
is computed by the writers of what it reads, and so on), so they change no answer; but without
them the relaxation is weak -- on the decoder block's 121 candidates it bounded the cost by 6.1
us against an optimum of 16.5 us, and HiGHS took 0.7 s per solve; with them the relaxation is
exact there and a solve takes 7 ms. A candidate that another one dominates (no more cost and
reads, at least the writes and operators) is left out first (``_undominated``). The order is
checked afterwards: the chosen candidates are placed greedily, each once everything it reads
has a placed writer. If some are stuck (they read values only stuck ones write), cuts over
those values are added (``_cycle_cuts``: for a value set ``V``, every reader of ``V`` implies
a chosen writer of ``V`` that reads none of it) and the program is solved again; one cut
forbids a cycle with all the twins of its candidates. Covering programs like this have tight
relaxations;
an earlier form with an order variable per candidate and big-M precedence constraints took
HiGHS 7 s per solve on the decoder block's 132 candidates, this one milliseconds
(``benchmarks/cover_solvers.py`` measures both solvers, HiGHS through ``scipy.optimize.milp``
and z3's optimiser, on the composition programs). HiGHS solves the relaxation first and stops
there when its optimum is already 0/1 (then it is the 0/1 optimum too): on stacked decoder
layers that is every solve once most wanted regions are answered.

**Quick covers** (``exact=False``). While many regions still enter at their lower bounds, the
relaxation of stacked layers is fractional (overlapping regions at 1/2 each, four layers: 59.7
against an optimum of 62.8) and HiGHS needs 0.25 s (four layers) to 0.6 s (eight) to close the
gap. A caller that only needs a good cover -- the lazy loop deciding what to search next -- asks
for a quick one: the 0/1 program restricted to the relaxation's support and the candidates whose
reduced cost is under ``QUICK_REDUCED`` times the mean chosen cost (at most as many as the
support, the smallest first). The relaxation's duals prove
that every cover using a left-out candidate ``j`` costs at least ``LP + r_j`` (``r_j`` its
reduced cost); so when the restricted optimum is within ``LP + min r_j`` it is the optimum
(``Cover.proven``), otherwise it is a good cover with no proof. On the decoder's four and eight
layers the restricted optimum equalled the optimum in every solve, in 0.02-0.07 s. A caller
that must be exact (the loop's last solve) asks again with ``exact=True`` when the quick cover
is not proven.

**Exact covers** where the relaxation is fractional: the restricted program first, as above;
when the duals do not prove its optimum ``z``, the 0/1 program over the restricted set and every
candidate with ``LP + r_j < z`` (reduced-cost fixing: the others cannot be in a cheaper cover),
to a zero gap. The bound comes from the duals clipped at 0 (``_dual_bound``), valid whatever
their accuracy. On a weak relaxation this keeps most candidates (a one-layer tiny Llama's
prefill: 25.15 against 26.80, 430 of 438), and HiGHS's time goes to its root cuts (4 s).

**The lazy loop's solves** (:class:`LazyCovers`): each proven optimum is kept as a lower bound
for the later solves of the same part (valid while no candidate got cheaper), so the last
optimum, or a cover next to it (``fixed``: its unchanged pieces kept, the rest solved), at that
bound is an optimum without an exact solve; restricted programs are ``hint``-ed with the last
optimum; a settled cover that ties an exact optimum is the answer.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from ..errors import MirageError, OptionError

TIE = 1e-6  # us added per chosen candidate: among equal costs, fewer kernels
# a quick cover keeps the candidates whose reduced cost is under this times the mean cost of
# the relaxation's chosen candidates (a third of a kernel: on four and eight stacked decoder
# layers it kept 200-260 of 559 and 400-500 of 1139 candidates, and the restricted optimum
# was the optimum in every solve)
QUICK_REDUCED = 0.3
# HiGHS's MILP presolve is off: on a one-layer tiny Llama's prefill (420 columns, 1173 rows) it
# reported 29.21 optimal where covers of 27.21 and 28.14 were feasible (scipy 1.17.1's HiGHS;
# without presolve 27.21, in the same 3.1 s)
MILP_PRESOLVE = False


class CoverError(MirageError):
    """No set of candidates covers the part (cannot happen while the naive candidates are
    there: they cover every part)."""


@dataclass(frozen=True)
class CoverCandidate:
    """A kernel or a group of kernels: what it reads, what it writes, what it costs."""

    key: str
    reads: frozenset
    writes: frozenset
    cost: float
    ops: frozenset = frozenset()  # the operators it computes (default: the values it writes)

    @property
    def computes(self) -> frozenset:
        return self.ops or self.writes


@dataclass
class Cover:
    """A chosen set of candidates, in an order they can run in, and who reads from whom."""

    chosen: list  # candidate keys, in run order
    cost: float
    seconds: float = 0.0
    solver: str = ""
    writer: dict = field(default_factory=dict)  # (reader key, value) -> the writer it reads
    proven: bool = True  # a cheapest cover (False: a quick cover with no proof)


def solve_cover(cands: list[CoverCandidate], outputs: frozenset, *,
                needed: frozenset = frozenset(), solver: str = "highs", time_limit_s: float = 60.0,
                max_cuts: int = 1000, exact: bool = True, hint: frozenset = frozenset(),
                fixed: frozenset = frozenset()) -> Cover:
    """The cheapest cover (see the module docstring). Candidates of infinite cost are left out;
    keys must be unique. ``needed``: operators every cover computes (those the outputs depend
    on), which tightens the program without changing its answer. ``solver``: ``"highs"`` or
    ``"z3"``. ``exact=False``: a quick cover, the cheapest one where that is proven cheaply
    (``Cover.proven``), otherwise a good one (HiGHS only; z3 is always exact). ``hint``: keys
    of candidates the restricted program of a quick or exact HiGHS solve always holds (an
    earlier optimum's: :class:`LazyCovers`). ``fixed``: keys of candidates every cover must
    use -- the cheapest cover among those (HiGHS, never ``proven``: others may be cheaper)."""
    t0 = time.perf_counter()
    cands = [c for c in cands if math.isfinite(c.cost)]
    if len({c.key for c in cands}) != len(cands):
        raise CoverError("cover: candidate keys are not unique")
    cands = _undominated(cands, keep=fixed)
    if solver not in ("highs", "z3"):
        raise MirageError(f"cover: unknown solver {solver!r}; choose 'highs' or 'z3'")
    writers: dict = {}
    for i, c in enumerate(cands):
        for v in c.writes:
            writers.setdefault(v, []).append(i)
    missing = [v for v in outputs if v not in writers]
    if missing:
        raise CoverError(f"cover: no candidate writes output value(s) {sorted(missing)[:3]}")
    rows = _Rows()
    for v in sorted(outputs):
        rows.add(writers[v], [1.0] * len(writers[v]), 1.0)
    for i, c in enumerate(cands):
        for v in sorted(c.reads):
            ws = [w for w in writers.get(v, ()) if w != i]
            rows.add(ws + [i], [1.0] * len(ws) + [-1.0], 0.0)
    computers: dict = {}
    for i, c in enumerate(cands):
        for d in c.computes:
            computers.setdefault(d, []).append(i)
    for d in sorted(needed):
        if d not in computers:
            raise CoverError(f"cover: no candidate computes operator {d[:12]}")
        rows.add(computers[d], [1.0] * len(computers[d]), 1.0)
    for _ in range(max_cuts):
        if solver == "z3":
            picked, proven = _z3(cands, rows, time_limit_s), True
        else:
            picked, proven = _highs(cands, rows, time_limit_s, exact,
                                    [i for i, c in enumerate(cands) if c.key in hint],
                                    [i for i, c in enumerate(cands) if c.key in fixed])
        order, stuck = _place(cands, picked, writers)
        if not stuck:
            out = _cover(cands, order, writers, time.perf_counter() - t0, solver)
            out.proven = proven
            return out
        for firsts, a in _cycle_cuts(cands, order, stuck, writers):
            rows.add(firsts + [a], [1.0] * len(firsts) + [-1.0], 0.0)
    raise CoverError(f"cover: no orderable cover after {max_cuts} cuts")


def _undominated(cands: list[CoverCandidate], keep: frozenset = frozenset()
                 ) -> list[CoverCandidate]:
    """The candidates no other one dominates (and those keyed in ``keep``). ``d`` dominates ``c`` when it costs no more, reads
    no more, writes and computes at least as much: in any orderable cover ``d`` can stand in
    ``c``'s place (what it reads is there when ``c``'s was) for no more, so some cheapest cover
    uses none of the dominated ones. Of equals, the first stays. Stacked layers repeat every
    region at every layer, with many twins (the floor's or an operator's, or the same values
    read and written around more operators inside): on a two-layer tiny Llama's whole-model
    part 290-380 of 917-1013 candidates leave, and a solve takes about half the time."""
    writers: dict = {}
    for i, c in enumerate(cands):
        for v in c.writes:
            writers.setdefault(v, set()).add(i)

    def dominates(j: int, i: int) -> bool:
        d, c = cands[j], cands[i]
        if not (d.cost <= c.cost and d.reads <= c.reads and d.computes >= c.computes):
            return False  # (it writes at least c's values: it came from their writers)
        strictly = d.cost < c.cost or d.reads < c.reads or d.computes > c.computes or \
            d.writes > c.writes
        return strictly or j < i

    out = []
    for i, c in enumerate(cands):
        pool = set.intersection(*(writers[v] for v in c.writes)) if c.writes else set()
        if c.key in keep or not any(j != i and dominates(j, i) for j in pool):
            out.append(c)
    return out


def _cycle_cuts(cands, order: list[int], stuck: list[int], writers: dict
                ) -> list[tuple[list[int], int]]:
    """Cuts over values that forbid the dependency cycles among the ``stuck`` candidates and
    every twin of them at once: for a set ``V`` of values, let ``A`` be the candidates that read
    one of ``V`` and ``B`` those that write one of ``V`` and read none; then ``x_a <= sum_B x_b``
    for every ``a`` in ``A``. Valid for every orderable cover: its first member of ``A`` to run
    reads a value of ``V`` that a chosen candidate placed earlier writes, and that one, not in
    ``A``, is in ``B``. The sets taken: every value a stuck candidate reads and no placed one
    writes (this cut is violated now: a chosen writer of such a value is itself stuck, so it
    reads one of them and is not in ``B``), and those of each cycle (strongly connected
    component of the stuck candidates' reads-from graph). One cut over values covers every
    candidate that reads and writes them the same way -- stacked layers' regions come with
    many twins (same values read and written, other operators inside), and a cut over
    candidates (``if all of S, then one of the others``) forbade one twin combination per
    solve: hundreds of solves on a two-layer model, a handful with these. Returned as (the
    ``B`` columns, ``a``) pairs."""
    import networkx as nx
    placed = set(order)
    members = set(stuck)

    def blocked(i: int) -> set:
        return {v for v in cands[i].reads if not any(w in placed for w in writers.get(v, ()))}

    value_sets = [frozenset(v for i in stuck for v in blocked(i))]
    g = nx.DiGraph()
    g.add_nodes_from(stuck)
    for i in stuck:
        for v in blocked(i):
            g.add_edges_from((w, i) for w in writers.get(v, ()) if w in members)
    for comp in nx.strongly_connected_components(g):
        c = next(iter(comp))
        if len(comp) > 1 or g.has_edge(c, c):
            value_sets.append(frozenset(v for i in comp for v in blocked(i)
                                        if any(w in comp for w in writers.get(v, ()))))
    cuts: dict = {}
    for vs in dict.fromkeys(value_sets):
        readers = [i for i, c in enumerate(cands) if not c.reads.isdisjoint(vs)]
        reading = set(readers)
        firsts = tuple(sorted({w for v in vs for w in writers.get(v, ()) if w not in reading}))
        for a in readers:
            cuts[(firsts, a)] = None
    return [(list(b), a) for b, a in cuts]


class _Rows:
    """The 0/1 program's rows ``sum_j a_j x_j >= b``, kept as coordinate lists (row, column,
    coefficient) and the right-hand sides."""

    def __init__(self) -> None:
        self.row: list[int] = []
        self.col: list[int] = []
        self.vals: list[float] = []
        self.lo: list[float] = []

    def add(self, cols: list[int], vals: list[float], b: float) -> None:
        self.row.extend([len(self.lo)] * len(cols))
        self.col.extend(cols)
        self.vals.extend(vals)
        self.lo.append(b)


def _place(cands, picked: list[int], writers: dict) -> tuple[list[int], list[int]]:
    """Place the picked candidates greedily (each once all it reads has a placed writer):
    (the order, the candidates left stuck)."""
    order: list[int] = []
    done: set[int] = set()
    rest = sorted(picked, key=lambda i: cands[i].key)
    progress = True
    while rest and progress:
        progress = False
        for i in list(rest):
            if all(any(w in done for w in writers.get(v, ())) for v in cands[i].reads):
                order.append(i)
                done.add(i)
                rest.remove(i)
                progress = True
    return order, rest


def _cover(cands, order: list[int], writers: dict, seconds: float, solver: str) -> Cover:
    pos = {i: k for k, i in enumerate(order)}
    writer = {}
    for i in order:
        for v in cands[i].reads:
            w = min((w for w in writers.get(v, ()) if w in pos and pos[w] < pos[i]),
                    key=pos.get)
            writer[(cands[i].key, v)] = cands[w].key
    return Cover([cands[i].key for i in order], sum(cands[i].cost for i in order), seconds,
                 solver, writer)


def _highs(cands, rows, time_limit_s, exact: bool = True, hint: list[int] = (),
           fixed: list[int] = ()) -> tuple[list[int], bool]:
    """HiGHS on the 0/1 program: (the picked candidates, whether they are proven cheapest).
    The relaxation first; where it is fractional, the 0/1 program over a restricted set of
    candidates (and the ``hint`` columns), and where the relaxation's duals cannot prove that
    optimal, again over every candidate that could still lower it (:func:`_dual_bound`; module
    docstring). With ``fixed`` columns (at 1): the 0/1 program over every column, not proven."""
    from scipy.optimize import linprog
    from scipy.sparse import coo_matrix

    n = len(cands)
    A = coo_matrix((rows.vals, (rows.row, rows.col)), shape=(len(rows.lo), n)).tocsr()
    lo = np.array(rows.lo)
    cost = np.array([c.cost + TIE for c in cands])

    def zero_one(x) -> bool:
        return x is not None and bool(np.all((x < 1e-9) | (x > 1 - 1e-9)))

    if len(fixed):
        return _integral(cost, A, lo, np.arange(n), time_limit_s, fixed).picked, False

    # the relaxation first: an optimum of it that is 0/1 is an optimum of the 0/1 program (the
    # lazy loop's later solves, where most regions are answered: 0.04 -> 0.017 s on four layers)
    # (without presolve: on these small sparse programs it costs more than it saves, 0.27 ->
    # 0.22 s for the nine largest solves of four stacked layers)
    lp = linprog(cost, A_ub=-A, b_ub=-lo, bounds=(0, 1), method="highs",
                 options={"time_limit": time_limit_s, "presolve": False})
    if lp.status == 0 and zero_one(lp.x):
        return [i for i in range(n) if lp.x[i] > 0.5], True
    every = np.arange(n)
    if lp.status != 0:
        whole = _integral(cost, A, lo, every, time_limit_s)
        return whole.picked, whole.optimal
    base, reduced = _dual_bound(cost, A, lo, -lp.ineqlin.marginals)
    # the 0/1 program over the relaxation's support and the candidates of small reduced cost
    support = lp.x > 1e-9
    chosen_mean = float(cost @ lp.x) / max(float(lp.x.sum()), 1e-9)
    # beside the support, at most as many again of the smallest reduced costs (32 stacked 8B
    # layers, everything at its lower bound: all 4011 candidates were under the threshold, and
    # the 0/1 program over them took HiGHS 8 s; over the 291 of the support 0.3 s, 0.008 %
    # above the optimum)
    near = np.flatnonzero(~support & (reduced < QUICK_REDUCED * chosen_mean))
    near = near[np.argsort(reduced[near], kind="stable")[:int(support.sum())]]
    keep = support.copy()
    keep[near] = True
    keep[list(hint)] = True
    part = None if keep.all() else _integral(cost, A, lo, np.flatnonzero(keep), time_limit_s)
    if part is None:  # every candidate kept, or no cover by the kept ones alone
        whole = _integral(cost, A, lo, every, time_limit_s)
        return whole.picked, whole.optimal
    # a cover using a left-out candidate j costs at least base + reduced[j]: the restricted
    # optimum is proven when none of them can come under it
    slack = 1e-9 * max(1.0, abs(part.value))
    if part.optimal and part.value <= base + float(reduced[~keep].min()) + slack:
        return part.picked, True
    if not exact:
        return part.picked, False
    # exact: only the left-out candidates that could come under it can be in a cheaper cover
    # (where the relaxation is weak that is most of them: the prefill of a one-layer tiny
    # Llama, 430 of 438, 4-6 s a solve at load 5 either way)
    keep |= base + reduced < part.value + slack
    whole = _integral(cost, A, lo, np.flatnonzero(keep), time_limit_s)
    if whole is None:  # cannot be: the restricted cover is among these columns
        whole = _integral(cost, A, lo, every, time_limit_s)
    return whole.picked, whole.optimal


def _dual_bound(cost: np.ndarray, A, lo: np.ndarray, y: np.ndarray
                ) -> tuple[float, np.ndarray]:
    """From row prices ``y`` (the relaxation's duals, clipped at 0): ``(base, r)`` such that
    every 0/1 ``x`` with ``A x >= lo`` costs at least ``base + sum_j r_j x_j``, ``r >= 0``.
    With ``d = cost - A^T y``: ``cost x = y A x + d x >= y lo + sum_j min(d_j, 0) +
    sum_j max(d_j, 0) x_j``, for any ``y >= 0`` -- so the bound holds whatever the accuracy of
    the duals (at the relaxation's optimum ``base`` is its value)."""
    y = np.maximum(y, 0.0)
    d = cost - A.T @ y
    return float(y @ lo + np.minimum(d, 0.0).sum()), np.maximum(d, 0.0)


def _integral(cost: np.ndarray, A, lo: np.ndarray, cols: np.ndarray, time_limit_s: float,
              fixed: list[int] = ()) -> _Integral | None:
    """The 0/1 program over the columns ``cols`` (the others at 0; the ``fixed`` ones of them
    at 1), solved to a zero gap; None when no cover uses only those columns."""
    from scipy.optimize import Bounds, LinearConstraint, milp
    m = len(cols)
    low = np.isin(cols, np.asarray(fixed, dtype=int)).astype(float)
    res = milp(cost[cols], constraints=LinearConstraint(A[:, cols], lo, np.inf),
               integrality=np.ones(m), bounds=Bounds(low, np.ones(m)),
               options={"time_limit": time_limit_s, "mip_rel_gap": 0.0,
                        "presolve": MILP_PRESOLVE})
    if res.x is None:
        if res.status == 2 and m < A.shape[1]:
            return None  # infeasible over these columns: the caller widens them
        raise CoverError(f"cover: HiGHS found no cover ({res.message})")
    return _Integral([int(cols[i]) for i in range(m) if res.x[i] > 0.5], float(res.fun),
                     res.status == 0)


@dataclass(frozen=True)
class _Integral:
    """An answer of :func:`_integral`: the picked columns, their cost, whether HiGHS proved
    it optimal over its columns (False: the time limit ended it)."""

    picked: list
    value: float
    optimal: bool


def _z3(cands, rows, time_limit_s) -> list[int]:
    try:
        import z3
    except ImportError:
        raise OptionError("cover: solver='z3' needs z3, which is not installed; pip install "
                          "'mirage_py[z3]' (or pip install z3-solver)") from None

    n = len(cands)
    opt = z3.Optimize()
    opt.set("timeout", int(time_limit_s * 1000))
    x = [z3.Bool(f"x{i}") for i in range(n)]
    terms: list[list] = [[] for _ in rows.lo]
    for r, j, a in zip(rows.row, rows.col, rows.vals):
        terms[r].append((x[j], int(a)))
    for entries, b in zip(terms, rows.lo):
        opt.add(z3.PbGe(entries, int(b)) if entries else z3.BoolVal(b <= 0))
    opt.minimize(z3.Sum([z3.If(x[i], round((c.cost + TIE) * 1e6), 0)
                         for i, c in enumerate(cands)]))
    if opt.check() != z3.sat:
        raise CoverError("cover: z3 found no cover")
    mdl = opt.model()
    return [i for i in range(n) if z3.is_true(mdl.eval(x[i], model_completion=True))]


def objective(cover: Cover) -> float:
    """What the 0/1 program minimises for a cover: its cost plus ``TIE`` per chosen candidate."""
    return cover.cost + TIE * len(cover.chosen)


def _same(a: float, b: float) -> bool:
    """``a`` is no more than ``b`` but for the solver's rounding."""
    return a <= b + 1e-9 * max(1.0, abs(b))


@dataclass(frozen=True)
class _Proof:
    """A proven optimum of an earlier solve: its objective, and the cost of every candidate
    it was solved over, by what the candidate is (key, reads, writes, operators)."""

    value: float
    costs: dict


def _what(c: CoverCandidate) -> tuple:
    return c.key, c.reads, c.writes, c.computes


class LazyCovers:
    """The cover solves of a lazy loop over one part (``superopt/part.py``,
    ``PartCover.settle``): candidates that are not *settled* (an unsearched region at its lower
    bound, an untuned or unverified one) enter at what they can cost at least, and settling one
    only makes it dearer. :meth:`next` answers with a cover the loop works on -- one that uses
    unsettled candidates -- or a settled one, proven the cheapest whenever it is.

    A quick cover decides (``solve_cover(exact=False)``); when it uses only settled candidates
    and the duals do not prove it, an exact solve does. Where the relaxation is weak (a
    one-layer tiny Llama's prefill: 25.15 against 26.80, docs/generator.md) the quick cover
    is often far above the optimum (28.4 against 27.2 there) and every round of the loop took
    an exact solve (4-7 s idle) to find the optimum again -- which was most often the same
    cover as the round before, or one next to it. So:

    * **Earlier proofs** (:meth:`bound`). The optimum of an earlier proven solve stays a lower
      bound on today's while every candidate is one it was solved over at no lower cost (they
      only get dearer as they settle; each one is compared, so one that did not is caught, not
      assumed). The last proven optimum, at today's costs, still within that bound is still an
      optimum: it is the answer again, no solve (a search or check that left its regions' costs
      as they were).
    * **Hints.** The quick and exact solves keep the last proven optimum's candidates in their
      restricted program (``solve_cover(hint=...)``), so the quick cover starts from it rather
      than from the weak relaxation's support.
    * **Ties go to the settled cover.** An exact optimum that costs no less than the settled
      quick cover (objectives compared, ``TIE`` per kernel included) proves the quick cover
      instead of sending the loop to search an unsettled region of an equal-cost optimum, whose
      answer -- at its lower bound at best -- could not lower the cost; a settled cover within
      a proof's bound is proven without a solve.

    ``solves``, ``exact_solves`` and ``seconds`` count what it did."""

    KEEP = 8  # the latest proofs kept (each a cost per candidate)

    def __init__(self, outputs: frozenset, needed: frozenset = frozenset()):
        self.outputs, self.needed = outputs, needed
        self.proofs: list[_Proof] = []
        # the last proven optimum, its pieces and their costs then
        self.last: tuple[Cover, list[tuple], list[float]] | None = None
        self.solves, self.exact_solves, self.seconds = 0, 0, 0.0

    def next(self, cands: list[CoverCandidate], unsettled: frozenset,
             time_limit_s: float = 60.0) -> Cover:
        """The quick cover when it uses a candidate of ``unsettled`` (keys); otherwise the
        cheapest cover, proven (``Cover.proven``; False only when a solve was cut short by
        ``time_limit_s``). The last proven optimum when it still is one."""
        bound = self.bound(cands)
        again = self._again(cands)
        if again is not None and _same(objective(again), bound):
            return again
        quick = self.solve(cands, exact=False, time_limit_s=time_limit_s)
        if not unsettled.isdisjoint(quick.chosen) or quick.proven:
            return quick
        if _same(objective(quick), bound):
            quick.proven = True
            self._keep(cands, quick)
            return quick
        near = self._nearby(cands, bound, unsettled, time_limit_s)
        if near is not None:
            return near
        exact = self.solve(cands, exact=True, time_limit_s=time_limit_s)
        if exact.proven and _same(objective(quick), objective(exact)):
            quick.proven = True  # a tie: the settled one
            self._keep(cands, quick)
            return quick
        return exact

    def solve(self, cands: list[CoverCandidate], exact: bool = True,
              time_limit_s: float = 60.0, fixed: frozenset = frozenset()) -> Cover:
        """One solve (:func:`solve_cover`, hinted by the last proven optimum), counted; a
        proven optimum is kept as a proof."""
        hint = self._again(cands)
        cover = solve_cover(cands, self.outputs, needed=self.needed, exact=exact,
                            time_limit_s=time_limit_s, fixed=fixed,
                            hint=frozenset(() if hint is None else hint.chosen))
        self.solves += 1
        self.exact_solves += exact and not fixed
        self.seconds += cover.seconds
        if cover.proven:
            self._keep(cands, cover)
        return cover

    def _keep(self, cands: list[CoverCandidate], cover: Cover) -> None:
        """A proven optimum: kept as a proof and as the last optimum."""
        costs = {_what(c): c.cost for c in cands if math.isfinite(c.cost)}
        self.proofs = self.proofs[-(self.KEEP - 1):] + [_Proof(objective(cover), costs)]
        by_key = {c.key: c for c in cands}
        pieces = [_what(by_key[k]) for k in cover.chosen]
        self.last = cover, pieces, [costs[w] for w in pieces]

    def _nearby(self, cands: list[CoverCandidate], bound: float, unsettled: frozenset,
                time_limit_s: float) -> Cover | None:
        """A cover at the proofs' ``bound`` next to the last optimum: the cheapest that keeps
        its pieces whose cost has not changed (``solve_cover(fixed=...)``), and failing that
        the cheapest that keeps those of them that are settled (on the tiny Llama's prefill,
        where hundreds of regions enter at the same lower bound, the optimum after some of
        them got dearer most often costs the same, swapping them for others); it is an
        optimum, by the bound. None when there is none such."""
        if self.last is None or not math.isfinite(bound):
            return None
        cover, pieces, then = self.last
        now = {_what(c): c.cost for c in cands}
        steady = frozenset(w[0] for w, cost in zip(pieces, then) if now.get(w) == cost)
        tries = [steady, steady - unsettled]
        for fixed in dict.fromkeys(f for f in tries if f and len(f) < len(pieces)):
            try:
                near = self.solve(cands, time_limit_s=time_limit_s, fixed=fixed)
            except CoverError:  # no cover keeps them all (cannot be: the last optimum did)
                continue
            if _same(objective(near), bound):
                near.proven = True
                self._keep(cands, near)
                return near
        return None

    def bound(self, cands: list[CoverCandidate]) -> float:
        """The best lower bound the kept proofs give on the cheapest cover by ``cands`` (its
        objective): a proof holds while every candidate is one it was solved over, at no lower
        cost (then every cover costs at least what it did then). -inf when none holds."""
        now = [(_what(c), c.cost) for c in cands if math.isfinite(c.cost)]
        best = -math.inf
        for p in self.proofs:
            if p.value > best and all(w in p.costs and cost >= p.costs[w] for w, cost in now):
                best = p.value
        return best

    def _again(self, cands: list[CoverCandidate]) -> Cover | None:
        """The last proven optimum at today's costs (same order and readers' writers: the
        pieces read and write what they did), or None when one of its pieces is gone."""
        if self.last is None:
            return None
        cover, pieces, _ = self.last
        now = {_what(c): c.cost for c in cands if math.isfinite(c.cost)}
        if not all(w in now for w in pieces):
            return None
        return replace(cover, cost=sum(now[w] for w in pieces), seconds=0.0, proven=True)
