"""Hyper-parameters and feature sets chosen by cross-validation on the training records only.

The held-out problems decide nothing: :func:`cross_validate` splits the *training* records into
``k`` folds by problem (a fixed-seed hash, as :func:`~.records.split_of`: every GPU's record of
a problem in one fold), and for each fold calibrates the analytic model and fits a model on the
other folds, then predicts the fold. The out-of-fold predictions of all training records are
scored as the held-out ones are (:func:`score_by_target`: Kendall tau within each GPU's
records of captured problems, the mean over GPUs -- every GPU weighs the same, and the tau of
one GPU is what a tuner on it needs); :func:`select` keeps the candidate with the highest.

A boosted-tree candidate is its LightGBM parameters, round count and the feature columns it
leaves out; one fit per (fold, parameters) scores every round count (``predict(rounds=)``).
"""

from __future__ import annotations

import hashlib
import math
import statistics
from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from ..eager import EagerConstants
from ..tuning.stats import kendall_tau
from .calibrate import calibrate
from .gbt import BoostedTrees
from .metrics import median_log_error
from .records import SPLIT_SEED, Record

FOLDS = 5


def fold_of(problem: str, k: int = FOLDS, seed: int = SPLIT_SEED) -> int:
    """The fold of a training problem (a hash, independent of the train / test split's)."""
    h = hashlib.sha256(f"{seed}:fold:{problem}".encode()).digest()
    return int.from_bytes(h[:4], "big") % k


def score_by_target(records: list[Record], pred: list[float]) -> dict[str, float]:
    """Mean over GPUs of the Kendall tau within each GPU's captured records (``tau``), the
    median |log ratio| over all of them (``median_log_error``)."""
    by: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        if r.captured:
            by[r.target].append(i)
    taus = [kendall_tau([pred[i] for i in idx], [records[i].measured_us for i in idx])
            for idx in by.values() if len(idx) >= 5]
    taus = [t for t in taus if not math.isnan(t)]
    cap = [i for idx in by.values() for i in idx]
    return {"tau": statistics.fmean(taus) if taus else float("nan"),
            "median_log_error": median_log_error([pred[i] for i in cap],
                                                 [records[i].measured_us for i in cap])}


@dataclass(frozen=True)
class TreeCandidate:
    """One boosted-tree setting: LightGBM parameters over ``gbt.PARAMS``, the rounds, the
    feature columns (name prefixes) left out, the ranking loss's weight."""

    params: tuple[tuple[str, Any], ...] = ()
    rounds: int = 300
    exclude: tuple[str, ...] = ()
    rank_weight: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"params": dict(self.params), "rounds": self.rounds,
                "exclude": list(self.exclude), "rank_weight": self.rank_weight}


@dataclass
class CvResult:
    """A candidate's out-of-fold score on the training records."""

    candidate: Any
    tau: float
    median_log_error: float
    extra: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        c = self.candidate.as_dict() if hasattr(self.candidate, "as_dict") else self.candidate
        return {"candidate": c, "cv_tau": round(self.tau, 4),
                "cv_median_log_error": round(self.median_log_error, 4), **self.extra}


def fold_constants(records: list[Record], k: int = FOLDS,
                   seed: int = SPLIT_SEED) -> list[EagerConstants]:
    """The calibration fitted without each fold (what that fold's models start from)."""
    folds = [fold_of(r.problem, k, seed) for r in records]
    return [calibrate([r for r, f in zip(records, folds) if f != i]) for i in range(k)]


