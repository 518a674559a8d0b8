"""How well predicted times order and match measured ones."""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from ..tuning.stats import kendall_tau


def median_log_error(pred: list[float], meas: list[float]) -> float:
    """Median of |log(predicted / measured)| (0.69: typically off by 2x)."""
    if not pred:
        return float("nan")
    return statistics.median(abs(math.log(p / m)) for p, m in zip(pred, meas))


@dataclass(frozen=True)
class Score:
    """A model's agreement with measurements over ``n`` records."""

    n: int
    tau: float
    median_log_error: float

    def as_dict(self) -> dict[str, float]:
        return {"n": self.n, "kendall_tau": round(self.tau, 4),
                "median_abs_log_ratio": round(self.median_log_error, 4)}


def score(pred: list[float], meas: list[float]) -> Score:
    if len(pred) < 2:
        return Score(len(pred), float("nan"), median_log_error(pred, meas))
    return Score(len(pred), kendall_tau(pred, meas), median_log_error(pred, meas))


@dataclass(frozen=True)
class TopK:
    """Per group (a problem family on one GPU): is the measured fastest the predicted fastest
    (top-1), among the predicted 5 fastest (top-5); over ``groups`` groups of >= 2 problems."""

    groups: int
    top1: float
    top5: float

    def as_dict(self) -> dict[str, float]:
        return {"groups": self.groups, "top1": round(self.top1, 4), "top5": round(self.top5, 4)}


def top_k(keys: list[str], pred: list[float], meas: list[float]) -> TopK:
    groups: dict[str, list[int]] = defaultdict(list)
    for i, k in enumerate(keys):
        groups[k].append(i)
    hit1 = hit5 = n = 0
    for idx in groups.values():
        if len(idx) < 2:
            continue
        n += 1
        best = min(idx, key=lambda i: meas[i])
        order = sorted(idx, key=lambda i: pred[i])
        hit1 += order[0] == best
        hit5 += best in order[:5]
    return TopK(n, hit1 / n if n else float("nan"), hit5 / n if n else float("nan"))
