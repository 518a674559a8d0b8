"""Task scheduler: spend a tuning budget across a program's subprograms where the estimated
end-to-end gain is largest (Ansor's gradient rule, simplified).

The program's predicted time is ``sum_i w_i * best_i`` over its tasks (subprograms; ``w_i`` how
often each runs). After one warm-up round per task, each next round goes to the task with the
largest expected reduction of that sum::

    gain_i = w_i * max(recent_i, floor_i)
    recent_i = (best_i[-1 - window] - best_i[-1]) / window     improvement per round lately
    floor_i  = eps * best_i[-1] / rounds_i**2                  optimism that fades with effort

``recent`` follows the tuner's progress; the floor keeps a task that has stalled for a while
eligible, with less weight the more rounds it has had. Exhausted tasks (nothing new to try) get
no more rounds. The budget is a number of rounds and/or a deadline; ties go to the earlier task,
so a run is deterministic when the budget is in rounds.

A task is anything with ``best_cost``, ``step() -> best cost``, ``done`` and ``weight``
(:class:`mirage_py.tuning.tuner.TuneTask`; tests use fakes).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol


class Task(Protocol):
    weight: float

    @property
    def best_cost(self) -> float: ...

    @property
    def done(self) -> bool: ...

    def step(self) -> float: ...


@dataclass
class ScheduleLog:
    """What the scheduler did: rounds per task, the order, and each task's best after each."""

    rounds: list[int]
    order: list[int] = field(default_factory=list)
    history: list[list[float]] = field(default_factory=list)
    seconds: float = 0.0

    def total(self, weights: list[float]) -> float:
        return sum(w * h[-1] for w, h in zip(weights, self.history))


class TaskScheduler:
    def __init__(self, tasks: list[Any], *, rounds: int | None = None,
                 deadline: float | None = None, window: int = 2, eps: float = 0.05,
                 clock: Callable[[], float] = time.perf_counter):
        if rounds is None and deadline is None:
            raise ValueError("TaskScheduler needs a budget: rounds or deadline")
        self.tasks = tasks
        self.rounds = rounds
        self.deadline = deadline
        self.window = window
        self.eps = eps
        self.clock = clock

    def gain(self, i: int, hist: list[float], n: int) -> float:
        best = hist[-1]
        if not math.isfinite(best):
            return 0.0
        w = min(self.window, len(hist) - 1)
        recent = (hist[-1 - w] - best) / w if w > 0 else 0.0
        if not math.isfinite(recent):
            recent = 0.0
        return self.tasks[i].weight * max(recent, self.eps * best / max(n, 1) ** 2)

    def _budget_left(self, used: int) -> bool:
        if self.rounds is not None and used >= self.rounds:
            return False
        return self.deadline is None or self.clock() < self.deadline

    def run(self) -> ScheduleLog:
        t0 = self.clock()
        n = len(self.tasks)
        log = ScheduleLog([0] * n, [], [[t.best_cost] for t in self.tasks])
        used = 0

        def play(i: int) -> None:
            nonlocal used
            log.history[i].append(self.tasks[i].step())
            log.rounds[i] += 1
            log.order.append(i)
            used += 1

        for i in range(n):  # warm-up: one round each
            if not self._budget_left(used):
                break
            if not self.tasks[i].done:
                play(i)
        while self._budget_left(used):
            live = [i for i in range(n) if not self.tasks[i].done]
            if not live:
                break
            gains = [(self.gain(i, log.history[i], log.rounds[i]), -i) for i in live]
            g, neg = max(gains)
            if g <= 0:
                break
            play(-neg)
        log.seconds = self.clock() - t0
        return log