def cross_validate(records: list[Record],
                   fit_predict: Callable[[list[Record], list[Record], EagerConstants],
                                         dict[Any, list[float]]],
                   constants: list[EagerConstants] | None = None, k: int = FOLDS,
                   seed: int = SPLIT_SEED,
                   held_folds: tuple[int, ...] | None = None) -> dict[Any, dict[str, float]]:
    """Out-of-fold scores of the candidates ``fit_predict(train, held, constants)`` returns
    predictions for (a dict: candidate -> predicted times of ``held``). ``held_folds``: hold
    out only these folds (``(0,)``: one validation split of a ``1/k`` of the training
    problems, a ``k``-th of the fits), scoring their records only."""
    folds = [fold_of(r.problem, k, seed) for r in records]
    held_folds = tuple(range(k)) if held_folds is None else held_folds
    consts = constants or fold_constants(records, k, seed)
    scored = [j for j, f in enumerate(folds) if f in held_folds]
    oof: dict[Any, list[float]] = {}
    for i in held_folds:
        tr = [r for r, f in zip(records, folds) if f != i]
        idx = [j for j, f in enumerate(folds) if f == i]
        held = [records[j] for j in idx]
        for cand, pred in fit_predict(tr, held, consts[i]).items():
            out = oof.setdefault(cand, [float("nan")] * len(records))
            for j, p in zip(idx, pred):
                out[j] = p
    return {c: score_by_target([records[j] for j in scored], [p[j] for j in scored])
            for c, p in oof.items()}


def tree_fit_predict(params: list[dict[str, Any]], rounds: list[int],
                     exclude: list[tuple[str, ...]], rank_weights: list[float] = (0.0,)):
    """``fit_predict`` for :func:`cross_validate` over a grid of boosted-tree candidates."""
    def fp(tr: list[Record], held: list[Record], c: EagerConstants):
        out = {}
        for ex in exclude:
            for rw in rank_weights:
                for p in params:
                    m = BoostedTrees(c, rounds=max(rounds), params=p, exclude=ex,
                                     rank_weight=rw).fit(tr)
                    for n in rounds:
                        out[TreeCandidate(tuple(sorted(p.items())), n, ex, rw)] = \
                            m.predict(held, rounds=n)
        return out
    return fp


def select(results: dict[Any, dict[str, float]]) -> list[CvResult]:
    """The candidates best first (highest cross-validated tau; the smaller median log error
    breaks ties)."""
    rows = [CvResult(c, s["tau"], s["median_log_error"]) for c, s in results.items()]
    return sorted(rows, key=lambda r: (-r.tau, r.median_log_error))


@dataclass(frozen=True)
class GraphCandidate:
    """One GraphSAGE setting: epochs, the ranking loss's weight and margin, the hidden width,
    the number of SAGE layers, Adam's learning rate."""

    epochs: int = 400
    rank_weight: float = 1.0
    hidden: int = 64
    layers: int = 3
    lr: float = 3e-3
    margin: float = 0.0

    def as_dict(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "rank_weight": self.rank_weight, "hidden": self.hidden,
                "layers": self.layers, "lr": self.lr, "margin": self.margin}


@dataclass(frozen=True)
class GraphGrid:
    """The GraphSAGE candidates to score: every combination of the fields (one fit per
    combination of all but ``epochs``, whose values are snapshots of that fit)."""

    epochs: tuple[int, ...] = (100, 200, 400)
    rank_weights: tuple[float, ...] = (1.0,)
    hidden: tuple[int, ...] = (64,)
    layers: tuple[int, ...] = (3,)
    lr: tuple[float, ...] = (3e-3,)
    margins: tuple[float, ...] = (0.0,)

    def fits(self) -> list[GraphCandidate]:
        """One candidate per fit, at the most epochs."""
        return [GraphCandidate(max(self.epochs), rw, hd, ly, lr, m)
                for rw in self.rank_weights for hd in self.hidden for ly in self.layers
                for lr in self.lr for m in self.margins]


def graph_fit_predict(grid: GraphGrid):
    """``fit_predict`` for :func:`cross_validate` over a grid of GraphSAGE candidates (one fit
    per :meth:`GraphGrid.fits` scores every epoch count, from its snapshots)."""
    from .gnn import GraphSage

    def fp(tr: list[Record], held: list[Record], c: EagerConstants):
        out = {}
        for f in grid.fits():
            m = GraphSage(c, epochs=f.epochs, rank_weight=f.rank_weight, hidden=f.hidden,
                          layers=f.layers, lr=f.lr, margin=f.margin,
                          snapshots=grid.epochs).fit(tr)
            for e in grid.epochs:
                out[replace(f, epochs=e)] = m.predict(held, epochs=e)
        return out
    return fp
