"""Annotation tuner: evolutionary search over the annotations of one μGraph structure.

Ansor's recipe on Mirage's objects. The structure (which kernels, which labels on the grid and
loop, which block operators) stays fixed; a population of :class:`Schedule` s varies its
annotations:

* **mutations**: move one kernel's grid part count or loop range to a neighbouring divisor
  (``Searcher.alternatives``, x1/4 .. x4, then ``replay``), change one kernel's threads per block
  (64 .. 1024), its pipeline stages (1 .. 4), or the storage dtype of one complete intermediate
  (float32 <-> the program's 16-bit dtype);
* **crossover**: per kernel, take the plan, threads and stages from one of two parents (a trace
  whose steps no longer fit together fails to replay and is dropped);
* **selection**: the ``elite`` best schedules seen so far (by the cost model, ties broken by the
  schedule's JSON) are the parents of the next generation; a schedule is evaluated once.

Everything random comes from ``random.Random`` seeded by (seed, the structure's hash), so the
same seed gives the same result in any process. Replays share work between traces with a common
prefix (:class:`Replayer`), so changing the last kernel's plan re-saturates only that kernel.
A GPU runner then measures the model's best few (``Tuner.top``), see ``superopt``.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from ..cost_model import DEFAULT_STAGES
from ..errors import MirageError
from ..generator.kernel_search import Candidate, Searcher, assemble
from ..targets import Target
from ..ugraph.graph import KernelGraph
from .annotations import MAX_STAGES, THREAD_CHOICES, AnnotatedGraph, Schedule, threads_of, \
    with_storage, with_threads


class Replayer:
    """``Searcher.replay`` with memoised prefixes: the state after each trace prefix is kept."""

    def __init__(self, searcher: Searcher):
        self.searcher = searcher
        self._memo: dict[tuple, tuple | None] = {
            (): (tuple(searcher.avail0), 0, (), frozenset())}
        self._graphs: dict[tuple, KernelGraph | None] = {}

    def _state(self, prefix: tuple):
        if prefix in self._memo:
            return self._memo[prefix]
        prev = self._state(prefix[:-1])
        st = None
        if prev is not None:
            avail, count, kernels, done = prev
            plan, grp = prefix[-1]
            counter = [count]
            got = self.searcher.step(list(avail), done, plan, grp, counter)
            if got is not None:
                after, kc = got
                st = (tuple(after), counter[0], kernels + (kc.kernel,),
                      done | frozenset(kc.finals))
        self._memo[prefix] = st
        return st

    def avail_before(self, trace: tuple, step: int):
        """The tensors step ``step`` of ``trace`` plans with (``Searcher.usable``)."""
        st = self._state(tuple(trace[:step]))
        return None if st is None else self.searcher.usable(list(st[0]), st[3])

    def _intermediates(self, trace: tuple) -> list:
        st = self._state(tuple(trace))
        g = self.graph(trace)
        if st is None or g is None:
            return []
        inputs = {t.name for t in self.searcher.program.inputs}
        produced = {t.name for op in g.ops for t in op.outputs} - set(g.outputs)
        return [a for a in st[0] if a.name not in inputs and a.name in produced and
                not any("/" in c[0] for d in a.dims for c in d)]

    def intermediates(self, trace: tuple) -> list[str]:
        """Names of the complete intermediates ``trace`` saves (not split-reduction partials,
        whose dims carry a ``label/parts`` component), in order of definition."""
        return [a.name for a in self._intermediates(trace)]

    def narrowable(self, trace: tuple) -> list[bool]:
        """Per intermediate of :meth:`intermediates`: may it be stored in the program's 16-bit
        dtype? Not a statistic (a sum, a square, what is computed from them:
        lax/precision.py), which stays float32."""
        return [not self.searcher.is_statistic(a.expr) for a in self._intermediates(trace)]

    def graph(self, trace: tuple) -> KernelGraph | None:
        trace = tuple(trace)
        if trace not in self._graphs:
            st = self._state(trace)
            g = None
            if st is not None and st[3] >= self.searcher.outputs:
                g = assemble(self.searcher.program, list(st[2]))
            self._graphs[trace] = g
        return self._graphs[trace]


def _annotate(replayer: Replayer, g: KernelGraph, sch: Schedule) -> AnnotatedGraph:
    names = replayer.intermediates(sch.trace) if sch.store else []
    g = with_storage(g, {n: d for n, d in zip(names, sch.store)})
    return AnnotatedGraph(with_threads(g, sch.threads), sch.stages)


def replay_schedule(program, target: Target, schedule: Schedule) -> AnnotatedGraph | None:
    """Rebuild the annotated graph a schedule describes (e.g. one stored in the results
    database or a saved result): replay its trace, then apply threads, storage and stages."""
    replayer = Replayer(Searcher(program, target, None))
    g = replayer.graph(schedule.trace)
    return None if g is None else _annotate(replayer, g, schedule)


@dataclass(frozen=True)
class Evaluated:
    cost: float
    schedule: Schedule
    graph: AnnotatedGraph | None

    def key(self) -> tuple:
        return (self.cost, self.schedule.sort_key())


class Tuner:
    """Evolutionary search over the annotations of one candidate's structure (module doc)."""

    def __init__(self, replayer: Replayer, cand: Candidate, model, target: Target, *,
                 seed: int = 0, population: int = 8, elite: int = 4, max_mutations: int = 2,
                 crossover: float = 0.25):
        self.replayer = replayer
        self.model = model
        self.target = target
        self.population = population
        self.elite = elite
        self.max_mutations = max_mutations
        self.crossover_p = crossover
        self.rng = random.Random(f"{seed}:{cand.graph.structural_hash()}")
        n = len(cand.graph.graph_kernels())
        dts = {t.dtype for t in cand.graph.tensors().values() if t.name in cand.graph.outputs}
        self.low = dts.pop() if len(dts) == 1 and dts <= {"float16", "bfloat16"} else None
        self._base_graph = replayer.graph(cand.trace) or cand.graph
        tensors = self._base_graph.tensors()
        store = tuple(tensors[n].dtype for n in replayer.intermediates(cand.trace))
        self.base = Schedule(tuple(cand.trace), threads_of(cand.graph), (DEFAULT_STAGES,) * n,
                             store)
        self.seen: dict[Schedule, Evaluated] = {}
        self.generations = 0
        self.exhausted = False
        self.base_cost = self.evaluate(self.base).cost

    # -- evaluation ---------------------------------------------------------------------------
    def realize(self, sch: Schedule) -> AnnotatedGraph | None:
        if sch.trace == self.base.trace:
            g = self._base_graph
        else:
            g = self.replayer.graph(sch.trace)
        if g is None:
            return None
        return _annotate(self.replayer, g, sch)

    def evaluate(self, sch: Schedule) -> Evaluated:
        ev = self.seen.get(sch)
        if ev is None:
            cost = math.inf
            try:
                ag = self.realize(sch)
                if ag is not None:
                    cost = float(self.model.predict(ag, self.target))
            except MirageError:  # an annotation the hardware or the graph cannot take
                ag, cost = None, math.inf
            ev = Evaluated(cost, sch, ag if math.isfinite(cost) else None)
            self.seen[sch] = ev
        return ev

    def ranked(self) -> list[Evaluated]:
        return sorted((e for e in self.seen.values() if e.graph is not None), key=Evaluated.key)

    def best(self) -> Evaluated:
        r = self.ranked()
        return r[0] if r else self.seen[self.base]

    def top(self, k: int) -> list[Evaluated]:
        return self.ranked()[:k]

    # -- variation ----------------------------------------------------------------------------
    def _mutate(self, sch: Schedule) -> Schedule | None:
        rng = self.rng
        kinds = ("parts", "parts", "threads", "stages") + (("store",) if self.low and
                                                            sch.store else ())
        kind = rng.choice(kinds)
        if kind == "parts" and sch.trace:
            step = rng.randrange(len(sch.trace))
            avail = self.replayer.avail_before(sch.trace, step)
            if avail is None:
                return None
            plan, grp = sch.trace[step]
            alts = self.replayer.searcher.alternatives(plan, avail)
            if not alts:
                return None
            trace = sch.trace[:step] + ((rng.choice(alts), grp),) + sch.trace[step + 1:]
            return Schedule(trace, sch.threads, sch.stages, sch.store)
        if kind == "threads" and sch.threads:
            i = rng.randrange(len(sch.threads))
            cur = sch.threads[i]
            near = [t for t in THREAD_CHOICES if t != cur and (t == cur * 2 or t * 2 == cur)]
            pool = near if near and rng.random() < 0.7 else [t for t in THREAD_CHOICES if t != cur]
            th = list(sch.threads)
            th[i] = rng.choice(pool)
            return Schedule(sch.trace, tuple(th), sch.stages, sch.store)
        if kind == "stages" and sch.stages:
            i = rng.randrange(len(sch.stages))
            st = list(sch.stages)
            st[i] = rng.choice([s for s in range(1, MAX_STAGES + 1) if s != st[i]])
            return Schedule(sch.trace, sch.threads, tuple(st), sch.store)
        if kind == "store" and sch.store and self.low:
            i = rng.randrange(len(sch.store))
            flags = self.replayer.narrowable(sch.trace)  # positional, as _annotate reads them
            if i < len(flags) and not flags[i]:
                return None  # a statistic stays float32
            sto = list(sch.store)
            sto[i] = self.low if sto[i] == "float32" else "float32"
            return Schedule(sch.trace, sch.threads, sch.stages, tuple(sto))
        return None

    def _crossover(self, a: Schedule, b: Schedule) -> Schedule:
        rng = self.rng
        if len(a.trace) == len(b.trace):
            trace = tuple(x if rng.random() < 0.5 else y for x, y in zip(a.trace, b.trace))
        else:
            trace = a.trace

        def mix(x: tuple, y: tuple) -> tuple:
            if len(x) != len(y):
                return x
            return tuple(p if rng.random() < 0.5 else q for p, q in zip(x, y))
        return Schedule(trace, mix(a.threads, b.threads), mix(a.stages, b.stages),
                        mix(a.store, b.store))

    def step(self) -> float:
        """One generation; returns the best cost so far."""
        rng = self.rng
        parents = [e.schedule for e in self.ranked()[:self.elite]] or [self.base]
        children: list[Schedule] = []
        fresh: set[Schedule] = set()
        attempts = 0
        while len(children) < self.population and attempts < self.population * 8:
            attempts += 1
            if len(parents) > 1 and rng.random() < self.crossover_p:
                a, b = rng.sample(parents, 2)
                child = self._mutate(self._crossover(a, b)) or self._crossover(a, b)
            else:
                child = rng.choice(parents)
                for _ in range(rng.randint(1, self.max_mutations)):
                    child = self._mutate(child) or child
            if child in self.seen or child in fresh:
                continue
            fresh.add(child)
            children.append(child)
        for c in children:
            self.evaluate(c)
        self.generations += 1
        self.exhausted = not children
        return self.best().cost


class TuneTask:
    """The tuning work of one subprogram: a tuner per candidate structure. One ``step`` is a
    generation of each; ``best_cost`` is the best predicted time over all of them."""

    def __init__(self, name: str, tuners: list[Tuner], weight: float = 1.0):
        self.name = name
        self.tuners = tuners
        self.weight = weight

    @property
    def best_cost(self) -> float:
        return min((t.best().cost for t in self.tuners), default=math.inf)

    @property
    def done(self) -> bool:
        return all(t.exhausted for t in self.tuners)

    def step(self) -> float:
        for t in self.tuners:
            if not t.exhausted:
                t.step()
        return self.best_cost


def make_task(name: str, program, target: Target, cands: list[Candidate], model, *,
              seed: int = 0, population: int = 8, elite: int = 4,
              weight: float = 1.0) -> TuneTask:
    """A task tuning ``cands`` (structures of ``program``) that share one replayer."""
    replayer = Replayer(Searcher(program, target, None))
    return TuneTask(name, [Tuner(replayer, c, model, target, seed=seed, population=population,
                                 elite=elite) for c in cands], weight)
